"""The Ray executor on a real local Ray cluster (head + 2 worker nodes on this host).

The cluster is started once per module (Ray takes ~10 s to start on 2 cores). Every node
and the driver use 127.0.0.1 only (see :mod:`fitness.ray._loopback`). One worker
node declares two (fake) GPUs so the device-actor path runs without a GPU: its device
stages have ``needs_gpu=False`` and run in the real fitness worker process.

Faults are real: Ray worker processes and actor processes are SIGKILLed mid-evaluation,
and the tests check that no candidate is lost, none is reported twice and the results
equal those of the local ``fitness.Evaluator``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evo.types import Evaluation, Genome, Status
from fitness._stage import Job, Stage, StageContext, StageResult
from fitness.ray import LOOPBACK, loopback_ray
from tests.evo import cpu_problem

REPO = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------- stages (picklable)


class PidStage(Stage):
    """A host stage that records which process ran it (file ``<pid>-<genome id>``) and waits a bit."""

    name = "pid"
    where = "host"

    def __init__(self, directory: str, delay: float = 0.6) -> None:
        self.directory = directory
        self.delay = delay

    def run(self, job: Job, ctx: StageContext) -> StageResult:
        Path(self.directory, f"{os.getpid()}-{job.genome.id}").write_text(str(time.time()))
        time.sleep(self.delay)
        return StageResult(ok=True)


class FakeCompile(Stage):
    """A host stage that hands later stages a product, like Compile's cubin."""

    name = "fake_compile"
    where = "host"

    def run(self, job: Job, ctx: StageContext) -> StageResult:
        return StageResult(ok=True, resources={"registers": 8}, data={"cubin": f"cubin:{job.genome.id}".encode()})


class DeviceScore(Stage):
    """A device stage without GPU use: checks the cubin arrived, records its process, scores the params.

    ``params["MODE"]``: ``"ok"``, ``"slow"`` (sleeps ``delay``), ``"hang"`` (sleeps 1000 s)
    or ``"bad"`` (INCORRECT).
    """

    name = "device_score"
    where = "device"
    needs_gpu = False

    def __init__(self, directory: str, delay: float = 0.8) -> None:
        self.directory = directory
        self.delay = delay

    def run(self, job: Job, ctx: StageContext) -> StageResult:
        mode = job.genome.params.get("MODE", "ok")
        Path(self.directory, f"{os.getppid()}-{os.getpid()}-{job.genome.id}").write_text(mode)
        if job.data.get("cubin") != f"cubin:{job.genome.id}".encode():
            return StageResult.fail(Status.RUNTIME_ERROR, "cubin did not reach the device stage")
        if mode == "hang":
            time.sleep(1000)
        if mode == "slow":
            time.sleep(self.delay)
        if mode == "bad":
            return StageResult.fail(Status.INCORRECT, "wrong on purpose")
        x = int(job.genome.params["X"])
        return StageResult(ok=True, fitness=float(x * x), metrics={"x": x, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                                                   "incumbents": job.data.get("incumbents")})


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    old = os.environ.get("PYTHONPATH")
    # Ray workers must import this test package (the stages above, tests.evo.cpu_problem).
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([old] if old else []))
    if ray.is_initialized():
        ray.shutdown()
    # All three nodes run on this host, on 127.0.0.1 only: test traffic must stay on loopback.
    with loopback_ray():
        c = Cluster(initialize_head=True, connect=False,
                    head_node_args={"num_cpus": 1, "include_dashboard": False, "node_ip_address": LOOPBACK})
        try:
            c.add_node(num_cpus=1, node_ip_address=LOOPBACK)
            c.add_node(num_cpus=1, num_gpus=2, node_ip_address=LOOPBACK)
            c.wait_for_nodes()
            ray.init(address=c.address, log_to_driver=False, _node_ip_address=LOOPBACK)
            yield c
        finally:
            ray.shutdown()
            c.shutdown()
            if old is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = old


def _off_loopback_sockets(root: int | None = None) -> list[str]:
    """TCP sockets of ``root`` (default: this process) and its descendants not on 127.0.0.0/8.

    A listening socket must be bound to a loopback address (not to the host's address
    nor to 0.0.0.0 / ::), a connected one must have both ends on loopback.
    """
    import psutil

    from fitness.ray import is_loopback

    me = psutil.Process(root if root is not None else os.getpid())
    bad = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            conns = (proc.net_connections if hasattr(proc, "net_connections") else proc.connections)(kind="tcp")
            name = proc.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for c in conns:
            ends = [c.laddr] + ([c.raddr] if c.raddr else [])
            if not all(is_loopback(e.ip) for e in ends):
                bad.append(f"{name}[{proc.pid}] {c.status} {c.laddr} -> {c.raddr or '-'}")
    return bad


