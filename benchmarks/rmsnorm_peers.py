"""RMSNorm on Hopper: our best genomes against the peers, side by side (forward, or --backward).

Providers: the exported best genomes (``--module`` from ``examples/rmsnorm_h100.py``, or
``--archive`` exported on the fly), torch.nn.functional.rms_norm, torch.compile of it
(static shapes), Liger-Kernel's RMSNorm, QuACK's ``rmsnorm_fwd`` and ``rmsnorm_fwd_tuned``.
Ours and QuACK read float32 weights; torch, torch.compile and Liger get them cast to the
input's dtype outside the timed call (how they are used), and "torch.compile fp32 w" is
torch.compile of the same function on the float32 weights, the operation ours performs.
Cases: the 11 standard shapes x bfloat16, float16, float32.

Timing, the same for every provider and the same as the fitness Timing stage
(:func:`fitness.time_calls`): L2-cold input rotation (enough input sets that one round
exceeds 3x L2), warm-up, then CUDA-graph replays of a round-robin batch of at least 2 ms
(calls issued one by one when capture fails); the median over replays is reported with
its spread ((p75-p25)/median). The providers of a case are timed in an order rotated from
case to case (:func:`timing_order`), so no provider always goes first, and ``--rounds R``
times each R times (the cell is the median of the rounds, :func:`combine_rounds`). Outputs rotate with the inputs for every provider: ours and
QuACK's tuned entry write into one preallocated output per input set, and the providers
that allocate their outputs per call keep each set's latest output alive until that set's
next call (:func:`holding`). Without that, the caching allocator hands every call the block
the previous call just freed, a block still in L2, and short rows gain up to 14% from
writes that never reach DRAM (measured on the H200: torch.compile at 32768x256 bf16 0.0086
ms with reuse, 0.0098 ms held; ours 0.0092 ms into one buffer, 0.0104 ms into one per set).
TB/s uses 2*M*N*elem + 4*N bytes; "% copy" is against a device-to-device copy (timed call
by call) in the same run. A provider that fails on a case is shown as FAILED with the
error class (the message goes to stderr); ``--require quack,liger`` (or ``all``) instead stops
before timing anything when a named provider did not load. The Markdown
table goes to ``--out`` (default ``benchmarks/results/rmsnorm_peers.md``), row by row;
RESULTS.md quotes it. Under it: each peer's time over ours per case, the cases where ours is
faster than every peer, and (forward) the cases where ours misses its copy floor
(:data:`COPY_FLOORS`), each with the points it is short by.

``--backward`` times dx and dw instead, on the backward Problem's timed shapes: the
genomes of a backward search (``examples/rmsnorm_h100.py --backward``), the reference
backward in torch (eager and torch.compile) and QuACK's ``rmsnorm_bwd``; bytes
``3*M*N*elem + 4*M + 8*N``.

    python benchmarks/rmsnorm_peers.py --module runs/rmsnorm_h100.dispatch.py
    python benchmarks/rmsnorm_peers.py --backward --archive runs/rmsnorm_bwd_h100.lmdb --skip "quack tuned"
    python benchmarks/rmsnorm_peers.py --module runs/rmsnorm_h100.dispatch.py --skip "quack tuned" --require all

A whole forward table (33 cases, seven providers, torch.compile and QuACK compiling per
case) can take longer than one sitting allows: ``--time-limit S`` starts no new case after
S seconds and writes the summary of the rows it has; ``--resume`` then keeps the rows
already in ``--out`` (same providers), times only the missing cases and writes the summary
over all of them. Each invocation measures its own copy ceiling; the file records it, and a
row's "% copy" is against the ceiling of the invocation that timed it.

    python benchmarks/rmsnorm_peers.py --module M --require all --time-limit 500
    python benchmarks/rmsnorm_peers.py --module M --require all --time-limit 500 --resume

``--confirm K`` (forward, with ``--archive``) re-times the archive's K fastest genomes of each
case (:func:`evo.export.top_per_case`, within :data:`CONFIRM_WITHIN` of the fastest) side by side
with this harness before the table, and exports the winner of each case
(``export_module(choices=...)``) to ``<archive>.confirmed.dispatch.py``, which the table then
times as ours. The search times each genome once with a short warm-up and races the cases of
weak genomes; between genomes a few per cent apart its order need not be this harness's (the
H100, run 26: at fp16 2K it preferred one genome by 0.35%, which ran 0.0916 ms here, while the
one it passed over ran 0.0885 on bf16, where the search had timed it as on fp16). The
candidates' times go to ``<out>.confirm.md``, with the device the archive was searched on.
Confirming on another device than the search's is where it matters most: run 26 (an H100
search) re-timed on an H200 took another genome than the search's fastest on 22 of 33 cases,
4.6% faster in geomean; candidates 0-2.6% apart on the H100 ran up to 24% apart there. Widen
the pool for such a transfer with ``--confirm-within`` (default :data:`CONFIRM_WITHIN`).

    python benchmarks/rmsnorm_peers.py --archive runs/run26.lmdb --confirm 3 --rounds 2
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.machinery
import importlib.util
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = [(32768, n) for n in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)] + [
    (16384, 131072), (8192, 262144)]
DTYPES = ("bfloat16", "float16", "float32")
EPS = 1e-6
COPY_FLOORS = {256: 0.65, 512: 0.78, 1024: 0.88, 2048: 0.93, 4096: 0.96}
"""The forward's target fraction of the measured copy bandwidth by row length (issue 6);
:data:`COPY_FLOOR_LONG` from 8K up."""
COPY_FLOOR_LONG = 0.97


WARMUP_MS = 300.0
"""Warm-up before each provider's timed batches. The fitness default (10 ms) suits the
Evaluator, whose GPU never idles between genomes; here a provider often starts after the
GPU idled (inputs being made, torch.compile or QuACK compiling), and on the H100 the first
two or three timings after such a pause (about 200-300 ms of work) ran 1.6-3% slower
(twenty-first session)."""
CONFIRM_WITHIN = 0.05
"""``--confirm``: only genomes whose search time on a case is within this fraction of the fastest
are re-timed there (farther ones are not plausibly faster)."""


def bench(make_call: Callable[[Any, Any], Callable[[], Any]], xs: list[Any], w: Any,
          warmup_ms: float = WARMUP_MS) -> tuple[float, float]:
    """(median ms per call, relative spread) with the fitness Timing stage's method.

    One call per input set (the sets together exceed 3x L2), CUDA-graph batches of at
    least 2 ms where the calls can be captured, after ``warmup_ms`` of warm-up; see
    :func:`fitness.time_calls`.
    """
    from fitness import time_calls

    res = time_calls([make_call(x, w) for x in xs], warmup_ms=warmup_ms)
    return res.time_ms, res.spread


def holding(make_call: Callable[..., Callable[[], Any]]) -> Callable[..., Callable[[], Any]]:
    """``make_call`` whose calls keep their latest result alive until the next call of the same input set.

    The benchmark makes one call per input set; each wrapped call stores what the provider
    returned in its own slot, replacing the result of that set's previous call. So a provider
    that allocates its output writes, like the preallocated ones, into a buffer no other set
    wrote since: never the block the previous call freed, which the caching allocator would
    hand back still resident in L2 (CUDA-graph capture included: the captured addresses are
    what the replays write).
    """
    def make_held(*args: Any) -> Callable[[], Any]:
        call = make_call(*args)
        slot: list[Any] = [None]

        def held() -> Any:
            slot[0] = call()
            return slot[0]
        return held
    return make_held


def module_call(module: Any, backward: bool = False) -> Callable[..., Callable[[], Any]]:
    """make_call for a dispatch module, through ``module.run`` on torch's stream: ``(x, w)`` with
    y allocated once, or with ``backward`` ``(x, w, dy, rstd)`` with dx and a float32 dw."""
    import torch

    dt = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}

    def evo_call(x: Any, w: Any, *grads: Any) -> Callable[[], Any]:
        import cupy

        outs = [torch.empty_like(x)]
        if backward:
            outs.append(torch.empty(x.shape[1], device=x.device, dtype=torch.float32))
        shape = {"M": x.shape[0], "N": x.shape[1]}
        bufs = [cupy.asarray(t) for t in (x, w, *grads, *outs)]

        def call() -> None:
            with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                module.run(*bufs, shape=shape, dtype=dt[x.dtype])
        return call
    return evo_call


EVO_PREFIX = "evo ("
"""Providers named so are modules of ours (``evo (ours)`` and each ``--also``), never peers."""


def parse_also(values: list[str], later: Path | None = None) -> list[tuple[str, Path]]:
    """``--also PATH[=LABEL]`` values as (provider name, path), checked before any GPU work.

    The label defaults to the file's name without ``.xz`` and ``.dispatch.py`` (``.py``); the
    provider is ``evo (LABEL)``. The ``--module`` path may be given again: the same module
    timed twice, each with its own buffers, shows how far ours moves within one run. ``later``
    is the module ``--confirm`` will write (``<archive>.confirmed.dispatch.py``): it may be
    named before it exists, so the confirmed module can be timed twice in the run that makes it.

    Raises:
        SystemExit: A missing file, an empty label, the label ``ours``, or a label given twice.
    """
    out: list[tuple[str, Path]] = []
    for v in values:
        path_s, sep, label = v.partition("=")
        path = Path(path_s)
        if not sep:
            label = path.name.removesuffix(".xz").removesuffix(".py").removesuffix(".dispatch")
        label = label.strip()
        if not path.is_file() and not (later is not None and path.resolve() == later.resolve()):
            raise SystemExit(f"--also {v}: no dispatch module at {path}")
        if not label or label == "ours":
            raise SystemExit(f"--also {v}: give the module a label other than 'ours' (PATH=LABEL)")
        name = f"{EVO_PREFIX}{label})"
        if any(name == n for n, _ in out):
            raise SystemExit(f"--also {v}: the label {label!r} is given twice; name each module (PATH=LABEL)")
        out.append((name, path))
    return out


def with_also(provs: dict[str, Any], also: list[tuple[str, Any]]) -> dict[str, Any]:
    """``provs`` with the ``also`` providers (name, make_call) right after ``evo (ours)`` (first if absent)."""
    names = list(provs)
    at = names.index("evo (ours)") + 1 if "evo (ours)" in names else 0
    order = names[:at] + [n for n, _ in also] + names[at:]
    merged = dict(provs) | dict(also)
    return {n: merged[n] for n in order}


def providers(module: Any | None) -> dict[str, Callable[[Any, Any], Callable[[], Any]]]:
    """name -> make_call(x, w) -> zero-argument call. Missing packages give a raising factory."""
    import torch
    import torch.nn.functional as F

    out: dict[str, Callable[[Any, Any], Callable[[], Any]]] = {}

    def missing(exc: BaseException) -> Callable[[Any, Any], Callable[[], Any]]:
        def f(x: Any, w: Any) -> Callable[[], Any]:
            raise exc
        f.load_error = exc  # type: ignore[attr-defined]
        return f

    if module is not None:
        out["evo (ours)"] = module_call(module)

    def eager(x: Any, w: Any) -> Any:
        return F.rms_norm(x, (x.shape[-1],), w, eps=EPS)

    def cast_once(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Callable[[], Any]]:
        def make(x: Any, w: Any) -> Callable[[], Any]:
            wt = w.to(x.dtype)  # torch wants the weight in the input's dtype; cast outside the timed call
            return lambda: fn(x, wt)
        return make

    out["torch"] = cast_once(eager)
    _allow_recompiles(torch)
    compiled = torch.compile(eager, dynamic=False)
    out["torch.compile"] = cast_once(compiled)
    # the same operation as ours and QuACK's: float32 weights (torch.compile fuses the mixed
    # dtypes; 16-bit weights halve the weight bytes every row reads)
    compiled_w32 = torch.compile(eager, dynamic=False)
    out["torch.compile fp32 w"] = lambda x, w: (lambda: compiled_w32(x, w))
    try:
        liger = importlib.import_module("liger_kernel.transformers.rms_norm")

        def liger_call(x: Any, w: Any) -> Callable[[], Any]:
            mod = liger.LigerRMSNorm(x.shape[-1], eps=EPS).to(x.device, x.dtype)
            with torch.no_grad():
                mod.weight.copy_(w.to(x.dtype))
            return lambda: mod(x)
        out["liger"] = liger_call
    except Exception as e:  # noqa: BLE001
        out["liger"] = missing(e)
    try:
        quack = importlib.import_module("quack.rmsnorm")
        out["quack"] = lambda x, w: (lambda: quack.rmsnorm_fwd(x, w, eps=EPS))
        tuned = getattr(quack, "rmsnorm_fwd_tuned", None)
        if tuned is None:
            raise AttributeError("quack.rmsnorm has no rmsnorm_fwd_tuned")
        def tuned_call(x: Any, w: Any) -> Callable[[], Any]:
            y = torch.empty_like(x)  # the tuned entry writes into a given output
            return lambda: tuned(x, w, out=y, eps=EPS)
        out["quack tuned"] = tuned_call
    except Exception as e:  # noqa: BLE001
        out.setdefault("quack", missing(e))
        out["quack tuned"] = missing(e)
    return out


def _allow_recompiles(torch: Any) -> None:
    """One torch.compile specialisation per case (33 forward, 9 backward), not dynamo's default
    limit of 8, past which it silently runs the function eagerly."""
    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)


def providers_backward(module: Any | None) -> dict[str, Callable[..., Callable[[], Any]]]:
    """name -> make_call(x, w, dy, rstd) for the backward (dx and dw); w and rstd are float32."""
    import torch

    from examples.rmsnorm_h100 import rmsnorm_backward_torch

    out: dict[str, Callable[..., Callable[[], Any]]] = {}
    if module is not None:
        out["evo (ours)"] = module_call(module, backward=True)
    out["torch"] = lambda x, w, dy, rstd: (lambda: rmsnorm_backward_torch(x, w, dy, rstd))
    _allow_recompiles(torch)
    compiled = torch.compile(rmsnorm_backward_torch, dynamic=False)
    out["torch.compile"] = lambda x, w, dy, rstd: (lambda: compiled(x, w, dy, rstd))
    try:
        quack = importlib.import_module("quack.rmsnorm")
        out["quack"] = lambda x, w, dy, rstd: (lambda: quack.rmsnorm_bwd(x, w, dy, rstd))
    except Exception as e:  # noqa: BLE001

        def missing(*_a: Any, exc: BaseException = e) -> Callable[[], Any]:
            raise exc
        missing.load_error = e  # type: ignore[attr-defined]
        out["quack"] = missing
    return out


def load_module(args: argparse.Namespace) -> Any | None:
    path = args.module
    if path is None and args.archive:
        from archive import Archive
        from evo.export import export_module
        from examples.rmsnorm_problem import make_backward_problem, make_forward_problem

        prob = make_backward_problem() if args.backward else make_forward_problem()
        arch = Archive(prob, args.archive)
        try:
            path = export_module(arch, prob, Path(args.archive).with_suffix(".dispatch.py"))
        finally:
            arch.close()
    if path is None:
        return None
    return import_dispatch(path)


def import_dispatch(path: str | Path) -> Any:
    """The dispatch module at ``path`` (written by :func:`evo.export.export_module`), imported.

    A path ending in ``.xz`` is read through :mod:`lzma` (how ``benchmarks/results`` keeps the
    modules its tables were timed with), so such a table can be re-timed without unpacking.

    Each call gives a module of its own (its own kernels and workspaces), so two modules, or
    one twice (``--also``), can be timed in one run. The example's exports end by registering
    the torch op ``evo_rmsnorm::fwd``, which torch refuses a second time in one process; the
    benchmark calls ``run()`` alone, so a module whose only failure is that registration is
    kept (a note on stderr says so).
    """
    path = Path(path)
    if path.suffix == ".xz":
        import lzma

        if not path.is_file():
            raise FileNotFoundError(f"no dispatch module at {path}")
        spec = importlib.machinery.ModuleSpec("evo_rmsnorm_dispatch", None, origin=str(path))
        mod = importlib.util.module_from_spec(spec)
        mod.__file__ = str(path)
        code = compile(lzma.decompress(path.read_bytes()).decode("utf-8"), str(path), "exec")

        def load() -> None:
            exec(code, mod.__dict__)
    else:
        spec = importlib.util.spec_from_file_location("evo_rmsnorm_dispatch", path)
        mod = importlib.util.module_from_spec(spec)

        def load() -> None:
            spec.loader.exec_module(mod)
    sys.modules[spec.name] = mod
    try:
        load()
    except RuntimeError as e:
        if "multiple times" not in str(e) or not callable(getattr(mod, "run", None)):
            raise
        print(f"rmsnorm_peers: {path}: its torch op was registered by a module imported before it "
              f"({str(e).splitlines()[0][:160]}); timing it through run()", file=sys.stderr)
    return mod


def check_required(provs: dict[str, Any], require: str) -> None:
    """Stop before timing anything if a provider named in ``require`` (comma list, or ``all``)
    did not load (its ``load_error``): a run meant to compare against QuACK should not spend
    the device's minutes on a table whose QuACK column says FAILED.

    Raises:
        SystemExit: A required provider failed to load (the message gives its error), or a name
            that is no provider.
    """
    names = list(provs) if require.strip() == "all" else [t.strip() for t in require.split(",") if t.strip()]
    unknown = [n for n in names if n not in provs]
    if unknown:
        raise SystemExit(f"--require: no provider named {', '.join(map(repr, unknown))}; "
                         f"the providers are {', '.join(map(repr, provs))}")
    failed = {n: getattr(provs[n], "load_error", None) for n in names}
    failed = {n: e for n, e in failed.items() if e is not None}
    if failed:
        raise SystemExit("--require: " + "; ".join(f"{n!r} did not load ({type(e).__name__}: {e})"
                                                   for n, e in failed.items())
                         + ". Install it (or put its unpacked wheels on PYTHONPATH) and run again; "
                         "nothing was timed")


def skip_providers(provs: dict[str, Any], skip: str) -> tuple[dict[str, Any], list[str]]:
    """``provs`` without the comma-separated names in ``skip``, and those names (for the table's header).

    Raises:
        SystemExit: A name that is no provider (a typo would otherwise time everything).
    """
    names = [t.strip() for t in skip.split(",") if t.strip()]
    unknown = [n for n in names if n not in provs]
    if unknown:
        raise SystemExit(f"--skip: no provider named {', '.join(map(repr, unknown))}; "
                         f"the providers are {', '.join(map(repr, provs))}")
    return {k: v for k, v in provs.items() if k not in names}, names


def summary(times: dict[tuple[str, int, str], float | None], names: list[str], ours: str = "evo (ours)") -> list[str]:
    """Markdown lines comparing ``ours`` with every other provider, from the run's medians.

    Args:
        times: ``(dtype, N, provider) -> median ms`` (None: the provider failed there).
        names: The providers in table order (``ours`` among them).
        ours: The provider compared.

    Returns:
        One table per dtype: for each peer, its time over ours per N (above 1: ours faster;
        ``F``: the peer failed; ``-``: ours failed), then the fastest peer over ours, then
        the other modules of ours (``--also``, named ``evo (...)``), which are not peers; and
        a line counting the cases where ours is faster than every peer that ran. Empty when
        ``ours`` did not run.
    """
    if ours not in names:
        return []
    mods = [n for n in names if n != ours and n.startswith(EVO_PREFIX)]
    peers = [n for n in names if n != ours and n not in mods]
    cases = sorted({(d, n) for d, n, _ in times}, key=lambda c: (c[0], c[1]))
    if not cases or not peers:
        return []
    out = ["", f"Peer's time / {ours}'s time (above 1: ours faster; F: the peer failed; -: ours failed).", ""]
    wins = 0
    for dtype in sorted({d for d, _ in cases}):
        ns = [n for d, n in cases if d == dtype]
        out += [f"| {dtype} | " + " | ".join(str(n) for n in ns) + " |", "|---" * (len(ns) + 1) + "|"]
        fastest: list[str] = []
        rows: dict[str, list[str]] = {p: [] for p in peers + mods}
        for n in ns:
            mine = times.get((dtype, n, ours))
            for p in peers + mods:
                t = times.get((dtype, n, p))
                rows[p].append("F" if t is None else ("-" if mine is None else f"{t / mine:.3f}"))
            ran = [times.get((dtype, n, p)) for p in peers]
            ok = [t for t in ran if t is not None]
            if mine is None:
                fastest.append("-")
            elif not ok:
                fastest.append("F")
                wins += 1
            else:
                fastest.append(f"{min(ok) / mine:.3f}")
                wins += min(ok) > mine
        out += [f"| {p} | " + " | ".join(rows[p]) + " |" for p in peers]
        out += ["| **fastest peer** | " + " | ".join(f"**{v}**" for v in fastest) + " |"]
        out += [f"| {p} (not a peer) | " + " | ".join(rows[p]) + " |" for p in mods] + [""]
    out.append(f"{ours} is faster than every peer that ran on {wins} of {len(cases)} cases.")
    return out


def copy_floor(n: int) -> float:
    """The target fraction of copy bandwidth for rows of ``n`` elements (:data:`COPY_FLOORS`;
    between two listed lengths the shorter one's floor; 97% from 8K up)."""
    if n >= 8192:
        return COPY_FLOOR_LONG
    listed = [k for k in sorted(COPY_FLOORS) if k <= n]
    return COPY_FLOORS[listed[-1]] if listed else 0.0


def floor_lines(copy: dict[tuple[str, int], float | None], ours: str = "evo (ours)") -> list[str]:
    """Markdown lines checking ``ours`` against the copy floors: how many cases meet theirs, and
    each case that does not, by how many points of copy bandwidth (or that ours failed there).

    Args:
        copy: ``(dtype, N) -> fraction of the copy ceiling`` ours reached (None: ours failed).
        ours: The provider's name in the text.

    Returns:
        The lines (empty when ``copy`` is).
    """
    if not copy:
        return []
    floors = ", ".join(f"{round(100 * v)}% at {k if k < 1024 else f'{k // 1024}K'}" for k, v in sorted(COPY_FLOORS.items()))
    short: list[str] = []
    for (dtype, n), frac in sorted(copy.items()):  # keys are unique: values never compared
        want = copy_floor(n)
        if frac is None:
            short.append(f"{dtype} N={n}: {ours} failed (floor {100 * want:.0f}%)")
        elif frac < want - 1e-9:
            short.append(f"{dtype} N={n}: {100 * frac:.1f}% of copy, floor {100 * want:.0f}%, "
                         f"short by {100 * (want - frac):.1f} points")
    met = len(copy) - len(short)
    out = ["", f"Copy floors ({floors}, {100 * COPY_FLOOR_LONG:.0f}% from 8K up): {ours} meets its floor on "
           f"{met} of {len(copy)} cases" + ("." if not short else "; short:")]
    out += [f"- {line}" for line in short]
    return out


_ROW = re.compile(r"^\| (\d+)x(\d+) (\w+) \| (.*) \|\s*$")


@dataclass
class PeerTable:
    """A peers table read back from its Markdown file (what ``--resume`` continues).

    Attributes:
        head: The lines before the table (title, machine, copy ceilings).
        names: The provider columns, in order.
        rows: The case rows as written, in order.
        times: ``(dtype, N, provider) -> median ms`` (None where the provider failed).
        copy: ``(dtype, N, provider) -> fraction of copy`` as the cell shows it (whole percent;
            None where the provider failed).
    """

    head: list[str]
    names: list[str]
    rows: list[str]
    times: dict[tuple[str, int, str], float | None]
    copy: dict[tuple[str, int, str], float | None] = field(default_factory=dict)

    def done(self) -> set[tuple[str, int]]:
        """The ``(dtype, N)`` cases that have a row."""
        return {(d, n) for d, n, _ in self.times}


def parse_table(text: str) -> PeerTable:
    """Read a table written by this benchmark (rows, times, header; the summary is dropped).

    Raises:
        ValueError: The text holds no table of this benchmark, or a row has a different
            number of cells than the header has providers (the message says which).
    """
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("| case | "))
    except StopIteration:
        raise ValueError("no peers table in it (no '| case | ...' header line)") from None
    names = [c.strip() for c in lines[start].strip().strip("|").split("|")][1:]
    rows: list[str] = []
    times: dict[tuple[str, int, str], float | None] = {}
    copy: dict[tuple[str, int, str], float | None] = {}
    for line in lines[start + 2:]:
        m = _ROW.match(line)
        if m is None:
            if line.strip():
                break  # the summary (or anything else) ends the table
            continue
        cells = [c.strip() for c in m.group(4).split("|")]
        if len(cells) != len(names):
            raise ValueError(f"row {line[:60]!r} has {len(cells)} cells for {len(names)} providers")
        n, dtype = int(m.group(2)), m.group(3)
        for name, cell in zip(names, cells, strict=True):
            failed = cell.startswith("FAILED")
            times[(dtype, n, name)] = None if failed else float(cell.split("/")[0])
            pct = None if failed else re.search(r"/\s*([\d.]+)%", cell)
            copy[(dtype, n, name)] = None if pct is None else float(pct.group(1)) / 100
        rows.append(line)
    return PeerTable(lines[:start], names, rows, times, copy)


def table_gpu(table: PeerTable) -> str | None:
    """The GPU a table's first run timed on (its head's ``Machine:`` line), if it names one."""
    for line in table.head:
        m = re.match(r"Machine: (.+?)(?:, |\. |$)", line)
        if m:
            return m.group(1).strip()
    return None


def resume_table(path: Path, names: list[str], gpu: str | None = None) -> PeerTable | None:
    """The table to continue at ``path`` (None when there is no file), checked against ``names``
    and, when given, against ``gpu`` (this run's device name).

    Raises:
        SystemExit: The file holds no table of this benchmark, other providers, or rows timed on
            another GPU (its rows could not be compared with new ones); the message says what to do.
    """
    if not path.exists():
        return None
    try:
        table = parse_table(path.read_text())
    except ValueError as e:
        raise SystemExit(f"--resume: {path}: {e}; pass another --out, or leave out --resume to start afresh") from None
    if table.names != names:
        raise SystemExit(f"--resume: {path} has the providers {table.names}, this run {names}; "
                         "pass the same --skip as the run that wrote it, or another --out")
    before = table_gpu(table)
    if gpu is not None and before is not None and before != gpu:
        raise SystemExit(f"--resume: {path} was timed on {before}, this run is on {gpu}; its rows and new ones "
                         "would not compare: pass another --out, or resume on the same GPU")
    return table


def table_start(head: list[str], prior: PeerTable | None, names: list[str], copy_tbs: float) -> list[str]:
    """The lines a run writes before its first new row: ``head`` (this run's title, machine
    and copy ceiling) and the table header; or (``--resume``) the earlier file's head, a line
    saying where the later rows start and what copy ceiling they are against, the table
    header and the earlier rows."""
    lines = [*(head if prior is None else prior.head)]
    if prior is not None:
        while lines and not lines[-1].strip():
            lines.pop()
        lines += [f"Resumed {datetime.datetime.now().isoformat(timespec='minutes')}: the rows after the first "
                  f"{len(prior.rows)} were timed by a later invocation, copy ceiling {copy_tbs:.3f} TB/s "
                  "(their % copy is against it).", ""]
    lines.append("| case | " + " | ".join(names) + " |")
    lines.append("|---" * (len(names) + 1) + "|")
    if prior is not None:
        lines += prior.rows
    return lines


def pending_cases(dtypes: list[str], shapes: list[tuple[int, int]],
                  prior: PeerTable | None) -> list[tuple[str, int, int]]:
    """``(dtype, M, N)`` of the cases to time, in table order: all, or those ``prior`` lacks."""
    done = prior.done() if prior is not None else set()
    return [(dtype, m, n) for dtype in dtypes for m, n in shapes if (dtype, n) not in done]


def timing_order(names: list[str], case_index: int, round_index: int = 0) -> list[str]:
    """The order in which one case's providers are timed: the table order rotated by the case's
    index in the full case list plus the round, so each provider is timed first in some cases
    and no one of them always carries whatever the first timing of a case costs (on the H100 the
    first provider timed on a case's fresh buffers ran 1.5-3% slow, twenty-first and
    twenty-second sessions; ours used to be first in every case)."""
    if not names:
        return []
    k = (case_index + round_index) % len(names)
    return names[k:] + names[:k]


def combine_rounds(results: list[tuple[float, float]]) -> tuple[float, float]:
    """One provider's ``(ms, spread)`` over its rounds on a case: the median of the rounds'
    medians, and as spread the larger of the worst round's spread and the rounds' range over
    that median (one round: its own figures).

    Raises:
        ValueError: ``results`` is empty.
    """
    if not results:
        raise ValueError("combine_rounds needs at least one round's result")
    ms = [r[0] for r in results]
    med = statistics.median(ms)
    spread = max(r[1] for r in results)
    if len(ms) > 1 and med > 0:
        spread = max(spread, (max(ms) - min(ms)) / med)
    return med, spread


def untimed_lines(left: list[tuple[str, int, int]], limit: float | None) -> list[str]:
    """The note a run that ``--time-limit`` stopped writes under its rows: the cases of the
    matrix it did not time, so a partial table says what it lacks (``--resume`` times them).
    Empty when nothing is left."""
    if not left:
        return []
    names = ", ".join(f"{m}x{n} {dtype}" for dtype, m, n in left)
    return ["", f"Not timed: --time-limit {limit:g} s stopped the run before {len(left)} "
            f"case{'s' if len(left) != 1 else ''}: {names}. Run again with --resume to time them."]


def copy_timing(nbytes: int, piece: int = 0) -> dict[str, Any]:
    """The device-to-device copy rate of an ``nbytes`` buffer (TB/s, read plus write), timed like
    the providers (:func:`fitness.time_calls`) but issued call by call: a memcpy recorded in a CUDA
    graph may run on a copy engine, slower than the kernel copy the fitness worker measures.

    Returns:
        ``bytes``, ``copy_tbs``, ``copy_spread`` and ``piece``; with ``0 < piece < nbytes`` also
        ``pieces_tbs``: the same two buffers copied in pieces of ``piece`` bytes, call by call.

    Raises:
        ValueError: ``nbytes`` or ``piece`` is not a whole number of float32 words.
    """
    if nbytes <= 0 or nbytes % 4 or piece % 4:
        raise ValueError(f"copy of {nbytes} bytes in pieces of {piece}: give positive multiples of 4 bytes")
    import torch

    from fitness import time_calls

    src = torch.empty(nbytes // 4, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    whole = time_calls([lambda: dst.copy_(src)], use_graph=False)
    out: dict[str, Any] = {"bytes": nbytes, "copy_tbs": 2 * nbytes / (whole.time_ms * 1e-3) / 1e12,
                           "copy_spread": whole.spread, "piece": piece or nbytes}
    if 0 < piece < nbytes:
        step = piece // 4

        def pieces() -> None:
            for o in range(0, src.numel(), step):
                dst[o:o + step].copy_(src[o:o + step])
        out["pieces_tbs"] = 2 * nbytes / (time_calls([pieces], use_graph=False).time_ms * 1e-3) / 1e12
    return out


def copy_ceiling_tbs() -> float:
    """The copy rate of a 2 GiB buffer (:func:`copy_timing`): every "% copy" of these benchmarks."""
    return copy_timing(1 << 31)["copy_tbs"]


def input_sets(dtype: str, m: int, n: int, l2: int, arrays: int) -> list[Any]:
    """Random M x N inputs of ``dtype`` on the GPU, as many sets as :func:`fitness.rotation_sets`
    asks for so that one round of calls exceeds 3x L2, a set holding ``arrays`` such arrays (x and
    y: 2) and all of them at most 40% of the free memory."""
    import torch

    from fitness import rotation_sets

    dt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    per_set = arrays * m * n * (torch.finfo(dt).bits // 8)
    sets = rotation_sets(l2, per_set, most=16, fit=int(0.4 * torch.cuda.mem_get_info()[0] // per_set))
    return [torch.randn(m, n, device="cuda", dtype=dt) for _ in range(sets)]


def time_rounds(names: list[str], timer: Callable[[str], tuple[float, float]], case_index: int, rounds: int,
                label: str, recover: Callable[[], Any]) -> tuple[dict[str, list[tuple[float, float]]], dict[str, str]]:
    """``timer(name)`` ((ms, spread)) for every name, ``rounds`` times, each round in :func:`timing_order`.

    A name whose timer raises is timed no more: its error class goes into the second dict, the
    message (with ``label``, e.g. the case) to stderr, and ``recover`` runs (a device sync, so
    the next name does not inherit the error; if that raises too, the context is poisoned and
    every later timing fails on its own). Returns (name -> its rounds' results, name -> error).
    """
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    failed: dict[str, str] = {}
    for r in range(rounds):
        for name in timing_order(names, case_index, r):
            if name in failed:
                continue
            try:
                results[name].append(timer(name))
            except Exception as e:  # noqa: BLE001 - shown, never dropped
                failed[name] = type(e).__name__
                print(f"  {name} {label}: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
                try:
                    recover()
                except Exception:  # noqa: BLE001 - a poisoned context fails every later timing too
                    pass
    return results, failed


def fastest(rounds: dict[str, list[tuple[float, float]]]) -> str:
    """The candidate with the lowest median over its rounds (:func:`combine_rounds`); ties: the first."""
    if not rounds:
        raise ValueError("fastest: no candidate was timed")
    return min(rounds, key=lambda name: combine_rounds(rounds[name])[0])


def confirm_line(case: str, ids: list[str], rounds: dict[str, list[tuple[float, float]]],
                 search_ms: dict[str, float], chosen: str) -> str:
    """One Markdown row of the confirmation table: each candidate's search time and time here."""
    cells = []
    for gid in ids:
        if gid not in rounds:
            cells.append(f"`{gid[:12]}` FAILED")
            continue
        ms, spread = combine_rounds(rounds[gid])
        mark = "**" if gid == chosen else ""
        cells.append(f"{mark}`{gid[:12]}` {ms:.4f} (±{100 * spread:.1f}%; search {search_ms[gid]:.4f}){mark}")
    return f"| {case} | " + " | ".join(cells) + " |"


def open_forward_archive(path: str, problem_name: str) -> Any:
    """The archive at ``path``, read-only (``--confirm`` writes nothing into it), after checking
    that it holds records of the forward Problem ``problem_name``."""
    from archive import Archive

    arch = Archive.open_readonly(path)
    name = arch.header.get("problem", {}).get("name")
    if name != problem_name:
        arch.close()
        raise SystemExit(f"--confirm: {path} holds records of problem {name!r}, not {problem_name!r} "
                         "(give the archive of a forward search, examples/rmsnorm_h100.py without --backward)")
    return arch


def export_candidates(source: Any, prob: Any, k: int, cand_dir: Path, binaries: bool = True,
                      within: float = CONFIRM_WITHIN) -> tuple[dict[str, list[Any]], dict[str, Path]]:
    """``--confirm``'s candidates: :func:`evo.export.top_per_case` (at most ``k`` per case, within
    ``within`` of the case's fastest) and one dispatch module per distinct candidate genome in
    ``cand_dir`` (genome id -> path)."""
    from evo.export import export_module, top_per_case

    top = top_per_case(source, prob, k=k, within=within)
    paths: dict[str, Path] = {}
    for recs in top.values():
        for rec in recs:
            if rec.genome.id not in paths:
                paths[rec.genome.id] = export_module([rec], prob, cand_dir / f"cand_{rec.genome.id[:16]}.py",
                                                     binaries=binaries)
    return top, paths


def device_line(searched: Any, here: str) -> str:
    """The confirmation table's line on devices: where the archive's search ran (its header's
    ``device``) and where the candidates are re-timed; a warning when they differ."""
    name = searched.get("name") if isinstance(searched, dict) else None
    if not name:
        return f"Search device: not recorded in the archive; timed here on {here}."
    if name != here:
        return (f"Search device: {name}; timed here on **{here}**, another device: the search's ms are "
                "that device's, and its order of close genomes need not hold here.")
    return f"Search device: {name}, as here."


def confirmed_path(archive_path: str) -> Path:
    """Where ``--confirm`` writes the module of its winners: ``<archive>.confirmed.dispatch.py``."""
    return Path(archive_path).with_suffix(".confirmed.dispatch.py")


def confirm_choices(archive_path: str, k: int, cases: list[tuple[str, int, int]], out: Path, warmup_ms: float,
                    rounds: int, l2: int, within: float = CONFIRM_WITHIN) -> Path:
    """Re-time the ``k`` fastest genomes of each case here and export the winners; returns the module's path.

    Each distinct candidate genome is exported to its own module under ``<archive>.candidates/``
    (cubins built as the gate builds them, through the compile cache); the candidates of a case
    are timed ``rounds`` times in rotated order on the same L2-cold input sets, and the one with
    the lowest median wins. The table of candidates goes to ``<out>.confirm.md``.
    """
    import torch

    from evo.export import export_module
    from evo.types import Case
    from examples.rmsnorm_problem import make_forward_problem

    prob = make_forward_problem()
    arch = open_forward_archive(archive_path, prob.name)
    try:
        top, paths = export_candidates(arch, prob, k, Path(archive_path).with_suffix(".candidates"), within=within)
        calls = {gid: holding(module_call(import_dispatch(path))) for gid, path in paths.items()}
        lines = [f"# --confirm {k}: the archive's fastest genomes per case re-timed side by side", "",
                 f"Archive {archive_path}; candidates within {100 * within:g}% of the case's fastest search "
                 f"time, at most {k}; {rounds} round(s), {warmup_ms:g} ms of warm-up each; ms (spread; the "
                 "search's ms). Bold: dispatched.",
                 device_line(arch.header.get("device"), torch.cuda.get_device_name()), "",
                 "| case | candidates |", "|---|---|"]
        choices = {}
        for i, (dtype, m, n) in enumerate(cases):
            key = Case({"M": m, "N": n}, dtype).key
            recs = top.get(key, [])
            if len(recs) < 2:
                continue
            by_id = {r.genome.id: r for r in recs}
            xs = input_sets(dtype, m, n, l2, 2)
            w = torch.randn(n, device="cuda", dtype=torch.float32)
            results, failed = time_rounds(list(by_id), lambda gid, xs=xs, w=w: bench(calls[gid], xs, w, warmup_ms), i, rounds,
                                          f"(a --confirm candidate) on {key}", torch.cuda.synchronize)
            timed = {gid: res for gid, res in results.items() if gid not in failed}  # a failed one is not chosen
            if timed:
                win = fastest(timed)
                choices[key] = by_id[win]
                search = {g: float(by_id[g].evaluation.metrics["cases"][key]["time_ms"]) for g in by_id}
                row = confirm_line(key, list(by_id), timed, search, win)
                lines.append(row)
                print(row, flush=True)
            xs = None
            torch.cuda.empty_cache()
        conf = out.with_suffix(".confirm.md")
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text("\n".join(lines) + "\n")
        return export_module(arch, prob, confirmed_path(archive_path), choices=choices)
    finally:
        arch.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="RMSNorm forward peers benchmark (H100/H200)")
    ap.add_argument("--module", help="dispatch module exported by examples/rmsnorm_h100.py (or its .xz)")
    ap.add_argument("--archive", help="archive to export the best genomes from (if no --module)")
    ap.add_argument("--shapes", default="all", help="'all' or a comma list of N values")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rmsnorm_peers.md"))
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma list of dtypes")
    ap.add_argument("--backward", action="store_true",
                    help="time the backward (dx, dw) on the backward Problem's timed shapes instead")
    ap.add_argument("--skip", default="", help="comma list of providers to leave out (e.g. 'quack tuned', "
                    "whose autotuning takes minutes per case)")
    ap.add_argument("--require", default="", help="comma list of providers (or 'all') that must load: "
                    "stop before timing if one did not (default: a peer that fails is shown as FAILED)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows already in --out (same providers) and time only the missing cases")
    ap.add_argument("--warmup-ms", type=float, default=WARMUP_MS,
                    help="warm-up of each provider on each case before its timed batches (ms)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every provider this many times per case, each round in a rotated order; "
                    "a cell is the median of the rounds (spread: its range too)")
    ap.add_argument("--time-limit", type=float, default=None, metavar="S",
                    help="start no new case after S seconds; the summary covers the rows written")
    ap.add_argument("--confirm", type=int, default=0, metavar="K",
                    help="(forward, with --archive) re-time the archive's K fastest genomes of each case side by "
                    "side first and dispatch the winners (<archive>.confirmed.dispatch.py)")
    ap.add_argument("--also", action="append", default=[], metavar="PATH[=LABEL]",
                    help="another dispatch module timed beside ours as 'evo (LABEL)' (repeatable; not a peer in "
                    "the summary): e.g. two runs' exports side by side, or --module's own path again (with "
                    "--confirm: <archive>.confirmed.dispatch.py, before it exists) to see how far ours moves "
                    "within one run")
    ap.add_argument("--confirm-rounds", type=int, default=None, metavar="R",
                    help="rounds of --confirm's timings (default: --rounds); the candidates of a case are often "
                    "closer together than the peers, so they may need more rounds than the table")
    ap.add_argument("--confirm-within", type=float, default=None, metavar="F",
                    help=f"--confirm's pool: genomes within this fraction of a case's fastest search time (default "
                    f"{CONFIRM_WITHIN:g}); widen it when the archive was searched on another device")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be 1 or more (got {args.rounds})")
    if args.confirm_rounds is not None:
        if not args.confirm:
            ap.error("--confirm-rounds sets the rounds of --confirm: give --confirm K too")
        if args.confirm_rounds < 1:
            ap.error(f"--confirm-rounds must be 1 or more (got {args.confirm_rounds})")
    if args.confirm_within is not None:
        if not args.confirm:
            ap.error("--confirm-within sets the pool of --confirm: give --confirm K too")
        if not args.confirm_within >= 0:
            ap.error(f"--confirm-within must be a fraction >= 0 (got {args.confirm_within})")
    if args.confirm:
        if args.confirm < 2:
            ap.error(f"--confirm needs 2 or more candidates per case (got {args.confirm})")
        if not args.archive or args.module:
            ap.error("--confirm re-times the genomes of an archive: give --archive (and no --module)")
        if args.backward:
            ap.error("--confirm times forward genomes only (leave out --backward)")
        if args.resume:
            ap.error("--confirm chooses the genomes the table times: it cannot --resume a table timed with others")
    also = parse_also(args.also, confirmed_path(args.archive) if args.confirm else None)
    started = time.monotonic()
    import torch

    if not torch.cuda.is_available():
        print("rmsnorm_peers: no CUDA device", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    all_shapes = SHAPES
    if args.backward:
        from examples.rmsnorm_problem import make_backward_problem

        all_shapes = [(s["M"], s["N"]) for s in make_backward_problem().timed_shapes]
    shapes = all_shapes if args.shapes == "all" else [s for s in all_shapes if str(s[1]) in args.shapes.split(",")]
    if args.confirm:
        args.module = str(confirm_choices(args.archive, args.confirm, pending_cases(args.dtypes.split(","), shapes, None),
                                          Path(args.out), args.warmup_ms,
                                          args.rounds if args.confirm_rounds is None else args.confirm_rounds, l2,
                                          CONFIRM_WITHIN if args.confirm_within is None else args.confirm_within))
        print(f"confirmed module: {args.module}", flush=True)
    module = load_module(args)
    provs: dict[str, Any] = providers_backward(module) if args.backward else providers(module)
    provs = with_also(provs, [(name, module_call(import_dispatch(path), args.backward)) for name, path in also])
    provs, skipped = skip_providers(provs, args.skip)
    check_required(provs, args.require)
    provs = {name: holding(make) for name, make in provs.items()}  # outputs rotate with the inputs
    out = Path(args.out)
    prior = resume_table(out, list(provs), props.name) if args.resume else None  # checked before any timing

    from fitness import time_calls

    copy_tbs = copy_ceiling_tbs()

    what = "backward (dx, dw)" if args.backward else "forward"
    lines = [f"# RMSNorm {what} peers ({datetime.date.today().isoformat()})", "",
             f"Machine: {props.name}, {props.multi_processor_count} SMs, L2 {l2 >> 20} MiB; host "
             f"{platform.node()}; torch {torch.__version__}; python {platform.python_version()}.",
             f"Copy ceiling (D2D, same method): {copy_tbs:.3f} TB/s. Cells: ms / TB/s / % of copy "
             f"(spread); median over CUDA-graph batches of L2-cold rotated calls (fitness.time_calls) after {args.warmup_ms:g} "
             "ms of warm-up; providers timed in an order rotated from case to case"
             + (f", {args.rounds} rounds per case (cell: median of the rounds; spread: the larger of a round's and "
                "the rounds' range)" if args.rounds > 1 else "") + ". "
             + ("Bytes: 3*M*N*elem + 4*M + 8*N." if args.backward else "Bytes: 2*M*N*elem + 4*N.")
             + (f" Not timed in this run (--skip): {', '.join(skipped)}." if skipped else ""), ""]
    names = list(provs)
    times: dict[tuple[str, int, str], float | None] = dict(prior.times) if prior is not None else {}
    copy: dict[tuple[str, int, str], float | None] = dict(prior.copy) if prior is not None else {}
    lines = table_start(lines, prior, names, copy_tbs)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")  # rows are appended as they are measured
    print("\n".join(lines), flush=True)
    todo = pending_cases(args.dtypes.split(","), shapes, prior)
    # the order of a case's providers depends on the case alone, so a resumed run keeps it
    case_index = {c: i for i, c in enumerate(pending_cases(args.dtypes.split(","), all_shapes, None))}
    left = len(todo)
    for i, (dtype, m, n) in enumerate(todo):
        if args.time_limit is not None and time.monotonic() - started > args.time_limit:
            print(f"stopped by --time-limit {args.time_limit:g} s with {left} of {len(todo)} cases left; "
                  "run again with --resume to time them", flush=True)
            untimed = untimed_lines(todo[i:], args.time_limit)
            print("\n".join(untimed), flush=True)
            with out.open("a") as fh:  # the table says what it lacks; --resume reads only the rows
                fh.write("\n".join(untimed) + "\n")
            break
        left -= 1
        xs = input_sets(dtype, m, n, l2, 3 if args.backward else 2)  # x + y, or x + dy + dx per set
        elem = xs[0].element_size()
        w = torch.randn(n, device="cuda", dtype=torch.float32)
        dys = rstds = None
        if args.backward:
            dys = [torch.randn(m, n, device="cuda", dtype=x.dtype) for x in xs]
            rstds = [torch.rsqrt(x.float().pow(2).mean(dim=1) + EPS) for x in xs]
            nbytes = 3 * m * n * elem + 4 * m + 8 * n
        else:
            nbytes = 2 * m * n * elem + 4 * n

        def timer(name: str, xs: Any = xs, w: Any = w, dys: Any = dys, rstds: Any = rstds) -> tuple[float, float]:
            if args.backward:
                res = time_calls([provs[name](x, w, dy, rs) for x, dy, rs in zip(xs, dys, rstds, strict=True)],
                                 warmup_ms=args.warmup_ms)
                return res.time_ms, res.spread
            return bench(provs[name], xs, w, args.warmup_ms)

        rounds, failed = time_rounds(names, timer, case_index[(dtype, m, n)], args.rounds, f"on {m}x{n} {dtype}",
                                     torch.cuda.synchronize)
        cells = []
        for name in names:
            if name in failed:
                times[(dtype, n, name)] = copy[(dtype, n, name)] = None
                cells.append(f"FAILED {failed[name]}")
                continue
            ms, spread = combine_rounds(rounds[name])
            tbs = nbytes / (ms * 1e-3) / 1e12
            times[(dtype, n, name)] = ms
            copy[(dtype, n, name)] = tbs / copy_tbs
            cells.append(f"{ms:.4f} / {tbs:.2f} / {100 * tbs / copy_tbs:.0f}% (±{100 * spread:.1f}%)")
        row = f"| {m}x{n} {dtype} | " + " | ".join(cells) + " |"
        print(row, flush=True)
        with out.open("a") as fh:  # a run cut short keeps every finished row
            fh.write(row + "\n")
        xs = dys = rstds = timer = None  # free this case's buffers (timer holds them too) before the next
        torch.cuda.empty_cache()
    tail = summary(times, names)
    if not args.backward and "evo (ours)" in names:  # the floors are the forward's targets
        tail += floor_lines({(d, k): f for (d, k, name), f in copy.items() if name == "evo (ours)"})
    if tail:
        print("\n".join(tail))
        with out.open("a") as fh:
            fh.write("\n".join(tail) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    code = main()
    # The table is written and closed. On the H200 (sixteenth session) the process then stayed
    # alive for about a minute after its last line, with torch.compile's workers and the peers'
    # libraries loaded, until the device call's timeout killed it: leave without exit handlers.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
