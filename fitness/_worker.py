"""Isolated device workers: one subprocess per GPU, replaced after any CUDA fault.

Parent side: :class:`WorkerProcess` starts ``python -m fitness._worker`` in its own
session with ``CUDA_VISIBLE_DEVICES`` set to one device, talks to it over its stdin and
stdout with length-prefixed pickle messages (8-byte big-endian length, then the
pickle), and sends its stderr to a temporary file whose tail explains a death.

Protocol::

    worker -> parent  ("ready", pid)                                   once, after start-up
    parent -> worker  ("run", job_id, genome dict, Problem, job data, [device stages], options, seed)
    worker -> parent  ("result", job_id, [(stage name, StageResult, seconds)], device dict | None, problem)
                      problem is None, ("fault", message, traceback) or ("error", stage, message, traceback)

The worker runs the stages in order, stopping at the first failed gate, and calls
``fitness._device.init_device(scratch)`` once before the first stage with
``needs_gpu=True``. A :class:`~fitness.CudaFault`, or any exception whose class comes
from ``cupy``, ``cupy_backends`` or ``cuda``, poisons the CUDA context: the worker
reports it and exits. Any other exception is reported and the worker is kept.

The parent classifies by what the worker *reported*, never by its exit code: a fault
or an error report is RUNTIME_ERROR; end of stream without a report is RUNTIME_ERROR
with the stderr tail; no reply within the timeout kills the worker's process group
(SIGKILL) and is TIMEOUT.

The worker's real stdout is private to the protocol: at start-up file descriptor 1 is
pointed at stderr, so anything a library prints cannot corrupt the message stream.

The worker dies with its parent: on Linux it asks the kernel for SIGKILL when the thread
that started it exits (``PR_SET_PDEATHSIG``), so a killed driver or Ray actor never
leaves an orphan worker holding the GPU, even while a stage runs or hangs. Start workers
from a long-lived thread (the Evaluator's dispatcher threads, an actor's method
thread): the signal follows the creating *thread*, not only the process.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

__all__ = ["WorkerOutcome", "WorkerProcess", "is_cuda_fault", "set_parent_death_signal", "visible_devices"]

_HEADER = struct.Struct(">Q")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PARENT_ENV = "EVO_WORKER_PARENT_PID"
_MAX_MESSAGE = 1 << 34
_CUDA_MODULES = {"cupy", "cupy_backends", "cuda"}


class WorkerDied(RuntimeError):
    """The worker's stream ended without a reply."""


class WorkerTimeout(RuntimeError):
    """No reply before the deadline."""


def is_cuda_fault(exc: BaseException) -> bool:
    """Whether ``exc`` means the CUDA context is poisoned (CudaFault or a cupy/cuda error)."""
    from fitness._stage import CudaFault

    if isinstance(exc, CudaFault):
        return True
    return any(getattr(k, "__module__", "").split(".")[0] in _CUDA_MODULES for k in type(exc).__mro__)


