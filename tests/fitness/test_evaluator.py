"""The Evaluator pipeline with host stages, real nvcc and HostScore; bad input before any GPU work."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap

import pytest

from evo.types import Genome, ProblemError, Status
from fitness import (
    Compile,
    Evaluator,
    EvaluatorConfigError,
    HostScore,
    Resources,
    Stage,
    StageResult,
    StaticCheck,
)
from tests.fitness.conftest import SIMPLE_KERNEL, host_problem, needs_nvcc, reference_raises


def score_registers(job, resources):
    """Fewer registers is better."""
    return -float(resources["registers"])


def score_ptx(job, resources):
    return float(len(job.data["ptx"]))


def host_stages(fn=score_registers):
    return [StaticCheck(), Compile(), Resources(), HostScore(fn)]


class Boom(Stage):
    name = "boom"

    def run(self, job, ctx):
        raise KeyError("harness bug in a host stage")


class PassNoScore(Stage):
    name = "pass"

    def run(self, job, ctx):
        return StageResult(ok=True)


@needs_nvcc
def test_host_pipeline_ok_rejected_and_compile_error(tmp_path):
    with Evaluator(host_problem(), host_stages(), cache_dir=tmp_path, compile_workers=2) as ev:
        ok, rejected, broken = [ev.submit(Genome(src, {"THREADS": 128})) for src in (
            SIMPLE_KERNEL,
            SIMPLE_KERNEL.replace("y[i] = 2.0f * x[i];", "y[i] = 2.0f * x[i]; cudaDeviceSynchronize();"),
            SIMPLE_KERNEL.replace("2.0f * x[i]", "2.0f * "),
        )]
        ok, rejected, broken = ok.result(60), rejected.result(60), broken.result(60)
        assert ok.status is Status.OK and ok.fitness == -ok.resources["registers"] < 0
        assert set(ok.stage_times) == {"static", "compile", "resources", "host_score"}
        assert "Compiling entry function 'kernel'" in ok.artifacts["compile_log"]
        assert ok.device == {}
        assert rejected.status is Status.REJECTED and "cudaDeviceSynchronize" in rejected.reason
        assert set(rejected.stage_times) == {"static"}
        assert broken.status is Status.COMPILE_ERROR and "compile_log" in broken.artifacts
        assert broken.fitness is None and "resources" not in broken.stage_times
        s = ev.stats()
        assert s["evaluations"] == 3 and s["by_status"] == {"ok": 1, "rejected": 1, "compile_error": 1}
        assert s["compiles"] == 2 and s["compile_cache_hits"] == 0 and s["compile_seconds"] > 0
        assert s["gpu_busy_fraction"]["overall"] == 0.0


@needs_nvcc
def test_cache_hit_across_evaluators_and_processes(tmp_path):
    genome = Genome(SIMPLE_KERNEL, {"THREADS": 256})
    with Evaluator(host_problem(), host_stages(), cache_dir=tmp_path) as ev:
        first = ev.evaluate(genome)
        assert ev.stats()["compiles"] == 1
    with Evaluator(host_problem(), host_stages(), cache_dir=tmp_path) as ev:
        second = ev.evaluate(genome)
        s = ev.stats()
        assert s["compile_cache_hits"] == 1 and s["compiles"] == 0
    assert second.fitness == first.fitness and second.resources == first.resources
    assert second.stage_times["compile"] < first.stage_times["compile"] / 5
    script = textwrap.dedent(f"""
        import json
        from evo.types import Genome
        from fitness import Evaluator
        from tests.fitness.conftest import SIMPLE_KERNEL, host_problem
        from tests.fitness.test_evaluator import host_stages
        with Evaluator(host_problem(), host_stages(), cache_dir={str(tmp_path)!r}) as ev:
            e = ev.evaluate(Genome(SIMPLE_KERNEL, {{"THREADS": 256}}))
            print(json.dumps({{"stats": ev.stats(), "fitness": e.fitness}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["stats"]["compile_cache_hits"] == 1 and got["stats"]["compiles"] == 0
    assert got["fitness"] == first.fitness


@needs_nvcc
def test_keep_ptx_reaches_later_stages(tmp_path):
    with Evaluator(host_problem(), host_stages(score_ptx), cache_dir=tmp_path, keep_ptx=True) as ev:
        e = ev.evaluate(Genome(SIMPLE_KERNEL, {"THREADS": 128}))
    assert e.ok and e.fitness > 100


def test_host_stage_exception_is_runtime_error_and_run_goes_on():
    with Evaluator(host_problem(), [Boom(), HostScore(score_registers)]) as ev:
        e = ev.evaluate(Genome(SIMPLE_KERNEL, {"THREADS": 128}))
        assert e.status is Status.RUNTIME_ERROR and "harness bug" in e.reason and "KeyError" in e.artifacts["traceback"]
        assert ev.evaluate(Genome(SIMPLE_KERNEL, {"THREADS": 256})).status is Status.RUNTIME_ERROR


def test_ok_without_fitness_is_a_config_error():
    with Evaluator(host_problem(), [PassNoScore()]) as ev:
        fut = ev.submit(Genome(SIMPLE_KERNEL, {"THREADS": 128}))
        with pytest.raises(EvaluatorConfigError, match="no stage set a fitness"):
            fut.result(10)


def test_host_score_pickles_and_rejects_nan():
    stage = pickle.loads(pickle.dumps(HostScore(score_registers)))
    assert stage.fn is score_registers
    with Evaluator(host_problem(), [HostScore(nan_score)]) as ev:
        e = ev.evaluate(Genome(SIMPLE_KERNEL, {"THREADS": 128}))
    assert e.status is Status.RUNTIME_ERROR and "NaN" in e.reason


def nan_score(job, resources):
    return float("nan")


@pytest.mark.parametrize("changes, match", [
    (dict(reference=reference_raises), r"reference failed on n=7:float32: KeyError"),
    (dict(check_shapes=()), "check_shapes is empty"),
    (dict(tolerances={"float32": -1.0}), "tolerance for 'float32'"),
    (dict(target="sm_999"), "target 'sm_999'"),
])
def test_bad_problem_fails_before_any_work(changes, match):
    with pytest.raises(ProblemError, match=match):
        Evaluator(host_problem(**changes), [HostScore(score_registers)])


@needs_nvcc
def test_target_unknown_to_the_compiler(tmp_path):
    with pytest.raises(ProblemError, match="sm_60"):
        Evaluator(host_problem(target="sm_60"), host_stages(), cache_dir=tmp_path)


def test_config_errors():
    with pytest.raises(EvaluatorConfigError, match="names repeat"):
        Evaluator(host_problem(), [HostScore(score_registers), HostScore(score_registers)])
    with pytest.raises(EvaluatorConfigError, match="not a fitness.Stage"):
        Evaluator(host_problem(), [object()])
    with Evaluator(host_problem(), [HostScore(score_registers)]) as ev:
        with pytest.raises(TypeError):
            ev.submit("not a genome")


class EchoOptions(Stage):
    """Scores with the option it was handed, to prove Evaluator(options=...) reaches stages."""

    name = "echo"

    def run(self, job, ctx):
        return StageResult(ok=True, fitness=float(ctx.options["timing_batches"]),
                           metrics={"options": {k: ctx.options[k] for k in ("timing_batches", "compile_timeout")}})


def test_options_reach_every_stage(tmp_path):
    with Evaluator(host_problem(), [EchoOptions()], cache_dir=tmp_path, timeout=33,
                   options={"timing_batches": 7}) as ev:
        e = ev.evaluate(Genome(SIMPLE_KERNEL, {"THREADS": 128}))
    assert e.status is Status.OK and e.fitness == 7.0
    assert e.metrics["options"] == {"timing_batches": 7, "compile_timeout": 33.0}


def test_options_may_not_shadow_arguments(tmp_path):
    with pytest.raises(EvaluatorConfigError, match="compile_timeout"):
        Evaluator(host_problem(), [EchoOptions()], cache_dir=tmp_path, options={"compile_timeout": 1})
