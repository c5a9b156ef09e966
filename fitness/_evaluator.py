"""The local executor: host stages on a thread pool, device stages on isolated workers.

An evaluation walks the stages in order and stops at the first failed gate. Runs of
consecutive host stages execute on a thread pool in the driver (the compile stage's
compiler runs in its own subprocess, so ``compile_workers`` compiles proceed in
parallel); runs of device stages go to one shared queue served by one dispatcher
thread and one :class:`~fitness._worker.WorkerProcess` per device, so whichever worker
is free takes the next job.

Everything that can be checked before any GPU work is checked in the constructor: the
Problem (:meth:`Problem.validate`), that the compiler knows the target (a trivial
kernel is compiled), that the reference runs on the smallest check case with numpy,
that the device stages and the Problem pickle, and that a device exists when device
stages do.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import pickle
import queue
import random
import secrets
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evo.types import DeviceInfo, Evaluation, Genome, Problem, ProblemError, Status
from fitness._compile import DEFAULT_COMPILE_TIMEOUT, Compile
from fitness._inputs import materialize
from fitness._resources import Resources
from fitness._stage import Job, Stage, StageContext, StageResult, incumbents_data
from fitness._static import StaticCheck
from fitness._worker import WorkerOutcome, WorkerProcess, visible_devices

__all__ = ["Evaluator", "EvaluatorConfigError", "HostScore", "check_reference", "default_stages"]

log = logging.getLogger(__name__)

DEFAULT_DEVICE_TIMEOUT = 120.0
DEFAULT_INIT_TIMEOUT = 300.0


def check_stages(stages: Sequence[Stage]) -> None:
    """Raise :class:`EvaluatorConfigError` unless every stage is a Stage with a known
    ``where`` and a distinct name (shared by every executor)."""
    names = []
    for s in stages:
        if not isinstance(s, Stage):
            raise EvaluatorConfigError(f"stage {s!r} is not a fitness.Stage instance")
        if s.where not in ("host", "device"):
            raise EvaluatorConfigError(f"stage {s!r} has where={s.where!r}; use 'host' or 'device'")
        names.append(s.name)
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise EvaluatorConfigError(f"stage names repeat ({dup}); give each stage a distinct name")


class EvaluatorConfigError(RuntimeError):
    """The harness is set up wrongly (not a candidate's fault); the message says what to fix."""


class HostScore(Stage):
    """Score a candidate on the CPU: ``fitness = fn(job, resources)``.

    For Problems scored without a GPU (tests, CPU-scorable objectives). ``resources``
    holds what earlier stages found (registers, spills, ...). The stage pickles when
    ``fn`` is a top-level function.

    Args:
        fn: ``fn(job, resources) -> float``; higher is better. A NaN score is a
            RUNTIME_ERROR.
        name: Key for the stage's wall time.
    """

    where = "host"

    def __init__(self, fn: Callable[[Job, Mapping[str, Any]], float], name: str = "host_score") -> None:
        if not callable(fn):
            raise TypeError(f"HostScore needs a callable fn(job, resources) -> float, got {fn!r}")
        self.fn = fn
        self.name = name  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"HostScore({getattr(self.fn, '__qualname__', self.fn)!r})"

    def run(self, job: Job, ctx: StageContext) -> StageResult:
        """Call ``fn`` and put its value in ``StageResult.fitness``."""
        value = float(self.fn(job, dict(job.data.get("resources", {}))))
        if math.isnan(value):
            return StageResult.fail(Status.RUNTIME_ERROR, f"score function {self!r} returned NaN")
        return StageResult(ok=True, fitness=value, metrics={"score": value})


def default_stages() -> list[Stage]:
    """``[StaticCheck(), Compile(), Resources(), Correctness(skip_timed=True), Timing()]``.

    The device stages come from :mod:`fitness._gate` (imported lazily).
    """
    from fitness._gate import Correctness, Timing

    return [StaticCheck(), Compile(), Resources(), Correctness(skip_timed=True), Timing()]


def check_reference(problem: Problem) -> None:
    """Run ``problem.reference`` once on the smallest check case with numpy.

    Raises:
        ProblemError: ``make_inputs`` or ``reference`` raised, or the reference did not
            return a mapping with every ``"out"`` buffer of the signature.
    """
    if problem.reference is None or problem.make_inputs is None:
        return
    cases = problem.check_cases()
    if not cases:
        return
    case = min(cases, key=lambda c: (math.prod(c.shape.values()), c.key))
    rng = np.random.default_rng(0)
    try:
        inputs = materialize(problem.make_inputs(case, rng, np), np)
    except Exception as e:
        raise ProblemError(f"make_inputs failed on {case.key}: {type(e).__name__}: {e}") from e
    stored = {k: (np.asarray(v, dtype=np.float32) if np.asarray(v).dtype.kind == "f" else np.asarray(v))
              for k, v in inputs.items()}
    try:
        out = problem.reference(stored, case, np)
    except Exception as e:
        raise ProblemError(f"reference failed on {case.key}: {type(e).__name__}: {e}") from e
    if not isinstance(out, Mapping):
        raise ProblemError(f"reference returned {type(out).__name__} on {case.key}; it must return a mapping "
                           f"from each 'out' buffer name to its expected array")
    if problem.signature is not None:
        try:
            outs = [a.name for a in problem.signature(case) if a.role == "out"]
        except Exception as e:
            raise ProblemError(f"signature failed on {case.key}: {type(e).__name__}: {e}") from e
        missing = [n for n in outs if n not in out]
        if missing:
            raise ProblemError(f"reference on {case.key} returned {sorted(out)} but not the out buffers {missing}")


@dataclass
class _Pending:
    genome: Genome
    future: concurrent.futures.Future[Evaluation]
    job: Job
    seed: int
    seg: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)
    stage_times: dict[str, float] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)
    fitness: float | None = None
    fitness_stage: str | None = None
    job_id: int = 0


