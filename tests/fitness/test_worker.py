"""Device-worker isolation with real subprocesses and test device stages (needs_gpu=False)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from evo.space import Choice, ParamSpace
from evo.types import Genome, Status
from fitness import CudaFault, Evaluator, EvaluatorConfigError, Stage, StageResult, is_cuda_fault, visible_devices
from tests.fitness.conftest import SIMPLE_KERNEL, group_alive, host_problem

MODES = ["ok", "slow", "hang", "exit", "fault", "cupy", "raise", "fail", "print"]


class Behave(Stage):
    """A device stage whose behaviour is the genome's MODE param."""

    name = "behave"
    where = "device"
    needs_gpu = False

    def run(self, job, ctx):
        mode = job.genome.params["MODE"]
        if mode == "slow":
            time.sleep(0.4)
        elif mode == "hang":
            time.sleep(1000)
        elif mode == "exit":
            sys.stderr.write("about to die without a report\n")
            sys.stderr.flush()
            os._exit(3)
        elif mode == "fault":
            raise CudaFault("cudaErrorIllegalAddress: an illegal memory access was encountered")
        elif mode == "cupy":
            raise FakeCupyError("CUDA_ERROR_MISALIGNED_ADDRESS")
        elif mode == "raise":
            raise ValueError("a bug in a stage")
        elif mode == "fail":
            return StageResult.fail(Status.INCORRECT, "mismatch at 3", mismatch="out[3] = 1 != 2")
        elif mode == "print":
            print("noise on stdout must not break the protocol")
        return StageResult(ok=True, fitness=1.0, metrics={"visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                                          "pid": os.getpid(), "seed": ctx.seed})


class FakeCupyError(RuntimeError):
    """An exception class that claims to come from cupy_backends (as CuPy's CUDARuntimeError does)."""


FakeCupyError.__module__ = "cupy_backends.cuda.api.runtime"


def problem():
    return host_problem(params=ParamSpace({"MODE": Choice(MODES)}))


def g(mode: str) -> Genome:
    return Genome(SIMPLE_KERNEL, {"MODE": mode})


@pytest.fixture
def ev():
    e = Evaluator(problem(), [Behave()], devices=["0"], device_timeout=2.0, seed=7)
    yield e
    e.close()


def test_is_cuda_fault():
    assert is_cuda_fault(CudaFault("x")) and is_cuda_fault(FakeCupyError("x"))
    assert not is_cuda_fault(ValueError("x"))


def test_visible_devices_from_env(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_devices() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_devices() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,-1,2")
    assert visible_devices() == ["1"]


def test_ok_runs_in_the_worker(ev):
    e = ev.evaluate(g("ok"))
    assert e.status is Status.OK and e.fitness == 1.0
    assert e.metrics["visible"] == "0"
    assert e.metrics["pid"] == ev.worker_pids()["0"] != os.getpid()
    assert "behave" in e.stage_times
    e2 = ev.evaluate(g("print"))
    assert e2.ok and e2.metrics["pid"] == e.metrics["pid"]


def test_hang_is_timeout_and_the_group_is_killed(ev):
    first = ev.evaluate(g("ok")).metrics["pid"]
    t0 = time.perf_counter()
    e = ev.evaluate(g("hang"))
    assert e.status is Status.TIMEOUT and time.perf_counter() - t0 < 20
    assert "device timeout" in e.reason and "behave" in e.reason
    assert group_alive(first) == []
    nxt = ev.evaluate(g("ok"))
    assert nxt.ok and nxt.metrics["pid"] != first
    s = ev.stats()
    assert s["respawns"] == 1 and s["respawn_seconds"] > 0
    assert s["by_status"] == {"ok": 2, "timeout": 1}


def test_exit_without_report_is_runtime_error_with_stderr(ev):
    first = ev.evaluate(g("ok")).metrics["pid"]
    e = ev.evaluate(g("exit"))
    assert e.status is Status.RUNTIME_ERROR
    assert "without a report" in e.reason and "about to die" in e.reason
    assert group_alive(first) == []
    nxt = ev.evaluate(g("ok"))
    assert nxt.ok and nxt.metrics["pid"] != first


@pytest.mark.parametrize("mode", ["fault", "cupy"])
def test_cuda_fault_replaces_the_worker(ev, mode):
    first = ev.evaluate(g("ok")).metrics["pid"]
    e = ev.evaluate(g(mode))
    assert e.status is Status.RUNTIME_ERROR and "CUDA fault in stage 'behave'" in e.reason
    assert "Traceback" in e.artifacts["traceback"]
    nxt = ev.evaluate(g("ok"))
    assert nxt.ok and nxt.metrics["pid"] != first
    assert group_alive(first) == []
    assert ev.stats()["respawns"] == 1


def test_other_exception_keeps_the_worker(ev):
    first = ev.evaluate(g("ok")).metrics["pid"]
    e = ev.evaluate(g("raise"))
    assert e.status is Status.RUNTIME_ERROR and "a bug in a stage" in e.reason
    assert "ValueError" in e.artifacts["traceback"]
    assert ev.evaluate(g("ok")).metrics["pid"] == first
    assert ev.stats()["respawns"] == 0


def test_failed_gate_reported_as_is(ev):
    e = ev.evaluate(g("fail"))
    assert e.status is Status.INCORRECT and e.artifacts["mismatch"] == "out[3] = 1 != 2" and e.fitness is None


def test_two_devices_share_one_queue():
    with Evaluator(problem(), [Behave()], devices=["0", "1"], device_timeout=10.0, seed=1) as ev:
        futs = [ev.submit(g("slow")) for _ in range(6)]
        evals = [f.result(timeout=60) for f in futs]
        assert all(e.ok for e in evals)
        assert {e.metrics["visible"] for e in evals} == {"0", "1"}
        s = ev.stats()
        assert set(s["gpu_busy_fraction"]["per_device"]) == {"0", "1"}
        assert 0 < s["gpu_busy_fraction"]["overall"] <= 1
        assert sum(s["device_jobs"].values()) == 6
        pids = ev.worker_pids()
    assert all(group_alive(p) == [] for p in pids.values() if p)


def test_seeds_are_reproducible_with_a_seed_and_secret_without():
    def seeds(seed):
        with Evaluator(problem(), [Behave()], devices=["0"], seed=seed) as ev:
            return [ev.evaluate(g("ok")).metrics["seed"] for _ in range(2)]

    a, b = seeds(123), seeds(123)
    assert a == b and a[0] != a[1]
    assert seeds(None) != seeds(None)


def test_close_fails_pending_and_stops_workers():
    ev = Evaluator(problem(), [Behave()], devices=["0"], device_timeout=30.0)
    busy = ev.submit(g("hang"))
    queued = ev.submit(g("ok"))
    time.sleep(1.0)
    pid = ev.worker_pids()["0"]
    ev.close()
    for f in (busy, queued):
        with pytest.raises(RuntimeError, match="closed"):
            f.result(timeout=30)
    assert pid is None or group_alive(pid) == []
    with pytest.raises(RuntimeError, match="closed"):
        ev.submit(g("ok"))


def test_no_device_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no CUDA device is visible"):
        Evaluator(problem(), [Behave()], devices=[])


class Unpicklable(Behave):
    def __init__(self):
        self.fn = lambda: None


def test_unpicklable_device_stage_is_a_config_error():
    with pytest.raises(EvaluatorConfigError, match="pickle"):
        Evaluator(problem(), [Unpicklable()], devices=["0"])


def score_from_device_metrics(job, resources):
    """A host stage after a device stage sees the device stage's data."""
    return 2.0 + len(job.data.get("device_note", ""))


class BehaveWithData(Behave):
    name = "behave_data"

    def run(self, job, ctx):
        res = super().run(job, ctx)
        res.data["device_note"] = "abc"
        return res


def test_host_stage_after_device_stage():
    from fitness import HostScore

    with Evaluator(problem(), [BehaveWithData(), HostScore(score_from_device_metrics)], devices=["0"]) as ev:
        e = ev.evaluate(g("ok"))
    assert e.ok and e.fitness == 5.0 and set(e.stage_times) == {"behave_data", "host_score"}


def test_outcome_stage_results_reads_every_kind():
    """WorkerOutcome.stage_results: the one reading of a worker's reply (Evaluator and Ray actors)."""
    from fitness import WorkerOutcome

    ok = StageResult(ok=True, metrics={"m": 1})
    names = ["a", "b", "c"]
    assert WorkerOutcome("ok", results=[("a", ok, 0.1)]).stage_results(names, 5.0) == [("a", ok, 0.1)]

    out = WorkerOutcome("timeout", results=[("a", ok, 0.5)], stderr_tail="late", seconds=3.0)
    (n0, r0, _), (name, res, secs) = out.stage_results(names, 2.5)
    assert (n0, r0) == ("a", ok) and name == "b" and secs == pytest.approx(2.5)
    assert res.status is Status.TIMEOUT and "'b' ran past the device timeout (2.5s)" in res.artifacts["reason"]
    assert res.artifacts["stderr"] == "late" and not res.ok

    for kind in ("fault", "error"):
        [(name, res, _)] = WorkerOutcome(kind, message="boom", traceback="TB").stage_results(names, 1.0)
        assert name == "a" and res.status is Status.RUNTIME_ERROR
        assert res.artifacts == {"reason": "boom", "traceback": "TB"}

    died = WorkerOutcome("died", results=[("a", ok, 0.1), ("b", ok, 0.1)], message="worker exited (code 3)",
                         stderr_tail="segfault\n", seconds=0.1)
    name, res, secs = died.stage_results(names, 1.0)[-1]
    assert name == "c" and secs == 0.0 and res.status is Status.RUNTIME_ERROR
    assert res.artifacts["reason"] == "worker exited (code 3) during stage 'c'; stderr tail:\nsegfault"

    # a failed gate is the answer, whatever happened to the worker afterwards
    gate = StageResult.fail(Status.INCORRECT, "mismatch")
    assert WorkerOutcome("fault", results=[("a", gate, 0.2)]).stage_results(names, 1.0) == [("a", gate, 0.2)]


# --------------------------------------------------------------------------- the worker dies with its parent


class MarkAndHang(Stage):
    """A device stage that writes ``<worker pid>`` into ``directory`` and then hangs."""

    name = "mark_and_hang"
    where = "device"
    needs_gpu = False

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def run(self, job, ctx):
        from pathlib import Path

        Path(self.directory, str(os.getpid())).write_text("busy")
        time.sleep(1000)
        return StageResult(ok=True, fitness=1.0)


_PARENT = """
import sys
from fitness import Job, WorkerProcess
from tests.fitness.test_worker import MarkAndHang, g, problem

w = WorkerProcess("0", start_timeout=60)
w.start()
w.run(1, Job(g("ok"), problem(), {}), [MarkAndHang(sys.argv[1])], {}, 0, 1000.0)
"""


def _proc_state(pid: int) -> str | None:
    """The State letter of /proc/<pid>/status (None when the pid is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    return line.split()[1]
    except OSError:
        return None
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_worker_dies_with_its_parent(tmp_path):
    """The parent (driver / Ray actor stand-in) is SIGKILLed while its worker is busy in a stage."""
    import signal
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path)], cwd=repo,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    worker = None
    try:
        deadline = time.monotonic() + 60
        while worker is None and time.monotonic() < deadline:
            marks = list(tmp_path.iterdir())
            if marks:
                worker = int(marks[0].name)
            elif parent.poll() is not None:
                pytest.fail(f"the parent exited early: {parent.stderr.read().decode()[-2000:]}")
            else:
                time.sleep(0.05)
        assert worker is not None, "the worker never reached its stage"
        assert _proc_state(worker) not in (None, "Z", "X")
        parent.kill()  # SIGKILL: no cleanup code of the parent runs
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _proc_state(worker) not in (None, "Z", "X") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _proc_state(worker) in (None, "Z", "X"), "the worker outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)
        if worker is not None and _proc_state(worker) not in (None, "Z", "X"):
            os.kill(worker, signal.SIGKILL)


# --------------------------------------------------------------------------- what submit hands the device stages


class EchoIncumbents(Stage):
    """A device stage that reports what reached it under ``Job.data[INCUMBENTS]``."""

    name = "echo_incumbents"
    where = "device"
    needs_gpu = False

    def run(self, job, ctx):
        from fitness import INCUMBENTS

        return StageResult(ok=True, fitness=1.0, metrics={"seen": job.data.get(INCUMBENTS)})


def test_incumbents_reach_the_device_stages_in_the_worker() -> None:
    with Evaluator(problem(), [EchoIncumbents()], devices=["0"], seed=3) as ev:
        e = ev.submit(g("ok"), incumbents={"M=1,N=2:float32": 0.25, "M=1,N=4:float32": 3}).result(timeout=60)
        assert e.status is Status.OK and e.metrics["seen"] == {"M=1,N=2:float32": 0.25, "M=1,N=4:float32": 3.0}
        assert ev.submit(g("ok")).result(timeout=60).metrics["seen"] is None  # none given: none there
        for bad in ({"M=1,N=2:float32": -1.0}, {"M=1,N=2:float32": float("nan")}, {3: 1.0}, [("k", 1.0)],
                    {"M=1,N=2:float32": True}):
            with pytest.raises(TypeError, match="incumbents"):
                ev.submit(g("ok"), incumbents=bad)
