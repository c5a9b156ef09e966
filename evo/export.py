"""Export the best genome per shape as a standalone dispatch module.

:func:`best_per_case` picks, for every timed case, the OK record with the lowest measured
time (``evaluation.metrics["cases"][case_key]["time_ms"]``). :func:`export_module` writes a
Python module that embeds those genomes and, at run time, picks the genome whose shape is
nearest (in log space) to the call's shape for the same dtype and launches it with the grid
the Problem's own ``launch`` function computes (imported by name, so the Problem's module
must be importable).

The module runs what the gate checked and timed: at export time each genome is compiled as
the gate compiles (nvcc by default, the Problem's target and options, the params as ``-D``
defines, plus the Problem's ``dtype_defines`` for the case's dtype) and the cubin is
embedded. Where the GPU at hand cannot load it (another architecture), or when exported
with ``binaries=False``, the module compiles the source with cupy's NVRTC for that GPU
instead. NVRTC through cupy is not the same build: it targets the
plain architecture (``sm_90``, not ``sm_90a``) and forces ``-ftz=true``.

The generated module needs cupy only when a kernel is launched; selecting a genome and
computing a launch work without a GPU.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import time
import zlib
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from evo.types import Case, Problem, Record, Status

__all__ = ["ExportError", "best_per_case", "export_module", "top_per_case"]

log = logging.getLogger(__name__)


class ExportError(ValueError):
    """Nothing to export, or a Problem whose callables cannot be imported by name."""


def _records(source: Any) -> Iterable[Record]:
    if hasattr(source, "records"):
        return source.records(Status.OK)  # an Archive
    return source


def _case_time(rec: Record, key: str) -> float | None:
    """The record's time on case ``key`` in ms: an OK record's finite, positive ``time_ms``, else None."""
    return rec.evaluation.case_times().get(key)


def _case_times(source: Any, problem: Problem | None) -> dict[str, list[tuple[float, Record]]]:
    """Case key -> (time, record) of every OK record timed on it (the Problem's timed cases only)."""
    wanted = {c.key for c in problem.timed_cases()} if problem is not None else None
    out: dict[str, list[tuple[float, Record]]] = {}
    for rec in _records(source):
        for key, t in rec.evaluation.case_times().items():
            if wanted is None or key in wanted:
                out.setdefault(key, []).append((t, rec))
    return out


def top_per_case(source: Any, problem: Problem | None = None, k: int = 3,
                 within: float | None = None) -> dict[str, list[Record]]:
    """The ``k`` fastest OK records (distinct genomes) of each case, fastest first.

    The candidates for a confirmation run: at a few per cent apart the search's own timings
    (short warm-up, raced cases, one call each) can rank genomes differently from a longer,
    side-by-side measurement, so a benchmark may re-time these and export the winner
    (:func:`export_module`'s ``choices``).

    Args:
        source: An Archive (anything with ``records(status)``) or an iterable of Records.
        problem: If given, only its timed cases are kept.
        k: Records per case at most (>= 1).
        within: If given, only records whose time is within this fraction of the case's
            fastest (0.05: at most 5% slower).

    Returns:
        Case key -> records, in case-key order.

    Raises:
        ValueError: ``k`` < 1 or ``within`` negative.
    """
    if k < 1:
        raise ValueError(f"top_per_case: k must be 1 or more (got {k})")
    if within is not None and not within >= 0:
        raise ValueError(f"top_per_case: within must be a fraction >= 0 (got {within})")
    out: dict[str, list[Record]] = {}
    for key, timed in sorted(_case_times(source, problem).items()):
        timed.sort(key=lambda tr: tr[0])
        best = timed[0][0]
        picked: list[Record] = []
        seen: set[str] = set()
        for t, rec in timed:
            if len(picked) == k or (within is not None and t > best * (1 + within)):
                break
            if rec.genome.id not in seen:
                seen.add(rec.genome.id)
                picked.append(rec)
        out[key] = picked
    return out


def best_per_case(source: Any, problem: Problem | None = None) -> dict[str, Record]:
    """The fastest OK record for each case key.

    Args:
        source: An Archive (anything with ``records(status)``) or an iterable of Records.
        problem: If given, only its timed cases are kept.

    Returns:
        Case key (e.g. ``"M=32768,N=4096:bfloat16"``) -> Record, in case-key order.
    """
    return {key: recs[0] for key, recs in top_per_case(source, problem, k=1).items()}


def _qualname(fn: Any, what: str) -> list[str]:
    mod, qn = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if fn is None or not mod or "<" in qn or mod == "__main__":
        raise ExportError(f"the Problem's {what} must be a top-level function of an importable module "
                          f"(got {fn!r}); move it out of __main__ or a closure")
    return [mod, qn]


_TEMPLATE = '''\
"""Per-shape dispatch for {name!s}: generated by evo.export; do not edit.

Genomes: {count} (one per exported case). Call ``run(*buffers, shape=..., dtype=...)``
with cupy arrays in the kernel's buffer order; ``select`` and ``launch_config`` need no GPU.
Each genome runs as the cubin built at export time the way the gate built the binary it
checked and timed ({build}), where the GPU loads it; otherwise its source is compiled
with NVRTC for the GPU at hand. ``origin(shape, dtype)`` says which.
Workspace buffers of the signature may be left out of ``buffers``: the module then passes
its own, one per device and buffer, zeroed once (the kernels return them zeroed; made on the
first call, so that later calls can be recorded in a CUDA graph). Calls running at the same
time on several streams of one device need their own workspaces: pass them.
"""

from __future__ import annotations

import base64
import importlib
import json
import math
import zlib

PROBLEM = {problem!r}
_DATA = json.loads({data!r})
GENOMES = _DATA["genomes"]
for _g in GENOMES:  # each distinct source is stored once
    _g["source"] = _DATA["sources"][_g.pop("source_key")] if "source_key" in _g else _g["source"]
_FUNCS = _DATA["funcs"]
_CTYPES = {{"int32": "int32", "int64": "int64", "uint32": "uint32", "float32": "float32"}}
BUILD = _DATA.get("build", "")  # how the embedded cubins were built
_BINARIES = _DATA.get("binaries", {{}})  # binary key -> base64 of the zlib-packed cubin
_cache = {{}}
_modules = {{}}
_origin = {{}}
_dyn = {{}}  # dynamic shared memory limit set per kernel
_fits = {{}}  # resident launches: CTAs that fit at once, per device, case and launch shape
_ws = {{}}  # (device, name, bytes) -> zeroed workspace


def _func(name):
    mod, qn = _FUNCS[name]
    obj = importlib.import_module(mod)
    for part in qn.split("."):
        obj = getattr(obj, part)
    return obj


def _case(shape, dtype):
    from evo.types import Case
    return Case(dict(shape), dtype)


def select(shape, dtype):
    """The exported genome for ``dtype`` whose shape is nearest in log space to ``shape``."""
    cands = [g for g in GENOMES if g["dtype"] == dtype]
    if not cands:
        raise KeyError(f"no exported genome for dtype {{dtype!r}}; exported: {{sorted({{g['dtype'] for g in GENOMES}})}}")

    def dist(g):
        return sum(abs(math.log(max(1, shape[k])) - math.log(max(1, v))) for k, v in g["shape"].items())

    return min(cands, key=lambda g: (dist(g), g["case"]))


def launch_config(shape, dtype, device=None):
    """The Launch the Problem computes for the selected genome."""
    g = select(shape, dtype)
    return _func("launch")(g["params"], _case(shape, dtype), device)


def _compile_nvrtc(g):
    import cupy
    if g.get("language", "cuda") == "ptx":  # the driver assembles PTX for this GPU
        mod = cupy.cuda.function.Module()
        mod.load(g["source"].encode())
        return mod, mod.get_function(g["entry"])
    opts = tuple(g["defines"]) + tuple(g.get("options", ())) + ("--std=c++17",)
    mod = cupy.RawModule(code=g["source"], options=opts)
    return mod, mod.get_function(g["entry"]).kernel


def _key(g):
    """What the kernel of ``g`` is cached under: its binary (genomes may share one), else its case."""
    return g.get("binary") or g["case"]


def _kernel(g):
    """The selected genome's kernel (a cupy Function), built once per binary.

    The cubin the export built as the gate builds kernels (``BUILD``), where this GPU loads
    it; otherwise the source compiled here with NVRTC for this GPU (see :func:`origin`).
    """
    key = _key(g)
    if key not in _cache:
        import cupy
        fn = None
        blob = _BINARIES.get(g.get("binary"))
        if blob is not None:
            mod = cupy.cuda.function.Module()
            try:
                mod.load(zlib.decompress(base64.b64decode(blob)))
                fn = mod.get_function(g["entry"])
                _origin[key] = "cubin: " + BUILD
            except cupy.cuda.driver.CUDADriverError as e:  # e.g. a cubin for another GPU
                _origin[key] = f"nvrtc for this GPU (the exported cubin did not load: {{e}})"
        if fn is None:
            mod, fn = _compile_nvrtc(g)
            _origin.setdefault(key, "nvrtc for this GPU (no exported cubin)")
        _modules[key] = mod  # the module must outlive its function
        _cache[key] = fn
    return _cache[key]


def origin(shape, dtype):
    """How the kernel selected for ``shape`` and ``dtype`` was built, or ``None`` before its first run."""
    return _origin.get(_key(select(shape, dtype)))


def _with_workspaces(buffers, case):
    """``buffers`` with the module's own zeroed workspaces where the signature has them."""
    import cupy
    specs = list(_func("signature")(case))
    ws = [s for s in specs if s.role == "workspace"]
    if len(buffers) == len(specs) or not ws:
        return tuple(buffers)
    if len(buffers) != len(specs) - len(ws):
        names = [s.name for s in specs if s.role != "workspace"]
        raise TypeError(f"run() takes the buffers {{names}} (workspaces optional), got {{len(buffers)}}")
    it = iter(buffers)
    out = []
    for s in specs:
        if s.role != "workspace":
            out.append(next(it))
            continue
        key = (cupy.cuda.runtime.getDevice(), s.name, s.nbytes)
        if key not in _ws:  # not per stream: a capture stream would allocate inside the capture
            _ws[key] = cupy.zeros(max(1, s.nbytes), dtype=cupy.uint8)
            _ws[key].data.device.synchronize()
        out.append(_ws[key])
    return tuple(out)


def run(*buffers, shape, dtype, device=None, stream=None):
    """Launch the selected genome on cupy ``buffers`` (the Problem's signature order)."""
    import cupy
    import numpy as np
    g = select(shape, dtype)
    case = _case(shape, dtype)
    stream = stream or cupy.cuda.get_current_stream()
    if "signature" in _FUNCS:
        buffers = _with_workspaces(buffers, case)
    launch = _func("launch")(g["params"], case, device)
    scalars = [getattr(np, _CTYPES[t])(v) for t, v in (_func("scalars")(case) if "scalars" in _FUNCS else [])]
    kern = _kernel(g)
    fptr = kern.ptr
    kkey = _key(g)
    if launch.shared_mem > _dyn.get(kkey, 0):  # 48 KB in all by default, static arrays included
        cupy.cuda.driver.funcSetAttribute(fptr, 8, launch.shared_mem)  # MAX_DYNAMIC_SHARED_SIZE_BYTES
        _dyn[kkey] = launch.shared_mem
    if launch.cluster is not None and launch.cluster[0] * launch.cluster[1] * launch.cluster[2] > 8:
        cupy.cuda.driver.funcSetAttribute(fptr, 14, 1)  # NON_PORTABLE_CLUSTER_SIZE_ALLOWED
    if getattr(launch, "resident", False):  # a persistent grid: no more CTAs than fit at once
        from fitness import fit_resident, resident_blocks
        dev = cupy.cuda.runtime.getDevice()
        key = (dev, kkey, launch.block, launch.shared_mem, launch.cluster)
        if key not in _fits:
            sms = cupy.cuda.runtime.getDeviceProperties(dev)["multiProcessorCount"]
            try:
                _fits[key] = resident_blocks(fptr, launch, sms)
            except (OSError, AttributeError):  # no driver library or symbol: the grid stays (an upper bound)
                _fits[key] = None
        launch = fit_resident(launch, _fits[key])
    kern(launch.grid, launch.block, tuple(buffers) + tuple(scalars), shared_mem=launch.shared_mem, stream=stream)
'''


def _build_line(backend: str, target: str) -> str:
    from fitness import toolkit_version

    text = toolkit_version(backend)
    m = re.search(r"release ([0-9.]+), (V[0-9.]+)", text)
    version = f"{m.group(1)} ({m.group(2)})" if m else (text.strip().splitlines() or ["?"])[-1]
    return f"{backend} {version}, {target}"


def _binaries(genomes: list[dict[str, Any]], problem: Problem, backend: str,
              use_cache: bool) -> tuple[dict[str, str], str]:
    """Compile each distinct (source, defines) once as the gate does, in parallel (one compiler
    process per CPU, at most 8); key -> base64 of the zlib-packed cubin."""
    from fitness import CompileCache, compile_source

    cache = CompileCache() if use_cache else None
    todo: dict[str, dict[str, Any]] = {}
    for g in genomes:
        ident = json.dumps([g["source"], g["entry"], g["defines"], list(problem.compile_options), problem.target,
                            backend, g["language"]])
        g["binary"] = hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:20]
        todo.setdefault(g["binary"], g)

    def build(g: dict[str, Any]) -> Any:
        return compile_source(g["source"], entry=g["entry"], language=g["language"], defines=g["defines"],
                              options=problem.compile_options, target=problem.target, backend=backend, cache=cache)

    out: dict[str, str] = {}
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1, len(todo)))) as pool:
        futures = {key: pool.submit(build, g) for key, g in todo.items()}
        for i, (key, fut) in enumerate(futures.items()):
            g = todo[key]
            try:
                r = fut.result()
            except (OSError, RuntimeError) as e:  # no compiler on this machine
                raise ExportError(f"cannot build the cubins with {backend} ({e}); install the CUDA toolkit, or export "
                                  "with binaries=False (the module then compiles with NVRTC where it runs)") from e
            if not r.ok:
                raise ExportError(f"genome {g['id'][:12]} (case {g['case']}) does not compile with {backend} for "
                                  f"{problem.target}: {r.reason}; export with binaries=False to skip the cubins")
            out[key] = base64.b64encode(zlib.compress(r.cubin, 9)).decode("ascii")
            log.info("export: cubin %d of %d built (%s, %.0f s)", i + 1, len(todo),
                     "cached" if r.cache_hit else backend, time.monotonic() - started)
    return out, _build_line(backend, problem.target)