def _cpu_genomes() -> list[Genome]:
    params = [(1, 1, 128), (2, 1, 256), (4, 2, 128), (8, 2, 512), (2, 4, 64), (1, 4, 320)]
    out = [cpu_problem.seed_genome(UNROLL=u, VEC=v, THREADS=t) for u, v, t in params]
    out.append(cpu_problem.seed_genome().with_source("extern \"C\" __global__ void axpy(float* p) { oops }"))
    return out


def _collect(futures: list[Any], timeout: float) -> tuple[list[Evaluation], Counter[int]]:
    """Wait for every future; count how often each one's done-callback fires."""
    fired: Counter[int] = Counter()
    lock = threading.Lock()
    for i, f in enumerate(futures):
        def cb(_f: Any, i: int = i) -> None:
            with lock:
                fired[i] += 1
        f.add_done_callback(cb)
    results = [f.result(timeout=timeout) for f in futures]
    time.sleep(0.2)  # a second resolution (there must be none) would raise in the executor's thread
    return results, fired


def _wait_for_files(directory: Path, n: int, timeout: float) -> list[Path]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        files = sorted(directory.iterdir(), key=lambda p: p.stat().st_mtime)
        if len(files) >= n:
            return files
        time.sleep(0.05)
    raise AssertionError(f"no {n} files appeared in {directory} within {timeout}s")


# --------------------------------------------------------------------------- tests without a cluster


def test_run_host_stages_in_process(tmp_path: Path) -> None:
    from fitness.ray import run_host_stages

    problem = cpu_problem.make_problem()
    g = Genome("x", {"UNROLL": 1, "VEC": 1, "THREADS": 128, "X": 3}, entry="axpy")
    summary, data = run_host_stages(problem, [PidStage(str(tmp_path), 0.0), FakeCompile()], g, {}, 7)
    assert not summary["failed"]
    assert [o.name for o in summary["outcomes"]] == ["pid", "fake_compile"]
    assert data["cubin"] == f"cubin:{g.id}".encode()
    assert Path(tmp_path, f"{os.getpid()}-{g.id}").exists()


def test_make_executor_rejects_bad_options() -> None:
    from fitness.ray import make_executor

    problem = cpu_problem.make_problem()
    with pytest.raises(ValueError, match="unknown executor 'dask'"):
        make_executor("dask", problem)
    with pytest.raises(ValueError, match="option 'ray_address' is for the 'ray' executor"):
        make_executor("local", problem, ray_address="auto")
    with pytest.raises(ValueError, match="both address"):
        make_executor("ray", problem, address="a:1", ray_address="b:2")


def test_importing_fitness_ray_does_not_import_ray() -> None:
    import subprocess
    import sys

    code = "import sys, fitness.ray; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


def test_is_loopback() -> None:
    from fitness.ray import is_loopback

    assert all(is_loopback(a) for a in ("127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1", "localhost"))
    assert not any(is_loopback(a) for a in ("0.0.0.0", "::", "192.0.2.2", "10.0.0.1", "::ffff:192.0.2.2", "example"))


_LOCAL_RAY = """
import json
from fitness import HostScore
from fitness.ray import RayExecutor, node_addresses
from tests.evo import cpu_problem
from tests.fitness.test_ray_executor import _off_loopback_sockets

ex = RayExecutor(cpu_problem.make_problem(), [HostScore(cpu_problem.score_fn)], preflight=False,
                 init_kwargs={"num_cpus": 1, "log_to_driver": False})
try:
    r = ex.evaluate(cpu_problem.seed_genome())
    print(json.dumps({"status": r.status.value, "nodes": node_addresses(), "off_loopback": _off_loopback_sockets()}))
finally:
    ex.close()
"""


