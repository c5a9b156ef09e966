"""Adversarial genomes through the real Evaluator: every cheat gets its expected status.

The static-rejection and compile-bomb cases run everywhere (host stages only); the
others need a GPU and carry the ``gpu`` marker.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from evo.types import Status
from fitness import Compile, Evaluator, Resources, StaticCheck, compile_genome
from fitness._device import gpu_available
from tests.fitness.adversarial import problem as rp

#: kernel file -> (expected status, what catches it)
EXPECTED = {
    "baseline": (Status.OK, "a correct kernel"),
    "noop": (Status.INCORRECT, "poisoned outputs stay NaN"),
    "zeros": (Status.INCORRECT, "relative error over the whole tensor"),
    "nan": (Status.INCORRECT, "non-finite where the reference is finite"),
    "mutate_input": (Status.INCORRECT, "input checksum"),
    "partial": (Status.INCORRECT, "poisoned outputs stay NaN"),
    "fixed_shape": (Status.INCORRECT, "several shapes, odd N"),
    "result_cache": (Status.INCORRECT, "new inputs after warm-up, timed outputs checked"),
    "replay": (Status.INCORRECT, "faster than the copy bandwidth: skips work on repeated launches"),
    "oob_write": (Status.INCORRECT, "guard regions"),
    "half_precision": (Status.INCORRECT, "float32 tolerance"),
    "racy": (Status.INCORRECT, "bitwise determinism rerun"),
    # the hang runs on a warm worker (a fresh one would add init_timeout to its deadline)
    "infinite_loop": (Status.TIMEOUT, "device timeout kills the worker"),
    "illegal_address": (Status.RUNTIME_ERROR, "sticky CUDA error, worker replaced"),
    "misaligned": (Status.RUNTIME_ERROR, "sticky CUDA error, worker replaced"),
    "side_stream": (Status.REJECTED, "static check: no launches or streams in a genome"),
    "compile_bomb": (Status.COMPILE_ERROR, "compile timeout / memory cap"),
}
HOST_ONLY = ("side_stream", "compile_bomb")
GPU_CASES = [k for k in EXPECTED if k not in HOST_ONLY]


def test_every_kernel_file_has_an_expectation():
    files = sorted(p.stem for p in rp.KERNELS.glob("*.cu"))
    assert files == sorted(EXPECTED)


def test_suite_kernels_compile(tmp_path):
    """Every GPU case builds with the real compiler (so a GPU failure is the gate's doing)."""
    problem = rp.problem()

    def build(name):
        return name, compile_genome(rp.genome(name), problem, timeout=120, memory_bytes=None)

    with ThreadPoolExecutor(2) as pool:
        results = dict(pool.map(build, GPU_CASES))
    bad = {k: r.reason for k, r in results.items() if not r.ok}
    assert not bad, bad
    assert all(r.cubin[:4] == b"\x7fELF" for r in results.values())


@pytest.mark.parametrize("name", HOST_ONLY)
def test_host_stage_cheats(name, tmp_path):
    problem = rp.problem()
    stages = [StaticCheck(), Compile(timeout=8, use_cache=False), Resources()]
    with Evaluator(problem, stages, timeout=8, cache_dir=tmp_path, devices=[]) as ev:
        result = ev.evaluate(rp.genome(name))
    expected, why = EXPECTED[name]
    assert result.status is expected, (why, result.artifacts)
    if name == "compile_bomb":
        assert "timed out" in result.reason or "killed" in result.reason, result.reason


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    if not gpu_available():
        pytest.skip("no usable CUDA device")
    # init_timeout bounds a fresh worker's first job (start-up) on top of device_timeout;
    # workers are replaced after faults, so it also bounds the hang test.
    ev = Evaluator(rp.problem(), timeout=120, device_timeout=20, init_timeout=60,
                   cache_dir=tmp_path_factory.mktemp("cache"), seed=20260514)
    yield ev
    ev.close()


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_CASES)
def test_gpu_cheats(evaluator, name):
    expected, why = EXPECTED[name]
    result = evaluator.evaluate(rp.genome(name))
    assert result.status is expected, (why, result.status, result.reason)
    if expected is Status.OK:
        assert result.fitness > 0 and 0 < result.metrics["fraction"] < 1.5
        assert set(result.metrics["cases"]) == {c.key for c in rp.problem().timed_cases()}
    if expected is Status.INCORRECT:
        assert result.artifacts.get("mismatch"), result.artifacts


@pytest.mark.gpu
def test_gpu_evaluator_survives_the_suite(evaluator):
    """After faults and hangs, the baseline still scores (a fresh worker took over)."""
    again = evaluator.evaluate(rp.genome("baseline", threads=128))
    assert again.status is Status.OK, again.reason
    assert evaluator.stats()["evaluations"] >= 1
