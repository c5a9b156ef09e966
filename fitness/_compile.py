"""Compiling genomes to cubins in isolated, time- and memory-limited subprocesses.

Backends:

``"nvcc"`` (default)
    ``nvcc -cubin -gencode=arch=compute_XX,code=sm_XX -O3 -Xptxas -v -lineinfo
    --std=c++17 <defines> <problem.compile_options>``. With ``keep_ptx`` the same
    single compile also keeps its intermediate PTX (``-keep``), so no second ``-ptx``
    compile is run.
``"nvrtc"``
    NVRTC through CuPy's binding, run in a child Python process (``python -m
    fitness._compile``) so that a crash or a runaway compile cannot take the driver
    down. Needs CuPy (the ``cuda`` extra).

Raw PTX genomes (``language == "ptx"``) are assembled with ``ptxas -arch=sm_XX -v``
whatever the backend; they have no preprocessor, so params and ``compile_options``
(nvcc options) are not passed.

Every compile runs in its own session (``start_new_session=True``) with
``RLIMIT_AS`` set in the child before ``exec`` (default 4 GiB) and a wall-clock timeout
(default 60 s); on timeout the whole process group is killed with SIGKILL and the
result is ``COMPILE_ERROR`` with reason ``"compile timed out after Ns"``. Results
(failures too, timeouts and signal deaths not) are kept in a :class:`CompileCache`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evo.types import Genome, Problem, ProblemError, Status
from fitness._cache import CompileCache, cache_key
from fitness._resources import parse_ptxas_report
from fitness._stage import Job, Stage, StageContext, StageResult

__all__ = ["Compile", "CompileResult", "ProcResult", "compile_genome", "compile_source", "run_limited", "toolkit_version",
           "truncate_log", "DEFAULT_COMPILE_TIMEOUT", "DEFAULT_COMPILE_MEMORY"]

DEFAULT_COMPILE_TIMEOUT = 60.0
DEFAULT_COMPILE_MEMORY = 4 << 30
LOG_LIMIT = 64 * 1024
BACKENDS = ("nvcc", "nvrtc")

_TRIVIAL = 'extern "C" __global__ void kernel(int* p) { if (p) *p = 1; }\n'
_known_targets: set[tuple[str, str, str, tuple[str, ...]]] = set()
_known_lock = threading.Lock()


# --------------------------------------------------------------------------- subprocesses


@dataclass
class ProcResult:
    """What a limited subprocess did.

    Attributes:
        returncode: Exit status (negative: killed by that signal; ``None`` if unknown).
        output: stdout and stderr together, decoded.
        timed_out: Whether it was killed for running past the timeout.
        seconds: Wall time.
        pid: Its process id (also its process-group id).
    """

    returncode: int | None
    output: str
    timed_out: bool
    seconds: float
    pid: int


def _limit_memory(nbytes: int | None):  # type: ignore[no-untyped-def]
    """A ``preexec_fn`` that caps the address space; only async-signal-safe-ish C calls."""
    if not nbytes:
        return None
    setrlimit, limit_as = resource.setrlimit, resource.RLIMIT_AS

    def preexec() -> None:
        setrlimit(limit_as, (nbytes, nbytes))

    return preexec


def run_limited(cmd: Sequence[str], *, timeout: float, memory_bytes: int | None = DEFAULT_COMPILE_MEMORY,
                cwd: str | os.PathLike[str] | None = None, input_bytes: bytes | None = None,
                env: dict[str, str] | None = None) -> ProcResult:
    """Run ``cmd`` in a new session with an address-space cap and a wall-clock timeout.

    On timeout the child's whole process group gets SIGKILL (the compiler's own children,
    such as ``cicc`` and ``ptxas``, die with it).

    Args:
        cmd: The command line.
        timeout: Seconds before the process group is killed.
        memory_bytes: ``RLIMIT_AS`` for the child (``None`` or 0: no cap).
        cwd: Working directory.
        input_bytes: Bytes written to the child's stdin.
        env: Environment (default: inherited).
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdin=subprocess.PIPE if input_bytes is not None
                            else subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=_limit_memory(memory_bytes))
    timed_out = False
    try:
        out, _ = proc.communicate(input=input_bytes, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # something outside the group holds the pipe
            proc.kill()
            out = b""
            proc.wait()
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Reap anything the compiler left behind in its group (a normal exit leaves nothing).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return ProcResult(proc.returncode, (out or b"").decode("utf-8", "replace"), timed_out,
                      time.perf_counter() - t0, proc.pid)


def truncate_log(text: str, limit: int = LOG_LIMIT) -> str:
    """Keep the head and the tail of a long log with a marker in between.

    The head holds the first errors; the tail holds ptxas's resource report.
    """
    if len(text) <= limit:
        return text
    head = limit * 3 // 4
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters of compiler output truncated ...]\n{text[-tail:]}"


