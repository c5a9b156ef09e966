"""Evaluation on a Ray cluster: host stages as CPU tasks, device stages on GPU actors.

The :class:`RayExecutor` has the interface of :class:`fitness.Evaluator` (``submit``,
``evaluate``, ``stats``, ``close``, ``device_info``) so the engine can use either one.

How a candidate travels
-----------------------
1. The driver (the engine's process, the only writer of the archive) queues it.
2. A Ray task (``num_cpus=1``) runs the host stages (static check, compile, resources,
   ...) on any node's CPU. It returns a small summary and, as a second object, the
   products later stages need (the cubin). The products stay in the object store of the
   node that made them; the driver only passes their reference on.
3. If the host stages passed and the stage list has device stages, the candidate goes
   to a GPU actor (``num_gpus=num_gpus_per_actor``). Each actor owns one isolated
   fitness worker process (:class:`fitness._worker` style: a hang is killed after the
   device timeout, a sticky CUDA error costs that worker, which is respawned); the actor
   and the run go on.
4. The results come back to the driver, which assembles the :class:`~evo.types.Evaluation`
   and resolves the candidate's future.

Failures of the infrastructure (a Ray worker killed, a node lost, an actor died) are
detected from the Ray exception; the candidate is re-queued from its host phase (the
compile cache makes that cheap) up to ``max_retries`` times, then resolved as a
RUNTIME_ERROR that says what happened. Every future resolves exactly once: results of
attempts that were given up are dropped by ticket bookkeeping, never reported.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import math
import os
import pickle
import random
import secrets
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evo.types import DeviceInfo, Evaluation, Genome, Problem, Status
from fitness._compile import DEFAULT_COMPILE_TIMEOUT
from fitness._evaluator import (
    DEFAULT_DEVICE_TIMEOUT,
    DEFAULT_INIT_TIMEOUT,
    EvaluatorConfigError,
    check_stages,
    default_stages,
)
from fitness._stage import Job, Stage, StageContext, StageResult, incumbents_data
from fitness.ray._loopback import init_local_ray

__all__ = ["RayExecutor", "RayExecutorError", "run_host_stages", "run_preflight"]

log = logging.getLogger(__name__)

_DISPATCH_POLL_S = 0.05
_RESOURCE_REFRESH_S = 5.0


class RayExecutorError(RuntimeError):
    """The Ray executor cannot run (no Ray, no GPU in the cluster, a Problem the workers cannot load)."""


# --------------------------------------------------------------------------- stage chains


@dataclass
class _StageOutcome:
    """What one stage did, in a form that travels between processes."""

    name: str
    result: StageResult
    seconds: float


def _run_chain(stages: Sequence[Stage], job: Job, ctx: StageContext) -> tuple[list[_StageOutcome], bool]:
    """Run ``stages`` in order on ``job`` as the local Evaluator does; stop at the first failed gate.

    A stage that raises is a RUNTIME_ERROR with its traceback; after every stage
    ``job.data["resources"]`` holds the resources found so far (what ``HostScore`` reads).

    Returns:
        The outcomes and whether a gate failed.
    """
    outcomes: list[_StageOutcome] = []
    resources: dict[str, Any] = dict(job.data.get("resources", {}))
    for stage in stages:
        t0 = time.perf_counter()
        try:
            res = stage.run(job, ctx)
        except Exception as exc:  # a harness fault; the candidate's record says what happened
            log.warning("host stage %s raised on genome %s", stage.name, job.genome.id[:12], exc_info=True)
            res = StageResult.fail(Status.RUNTIME_ERROR, f"stage {stage.name!r} raised {type(exc).__name__}: {exc}",
                                   traceback=traceback.format_exc())
        if not isinstance(res, StageResult):
            res = StageResult.fail(Status.RUNTIME_ERROR,
                                   f"harness error: stage {stage!r} returned {type(res).__name__}, not a StageResult")
        outcomes.append(_StageOutcome(stage.name, res, time.perf_counter() - t0))
        job.data.update(res.data)
        resources.update(res.resources)
        job.data["resources"] = dict(resources)
        if not res.ok:
            return outcomes, True
    return outcomes, False


def _assemble(genome: Genome, outcomes: Sequence[_StageOutcome], device: Mapping[str, Any] | None,
              stage_names: Sequence[str]) -> Evaluation:
    """Merge stage outcomes into one Evaluation (later stages overwrite earlier keys).

    Raises:
        EvaluatorConfigError: Every stage passed but none set a fitness (a harness bug,
            raised on the future as the local Evaluator does).
    """
    metrics: dict[str, Any] = {}
    resources: dict[str, Any] = {}
    artifacts: dict[str, Any] = {}
    times: dict[str, float] = {}
    fitness: float | None = None
    status: Status | None = None
    for out in outcomes:
        r = out.result
        times[out.name] = times.get(out.name, 0.0) + out.seconds
        metrics.update(r.metrics)
        resources.update(r.resources)
        artifacts.update(r.artifacts)
        if r.fitness is not None:
            fitness = float(r.fitness)
        if not r.ok:
            status = r.status or Status.RUNTIME_ERROR
            break
    if status is not None:
        return Evaluation(status, None, metrics, resources, artifacts, times, dict(device or {}))
    if fitness is None:
        raise EvaluatorConfigError(
            f"genome {genome.id[:12]} passed every stage but no stage set a fitness: the stage list "
            f"{list(stage_names)} needs a scoring stage (Timing, or HostScore for CPU-scored problems)")
    return Evaluation(Status.OK, fitness, metrics, resources, artifacts, times, dict(device or {}))


def run_host_stages(problem: Problem, stages: Sequence[Stage], genome: Genome, options: Mapping[str, Any],
                    seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the host stages of one candidate (the body of the Ray CPU task).

    Args:
        problem: The Problem.
        stages: The host stages, in order.
        genome: The candidate.
        options: Evaluator options passed to the stages through :attr:`StageContext.options`.
        seed: The evaluation's secret seed.

    Returns:
        ``(summary, data)``: ``summary`` holds ``outcomes`` (list of stage outcomes),
        ``failed`` (a gate failed) and ``pid``/``node`` of the process that ran it;
        ``data`` is the job data later stages need (``"cubin"``, ``"resources"``, ...).
    """
    job = Job(genome=genome, problem=problem, data={})
    ctx = StageContext(device=None, seed=seed, scratch=_PROCESS_SCRATCH, options=dict(options))
    outcomes, failed = _run_chain(stages, job, ctx)
    summary = {"outcomes": outcomes, "failed": failed, "pid": os.getpid(), "node": _node_name()}
    return summary, ({} if failed else job.data)