def test_executor_starts_its_own_ray_on_loopback_only() -> None:
    """RayExecutor(address=None) without a Ray: a private cluster on 127.0.0.1, no other address used."""
    pytest.importorskip("ray")
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    out = subprocess.run([sys.executable, "-c", _LOCAL_RAY], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rep = json.loads(out.stdout.strip().splitlines()[-1])
    assert rep["status"] == "ok"
    assert rep["nodes"] == [LOOPBACK]
    assert rep["off_loopback"] == []


# --------------------------------------------------------------------------- on the cluster


def test_cluster_and_driver_keep_to_loopback(cluster: Any) -> None:
    """Every node registered on 127.0.0.1; no Ray process listens on or talks to another address."""
    from fitness.ray import node_addresses

    assert node_addresses() == [LOOPBACK] * 3
    assert _off_loopback_sockets() == []


def test_cpu_problem_same_results_as_local_with_killed_worker(cluster: Any, tmp_path: Path) -> None:
    """Real nvcc compiles as Ray tasks; one Ray worker is SIGKILLed mid-task."""
    from fitness import Compile, HostScore, Resources, StaticCheck
    from fitness.ray import RayExecutor

    problem = cpu_problem.make_problem()
    genomes = _cpu_genomes()
    with cpu_problem.make_evaluator(problem, cache_dir=tmp_path / "cache") as local:
        expected = [local.evaluate(g) for g in genomes]
    assert Counter(e.status for e in expected) == {Status.OK: 6, Status.COMPILE_ERROR: 1}

    pids = tmp_path / "pids"
    pids.mkdir()
    stages = [StaticCheck(), Compile(), Resources(), PidStage(str(pids), 1.0), HostScore(cpu_problem.score_fn)]
    ex = RayExecutor(problem, stages, cache_dir=str(tmp_path / "cache"), max_retries=3)
    try:
        futures = [ex.submit(g) for g in genomes]
        victim = _wait_for_files(pids, 1, 60)[0]
        pid, gid = victim.name.split("-")
        os.kill(int(pid), signal.SIGKILL)
        results, fired = _collect(futures, timeout=120)
        stats = ex.stats()
    finally:
        ex.close()

    assert all(fired[i] == 1 for i in range(len(genomes))), fired
    assert [r.status for r in results] == [e.status for e in expected]
    assert [r.fitness for r in results] == [e.fitness for e in expected]
    assert [r.resources.get("registers") for r in results] == [e.resources.get("registers") for e in expected]
    assert stats["retries"] >= 1 and stats["lost"] == 0
    assert stats["evaluations"] == len(genomes) and stats["pending"] == 0
    # the killed candidate really ran again, in another process
    runs = [p.name.split("-") for p in pids.iterdir()]
    assert sum(1 for _, g in runs if g == gid) >= 2
    assert any(p != pid for p, g in runs if g == gid)


def _device_genomes() -> list[Genome]:
    return [Genome("dev", {"X": x, "MODE": m}, entry="k") for x, m in
            [(1, "slow"), (2, "slow"), (3, "ok"), (4, "bad"), (5, "slow"), (6, "ok"), (7, "slow"), (8, "ok")]]


def _device_problem() -> Any:
    from evo.space import Choice, ParamSpace
    from evo.types import Problem

    space = ParamSpace({"X": Choice(tuple(range(1, 20))), "MODE": Choice(("ok", "slow", "hang", "bad"))})
    return Problem(name="ray_device", params=space, check_shapes=({"N": 4},), objective="geomean_speed")


def test_device_actors_survive_a_killed_actor(cluster: Any, tmp_path: Path) -> None:
    """Device stages run in the fitness worker inside GPU actors; an actor is SIGKILLed mid-job."""
    from fitness.ray import RayExecutor

    marks = tmp_path / "marks"
    marks.mkdir()
    ex = RayExecutor(_device_problem(), [FakeCompile(), DeviceScore(str(marks))], max_retries=3,
                     device_timeout=30)
    genomes = _device_genomes()
    try:
        futures = [ex.submit(g) for g in genomes]
        first = _wait_for_files(marks, 1, 90)[0]
        actor_pid = int(first.name.split("-")[0])
        os.kill(actor_pid, signal.SIGKILL)
        results, fired = _collect(futures, timeout=150)
        stats = ex.stats()
    finally:
        ex.close()

    assert all(fired[i] == 1 for i in range(len(genomes))), fired
    for g, r in zip(genomes, results, strict=True):
        if g.params["MODE"] == "bad":
            assert r.status is Status.INCORRECT and "wrong on purpose" in r.reason
        else:
            assert r.status is Status.OK, r.reason
            assert r.fitness == float(g.params["X"]) ** 2
            assert r.metrics["cvd"] in ("0", "1")  # pinned to the one GPU Ray gave the actor
            assert set(r.stage_times) == {"fake_compile", "device_score"}
    assert stats["actor_failures"] >= 1 and stats["retries"] >= 1 and stats["lost"] == 0
    assert stats["evaluations"] == len(genomes)
    actors = {int(p.name.split("-")[0]) for p in marks.iterdir()}
    assert len(actors) >= 2  # the work went on in another actor


def test_device_hang_costs_the_worker_not_the_actor(cluster: Any, tmp_path: Path) -> None:
    from fitness.ray import RayExecutor

    marks = tmp_path / "marks"
    marks.mkdir()
    ex = RayExecutor(_device_problem(), [FakeCompile(), DeviceScore(str(marks))], num_actors=1, device_timeout=3)
    try:
        hang = ex.submit(Genome("dev", {"X": 2, "MODE": "hang"}, entry="k"))
        # the second job is submitted once the hang runs: submitted together, its host stage may
        # finish first under load, and then it would run on the worker before the hang
        _wait_for_files(marks, 1, 90)
        after = ex.submit(Genome("dev", {"X": 3, "MODE": "ok"}, entry="k"), incumbents={"N=8:float32": 0.5})
        r1, r2 = hang.result(timeout=90), after.result(timeout=90)
        stats = ex.stats()
        off = _off_loopback_sockets()  # with an actor and its fitness worker alive
    finally:
        ex.close()
    assert r1.status is Status.TIMEOUT
    assert r2.status is Status.OK and r2.fitness == 9.0
    assert r2.metrics["incumbents"] == {"N=8:float32": 0.5}  # what submit was handed reached the device stage
    assert stats["actor_failures"] == 0 and stats["respawns"] >= 1
    assert off == []
    recs = [p.name.split("-") for p in marks.iterdir()]
    assert len({a for a, _, _ in recs}) == 1  # one actor throughout
    assert len({w for _, w, _ in recs}) == 2  # its worker was replaced after the hang


def test_make_executor_ray_and_give_up_after_max_retries(cluster: Any, tmp_path: Path) -> None:
    """With max_retries=0 a killed task resolves as RUNTIME_ERROR that says why; nothing hangs."""
    from fitness.ray import RayExecutor, make_executor

    problem = _device_problem()
    pids = tmp_path / "pids"
    pids.mkdir()
    ex = make_executor("ray", problem, [PidStage(str(pids), 3.0), FakeCompile(), DeviceScore(str(tmp_path))],
                       ray_address=None, max_retries=0)
    try:
        assert isinstance(ex, RayExecutor)
        fut = ex.submit(Genome("dev", {"X": 4, "MODE": "ok"}, entry="k"))
        victim = _wait_for_files(pids, 1, 60)[0]
        os.kill(int(victim.name.split("-")[0]), signal.SIGKILL)
        r = fut.result(timeout=60)
        ok = ex.evaluate(Genome("dev", {"X": 5, "MODE": "ok"}, entry="k"))
        stats = ex.stats()
    finally:
        ex.close()
    assert r.status is Status.RUNTIME_ERROR
    assert "lost 1 times to infrastructure failures" in r.reason and "WorkerCrashedError" in r.reason
    assert ok.status is Status.OK and ok.fitness == 25.0
    assert stats["lost"] == 1


def test_engine_with_ray_executor_matches_local(cluster: Any, tmp_path: Path) -> None:
    engine_mod = pytest.importorskip("evo.engine")
    archive_mod = pytest.importorskip("archive")
    if not hasattr(archive_mod, "Archive"):
        pytest.skip("archive.Archive not available yet")
    from fitness.ray import make_executor

    problem = cpu_problem.make_problem()
    runs = {}
    for kind in ("local", "ray"):
        ex = (cpu_problem.make_evaluator(problem, cache_dir=tmp_path / "cache") if kind == "local" else
              make_executor("ray", problem, _cpu_stages(), cache_dir=str(tmp_path / "cache")))
        arch = archive_mod.Archive(problem, str(tmp_path / f"{kind}.lmdb"))
        try:
            # one candidate in flight: the same seed gives the same proposals in the same order
            # whichever executor scores them
            eng = engine_mod.Engine(problem, arch, evaluator=ex, seed=3, config=engine_mod.EngineConfig(in_flight=1))
            eng.run(engine_mod.Budget(evaluations=6), progress=False)
            runs[kind] = [(r.id, r.operator, r.parents, r.status.value, r.fitness) for r in arch.records()]
        finally:
            arch.close()
            ex.close()
    assert runs["local"] == runs["ray"]
    assert len(runs["ray"]) >= 6


def _cpu_stages() -> list[Stage]:
    from fitness import Compile, HostScore, Resources, StaticCheck

    return [StaticCheck(), Compile(), Resources(), HostScore(cpu_problem.score_fn)]