# --------------------------------------------------------------------------- toolkit


@functools.cache
def toolkit_version(backend: str = "nvcc") -> str:
    """The compiler's version text (computed once per process); part of the cache key.

    Raises:
        RuntimeError: The compiler is not installed.
    """
    if backend == "nvrtc":
        r = run_limited([sys.executable, "-c", "from cupy_backends.cuda.libs import nvrtc; "
                         "print('nvrtc', nvrtc.getVersion())"], timeout=120, memory_bytes=None)
        if r.returncode != 0:
            raise RuntimeError(f"the nvrtc backend needs CuPy with NVRTC (pip install cupy-cuda13x): "
                               f"{r.output.strip()[-500:]}")
        return r.output.strip()
    tool = {"nvcc": "nvcc", "ptxas": "ptxas"}.get(backend)
    if tool is None:
        raise ValueError(f"unknown compile backend {backend!r} (known: {', '.join(BACKENDS)})")
    exe = shutil.which(tool)
    if exe is None:
        raise RuntimeError(f"{tool} is not on PATH: install the CUDA toolkit or put its bin/ on PATH")
    r = run_limited([exe, "--version"], timeout=60, memory_bytes=None)
    if r.returncode != 0:
        raise RuntimeError(f"`{tool} --version` failed: {r.output.strip()[-500:]}")
    return r.output.strip()


def _arch(target: str) -> tuple[str, str]:
    """``"sm_90a"`` -> (``"compute_90a"``, ``"sm_90a"``)."""
    m = re.fullmatch(r"(?:sm|compute)_(\w+)", target)
    if not m:
        raise ProblemError(f"target {target!r} is not of the form 'sm_XX' (e.g. 'sm_90a')")
    return f"compute_{m.group(1)}", f"sm_{m.group(1)}"


# --------------------------------------------------------------------------- compile


@dataclass
class CompileResult:
    """The outcome of one compile.

    Attributes:
        ok: Whether a cubin was produced.
        cubin: The cubin (empty on failure).
        log: Compiler output (truncated to 64 KB with a marker).
        backend: ``"nvcc"``, ``"nvrtc"`` or ``"ptxas"``.
        reason: Short failure reason (empty when ok).
        ptx: PTX text when asked for (``keep_ptx``), else ``None``.
        timed_out: Killed for running past the timeout.
        cache_hit: Served from the compile cache (no subprocess ran).
        seconds: Wall time of the compiler subprocess (0 on a cache hit).
        resources: ptxas resource report of the entry, if found.
    """

    ok: bool
    cubin: bytes
    log: str
    backend: str
    reason: str = ""
    ptx: str | None = None
    timed_out: bool = False
    cache_hit: bool = False
    seconds: float = 0.0
    resources: dict[str, int] | None = field(default=None)


def _failure_reason(rc: int | None, log: str) -> str:
    errs = [ln.strip() for ln in log.splitlines() if re.search(r"\berror\b|fatal", ln, re.IGNORECASE)]
    detail = "; ".join(errs[:5]) if errs else log.strip()[-400:]
    if rc is not None and rc < 0:
        return f"compiler killed by signal {-rc}: {detail}"
    return f"compile failed (exit {rc}): {detail}"


def _nvrtc_options(defines: Sequence[str], options: Sequence[str], target: str) -> list[str]:
    # -default-device: unannotated functions (a device function's generic lambdas, which nvcc
    # takes as device code) are device functions; NVRTC otherwise rejects them as host code.
    return [f"-arch={_arch(target)[1]}", "--std=c++17", "-lineinfo", "--ptxas-options=-v", "-default-device",
            *defines, *options]