def visible_devices() -> list[str]:
    """Device ids the CUDA runtime would see, found without importing CuPy.

    ``CUDA_VISIBLE_DEVICES`` when set (its entries, which may be indices or UUIDs; an
    empty value or ``-1`` means none), else one index per GPU that ``nvidia-smi -L``
    lists, else none.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        out = []
        for part in env.split(","):
            part = part.strip()
            if not part or part.startswith("-"):
                break  # the runtime ignores everything from the first invalid entry on
            out.append(part)
        return out
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    if r.returncode != 0:
        return []
    n = sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))
    return [str(i) for i in range(n)]


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent (thread) exits.

    Linux only (``prctl(PR_SET_PDEATHSIG)`` through ctypes); elsewhere, or if libc or
    the call is unavailable, it does nothing.

    Returns:
        Whether the signal is armed.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# --------------------------------------------------------------------------- framing


def _write_msg(f: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_HEADER.pack(len(data)) + data)
    f.flush()


def _read_exact_blocking(f: BinaryIO, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _read_msg_blocking(f: BinaryIO) -> Any:
    head = _read_exact_blocking(f, _HEADER.size)
    if head is None:
        return None
    (n,) = _HEADER.unpack(head)
    body = _read_exact_blocking(f, n)
    if body is None:
        return None
    return pickle.loads(body)


def _read_exact_deadline(fd: int, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WorkerTimeout()
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            raise WorkerTimeout()
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise WorkerDied()
        buf += chunk
    return bytes(buf)


# --------------------------------------------------------------------------- parent side


@dataclass
class WorkerOutcome:
    """What one job on a worker came to.

    Attributes:
        kind: ``"ok"`` (all stages reported; some may have failed their gate), ``"fault"``
            (CUDA fault; the worker is gone), ``"error"`` (a stage raised; worker kept),
            ``"died"`` (no report) or ``"timeout"`` (killed).
        results: ``(stage name, StageResult, seconds)`` for every stage that finished.
        device: The worker's DeviceInfo dict, if it initialised the device.
        message: Failure message.
        traceback: Failure traceback (fault and error).
        stage: The stage that raised (error).
        stderr_tail: The worker's stderr tail (died, fault, timeout).
        seconds: Wall time of the request.
    """

    kind: str
    results: list[tuple[str, Any, float]] = field(default_factory=list)
    device: dict[str, Any] | None = None
    message: str = ""
    traceback: str = ""
    stage: str = ""
    stderr_tail: str = ""
    seconds: float = 0.0

    def stage_results(self, stage_names: Sequence[str], timeout: float) -> list[tuple[str, Any, float]]:
        """The job's per-stage results, with the failure of an unfinished job made a stage result.

        This is how every executor reads a worker's reply (the local
        :class:`~fitness.Evaluator` and the Ray device actors alike). The results of the
        stages that finished come first, as reported. If the job did not complete
        (``kind`` is not ``"ok"``) and no reported stage failed its gate, one failed
        :class:`~fitness.StageResult` is appended for the first stage that did not
        finish, carrying the wall time not accounted for by the finished stages:

        * ``"timeout"``: TIMEOUT, reason names the stage and the timeout, artifact ``stderr``;
        * ``"fault"``, ``"error"``: RUNTIME_ERROR with the worker's message, artifact ``traceback``;
        * ``"died"``: RUNTIME_ERROR with the message and the stderr tail, artifact ``stderr``.

        Args:
            stage_names: Names of the stages sent with the job, in order.
            timeout: The reply timeout the job ran under (quoted in the TIMEOUT reason).

        Returns:
            ``(stage name, StageResult, seconds)`` in stage order; apply them in order and
            stop at the first one that is not ``ok``.
        """
        from evo.types import Status
        from fitness._stage import StageResult

        results = list(self.results)
        if self.kind == "ok" or any(not res.ok for _, res, _ in results):
            return results
        done = {name for name, _, _ in results}
        unfinished = next((n for n in stage_names if n not in done), "device")
        left = max(0.0, self.seconds - sum(secs for _, _, secs in results))
        if self.kind == "timeout":
            fail = StageResult.fail(Status.TIMEOUT, f"device stage {unfinished!r} ran past the device timeout "
                                    f"({timeout:g}s); the worker was killed", stderr=self.stderr_tail)
        elif self.kind in ("fault", "error"):
            fail = StageResult.fail(Status.RUNTIME_ERROR, self.message, traceback=self.traceback)
        else:
            tail = self.stderr_tail.strip()[-1500:]
            fail = StageResult.fail(Status.RUNTIME_ERROR, f"{self.message} during stage {unfinished!r}"
                                    + (f"; stderr tail:\n{tail}" if tail else ""), stderr=self.stderr_tail)
        results.append((unfinished, fail, left))
        return results


class WorkerProcess:
    """One device worker subprocess (see the module docstring).

    The child dies with the thread that called :meth:`start` (``PR_SET_PDEATHSIG`` on
    Linux), so call it from a thread that lives as long as the worker should.

    Args:
        device: The device id put in the child's ``CUDA_VISIBLE_DEVICES``.
        start_timeout: Seconds to wait for the child's ``ready`` message.
    """

    def __init__(self, device: str, *, start_timeout: float = 120.0) -> None:
        self.device = str(device)
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self.initialised = False
        self.started_at = 0.0

    @property
    def pid(self) -> int | None:
        """The worker's process id (``None`` when not running)."""
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        """Whether the worker process is running."""
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> float:
        """Start the child and wait for ``ready``; return the seconds it took.

        Raises:
            RuntimeError: The child did not start (the message holds its stderr tail).
        """
        self.kill()
        t0 = time.perf_counter()
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = self.device
        env["PYTHONUNBUFFERED"] = "1"
        env[_PARENT_ENV] = str(os.getpid())
        paths = [p or os.getcwd() for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if os.path.isdir(p)))
        self._stderr = tempfile.TemporaryFile(prefix="evo-worker-", suffix=".stderr")
        self.proc = subprocess.Popen([sys.executable, "-m", "fitness._worker"], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, start_new_session=True)
        self.initialised = False
        try:
            msg = self._recv(time.monotonic() + self.start_timeout)
        except (WorkerDied, WorkerTimeout) as e:
            tail = self.stderr_tail()
            self.kill()
            raise RuntimeError(f"device worker for device {self.device} did not start "
                               f"({type(e).__name__}); stderr tail:\n{tail}") from None
        if not (isinstance(msg, tuple) and msg and msg[0] == "ready"):
            self.kill()
            raise RuntimeError(f"device worker for device {self.device} sent {msg!r} instead of 'ready'")
        self.started_at = time.time()
        return time.perf_counter() - t0

    def _recv(self, deadline: float) -> Any:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        (n,) = _HEADER.unpack(_read_exact_deadline(fd, _HEADER.size, deadline))
        if n > _MAX_MESSAGE:
            raise WorkerDied()
        return pickle.loads(_read_exact_deadline(fd, n, deadline))

    def stderr_tail(self, limit: int = 4000) -> str:
        """The last ``limit`` characters the worker wrote to stderr."""
        if self._stderr is None:
            return ""
        try:
            self._stderr.flush()
            size = os.fstat(self._stderr.fileno()).st_size
            self._stderr.seek(max(0, size - limit))
            return self._stderr.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def run(self, job_id: int, job: Any, stages: Sequence[Any], options: Any, seed: int,
            timeout: float) -> WorkerOutcome:
        """Send one job and wait up to ``timeout`` seconds for its report.

        On timeout the worker's process group is killed (and reaped) before returning;
        after a fault, a death or a timeout :meth:`alive` is ``False``.
        """
        if not self.alive():
            raise RuntimeError("worker is not running: call start() first")
        assert self.proc is not None and self.proc.stdin is not None
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout
        try:
            # The genome travels as its plain dict: Genome keeps its params in a mappingproxy, which does not pickle.
            _write_msg(self.proc.stdin, ("run", job_id, job.genome.to_dict(), job.problem, job.data, list(stages),
                                         dict(options), seed))
            msg = self._recv(deadline)
        except WorkerTimeout:
            self.kill()
            return WorkerOutcome("timeout", message=f"no reply within {timeout:g}s; worker killed",
                                 stderr_tail=self.stderr_tail(), seconds=time.perf_counter() - t0)
        except (WorkerDied, BrokenPipeError, EOFError, pickle.UnpicklingError, OSError):
            return self._died(t0)
        if not (isinstance(msg, tuple) and len(msg) == 5 and msg[0] == "result" and msg[1] == job_id):
            self.kill()
            return WorkerOutcome("died", message=f"worker sent an unexpected message {str(msg)[:200]}",
                                 stderr_tail=self.stderr_tail(), seconds=time.perf_counter() - t0)
        _, _, results, device, problem = msg
        if device is not None:
            self.initialised = True
        dt = time.perf_counter() - t0
        if problem is None:
            return WorkerOutcome("ok", results=results, device=device, seconds=dt)
        if problem[0] == "fault":
            # The worker exits by itself; make sure it is gone before the next job.
            self._reap(grace=5.0)
            return WorkerOutcome("fault", results=results, device=device, message=problem[1], traceback=problem[2],
                                 stderr_tail=self.stderr_tail(), seconds=dt)
        return WorkerOutcome("error", results=results, device=device, stage=problem[1], message=problem[2],
                             traceback=problem[3], seconds=dt)

    def _died(self, t0: float) -> WorkerOutcome:
        rc = self._reap(grace=5.0)
        return WorkerOutcome("died", message=f"worker exited (code {rc}) without a report",
                             stderr_tail=self.stderr_tail(), seconds=time.perf_counter() - t0)

    def _reap(self, grace: float) -> int | None:
        """Wait up to ``grace`` seconds for the child to exit, then kill its group."""
        if self.proc is None:
            return None
        try:
            rc = self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            rc = None
        self.kill()
        return rc if rc is not None else (self.proc.returncode if self.proc else None)

    def kill(self) -> None:
        """SIGKILL the worker's process group and reap it."""
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            proc.wait(timeout=30)
        for f in (proc.stdin, proc.stdout):
            with contextlib.suppress(Exception):
                if f is not None:
                    f.close()

    def stop(self, grace: float = 5.0) -> None:
        """Ask the worker to exit (close its stdin), then kill its group after ``grace``."""
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(Exception):
            if proc.stdin is not None:
                proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
        self.kill()
        if self._stderr is not None:
            with contextlib.suppress(Exception):
                self._stderr.close()
            self._stderr = None


