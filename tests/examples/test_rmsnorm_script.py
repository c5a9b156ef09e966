"""The example script stops at once, with exit code 2, where no GPU is usable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import _cuda_usable

ROOT = Path(__file__).resolve().parents[2]


def test_no_gpu_exits_2(tmp_path: Path) -> None:
    if _cuda_usable():
        pytest.skip("a GPU is present")
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "rmsnorm_h100.py"), "--archive",
                        str(tmp_path / "a.lmdb"), "--minutes", "0.1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "no usable GPU" in r.stderr
    assert not (tmp_path / "a.lmdb").exists()


def test_summary_reports_the_run_and_the_gain_over_the_seeds(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from archive import Archive
    from evo.types import Evaluation, Record, Status
    from examples.rmsnorm_h100 import summary
    from examples.rmsnorm_problem import make_forward_problem

    prob = make_forward_problem(quick=True)
    arch = Archive(prob, str(tmp_path / "a.lmdb"))
    try:
        for g, fit in zip(prob.seeds[:2], (0.40, 0.50), strict=True):
            arch.add(Record(g, Evaluation(Status.OK, fitness=fit, resources={"registers": 40})))
        child = prob.seeds[0].with_params(THREADS=256)
        arch.add(Record(child, Evaluation(Status.OK, fitness=0.60, resources={"registers": 48}),
                        parents=(prob.seeds[0].id,), operator="param_mutation"))
        engine = SimpleNamespace(last_run={"evaluations": 3, "seconds": 30.0, "rate_per_min": 6.0, "gpu_busy": 0.91,
                                           "stop": "time budget reached"}, stats=lambda: {})
        text = summary(engine, arch, prob, arch.best())
        engine.stats = lambda: {"warm_start_seeds_skipped": 2}
        warm = summary(engine, arch, prob, arch.best())
    finally:
        arch.close()
    assert "warm start" not in text
    assert f"warm start: 2 of the family's {len(prob.seeds)} seeds not timed again" in warm
    assert "3 evaluations in 30 s (6.0/min), GPU busy 91%" in text
    assert "stopped: time budget reached; archive: 3 records" in text
    assert "best fitness 0.6000" in text and "vs best seed 0.5000: 1.200x" in text
    assert "operators (whole archive): seed 2 evaluated, 0 new best; param_mutation 1 evaluated, 0 new best" in text


def test_backward_flag_also_stops_without_a_gpu(tmp_path: Path) -> None:
    if _cuda_usable():
        pytest.skip("a GPU is present")
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "rmsnorm_h100.py"), "--backward", "--no-racing",
                        "--archive", str(tmp_path / "b.lmdb")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no usable GPU" in r.stderr


def test_torch_reference_backward_matches_the_problem_reference() -> None:
    torch = pytest.importorskip("torch")
    import numpy as np

    from evo.types import Case
    from examples.rmsnorm_h100 import rmsnorm_backward_torch
    from examples.rmsnorm_problem import bwd_make_inputs, bwd_reference
    from fitness import materialize

    case = Case({"M": 7, "N": 33}, "float32")
    inputs = materialize(bwd_make_inputs(case, np.random.default_rng(0), np))
    want = bwd_reference(inputs, case, np)
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in inputs.items()}
    dx, dw = rmsnorm_backward_torch(t["x"].reshape(7, 33), t["w"], t["dy"].reshape(7, 33), t["rstd"])
    assert np.allclose(dx.numpy().reshape(-1), want["dx"], rtol=1e-4, atol=1e-5)
    assert np.allclose(dw.numpy(), want["dw"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("what", ["missing", "not-an-archive"])
def test_warm_start_that_is_not_an_archive_is_a_clear_error(tmp_path: Path, what: str) -> None:
    src = tmp_path / "old.lmdb"
    if what == "not-an-archive":
        src.mkdir()
        (src / "data.mdb").write_text("not lmdb")
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "rmsnorm_h100.py"), "--archive",
                        str(tmp_path / "a.lmdb"), "--warm-start", str(src)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"--warm-start {src}" in r.stderr
    assert not (tmp_path / "a.lmdb").exists()


@pytest.mark.parametrize("option,value,message", [
    ("--warm-start-per-case", "0", "--warm-start-per-case must be 1 or more"),
    ("--warm-start-seeds", "some", "--warm-start-seeds: invalid choice: 'some'"),
    ("--warm-start-within", "-0.1", "--warm-start-within must be a fraction >= 0 (got -0.1)"),
])
def test_bad_warm_start_options_are_refused_before_any_gpu_work(tmp_path: Path, option: str, value: str,
                                                                 message: str) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "rmsnorm_h100.py"), "--archive",
                        str(tmp_path / "a.lmdb"), option, value], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert not (tmp_path / "a.lmdb").exists()