def _nvrtc_include_dirs() -> list[str]:
    """Header folders for NVRTC: those of the candidates (the CUDA path CuPy uses, ``$CUDA_HOME``,
    ``$CUDA_PATH``, the toolkit of ``nvcc`` on PATH, ``/usr/local/cuda``) that hold ``cuda_fp16.h``,
    else CuPy's. CuPy's path may be the NVRTC wheel's, which lacks the toolkit headers."""
    dirs = []
    try:
        import cupy

        cuda_path = cupy.cuda.get_cuda_path()
    except Exception:  # noqa: BLE001 - no CuPy path: the toolkit's may still do
        cuda_path = None
    if cuda_path:
        dirs.append(os.path.join(cuda_path, "include"))
    dirs += [os.path.join(os.environ[v], "include") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        dirs.append(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include"))
    dirs.append("/usr/local/cuda/include")  # where nvcc on PATH is a wrapper script
    return [d for d in dict.fromkeys(dirs) if os.path.isfile(os.path.join(d, "cuda_fp16.h"))] or dirs[:1]


def compile_source(source: str, *, entry: str = "kernel", language: str = "cuda", defines: Sequence[str] = (),
                   options: Sequence[str] = (), target: str = "sm_90a", backend: str = "nvcc",
                   timeout: float = DEFAULT_COMPILE_TIMEOUT, memory_bytes: int | None = DEFAULT_COMPILE_MEMORY,
                   keep_ptx: bool = False, cache: CompileCache | None = None) -> CompileResult:
    """Compile device source to a cubin (see the module docstring for the command lines).

    Args:
        source: CUDA C++ or raw PTX.
        entry: Entry function name (for the resource report).
        language: ``"cuda"`` or ``"ptx"``.
        defines: ``-DNAME=VALUE`` options.
        options: Further compiler options (ignored for raw PTX).
        target: e.g. ``"sm_90a"``.
        backend: ``"nvcc"`` or ``"nvrtc"``.
        timeout: Seconds before the compiler's process group is killed.
        memory_bytes: Address-space cap of the compiler process.
        keep_ptx: Also return the PTX text.
        cache: Where to look up and store the result (``None``: no cache).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown compile backend {backend!r} (known: {', '.join(BACKENDS)})")
    used = "ptxas" if language == "ptx" else backend
    if language == "ptx":
        defines, options = (), ()
    key = None
    if cache is not None:
        key = cache_key(source=source, defines=defines, options=options, target=target, backend=used,
                        toolkit=toolkit_version(used), language=language, entry=entry)
        hit = cache.get(key)
        if hit is not None and (not keep_ptx or not hit.get("ok") or hit.get("ptx") is not None):
            return CompileResult(ok=bool(hit["ok"]), cubin=bytes(hit.get("cubin") or b""), log=hit.get("log", ""),
                                 backend=used, reason=hit.get("reason", ""), ptx=hit.get("ptx"), cache_hit=True,
                                 resources=hit.get("resources"))
    compute, sm = _arch(target)
    with tempfile.TemporaryDirectory(prefix="evo-compile-") as tmp:
        tmpd = Path(tmp)
        out_path = tmpd / "kernel.cubin"
        ptx: str | None = None
        if used == "ptxas":
            (tmpd / "kernel.ptx").write_text(source)
            cmd = [_exe("ptxas"), f"-arch={sm}", "-v", "-O3", "-lineinfo", "-o", str(out_path), "kernel.ptx"]
            r = run_limited(cmd, timeout=timeout, memory_bytes=memory_bytes, cwd=tmpd)
            if keep_ptx:
                ptx = source
        elif used == "nvcc":
            (tmpd / "kernel.cu").write_text(source)
            cmd = [_exe("nvcc"), "-cubin", f"-gencode=arch={compute},code={sm}", "-O3", "-Xptxas", "-v",
                   "-lineinfo", "--std=c++17", *defines, *options]
            if keep_ptx:
                (tmpd / "keep").mkdir()
                cmd += ["-keep", "-keep-dir", "keep"]
            cmd += ["-o", str(out_path), "kernel.cu"]
            r = run_limited(cmd, timeout=timeout, memory_bytes=memory_bytes, cwd=tmpd)
            if keep_ptx and r.returncode == 0:
                found = sorted((tmpd / "keep").glob("*.ptx"))
                ptx = found[0].read_text() if found else None
        else:  # nvrtc in a child Python
            import msgpack

            req = msgpack.packb({"source": source, "options": _nvrtc_options(defines, options, target),
                                 "out": str(out_path), "keep_ptx": keep_ptx}, use_bin_type=True)
            r = run_limited([sys.executable, "-m", "fitness._compile"], timeout=timeout, memory_bytes=memory_bytes,
                            cwd=tmpd, input_bytes=req, env=_child_env())
            ptx_path = out_path.with_suffix(".ptx")
            if keep_ptx and ptx_path.exists():
                ptx = ptx_path.read_text()
        log = truncate_log(r.output)
        if r.timed_out:
            return CompileResult(ok=False, cubin=b"", log=log, backend=used, timed_out=True, seconds=r.seconds,
                                 reason=f"compile timed out after {timeout:g}s")
        ok = r.returncode == 0 and out_path.exists()
        cubin = out_path.read_bytes() if ok else b""
    reason = "" if ok else _failure_reason(r.returncode, log)
    res = parse_ptxas_report(log, entry) if ok else None
    result = CompileResult(ok=ok, cubin=cubin, log=log, backend=used, reason=reason, ptx=ptx, seconds=r.seconds,
                           resources=res)
    # Deaths by signal (negative codes, or 128+N reported by nvcc's shell wrappers) may come from the memory
    # cap or the machine, not the source: they are not cached.
    if cache is not None and key is not None and r.returncode is not None and 0 <= r.returncode < 128:
        cache.put(key, {"ok": ok, "cubin": cubin, "log": log, "reason": reason, "ptx": ptx, "resources": res,
                        "backend": used})
    return result


def compile_genome(genome: Genome, problem: Problem, *, backend: str = "nvcc",
                   timeout: float = DEFAULT_COMPILE_TIMEOUT, memory_bytes: int | None = DEFAULT_COMPILE_MEMORY,
                   keep_ptx: bool = False, cache: CompileCache | None = None, dtype: str | None = None) -> CompileResult:
    """:func:`compile_source` for a genome under a problem (its target and compile options).

    ``dtype``: build for that dtype, adding the Problem's ``dtype_defines`` for it (what the
    gate runs on cases of that dtype); None builds with the params' definitions alone.
    """
    return compile_source(genome.source, entry=genome.entry, language=genome.language,
                          defines=problem.genome_defines(genome, dtype),
                          options=problem.compile_options, target=problem.target, backend=backend, timeout=timeout,
                          memory_bytes=memory_bytes, keep_ptx=keep_ptx, cache=cache)


def _exe(tool: str) -> str:
    exe = shutil.which(tool)
    if exe is None:
        raise RuntimeError(f"{tool} is not on PATH: install the CUDA toolkit or put its bin/ on PATH")
    return exe


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [p or os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if os.path.isdir(p)))
    return env


class Compile(Stage):
    """Compile the genome to a cubin (``COMPILE_ERROR`` with the compiler log on failure).

    Args:
        backend: ``"nvcc"`` (default) or ``"nvrtc"``.
        timeout: Seconds per compile; default: the Evaluator's ``timeout`` option
            (``ctx.options["compile_timeout"]``), else 60.
        memory_bytes: Address-space cap of the compiler (default 4 GiB).
        use_cache: Look up and store results in the compile cache
            (``ctx.options["cache_dir"]``, default :func:`~fitness.default_cache_dir`).

    ``StageResult.data``: ``cubin`` (bytes), ``compile_log``, ``backend``, ``ptx`` (when
    ``ctx.options["keep_ptx"]``), ``compile_cache_hit`` and ``compile_seconds``. Where the
    Problem's ``dtype_defines`` asks for several builds of the genome
    (:meth:`~evo.types.Problem.builds`), each is compiled (concurrently): ``cubins`` and
    ``compile_logs`` map each build's name to its cubin and log, ``cubin`` and ``ptx`` are the
    first build's, and ``compile_log`` holds every build's log under a header line naming it.
    A build that fails fails the genome (``COMPILE_ERROR`` naming the build).
    """

    name = "compile"
    where = "host"

    def __init__(self, backend: str = "nvcc", *, timeout: float | None = None,
                 memory_bytes: int | None = DEFAULT_COMPILE_MEMORY, use_cache: bool = True) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown compile backend {backend!r} (known: {', '.join(BACKENDS)})")
        self.backend = backend
        self.timeout = timeout
        self.memory_bytes = memory_bytes
        self.use_cache = use_cache

    def __repr__(self) -> str:
        return f"Compile(backend={self.backend!r})"

    def _cache(self, options: Any) -> CompileCache | None:
        if not self.use_cache or options.get("compile_cache") is False:
            return None
        return CompileCache(options.get("cache_dir"))

    def _timeout(self, options: Any) -> float:
        if self.timeout is not None:
            return float(self.timeout)
        return float(options.get("compile_timeout") or DEFAULT_COMPILE_TIMEOUT)

    def run(self, job: Job, ctx: StageContext) -> StageResult:
        """Compile ``job.genome`` for ``job.problem.target`` (once per build of the Problem)."""
        problem = job.problem
        builds = problem.builds(job.genome.params)
        keep_ptx, cache = bool(ctx.options.get("keep_ptx")), self._cache(ctx.options)

        def build(name: str) -> CompileResult:
            return compile_genome(job.genome, problem, backend=self.backend, timeout=self._timeout(ctx.options),
                                  memory_bytes=self.memory_bytes, keep_ptx=keep_ptx, cache=cache,
                                  dtype=name or None)

        if len(builds) == 1:
            results = {name: build(name) for name in builds}
        else:
            with ThreadPoolExecutor(max_workers=len(builds)) as pool:
                futures = {name: pool.submit(build, name) for name in builds}
                results = {name: fut.result() for name, fut in futures.items()}
        first = next(iter(results.values()))

        def header(name: str) -> str:
            return f"== build {name} ({' '.join(builds[name]) or 'no extra definitions'}) ==\n"

        log = first.log if len(results) == 1 else "".join(header(n) + r.log for n, r in results.items())
        data: dict[str, Any] = {"compile_log": log, "backend": first.backend,
                                "compile_cache_hit": all(r.cache_hit for r in results.values()),
                                "compile_seconds": sum(r.seconds for r in results.values())}
        if len(results) > 1:
            data["compile_logs"] = {n: r.log for n, r in results.items()}
        failed = [(n, r) for n, r in results.items() if not r.ok]
        if failed:
            name, r = failed[0]
            reason = r.reason if len(results) == 1 else f"build {name} ({' '.join(builds[name])}): {r.reason}"
            res = StageResult.fail(Status.COMPILE_ERROR, reason, compile_log=log)
            res.data = data
            return res
        data["cubin"] = first.cubin
        if len(results) > 1:
            data["cubins"] = {n: r.cubin for n, r in results.items()}
        if first.ptx is not None:
            data["ptx"] = first.ptx
        return StageResult(ok=True, artifacts={"compile_log": log}, data=data)

    def check_target(self, problem: Problem, options: Any = None) -> None:
        """Compile a trivial kernel for ``problem.target``; raise :class:`ProblemError` if it fails.

        Remembered per process (backend, toolkit, target, options), and served from the
        compile cache across processes.
        """
        options = options or {}
        used = self.backend
        memo = (used, toolkit_version(used), problem.target, tuple(problem.compile_options))
        with _known_lock:
            if memo in _known_targets:
                return
        r = compile_source(_TRIVIAL, target=problem.target, options=problem.compile_options, backend=used,
                           timeout=max(self._timeout(options), 120.0), memory_bytes=self.memory_bytes,
                           cache=self._cache(options))
        if not r.ok:
            raise ProblemError(f"target {problem.target!r} with compile_options {list(problem.compile_options)} "
                               f"does not compile a trivial kernel with {used}: {r.reason}\n"
                               f"{r.log.strip()[-1000:]}\nFix Problem.target (e.g. 'sm_90a') or compile_options.")
        with _known_lock:
            _known_targets.add(memo)


# --------------------------------------------------------------------------- NVRTC child


def _nvrtc_main() -> int:
    """Child side of the nvrtc backend: msgpack request on stdin, cubin to the given path."""
    import msgpack

    req = msgpack.unpackb(sys.stdin.buffer.read(), raw=False)
    from cupy_backends.cuda.libs import nvrtc

    options = list(req["options"]) + [f"--include-path={d}" for d in _nvrtc_include_dirs()]
    prog = nvrtc.createProgram(req["source"], "kernel.cu", [], [])
    ok = True
    try:
        nvrtc.compileProgram(prog, options)
    except nvrtc.NVRTCError:
        ok = False
    log = nvrtc.getProgramLog(prog)
    sys.stdout.write(log if isinstance(log, str) else log.decode("utf-8", "replace"))
    if ok:
        Path(req["out"]).write_bytes(nvrtc.getCUBIN(prog))
        if req.get("keep_ptx"):
            with contextlib.suppress(Exception):
                ptx = nvrtc.getPTX(prog)
                Path(req["out"]).with_suffix(".ptx").write_text(ptx if isinstance(ptx, str) else ptx.decode())
    nvrtc.destroyProgram(prog)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(_nvrtc_main())