@dataclass
class _DeviceState:
    device: str
    worker: WorkerProcess | None = None
    busy_seconds: float = 0.0
    first_job: float | None = None
    jobs: int = 0
    inflight: bool = False
    thread: threading.Thread | None = None


class Evaluator:
    """Score genomes through the stages; the local executor.

    Args:
        problem: The Problem every genome is scored against.
        stages: Ordered stages; default :func:`default_stages`.
        devices: Device ids for the workers (default: :func:`visible_devices`).
        compile_workers: Host threads (default ``os.cpu_count()``).
        cache_dir: Compile cache directory (default ``$EVO_CACHE_DIR`` or
            ``~/.cache/ptx-kernel-factory/compile``).
        timeout: Seconds per compile.
        device_timeout: Seconds a worker may take for one job's device stages before it is
            killed (TIMEOUT). A worker's first job also gets ``init_timeout`` for device
            start-up and the copy-bandwidth measurement.
        keep_ptx: Also keep the PTX text (``job.data["ptx"]``).
        seed: Derive the secret per-evaluation seeds from this (reproducible tests);
            default: :func:`secrets.randbits`.
        init_timeout: Extra seconds for a worker's first job.
        options: Further options handed to every stage through ``StageContext.options``,
            e.g. the Timing stage's ``timing_batches``, ``min_batch_ms``, ``warmup_ms``,
            ``timing_target_ms`` and ``max_sets`` (they override the stage's own defaults).

    Raises:
        ProblemError: The Problem is not valid, its target does not compile, or its
            reference fails.
        EvaluatorConfigError: Stages are malformed or do not pickle.
        RuntimeError: Device stages are configured but no device is visible.
    """

    def __init__(self, problem: Problem, stages: Sequence[Stage] | None = None, *,
                 devices: Sequence[str | int] | None = None, compile_workers: int | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, timeout: float = DEFAULT_COMPILE_TIMEOUT,
                 device_timeout: float = DEFAULT_DEVICE_TIMEOUT, keep_ptx: bool = False, seed: int | None = None,
                 init_timeout: float = DEFAULT_INIT_TIMEOUT, options: Mapping[str, Any] | None = None) -> None:
        self.problem = problem
        self.stages: list[Stage] = list(default_stages() if stages is None else stages)
        self._check_stages()
        needs_gpu = any(getattr(s, "needs_gpu", False) for s in self.stages)
        problem.validate(needs_gpu_contract=needs_gpu)
        self.options: dict[str, Any] = {"compile_timeout": float(timeout), "device_timeout": float(device_timeout),
                                        "keep_ptx": bool(keep_ptx),
                                        "cache_dir": os.fspath(cache_dir) if cache_dir is not None else None}
        clash = sorted(set(options or {}) & set(self.options))
        if clash:
            raise EvaluatorConfigError(f"options {clash} are set through their own arguments, not options=")
        self.options.update(options or {})
        for s in self.stages:
            check = getattr(s, "check_target", None)
            if callable(check):
                check(problem, self.options)
        check_reference(problem)

        self._segments: list[tuple[str, list[Stage]]] = []
        for s in self.stages:
            if self._segments and self._segments[-1][0] == s.where:
                self._segments[-1][1].append(s)
            else:
                self._segments.append((s.where, [s]))
        has_device = any(w == "device" for w, _ in self._segments)
        if has_device:
            self._check_pickles()
        self.devices = [str(d) for d in (visible_devices() if devices is None else devices)]
        if has_device and not self.devices:
            raise RuntimeError("device stages are configured but no CUDA device is visible (CUDA_VISIBLE_DEVICES is "
                               "empty or nvidia-smi lists no GPU); pass devices=[...], or use host-only stages "
                               "such as HostScore")
        self.device_timeout = float(device_timeout)
        self.init_timeout = float(init_timeout)
        self._seed_rng = random.Random(seed) if seed is not None else None
        self._lock = threading.Lock()
        self._closed = False
        self._pending: set[int] = set()
        self._states: dict[int, _Pending] = {}
        self._next_id = 0
        self._scratch: dict[str, Any] = {}
        self._device_info: DeviceInfo | None = None
        self._counts: Counter[str] = Counter()
        self._n_evals = 0
        self._respawns = 0
        self._respawn_seconds = 0.0
        self._spawn_seconds: list[float] = []
        self._cache_hits = 0
        self._compiles = 0
        self._compile_seconds = 0.0
        self._host_inflight = 0
        self._started = time.time()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=compile_workers or os.cpu_count() or 1,
                                                           thread_name_prefix="evo-host")
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._dev: list[_DeviceState] = []
        if has_device:
            for d in self.devices:
                st = _DeviceState(d)
                st.thread = threading.Thread(target=self._dispatch, args=(st,), name=f"evo-device-{d}", daemon=True)
                self._dev.append(st)
                st.thread.start()

    # -- construction checks ---------------------------------------------------------

    def _check_stages(self) -> None:
        check_stages(self.stages)

    def _check_pickles(self) -> None:
        dev_stages = [s for s in self.stages if s.where == "device"]
        try:
            pickle.dumps(dev_stages)
        except Exception as e:
            raise EvaluatorConfigError(f"device stages must pickle to reach the worker: {e}") from e
        try:
            pickle.dumps(self.problem)
        except Exception as e:
            raise EvaluatorConfigError(f"Problem {self.problem.name!r} does not pickle ({e}); its callables must be "
                                       f"top-level functions (no lambdas or closures)") from e

    # -- submission ---------------------------------------------------------------------

    def submit(self, genome: Genome, *, incumbents: Mapping[str, float] | None = None,
               ) -> concurrent.futures.Future[Evaluation]:
        """Start scoring ``genome``; the future never raises for a candidate's fault.

        Args:
            genome: The candidate.
            incumbents: The best time in ms known for each timed case key (e.g.
                ``"M=32768,N=256:bfloat16"``); the Timing stage stops timing a case whose
                first batches are far slower (racing, ``Timing(race_margin=...)``). The
                engine passes its per-case champions; ``None``: time every batch.

        Raises:
            RuntimeError: The evaluator is closed.
            TypeError: ``genome`` is not a Genome, or ``incumbents`` not a mapping of case
                keys to positive times.
        """
        if not isinstance(genome, Genome):
            raise TypeError(f"submit() needs a Genome, got {type(genome).__name__}")
        data = incumbents_data(incumbents)
        fut: concurrent.futures.Future[Evaluation] = concurrent.futures.Future()
        fut.set_running_or_notify_cancel()
        with self._lock:
            if self._closed:
                raise RuntimeError("Evaluator is closed")
            self._next_id += 1
            jid = self._next_id
            seed = self._seed_rng.getrandbits(63) if self._seed_rng is not None else secrets.randbits(63)
            st = _Pending(genome=genome, future=fut, job=Job(genome, self.problem, data), seed=seed, job_id=jid)
            self._states[jid] = st
        self._advance(st)
        return fut

    def evaluate(self, genome: Genome) -> Evaluation:
        """Score ``genome`` and wait: ``submit(genome).result()``."""
        return self.submit(genome).result()

    def _advance(self, st: _Pending) -> None:
        if st.seg >= len(self._segments):
            self._finish(st, None)
            return
        where, _ = self._segments[st.seg]
        with self._lock:
            closed = self._closed
            if not closed and where == "host":
                self._host_inflight += 1
        if closed:
            self._abandon(st)
            return
        if where == "host":
            try:
                self._pool.submit(self._run_host, st)
            except RuntimeError:  # pool shut down in between
                with self._lock:
                    self._host_inflight -= 1
                self._abandon(st)
        else:
            self._queue.put(st)

    def _abandon(self, st: _Pending) -> None:
        with self._lock:
            self._states.pop(st.job_id, None)
        if not st.future.done():
            st.future.set_exception(RuntimeError("Evaluator closed before this evaluation finished"))

    def _ctx(self, st: _Pending) -> StageContext:
        return StageContext(device=None, seed=st.seed, scratch=self._scratch, options=self.options)

    def _apply(self, st: _Pending, name: str, res: StageResult, seconds: float) -> bool:
        st.stage_times[name] = st.stage_times.get(name, 0.0) + seconds
        st.metrics.update(res.metrics)
        st.resources.update(res.resources)
        st.artifacts.update(res.artifacts)
        st.job.data.update(res.data)
        st.job.data["resources"] = dict(st.resources)
        if res.fitness is not None:
            st.fitness = float(res.fitness)
            st.fitness_stage = name
        if "compile_cache_hit" in res.data:
            with self._lock:
                if res.data["compile_cache_hit"]:
                    self._cache_hits += 1
                else:
                    self._compiles += 1
                    self._compile_seconds += float(res.data.get("compile_seconds", 0.0))
        return res.ok

    def _run_host(self, st: _Pending) -> None:
        try:
            _, stages = self._segments[st.seg]
            for stage in stages:
                t0 = time.perf_counter()
                try:
                    res = stage.run(st.job, self._ctx(st))
                except Exception as e:
                    log.warning("host stage %s raised on genome %s", stage.name, st.genome.id[:12], exc_info=True)
                    res = StageResult.fail(Status.RUNTIME_ERROR, f"stage {stage.name!r} raised "
                                           f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
                if not isinstance(res, StageResult):
                    raise EvaluatorConfigError(f"stage {stage!r} returned {type(res).__name__}, not a StageResult")
                if not self._apply(st, stage.name, res, time.perf_counter() - t0):
                    self._finish(st, res.status or Status.RUNTIME_ERROR)
                    return
            st.seg += 1
            self._advance(st)
        except BaseException as e:  # a harness bug: surface it on the future, never lose the future
            if not st.future.done():
                st.future.set_exception(e)
            with self._lock:
                self._states.pop(st.job_id, None)
        finally:
            with self._lock:
                self._host_inflight -= 1

    # -- device side ----------------------------------------------------------------------

    def _spawn(self, ds: _DeviceState, respawn: bool) -> None:
        w = WorkerProcess(ds.device, start_timeout=self.init_timeout)
        seconds = w.start()
        ds.worker = w
        with self._lock:
            self._spawn_seconds.append(seconds)
            if respawn:
                self._respawns += 1
                self._respawn_seconds += seconds

    def _dispatch(self, ds: _DeviceState) -> None:
        spawn_error: str | None = None
        try:
            self._spawn(ds, respawn=False)
        except Exception as e:
            spawn_error = str(e)
            log.error("device %s: %s", ds.device, e)
        while True:
            st = self._queue.get()
            if st is None:
                break
            if self._closed:
                self._abandon(st)
                continue
            try:
                if ds.worker is None or not ds.worker.alive():
                    try:
                        self._spawn(ds, respawn=spawn_error is None)
                        spawn_error = None
                    except Exception as e:
                        spawn_error = str(e)
                        self._finish_failure(st, Status.RUNTIME_ERROR, f"device worker could not start: {e}")
                        continue
                self._run_device(ds, st)
            except BaseException as e:  # harness bug
                log.exception("device dispatcher %s", ds.device)
                if not st.future.done():
                    st.future.set_exception(e)
        if ds.worker is not None:
            ds.worker.stop()

    def _run_device(self, ds: _DeviceState, st: _Pending) -> None:
        assert ds.worker is not None
        _, stages = self._segments[st.seg]
        needs_init = any(getattr(s, "needs_gpu", False) for s in stages) and not ds.worker.initialised
        timeout = self.device_timeout + (self.init_timeout if needs_init else 0.0)
        t0 = time.time()
        with self._lock:
            if ds.first_job is None:
                ds.first_job = t0
            ds.inflight = True
        try:
            out: WorkerOutcome = ds.worker.run(st.job_id, st.job, stages, self.options, st.seed, timeout)
        finally:
            with self._lock:
                ds.inflight = False
        with self._lock:
            ds.busy_seconds += time.time() - t0
            ds.jobs += 1
        if self._closed:
            self._abandon(st)
            return
        if out.device:
            st.device = dict(out.device)
            with self._lock:
                self._device_info = DeviceInfo.from_dict(out.device)
        # The worker's reply, read as every executor reads it: an unfinished job ends in
        # one failed result for the stage it stopped in (WorkerOutcome.stage_results).
        for name, res, seconds in out.stage_results([s.name for s in stages], timeout):
            if not self._apply(st, name, res, seconds):
                self._finish(st, res.status or Status.RUNTIME_ERROR)
                if out.kind != "ok":
                    self._replace_if_dead(ds)
                return
        st.seg += 1
        self._advance(st)

    def _replace_if_dead(self, ds: _DeviceState) -> None:
        if ds.worker is not None and not ds.worker.alive() and not self._closed:
            ds.worker.stop(grace=0)
            try:
                self._spawn(ds, respawn=True)
            except Exception as e:  # retried at the next job
                log.error("device %s: respawn failed: %s", ds.device, e)
                ds.worker = None

    # -- completion ---------------------------------------------------------------------

    def _finish_failure(self, st: _Pending, status: Status, reason: str) -> None:
        st.artifacts["reason"] = reason
        self._finish(st, status)

    def _finish(self, st: _Pending, status: Status | None) -> None:
        with self._lock:
            self._states.pop(st.job_id, None)
        if st.future.done():
            return
        try:
            if status is None:
                if st.fitness is None:
                    raise EvaluatorConfigError(
                        f"genome {st.genome.id[:12]} passed every stage but no stage set a fitness: the stage list "
                        f"{[s.name for s in self.stages]} needs a scoring stage (Timing, or HostScore for CPU-scored "
                        f"problems)")
                ev = Evaluation(Status.OK, st.fitness, st.metrics, st.resources, st.artifacts, st.stage_times,
                                st.device)
            else:
                ev = Evaluation(status, None, st.metrics, st.resources, st.artifacts, st.stage_times, st.device)
        except Exception as e:
            st.future.set_exception(e if isinstance(e, EvaluatorConfigError) else EvaluatorConfigError(
                f"could not build the Evaluation of genome {st.genome.id[:12]}: {e}"))
            return
        with self._lock:
            self._n_evals += 1
            self._counts[ev.status.value] += 1
        st.future.set_result(ev)

    # -- introspection ------------------------------------------------------------------

    @property
    def device_info(self) -> DeviceInfo | None:
        """The GPU the workers run on; known after the first device evaluation."""
        return self._device_info

    def worker_pids(self) -> dict[str, int | None]:
        """Device id -> current worker process id (``None`` while none runs)."""
        return {ds.device: (ds.worker.pid if ds.worker is not None and ds.worker.alive() else None)
                for ds in self._dev}

    def stats(self) -> dict[str, Any]:
        """Counters and utilisation.

        Keys: ``evaluations``, ``by_status``, ``gpu_busy_fraction`` (``{"overall",
        "per_device"}``: time workers spent on device stages over wall time since each
        device's first job), ``device_jobs``, ``respawns``, ``respawn_seconds``,
        ``spawn_seconds`` (every worker start), ``compile_cache_hits``, ``compiles``
        (compiler subprocesses run), ``compile_seconds``, ``host_inflight``,
        ``device_queue``, ``pending``, ``workers``.
        """
        now = time.time()
        with self._lock:
            per: dict[str, float] = {}
            busy = 0.0
            span = 0.0
            for ds in self._dev:
                if ds.first_job is None:
                    continue
                wall = max(now - ds.first_job, 1e-9)
                per[ds.device] = min(1.0, ds.busy_seconds / wall)
                busy += ds.busy_seconds
                span += wall
            return {
                "evaluations": self._n_evals,
                "by_status": dict(self._counts),
                "gpu_busy_fraction": {"overall": min(1.0, busy / span) if span else 0.0, "per_device": per},
                "device_jobs": {ds.device: ds.jobs for ds in self._dev},
                "respawns": self._respawns,
                "respawn_seconds": self._respawn_seconds,
                "spawn_seconds": list(self._spawn_seconds),
                "compile_cache_hits": self._cache_hits,
                "compiles": self._compiles,
                "compile_seconds": self._compile_seconds,
                "host_inflight": self._host_inflight,
                "device_queue": self._queue.qsize(),
                "pending": len(self._states),
                "workers": {ds.device: (ds.worker.pid if ds.worker is not None else None) for ds in self._dev},
            }

    # -- shutdown -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the workers and the thread pool; unfinished evaluations fail with RuntimeError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        for _ in self._dev:
            self._queue.put(None)
        for ds in self._dev:
            if ds.worker is not None and ds.inflight:
                # A job in flight would otherwise hold close() for up to device_timeout.
                ds.worker.kill()
        for ds in self._dev:
            if ds.thread is not None:
                ds.thread.join(timeout=60)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self._abandon(item)
        with self._lock:
            leftovers = list(self._states.values())
            self._states.clear()
        for st in leftovers:
            if not st.future.done():
                st.future.set_exception(RuntimeError("Evaluator closed before this evaluation finished"))

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # best effort: never leave worker processes behind
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"Evaluator({self.problem.name!r}, stages={[s.name for s in self.stages]}, devices={self.devices})"