def export_module(source: Any, problem: Problem, path: str | Path, *, extra_code: str = "",
                  binaries: bool = True, backend: str = "nvcc", use_cache: bool = True,
                  choices: Mapping[str, Record] | None = None) -> Path:
    """Write a dispatch module holding the best genome per timed case.

    Args:
        source: An Archive or an iterable of Records.
        problem: The Problem the records were scored against (its ``launch`` and
            ``scalars`` are referenced by module and name).
        path: The ``.py`` file to write (parent directories are created).
        extra_code: Python appended to the module (e.g. a framework wrapper).
        binaries: Embed each genome's cubin, built now as the gate builds the binary it
            checks and times (``backend``, the Problem's target and compile options), so the
            module runs that binary. Without them it compiles the sources with NVRTC for the
            GPU it runs on (cupy's options, e.g. ``-ftz=true``), which can be slower.
        backend: The gate's compile backend, ``"nvcc"`` (the Evaluator's default) or ``"nvrtc"``.
        use_cache: Look the cubins up in (and add them to) the compile cache the Evaluator uses.
        choices: Case key -> the record to dispatch there instead of the fastest by the
            records' own timings (e.g. the winner of a side-by-side re-timing of
            :func:`top_per_case`'s candidates); cases it leaves out keep the fastest.

    Returns:
        The written path.

    Raises:
        ExportError: No OK record has a timed case, the Problem's callables are not
            importable by name, (``binaries``) a genome does not compile here, or a choice
            names a case the records do not time or a record that is not OK and timed there.
    """
    best = best_per_case(source, problem)
    if not best:
        raise ExportError("no OK record with timed cases to export: run the search first (or check the archive path)")
    for key, rec in (choices or {}).items():
        if key not in best:
            raise ExportError(f"choices: case {key!r} is not a timed case of these records "
                              f"(timed: {', '.join(sorted(best)[:4])}{', ...' if len(best) > 4 else ''})")
        if _case_time(rec, key) is None:
            raise ExportError(f"choices: record {rec.genome.id[:12]} for {key!r} is not an OK record timed on "
                              "that case (choose among top_per_case's candidates)")
        best[key] = rec
    funcs = {"launch": _qualname(problem.launch, "launch")}
    if problem.scalars is not None:
        funcs["scalars"] = _qualname(problem.scalars, "scalars")
    genomes = []
    if problem.signature is not None and any(
            s.role == "workspace" for key in best for s in problem.signature(Case.from_key(key))):
        funcs["signature"] = _qualname(problem.signature, "signature")  # run() supplies the workspaces
    for key, rec in best.items():
        case = Case.from_key(key)
        m = rec.evaluation.metrics["cases"][key]
        genomes.append({
            "case": key, "shape": dict(case.shape), "dtype": case.dtype, "id": rec.genome.id,
            "source": rec.genome.source, "params": dict(rec.genome.params), "entry": rec.genome.entry,
            "language": rec.genome.language,
            "defines": problem.genome_defines(rec.genome, case.dtype),
            "options": list(problem.compile_options), "time_ms": m.get("time_ms"), "fraction": m.get("fraction"),
        })
    payload: dict[str, Any] = {"genomes": genomes, "funcs": funcs, "sources": {}}
    if binaries:  # before the sources move out of the genomes
        payload["binaries"], payload["build"] = _binaries(genomes, problem, backend, use_cache)
    build = payload.get("build", "none: the sources are compiled with NVRTC where the module runs")
    for g in genomes:  # searched genomes mostly share one source: keep each once
        text = g.pop("source")
        g["source_key"] = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]
        payload["sources"][g["source_key"]] = text
    data = json.dumps(payload, sort_keys=True)
    text = _TEMPLATE.format(name=problem.name, count=len(genomes), problem=problem.name, data=data, build=build)
    if extra_code:
        text += "\n\n" + extra_code.strip() + "\n"
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out