# --------------------------------------------------------------------------- worker side


def _serve() -> int:
    """The worker's main loop (runs in the child)."""
    from evo.types import Genome
    from fitness._stage import Job, StageContext

    # Die with the parent. The parent may already be gone (killed between our fork and
    # this call): then we were re-parented and must not start.
    set_parent_death_signal(signal.SIGKILL)
    expected = os.environ.pop(_PARENT_ENV, "")
    if expected.isdigit() and os.getppid() != int(expected):
        return 75
    chan_out = os.fdopen(os.dup(1), "wb")
    chan_in = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)  # stray prints go to stderr, never into the protocol stream
    sys.stdout = sys.stderr
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)

    _write_msg(chan_out, ("ready", os.getpid()))
    scratch: dict[str, Any] = {}
    device: Any = None
    while True:
        msg = _read_msg_blocking(chan_in)
        if msg is None or msg[0] == "stop":
            return 0
        _, job_id, genome, problem_obj, data, stages, options, seed = msg
        job = Job(Genome.from_dict(genome), problem_obj, data)
        results: list[tuple[str, Any, float]] = []
        problem: tuple[Any, ...] | None = None
        current = ""
        fatal = False
        try:
            for stage in stages:
                current = stage.name
                if getattr(stage, "needs_gpu", False) and device is None:
                    from fitness._device import init_device

                    device = init_device(scratch)
                ctx = StageContext(device=device, seed=seed, scratch=scratch, options=options)
                t0 = time.perf_counter()
                res = stage.run(job, ctx)
                results.append((stage.name, res, time.perf_counter() - t0))
                job.data.update(res.data)
                if not res.ok:
                    break
        except Exception as e:
            tb = traceback.format_exc()
            text = f"{type(e).__module__}.{type(e).__qualname__}: {e}"
            if is_cuda_fault(e):
                problem = ("fault", f"CUDA fault in stage {current!r}: {text}", tb)
                fatal = True
            else:
                problem = ("error", current, f"stage {current!r} raised {text}", tb)
        dev = device.to_dict() if device is not None and hasattr(device, "to_dict") else device
        try:
            _write_msg(chan_out, ("result", job_id, results, dev, problem))
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            _write_msg(chan_out, ("result", job_id, [], dev,
                                  ("error", current, f"stage results could not be pickled: {e}", "")))
        if fatal:
            chan_out.flush()
            os._exit(70)  # the CUDA context is poisoned; the parent starts a fresh worker


if __name__ == "__main__":
    sys.exit(_serve())