def run_preflight(problem: Problem, stages: Sequence[Stage], options: Mapping[str, Any]) -> dict[str, Any]:
    """The local Evaluator's start-up checks, run where the compiler is (a Ray task).

    Compiles a trivial kernel for the Problem's target (each stage's ``check_target``)
    and runs the reference once with numpy.

    Raises:
        ProblemError: The target does not compile or the reference fails.
    """
    from fitness._evaluator import check_reference

    for stage in stages:
        check = getattr(stage, "check_target", None)
        if callable(check):
            check(problem, dict(options))
    check_reference(problem)
    return {"pid": os.getpid(), "node": _node_name()}


_PROCESS_SCRATCH: dict[str, Any] = {}


def _node_name() -> str:
    try:
        return os.uname().nodename
    except AttributeError:  # pragma: no cover - non-POSIX
        return "?"


# --------------------------------------------------------------------------- the GPU actor


class _DeviceActor:
    """Body of the Ray actor that owns one GPU and one isolated fitness worker process.

    The worker (:class:`fitness._worker.WorkerProcess`) runs the device stages in a
    separate process with ``CUDA_VISIBLE_DEVICES`` pinned to the GPU Ray gave this actor;
    a hang is killed after the device timeout (TIMEOUT) and a sticky CUDA error costs
    the worker (RUNTIME_ERROR); a fresh worker takes the next job. The actor survives both.
    Outcomes are read exactly as the local Evaluator reads them
    (:meth:`fitness.WorkerOutcome.stage_results`).
    """

    def __init__(self, problem: Problem, stages: Sequence[Stage], options: Mapping[str, Any],
                 device_timeout: float, init_timeout: float) -> None:
        self.problem = problem
        self.stages = list(stages)
        self.options = dict(options)
        self.device_timeout = float(device_timeout)
        self.init_timeout = float(init_timeout)
        self.needs_gpu = any(getattr(s, "needs_gpu", False) for s in self.stages)
        self.busy_seconds = 0.0
        self.respawns = 0
        self.respawn_seconds = 0.0
        self.job_ids = itertools.count(1)
        gpu_ids = _ray_gpu_ids()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self.device = str(gpu_ids[0]) if gpu_ids else (visible.split(",")[0] if visible else "0")
        self.worker: Any = None
        self._spawn(respawn=False)

    def _spawn(self, respawn: bool) -> None:
        from fitness._worker import WorkerProcess

        if self.worker is not None:
            self.worker.stop(grace=0)
        self.worker = None
        w = WorkerProcess(self.device, start_timeout=self.init_timeout)
        seconds = w.start()
        self.worker = w
        if respawn:
            self.respawns += 1
            self.respawn_seconds += seconds

    def ready(self) -> dict[str, Any]:
        """Where the actor runs (answered once it is placed and its worker is up)."""
        return {"pid": os.getpid(), "node": _node_name(), "device": self.device,
                "worker_pid": self.worker.pid if self.worker is not None else None}

    def run(self, genome: Genome, data: dict[str, Any], seed: int,
            given: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run the device stages of one candidate in the isolated worker.

        ``data`` is what the host stages produced; ``given`` what the submitter handed
        over (:func:`fitness._stage.incumbents_data`), merged into the job's data.
        """
        t0 = time.perf_counter()
        outcomes: list[_StageOutcome] = []
        device: dict[str, Any] = {}
        if self.worker is None or not self.worker.alive():
            try:
                self._spawn(respawn=True)
            except Exception as exc:  # noqa: BLE001 - reported on this candidate, retried at the next
                outcomes.append(_StageOutcome(self.stages[0].name, StageResult.fail(
                    Status.RUNTIME_ERROR, f"device worker could not start: {exc}"), 0.0))
                return self._reply(outcomes, device, t0)
        needs_init = self.needs_gpu and not self.worker.initialised
        timeout = self.device_timeout + (self.init_timeout if needs_init else 0.0)
        job = Job(genome=genome, problem=self.problem, data={**data, **(given or {})})
        out = self.worker.run(next(self.job_ids), job, self.stages, self.options, seed, timeout)
        device = dict(out.device or {})
        outcomes = [_StageOutcome(name, res, secs)
                    for name, res, secs in out.stage_results([s.name for s in self.stages], timeout)]
        if not self.worker.alive():
            try:  # replace it now, so the next candidate does not wait for the start-up
                self._spawn(respawn=True)
            except Exception as exc:  # noqa: BLE001 - retried at the next job
                log.error("device %s: respawn failed: %s", self.device, exc)
                self.worker = None
        return self._reply(outcomes, device, t0)

    def _reply(self, outcomes: list[_StageOutcome], device: dict[str, Any], t0: float) -> dict[str, Any]:
        dt = time.perf_counter() - t0
        self.busy_seconds += dt
        return {"outcomes": outcomes, "device": device, "busy_seconds": dt, "pid": os.getpid(),
                "node": _node_name(), "respawns": self.respawns, "respawn_seconds": self.respawn_seconds,
                "worker_pid": self.worker.pid if self.worker is not None else None}

    def shutdown(self) -> bool:
        """Stop the worker process (called before the actor is killed)."""
        if self.worker is not None:
            self.worker.stop(grace=2.0)
            self.worker = None
        return True


def _ray_gpu_ids() -> list[Any]:
    try:
        import ray

        return list(ray.get_gpu_ids())
    except Exception:  # noqa: BLE001 - outside Ray (unit use of the actor body)
        return []


# --------------------------------------------------------------------------- driver side


@dataclass
class _Ticket:
    """One submit(): a genome, its future and its attempts."""

    id: int
    genome: Genome
    future: concurrent.futures.Future[Evaluation]
    seed: int
    given: dict[str, Any] = field(default_factory=dict)  # submit()'s job data (incumbents)
    attempts: int = 0
    host_outcomes: list[_StageOutcome] = field(default_factory=list)
    data_ref: Any = None
    errors: list[str] = field(default_factory=list)


@dataclass
class _ActorSlot:
    """A GPU actor and what it is doing."""

    index: int
    handle: Any
    ready_ref: Any = None
    live: bool = False
    inflight: dict[Any, int] = field(default_factory=dict)  # ref -> ticket id
    info: dict[str, Any] = field(default_factory=dict)
    busy_seconds: float = 0.0
    respawns: int = 0
    respawn_seconds: float = 0.0
    first_job: float | None = None


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - ray is in the dev extra
        raise RayExecutorError("the Ray executor needs Ray: pip install 'ptx-kernel-factory[ray]'") from exc
    return ray


def _retryable_errors(ray: Any) -> tuple[type[BaseException], ...]:
    names = ("WorkerCrashedError", "RayActorError", "NodeDiedError", "LocalRayletDiedError", "ObjectLostError",
             "ObjectFetchTimedOutError", "OutOfMemoryError", "RaySystemError", "ObjectStoreFullError",
             "ActorUnavailableError", "OwnerDiedError", "ObjectReconstructionFailedError")
    return tuple(getattr(ray.exceptions, n) for n in names if hasattr(ray.exceptions, n))


def _check_stages(stages: Sequence[Stage]) -> None:
    """The local Evaluator's stage checks, plus: host stages come before device stages."""
    check_stages(stages)
    kinds = [s.where for s in stages]
    if "device" in kinds and "host" in kinds[kinds.index("device"):]:
        raise EvaluatorConfigError(f"the Ray executor runs host stages before device stages; reorder "
                                   f"{[(s.name, s.where) for s in stages]} or use the local Evaluator")


def _check_pickles(problem: Problem, device_stages: Sequence[Stage]) -> None:
    """Device stages and the Problem travel to the worker process by plain pickle."""
    try:
        pickle.dumps(list(device_stages))
    except Exception as e:
        raise EvaluatorConfigError(f"device stages must pickle to reach the worker: {e}") from e
    try:
        pickle.dumps(problem)
    except Exception as e:
        raise EvaluatorConfigError(f"Problem {problem.name!r} does not pickle ({e}); its callables must be "
                                   "top-level functions (no lambdas or closures)") from e


class RayExecutor:
    """Evaluate candidates on a Ray cluster; the interface of :class:`fitness.Evaluator`.

    Host stages run as Ray tasks on CPU workers (``num_cpus=1``); device stages run on
    Ray actors that each own ``num_gpus_per_actor`` GPUs and one isolated fitness worker
    process. A Problem without device stages runs entirely as CPU tasks. Results come
    back to the driver, which alone writes the archive.

    Args:
        problem: The Problem. It travels to the workers by pickling, so its callables must
            be importable there (install the module on every node or pass
            ``runtime_env={"working_dir": ...}``).
        stages: The stage list (default: static check, compile, resources, correctness,
            timing). Host stages must come before device stages.
        address: Ray cluster address (``"auto"``, ``"HEAD:6379"``, ``"ray://..."``). ``None``
            uses Ray if this process already initialised it, else the cluster in
            ``RAY_ADDRESS`` if set, else (like ``"local"``) starts a private single-node Ray
            that listens on 127.0.0.1 only, without the dashboard
            (:func:`fitness.ray.init_local_ray`).
        num_gpus_per_actor: GPUs each device actor reserves (1: one actor per GPU).
        num_actors: Device actors to start (default: every GPU of the cluster divided by
            ``num_gpus_per_actor``, re-read while running so joining nodes are used).
        compile_concurrency: Host tasks in flight at once (default: the cluster's CPUs).
        max_retries: How often a candidate is re-queued after an infrastructure failure
            (killed worker, lost node, dead actor) before it is resolved as RUNTIME_ERROR.
        cache_dir: Compile cache directory on each node (default: the stages' default).
        timeout: Compile timeout in seconds (passed to the stages as ``compile_timeout``).
        device_timeout: Seconds a device evaluation may take before its worker is killed.
        init_timeout: Extra seconds for a worker's first device job (device start-up and
            the copy-bandwidth measurement), as in the local Evaluator.
        keep_ptx: Also keep PTX text from compiles.
        seed: Derive the per-evaluation secret seeds from this, exactly as the local
            Evaluator does (same seed, same submission order: same seeds);
            default: fresh random seeds.
        preflight: Run the local Evaluator's start-up checks (the target compiles, the
            reference runs) as one Ray task before accepting candidates.
        options: Extra options for the stages (:attr:`StageContext.options`).
        runtime_env: Ray runtime environment for ``ray.init`` (when this executor starts Ray).
        init_kwargs: Further ``ray.init`` keyword arguments (``num_cpus``, ``num_gpus``, ...).

    Raises:
        RayExecutorError: Ray missing, or device stages and no GPU in the cluster.
        evo.types.ProblemError: The Problem is not valid, its target does not compile
            or its reference fails.
        fitness.EvaluatorConfigError: Stages are malformed or do not pickle.
    """

    def __init__(self, problem: Problem, stages: Sequence[Stage] | None = None, *, address: str | None = None,
                 num_gpus_per_actor: float = 1, num_actors: int | None = None,
                 compile_concurrency: int | None = None, max_retries: int = 3, cache_dir: str | None = None,
                 timeout: float = DEFAULT_COMPILE_TIMEOUT, device_timeout: float = DEFAULT_DEVICE_TIMEOUT,
                 init_timeout: float = DEFAULT_INIT_TIMEOUT, keep_ptx: bool = False, seed: int | None = None,
                 preflight: bool = True, options: Mapping[str, Any] | None = None,
                 runtime_env: Mapping[str, Any] | None = None, init_kwargs: Mapping[str, Any] | None = None) -> None:
        self.problem = problem
        self.stages: list[Stage] = list(default_stages() if stages is None else stages)
        _check_stages(self.stages)
        self.host_stages = [s for s in self.stages if s.where == "host"]
        self.device_stages = [s for s in self.stages if s.where == "device"]
        problem.validate(needs_gpu_contract=any(getattr(s, "needs_gpu", False) for s in self.stages))
        if self.device_stages:
            _check_pickles(problem, self.device_stages)
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if num_gpus_per_actor <= 0:
            raise ValueError(f"num_gpus_per_actor must be > 0, got {num_gpus_per_actor}")
        self.max_retries = int(max_retries)
        self.num_gpus_per_actor = num_gpus_per_actor
        self._num_actors_fixed = num_actors
        self._concurrency_fixed = compile_concurrency
        self.device_timeout = float(device_timeout)
        self.init_timeout = float(init_timeout)
        opts: dict[str, Any] = {"compile_timeout": float(timeout), "device_timeout": float(device_timeout),
                                "keep_ptx": bool(keep_ptx),
                                "cache_dir": os.fspath(cache_dir) if cache_dir is not None else None}
        opts.update(options or {})
        self.options = opts
        self._seed_rng = random.Random(seed) if seed is not None else None

        ray = self._ray = _import_ray()
        self._retryable = _retryable_errors(ray)
        self._owns_ray = False
        if not ray.is_initialized():
            kw = dict(init_kwargs or {})
            if runtime_env is not None:
                kw["runtime_env"] = dict(runtime_env)
            kw.setdefault("log_to_driver", True)
            if address == "local" or (address is None and not os.environ.get("RAY_ADDRESS")):
                # A private single-node cluster: on 127.0.0.1 only, no dashboard.
                init_local_ray(**kw)
            else:
                ray.init(address=address, **kw)
            self._owns_ray = True
        elif address is not None:
            log.info("Ray is already initialised; address=%r is ignored", address)

        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._tickets: dict[int, _Ticket] = {}
        self._host_queue: deque[int] = deque()
        self._device_queue: deque[int] = deque()
        self._host_inflight: dict[Any, int] = {}  # summary ref -> ticket id
        self._actors: list[_ActorSlot] = []
        self._actor_index = itertools.count()
        self._counts: Counter[str] = Counter()
        self._by_status: Counter[str] = Counter()
        self._device_info: DeviceInfo | None = None
        self._busy_retired = 0.0
        self._span_retired = 0.0
        self._respawns_retired = 0
        self._respawn_seconds_retired = 0.0
        self._fatal: BaseException | None = None
        self._closed = False
        self._resources: dict[str, float] = {}
        self._resources_at = 0.0
        self._started = time.time()

        self._problem_ref = ray.put(problem)
        self._host_stages_ref = ray.put(self.host_stages)
        self._host_fn = ray.remote(run_host_stages).options(num_cpus=1, num_returns=2, max_retries=0)
        self._actor_cls = ray.remote(_DeviceActor) if self.device_stages else None
        self._refresh_resources(force=True)
        if preflight:
            try:
                ray.get(ray.remote(run_preflight).options(num_cpus=1, max_retries=2).remote(
                    self._problem_ref, self.host_stages, self.options))
            except Exception:
                self._shutdown_ray()
                raise
        if self.device_stages and self._target_actors() == 0:
            self._shutdown_ray()
            raise RayExecutorError(
                f"the stages include device stages ({', '.join(s.name for s in self.device_stages)}) but the Ray "
                f"cluster has no GPU (resources: {self._resources}); start nodes with GPUs "
                "(`ray start --num-gpus N`) or use CPU-only stages")
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ray-executor-dispatch", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- public API

    def submit(self, genome: Genome, *, incumbents: Mapping[str, float] | None = None,
               ) -> concurrent.futures.Future[Evaluation]:
        """Queue ``genome`` for evaluation; the future resolves exactly once.

        Candidate faults become failed Evaluations; only faults of the harness (Problem
        not loadable on the workers, every actor gone for good) set an exception.
        ``incumbents``: the best known time in ms per timed case key, for the Timing
        stage's racing (as :meth:`fitness.Evaluator.submit`).
        """
        if not isinstance(genome, Genome):
            raise TypeError(f"submit() takes a Genome, got {type(genome).__name__}")
        given = incumbents_data(incumbents)
        fut: concurrent.futures.Future[Evaluation] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("RayExecutor is closed")
            if self._fatal is not None:
                fut.set_exception(self._fatal)
                return fut
            tid = next(self._ids)
            seed = self._seed_rng.getrandbits(63) if self._seed_rng is not None else secrets.randbits(63)
            self._tickets[tid] = _Ticket(tid, genome, fut, seed, given)
            self._host_queue.append(tid)
            self._counts["submitted"] += 1
        self._wake.set()
        return fut

    def evaluate(self, genome: Genome) -> Evaluation:
        """Evaluate one genome and wait for the result."""
        return self.submit(genome).result()

    @property
    def device_info(self) -> DeviceInfo | None:
        """The GPU of the first device evaluation (``None`` before one or for CPU-only stages)."""
        return self._device_info

    def stats(self) -> dict[str, Any]:
        """Counters and utilisation, with the local Evaluator's keys where they apply.

        Keys: ``evaluations``, ``by_status``, ``gpu_busy_fraction`` (``{"overall",
        "per_device"}``: actor busy time over wall time since its first job, keyed
        ``"node:device"``), ``respawns`` and ``respawn_seconds`` (worker processes
        replaced inside actors), ``retries`` (candidates re-queued after an infrastructure
        failure), ``lost`` (resolved as RUNTIME_ERROR after ``max_retries``),
        ``actor_failures``, ``actors``, ``actors_live``, ``host_tasks``, ``device_jobs``,
        queue lengths (``host_queue``, ``device_queue``, ``host_inflight``,
        ``device_inflight``), ``pending`` and ``cluster_resources``.
        """
        with self._lock:
            now = time.time()
            per: dict[str, float] = {}
            busy = self._busy_retired
            span = self._span_retired
            for a in self._actors:
                busy += a.busy_seconds
                if a.first_job is not None:
                    wall = max(now - a.first_job, 1e-9)
                    span += wall
                    per[f"{a.info.get('node', '?')}:{a.info.get('device', '?')}"] = min(1.0, a.busy_seconds / wall)
            return {
                "executor": "ray",
                "evaluations": sum(self._by_status.values()),
                "submitted": self._counts["submitted"],
                "by_status": dict(self._by_status),
                "gpu_busy_fraction": {"overall": min(1.0, busy / span) if span else 0.0, "per_device": per},
                "gpu_busy_seconds": busy,
                "respawns": self._respawns_retired + sum(a.respawns for a in self._actors),
                "respawn_seconds": self._respawn_seconds_retired + sum(a.respawn_seconds for a in self._actors),
                "retries": self._counts["retries"],
                "lost": self._counts["lost"],
                "actor_failures": self._counts["actor_failures"],
                "actors": len(self._actors),
                "actors_live": sum(1 for a in self._actors if a.live),
                "host_tasks": self._counts["host_tasks"],
                "device_jobs": self._counts["device_jobs"],
                "host_queue": len(self._host_queue),
                "device_queue": len(self._device_queue),
                "host_inflight": len(self._host_inflight),
                "device_inflight": sum(len(a.inflight) for a in self._actors),
                "pending": len(self._tickets),
                "cluster_resources": dict(self._resources),
                "uptime_seconds": now - self._started,
            }

    def close(self) -> None:
        """Stop dispatching, cancel what is still pending, stop the actors (and Ray if this executor started it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        self._thread.join(timeout=30)
        with self._lock:
            tickets = list(self._tickets.values())
            self._tickets.clear()
        for t in tickets:
            if not t.future.done():
                t.future.cancel()
        for ref in list(self._host_inflight):
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - best effort
                pass
        self._stop_actors()
        self._shutdown_ray()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- resources and actors

    def _refresh_resources(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._resources_at > _RESOURCE_REFRESH_S:
            try:
                self._resources = {k: float(v) for k, v in self._ray.cluster_resources().items()
                                   if k in ("CPU", "GPU", "memory")}
            except Exception as exc:  # noqa: BLE001 - keep the last known figures
                log.warning("could not read Ray cluster resources: %s", exc)
            self._resources_at = now

    def _host_limit(self) -> int:
        if self._concurrency_fixed is not None:
            return max(1, int(self._concurrency_fixed))
        return max(1, int(self._resources.get("CPU", 1)))

    def _target_actors(self) -> int:
        if not self.device_stages:
            return 0
        if self._num_actors_fixed is not None:
            return int(self._num_actors_fixed)
        return int(math.floor(self._resources.get("GPU", 0.0) / self.num_gpus_per_actor + 1e-9))

    def _start_actor(self) -> None:
        assert self._actor_cls is not None
        handle = self._actor_cls.options(num_gpus=self.num_gpus_per_actor, num_cpus=0, max_restarts=0,
                                         max_task_retries=0).remote(self._problem_ref, self.device_stages,
                                                                    self.options, self.device_timeout,
                                                                    self.init_timeout)
        slot = _ActorSlot(next(self._actor_index), handle)
        slot.ready_ref = handle.ready.remote()
        self._actors.append(slot)

    def _retire_actor(self, slot: _ActorSlot, reason: str) -> list[int]:
        """Drop a failed actor; return the tickets it had in flight."""
        self._actors.remove(slot)
        self._busy_retired += slot.busy_seconds
        if slot.first_job is not None:
            self._span_retired += max(time.time() - slot.first_job, 1e-9)
        self._respawns_retired += slot.respawns
        self._respawn_seconds_retired += slot.respawn_seconds
        self._counts["actor_failures"] += 1
        try:
            self._ray.kill(slot.handle, no_restart=True)
        except Exception:  # noqa: BLE001 - it is gone already
            pass
        log.warning("Ray device actor %d (%s) failed: %s", slot.index, slot.info or "not started", reason)
        return list(slot.inflight.values())

    def _stop_actors(self) -> None:
        actors, self._actors = self._actors, []
        refs = []
        for a in actors:
            try:
                refs.append(a.handle.shutdown.remote())
            except Exception:  # noqa: BLE001
                pass
        if refs:
            try:
                self._ray.wait(refs, num_returns=len(refs), timeout=10)
            except Exception:  # noqa: BLE001
                pass
        for a in actors:
            try:
                self._ray.kill(a.handle, no_restart=True)
            except Exception:  # noqa: BLE001
                pass

    def _shutdown_ray(self) -> None:
        if self._owns_ray:
            self._owns_ray = False
            try:
                self._ray.shutdown()
            except Exception:  # noqa: BLE001
                pass

    # ----------------------------------------------------------------- the dispatch loop

    def _loop(self) -> None:
        try:
            while not self._closed:
                self._dispatch()
                refs = self._watched_refs()
                if not refs:
                    self._wake.wait(_DISPATCH_POLL_S * 4)
                    self._wake.clear()
                    continue
                ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=_DISPATCH_POLL_S, fetch_local=False)
                for ref in ready:
                    self._handle(ref)
        except Exception as exc:  # a bug here must not leave futures hanging
            log.exception("Ray executor dispatch loop failed")
            self._fail_all(RayExecutorError(f"the Ray executor's dispatch loop failed: {exc!r}"))

    def _watched_refs(self) -> list[Any]:
        with self._lock:
            refs = list(self._host_inflight)
            for a in self._actors:
                if not a.live and a.ready_ref is not None:
                    refs.append(a.ready_ref)
                refs.extend(a.inflight)
            return refs

    def _dispatch(self) -> None:
        self._refresh_resources()
        with self._lock:
            # host tasks, bounded by the CPU budget
            while self._host_queue and len(self._host_inflight) < self._host_limit():
                tid = self._host_queue.popleft()
                t = self._tickets.get(tid)
                if t is None:
                    continue
                t.attempts += 1
                summary_ref, data_ref = self._host_fn.remote(self._problem_ref, self._host_stages_ref, t.genome,
                                                             self.options, t.seed)
                t.data_ref = data_ref
                self._host_inflight[summary_ref] = tid
                self._counts["host_tasks"] += 1
            # actors: keep as many as the cluster's GPUs allow
            if self.device_stages:
                while len(self._actors) < self._target_actors():
                    self._start_actor()
                # device jobs: two per live actor so the GPU never waits for the next one
                for slot in sorted((a for a in self._actors if a.live), key=lambda a: len(a.inflight)):
                    while self._device_queue and len(slot.inflight) < 2:
                        tid = self._device_queue.popleft()
                        t = self._tickets.get(tid)
                        if t is None:
                            continue
                        ref = slot.handle.run.remote(t.genome, t.data_ref, t.seed, t.given)
                        slot.inflight[ref] = tid
                        self._counts["device_jobs"] += 1
                        if slot.first_job is None:
                            slot.first_job = time.time()

    def _handle(self, ref: Any) -> None:
        with self._lock:
            if ref in self._host_inflight:
                tid = self._host_inflight.pop(ref)
                self._on_host_done(ref, tid)
                return
            for slot in list(self._actors):
                if ref is slot.ready_ref or ref == slot.ready_ref:
                    self._on_actor_ready(slot)
                    return
                if ref in slot.inflight:
                    tid = slot.inflight.pop(ref)
                    self._on_device_done(slot, ref, tid)
                    return

    def _on_host_done(self, ref: Any, tid: int) -> None:
        t = self._tickets.get(tid)
        try:
            summary = self._ray.get(ref)
        except self._retryable as exc:
            self._requeue(tid, f"host task lost: {type(exc).__name__}: {_short(exc)}")
            return
        except Exception as exc:  # noqa: BLE001 - the task could not run at all (Problem not loadable, ...)
            self._fail(tid, RayExecutorError(
                f"a Ray host task could not run ({type(exc).__name__}): {_short(exc)}. If the Problem's module is "
                "missing on a node, install it there or pass runtime_env={'working_dir': ...}"))
            return
        if t is None:  # resolved already (closed); drop it
            return
        outcomes = summary["outcomes"]
        if summary["failed"] or not self.device_stages:
            t.data_ref = None
            self._finish(tid, outcomes, None)
            return
        t.host_outcomes = outcomes
        self._device_queue.append(tid)

    def _on_actor_ready(self, slot: _ActorSlot) -> None:
        try:
            slot.info = self._ray.get(slot.ready_ref)
        except Exception as exc:  # noqa: BLE001 - the actor could not start
            tids = self._retire_actor(slot, f"could not start: {type(exc).__name__}: {_short(exc)}")
            for tid in tids:
                self._requeue(tid, "device actor failed to start")
            if self._counts["actor_failures"] > 3 * max(self._target_actors(), 1) + 3 and not any(
                    a.live for a in self._actors):
                err = RayExecutorError(f"Ray device actors keep failing to start; last error: {_short(exc)}")
                self._fatal = err
                for tid in list(self._device_queue):
                    self._fail(tid, err)
                self._device_queue.clear()
            return
        slot.live = True
        slot.ready_ref = None
        log.info("Ray device actor %d ready: %s", slot.index, slot.info)

    def _on_device_done(self, slot: _ActorSlot, ref: Any, tid: int) -> None:
        try:
            reply = self._ray.get(ref)
        except self._retryable as exc:
            tids = [tid] + self._retire_actor(slot, f"{type(exc).__name__}: {_short(exc)}")
            for x in tids:
                self._requeue(x, f"device actor lost: {type(exc).__name__}: {_short(exc)}")
            return
        except Exception as exc:  # noqa: BLE001 - a bug in the actor body
            self._fail(tid, RayExecutorError(f"a Ray device actor raised {type(exc).__name__}: {_short(exc)}"))
            return
        slot.busy_seconds += float(reply.get("busy_seconds", 0.0))
        slot.respawns = int(reply.get("respawns", slot.respawns))
        slot.respawn_seconds = float(reply.get("respawn_seconds", slot.respawn_seconds))
        t = self._tickets.get(tid)
        if t is None:
            return
        device = reply.get("device") or {}
        if device:
            self._device_info = DeviceInfo.from_dict(device)
        self._finish(tid, list(t.host_outcomes) + list(reply["outcomes"]), device)

    # ----------------------------------------------------------------- bookkeeping (lock held)

    def _requeue(self, tid: int, why: str) -> None:
        t = self._tickets.get(tid)
        if t is None:
            return
        t.errors.append(why)
        t.data_ref = None
        t.host_outcomes = []
        if t.attempts > self.max_retries:
            self._counts["lost"] += 1
            self._resolve(tid, Evaluation.failure(
                Status.RUNTIME_ERROR,
                f"evaluation lost {t.attempts} times to infrastructure failures (max_retries={self.max_retries}): "
                + "; ".join(t.errors)))
            return
        self._counts["retries"] += 1
        log.info("re-queueing candidate %s (attempt %d): %s", t.genome.id[:12], t.attempts + 1, why)
        self._host_queue.appendleft(tid)

    def _finish(self, tid: int, outcomes: Sequence[_StageOutcome], device: Mapping[str, Any] | None) -> None:
        t = self._tickets.get(tid)
        if t is None:
            return
        try:
            ev = _assemble(t.genome, outcomes, device, [s.name for s in self.stages])
        except Exception as exc:  # noqa: BLE001 - EvaluatorConfigError: a harness bug, on the future
            self._fail(tid, exc)
            return
        self._resolve(tid, ev)

    def _resolve(self, tid: int, evaluation: Evaluation) -> None:
        t = self._tickets.pop(tid, None)
        if t is None or t.future.done():
            return
        self._by_status[evaluation.status.value] += 1
        t.future.set_result(evaluation)

    def _fail(self, tid: int, exc: BaseException) -> None:
        t = self._tickets.pop(tid, None)
        if t is None or t.future.done():
            return
        t.future.set_exception(exc)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            self._fatal = exc
            for tid in list(self._tickets):
                self._fail(tid, exc)


def _short(exc: BaseException, limit: int = 500) -> str:
    text = str(exc).strip().splitlines()
    msg = text[-1] if text else repr(exc)
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."
