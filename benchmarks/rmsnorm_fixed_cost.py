"""Fixed and per-row cost of the RMSNorm genomes: time over several M, fit ``time = a + b * M``.

A kernel that streams at the copy rate can still lose to a peer through what it costs per
call whatever the size: launch and ramp-up, the last rows' latency, and (backward) the
reduction of the per-CTA dw partials after the last CTA. Timing the same genome at several
row counts M (N fixed) and fitting a line separates the two: the slope is the streaming
cost (shown per 32,768 rows), the intercept the fixed cost per call.

Variants of a genome's source isolate parts of the fixed cost. They are edits made here,
for timing only; the engine never sees them:

* ``full``: the genome as exported;
* ``dtype-only``: only the timed dtype's path instantiated (the kernels carry all three in
  one cubin): the source built with ``DTYPE_CODE`` defined, as the gate builds a genome of
  ``DTYPE_BUILD`` 1 (``--vs '{"DTYPE_BUILD": 1}'`` times that genome itself); computes the
  same outputs, which the script checks bitwise against ``full``;
* ``no-reduce`` (backward): every CTA returns after taking its ticket, so nobody sums the
  partial rows (dw is wrong);
* ``no-sum`` (backward): the reducers wait for every partial row as in ``full`` but sum no
  column (dw is wrong): ``full`` minus ``no-sum`` is the summation, ``no-sum`` minus
  ``no-reduce`` the wait for the last CTA;
* ``no-dw`` (backward): every CTA returns before publishing its partial row (dw is wrong).
* ``no-w`` (forward): the float32 weights of every vector path are never loaded (1.0 stands for
  each; y is wrong; only the scalar head and tail of unaligned rows still read theirs):
  ``full`` minus ``no-w`` is what the weights' traffic costs (at long rows every row reads its
  weights again, from L2, two bytes of them per byte of 16-bit x);
* ``no-store`` (forward): y is stored only when a value has a NaN bit pattern no input gives,
  so the loads and arithmetic stay and the stores go (y is not written): the read side alone.

Timing a shape at one row count (``--rows`` with a single M, e.g. the standard 16384 rows at
N=131072) gives no line fit, only the times, e.g. ``--n 131072 --rows 16384 --variants
full,no-w,no-store``; the table then shows each variant's time and fraction of the copy
bandwidth measured in the same run.

Every variant is timed like the fitness Timing stage (:func:`fitness.time_calls`: L2-cold
rotated input sets, one output set per input set, CUDA-graph batches); ``--torch`` adds
torch.compile of the reference under the same method (outputs held per set, as in
``rmsnorm_peers.py``). Results: a table on stdout and ``--out`` (JSON).

    python benchmarks/rmsnorm_fixed_cost.py --module runs/rmsnorm_h100.dispatch.py --n 256 \\
        --variants full,dtype-only --torch
    python benchmarks/rmsnorm_fixed_cost.py --backward --module runs/rmsnorm_bwd_h100.dispatch.py \\
        --n 1024 --variants full,dtype-only,no-reduce,no-dw --torch
    python benchmarks/rmsnorm_fixed_cost.py --n 256 --params '{"STAGE": 4, "TPR": 16, "THREADS": 256, ...}'

``--params`` times a genome of the kernel family given by its knobs (the rest as in the
first seed) instead of a dispatch module's choice, e.g. a seed, without running a search.
``--vs '{"TREE": 8}'`` (repeatable) times the same genome with those knobs changed beside it, in
the same run and at every row count, e.g. two forms of the backward's dw reduction side by side:

    python benchmarks/rmsnorm_fixed_cost.py --backward --n 1024 --params '{"ALGO": 1, ...}' \\
        --variants full,no-reduce --vs '{"TREE": 8}' --vs '{"TREE": 4}'
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # rmsnorm_peers: the dispatch import, and --torch

import rmsnorm_peers  # noqa: E402

ROWS_32K = 32768
_ATTR_NON_PORTABLE_CLUSTER = 14  # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
VARIANTS = ("full", "dtype-only", "no-reduce", "no-sum", "no-dw", "no-w", "no-store")
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}

_PUBLISH = ("    if (use_smem) {\n        __syncthreads();\n        for (int j = plo + threadIdx.x; j < phi; j += THREADS) "
            "mine[j] = sdw[j];")
# backward variant -> (code it looks for, what replaces it, how the error names that code)
_EDITS = {
    "no-reduce": ("    if (t < T - K) return;\n", "    return;\n", "the reducers' 'if (t < T - K) return;'"),
    "no-sum": ("    for (int j0 = jlo; j0 < jhi; j0 += L) {\n", "    for (int j0 = jhi; j0 < jhi; j0 += L) {\n",
               "the reducers' column loop 'for (int j0 = jlo; j0 < jhi; j0 += L)'"),
    "no-dw": (_PUBLISH, "    return;\n" + _PUBLISH, "the publication of the partial row ('mine[j] = sdw[j]')"),
}
BACKWARD_ONLY = tuple(_EDITS)
_ST_V4 = ('    asm volatile(ST_OP ".v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.w[0]), "r"(v.w[1]), '
          '"r"(v.w[2]),\n                 "r"(v.w[3]));')
# forward variant -> the (code it looks for, what replaces it) pairs, every one required, and how the
# error names that code
_FWD_EDITS = {
    "no-w": ([("load_w<E, A16>(w, g);", "load_ones<E>(g);"),
              ("load_w<E, decltype(a16)::value>(wt + k * (TPR * E), g);", "load_ones<E>(g);"),
              ("load_w<E>(w + (k * TPR + t) * E, wr[k]);", "load_ones<E>(wr[k]);"),
              ("// ----------------------------------------------------------------------------- reductions",
               "template <int E>\n__device__ __forceinline__ void load_ones(float* f) {\n#pragma unroll\n"
               "    for (int i = 0; i < E; ++i) f[i] = 1.0f;\n}\n\n"
               "// ----------------------------------------------------------------------------- reductions")],
             "the weight loads of norm_store, norm_rows and the row tile ('load_w<E, A16>(w, g);')"),
    "no-store": ([(_ST_V4, "    if (v.w[0] == 0x7fc00001u && v.w[1] == 0x7fc00001u && v.w[2] == 0x7fc00001u)\n"
                   + _ST_V4.replace("    asm", "        asm", 1))],
                 "st_vec's 16-byte store"),
}
FORWARD_ONLY = tuple(_FWD_EDITS)


def variant_source(source: str, variant: str, dtype: str, backward: bool) -> str:
    """``source`` edited for ``variant`` (see the module docstring).

    Raises:
        ValueError: An unknown variant, a backward-only variant on the forward, or a source
            that no longer has the code the edit looks for (the kernel changed: update the edit).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    if variant in BACKWARD_ONLY and not backward:
        raise ValueError(f"variant {variant!r} is for the backward kernel (--backward)")
    if variant in FORWARD_ONLY and backward:
        raise ValueError(f"variant {variant!r} is for the forward kernel (leave out --backward)")
    if variant == "full":
        return source
    if variant == "dtype-only":  # the kernels pick their dtype at compile time when DTYPE_CODE is defined
        if "#ifdef DTYPE_CODE" not in source:
            raise ValueError("dtype-only: the source has no '#ifdef DTYPE_CODE' (a build of one dtype's body)")
        return f"#define DTYPE_CODE {DTYPE_CODES[dtype]}\n" + source
    if variant in FORWARD_ONLY:
        pairs, what = _FWD_EDITS[variant]
        for old, new in pairs:
            if old not in source:
                raise ValueError(f"{variant}: {what} is not in the source (looked for {old[:60]!r})")
            source = source.replace(old, new)
        return source
    old, new, what = _EDITS[variant]
    if old not in source:
        raise ValueError(f"{variant}: {what} is not in the source")
    return source.replace(old, new, 1)


def _knobs(problem: Any, text: str, flag: str) -> dict[str, Any]:
    """The JSON object ``text`` of knob names to values, checked against the family's knobs."""
    try:
        given = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"{flag}: not JSON ({e}); give an object such as '{{\"THREADS\": 256, ...}}'") from e
    if not isinstance(given, dict):
        raise SystemExit(f"{flag}: give a JSON object of knob names to values")
    known = problem.seeds[0].params
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise SystemExit(f"{flag}: unknown knobs {unknown}; the kernel's are {sorted(known)}")
    return given


def _as_entry(problem: Any, genome: Any, case: str, flag: str) -> dict[str, Any]:
    params = dict(genome.params)
    if not problem.params.is_valid(params):
        raise SystemExit(f"{flag} break the kernel family's rules: {problem.params.violations(params)}")
    canonical = problem.params.canonical(params)  # knobs the others switch off at their defaults, as the
    if canonical != params:                       # engine stores them (e.g. PREFETCH 0 under STAGES)
        genome, params = genome.with_params(**canonical), canonical
    return {"id": genome.id, "case": case, "params": params, "source": genome.source,
            "defines": genome.defines(), "entry": genome.entry}


def genome_from_params(problem: Any, text: str) -> dict[str, Any]:
    """A genome of ``problem``'s kernel family (its first seed's source) with the JSON params ``text``,
    in the form a dispatch module's ``select`` returns.

    Raises:
        SystemExit: ``text`` is not a JSON object, names a knob the family does not have, or the
            params break the Problem's rules (the message lists which).
    """
    given = _knobs(problem, text, "--params")
    return _as_entry(problem, problem.seeds[0].with_params(**given), "--params", "--params")


def edited_genome(problem: Any, genome: dict[str, Any], text: str) -> tuple[str, dict[str, Any]]:
    """``genome`` (a dispatch module's or :func:`genome_from_params`' form) with the knobs of the JSON
    object ``text`` changed, and a label naming the changes (e.g. ``TREE=8``): what ``--vs`` times
    beside the genome itself, in the same run.

    Raises:
        SystemExit: As :func:`genome_from_params`, or ``text`` changes no knob.
    """
    from evo.types import Genome

    given = _knobs(problem, text, "--vs")
    changed = {k: v for k, v in given.items() if genome["params"].get(k) != v}
    if not changed:
        raise SystemExit(f"--vs {text}: changes no knob of the genome (its params: {genome['params']})")
    edited = Genome(genome["source"], genome["params"], entry=genome["entry"]).with_params(**changed)
    label = " ".join(f"{k}={v}" for k, v in changed.items())
    return label, _as_entry(problem, edited, f"{genome['case']}, {label}", f"--vs {text}")


def input_sets(l2_bytes: int, set_bytes: int) -> int:
    """Input sets to rotate so that one round exceeds 3x L2 (at least 2, at most 16)."""
    from fitness import rotation_sets

    return rotation_sets(l2_bytes, set_bytes, most=16, least=2)


def fit_line(ms: Sequence[int], times_us: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares ``time = a + b * M``: (a in us, b * 32768 in us, largest residual in us)."""
    if len(ms) < 2 or len(set(ms)) < 2:
        raise ValueError("fit_line needs at least two different row counts")
    n = len(ms)
    mx, my = sum(ms) / n, sum(times_us) / n
    sxx = sum((m - mx) ** 2 for m in ms)
    b = sum((m - mx) * (t - my) for m, t in zip(ms, times_us, strict=True)) / sxx
    a = my - b * mx
    worst = max(abs(t - (a + b * m)) for m, t in zip(ms, times_us, strict=True))
    return a, b * ROWS_32K, worst


_KERNELS: dict[tuple[str, tuple[str, ...], str], Any] = {}


def _calls(problem: Any, source: str, genome: dict[str, Any], case: Any, sets: int,
           seed: int) -> tuple[list[Callable[[], None]], list[dict[str, Any]]]:
    """One launch per input set of ``source`` compiled with the genome's defines (same launch and scalars)."""
    import cupy
    import numpy as np
    import torch

    from evo.types import Genome
    from fitness import materialize
    from fitness._dtypes import storage_dtype, to_storage

    # the options the gate builds this genome with for the case's dtype (DTYPE_BUILD 1 adds its own)
    defines = problem.genome_defines(Genome(genome["source"], genome["params"], entry=genome["entry"]), case.dtype)
    key = (source, tuple(defines), genome["entry"])
    if key not in _KERNELS:  # one compile per variant, not per row count
        _KERNELS[key] = cupy.RawModule(code=source, options=key[1] + ("--std=c++17",)).get_function(key[2])
    kern = _KERNELS[key]
    launch = problem.launch(genome["params"], case, None)
    if launch.shared_mem > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = launch.shared_mem
    if launch.cluster is not None and launch.cluster[0] * launch.cluster[1] * launch.cluster[2] > 8:
        cupy.cuda.driver.funcSetAttribute(kern.kernel.ptr, _ATTR_NON_PORTABLE_CLUSTER, 1)  # 16-CTA clusters
    if launch.resident:  # a persistent grid: no more CTAs than fit at once, as the Timing stage runs it
        from fitness import fit_resident, resident_blocks

        sms = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())["multiProcessorCount"]
        launch = fit_resident(launch, resident_blocks(kern.kernel.ptr, launch, sms))
    ctype = {"int32": np.int32, "float32": np.float32}
    scalars = tuple(ctype[t](v) for t, v in problem.scalars(case))
    specs = list(problem.signature(case))
    rng = np.random.default_rng(seed)
    shared_ws = {s.name: cupy.zeros(max(1, s.nbytes), dtype=cupy.uint8) for s in specs if s.role == "workspace"}
    calls, bufsets = [], []
    for _ in range(sets):
        inputs = materialize(problem.make_inputs(case, rng, cupy), cupy)
        bufs: dict[str, Any] = {}
        for s in specs:
            if s.role == "in":
                bufs[s.name] = to_storage(inputs[s.name].reshape(-1), s.dtype, cupy)
            elif s.role == "workspace":
                bufs[s.name] = shared_ws[s.name]  # zeros, returned zeros by the kernel (shared, as in an export)
            else:
                bufs[s.name] = cupy.zeros(s.numel, dtype=storage_dtype(s.dtype))
        args = tuple(bufs[s.name] for s in specs) + scalars

        def call(args: tuple[Any, ...] = args) -> None:
            with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):  # time_calls times torch's stream
                kern(launch.grid, launch.block, args, shared_mem=launch.shared_mem)
        calls.append(call)
        bufsets.append(bufs)
    return calls, bufsets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="RMSNorm fixed vs per-row cost (H100/H200)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--module", help="dispatch module exported by examples/rmsnorm_h100.py")
    src.add_argument("--params", help="a genome of the kernel family as JSON params (e.g. a seed's), "
                     "instead of a module's")
    ap.add_argument("--backward", action="store_true", help="the module holds backward genomes")
    ap.add_argument("--n", type=int, required=True, help="row length N (the module's genome for it is used)")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_CODES))
    ap.add_argument("--rows", default="16384,32768,65536,131072", help="comma list of M")
    ap.add_argument("--variants", default="full,dtype-only", help="comma list of " + ", ".join(VARIANTS))
    ap.add_argument("--vs", action="append", default=[], metavar="JSON",
                    help="knob changes (a JSON object, e.g. '{\"TREE\": 8}') whose genome is timed beside the "
                         "genome in the same run, row count by row count (repeatable; rows labelled by the changes)")
    ap.add_argument("--torch", action="store_true", help="also time torch.compile of the reference")
    ap.add_argument("--out", default=None, help="JSON results (default: print only)")
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",") if r.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not rows:
        ap.error("--rows needs at least one row count")
    for v in variants:
        if v not in VARIANTS or (v in BACKWARD_ONLY and not args.backward) or (v in FORWARD_ONLY and args.backward):
            ap.error(f"--variants: {v!r} is not one of {', '.join(VARIANTS)}"
                     + (" (no-reduce, no-sum and no-dw need --backward)" if v in BACKWARD_ONLY else "")
                     + (" (no-w and no-store are forward variants: leave out --backward)" if v in FORWARD_ONLY else ""))

    import cupy

    from evo.types import Case
    from examples.rmsnorm_problem import make_backward_problem, make_forward_problem
    from fitness import time_calls

    if cupy.cuda.runtime.getDeviceCount() < 1:
        print("rmsnorm_fixed_cost: no CUDA device", file=sys.stderr)
        return 2
    problem = make_backward_problem() if args.backward else make_forward_problem()
    props = cupy.cuda.runtime.getDeviceProperties(0)
    l2 = props["l2CacheSize"]
    elem = {"float32": 4, "float16": 2, "bfloat16": 2}[args.dtype]
    per_row = (3 if args.backward else 2) * args.n * elem  # bytes of one row's inputs and outputs
    table: dict[str, dict[int, float]] = {}
    genome = (rmsnorm_peers.import_dispatch(args.module).select({"M": rows[0], "N": args.n}, args.dtype) if args.module
              else genome_from_params(problem, args.params))
    print(f"genome {genome['id'][:12]} (exported for {genome['case']}) {genome['params']}", flush=True)
    entries = [("", genome)] + [edited_genome(problem, genome, text) for text in args.vs]
    for label, g in entries[1:]:
        print(f"  beside it: {label} (genome {g['id'][:12]})", flush=True)
    sources = {v: variant_source(genome["source"], v, args.dtype, args.backward) for v in variants}
    copy_tbs = rmsnorm_peers.copy_ceiling_tbs()
    print(f"copy ceiling (D2D, 2 GiB, same method): {copy_tbs:.3f} TB/s", flush=True)
    moved = problem.bytes_moved  # bytes each call must move (the fraction of copy's numerator)
    for m in rows:
        case = Case({"M": m, "N": args.n}, args.dtype)
        sets = input_sets(l2, m * per_row)
        out_names = [s.name for s in problem.signature(case) if s.role == "out"]
        for label, g in entries:
            full_out = None
            for v in variants:
                row = f"{v} {label}" if label else v
                calls, bufs = _calls(problem, sources[v], g, case, sets, seed=m)
                calls[0]()
                cupy.cuda.runtime.deviceSynchronize()
                outs = {k: cupy.asnumpy(bufs[0][k]).tobytes() for k in out_names}
                if v == "full":
                    full_out = outs
                elif v == "dtype-only" and full_out is not None and outs != full_out:
                    raise SystemExit(f"dtype-only computed different outputs from full at M={m}: the edit is wrong")
                res = time_calls(calls)
                table.setdefault(row, {})[m] = res.time_ms * 1000.0
                frac = fraction_of_copy(moved(case), res.time_ms * 1000.0, copy_tbs)
                print(f"M={m:7d} {row:10s} {res.time_ms * 1000:9.2f} us  spread {100 * res.spread:.1f}%  "
                      f"{frac:.3f} of copy", flush=True)
        if args.torch:
            table.setdefault("torch.compile", {})[m] = _time_torch(args, m) * 1000.0
            print(f"M={m:7d} {'torch.compile':10s} {table['torch.compile'][m]:9.2f} us", flush=True)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    fit = len(set(rows)) >= 2
    lines = [f"# RMSNorm {'backward' if args.backward else 'forward'} fixed cost, N={args.n} {args.dtype} "
             f"({datetime.date.today().isoformat()}, {name}, {platform.node()}; copy {copy_tbs:.3f} TB/s)", "",
             "| variant | " + " | ".join(f"M={m}: us / of copy" for m in rows)
             + (" | us per 32K rows | fixed us | worst residual us |" if fit else " |"),
             "|---" * (len(rows) + (4 if fit else 1)) + "|"]
    fits: dict[str, tuple[float, float, float]] = {}
    for v, by_m in table.items():
        ms = [m for m in rows if m in by_m]
        cells = " | ".join(f"{by_m[m]:.2f} / {fraction_of_copy(moved(Case({'M': m, 'N': args.n}, args.dtype)), by_m[m], copy_tbs):.3f}"
                           for m in ms)
        if fit:
            a, b, worst = fit_line(ms, [by_m[m] for m in ms])
            fits[v] = (a, b, worst)
            lines.append(f"| {v} | {cells} | {b:.2f} | {a:.2f} | {worst:.2f} |")
        else:
            lines.append(f"| {v} | {cells} |")
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps({"n": args.n, "dtype": args.dtype, "backward": args.backward,
                                              "copy_tbs": copy_tbs,
                                              "genome": genome["id"], "params": genome["params"],
                                              "vs": [{"label": label, "genome": g["id"], "params": g["params"]}
                                                     for label, g in entries[1:]],
                                              "times_us": table,
                                              "fits": {k: {"fixed_us": a, "per_32k_rows_us": b, "worst_residual_us": w}
                                                       for k, (a, b, w) in fits.items()}}, indent=1))
    return 0


def fraction_of_copy(nbytes: int, time_us: float, copy_tbs: float) -> float:
    """The rate ``nbytes`` moved in ``time_us`` microseconds reach, as a fraction of ``copy_tbs`` (TB/s)."""
    return nbytes / (time_us * 1e-6) / 1e12 / copy_tbs


def _time_torch(args: argparse.Namespace, m: int) -> float:
    """torch.compile of the reference at (m, N), outputs held per input set; ms per call."""
    import torch

    from fitness import time_calls

    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.dtype]
    elem = torch.finfo(tdt).bits // 8
    sets = input_sets(torch.cuda.get_device_properties(0).L2_cache_size,
                      (3 if args.backward else 2) * m * args.n * elem)
    xs = [torch.randn(m, args.n, device="cuda", dtype=tdt) for _ in range(sets)]
    w = torch.randn(args.n, device="cuda", dtype=torch.float32)
    if args.backward:
        make = rmsnorm_peers.holding(rmsnorm_peers.providers_backward(None)["torch.compile"])
        dys = [torch.randn_like(x) for x in xs]
        rs = [torch.rsqrt(x.float().pow(2).mean(dim=1) + rmsnorm_peers.EPS) for x in xs]
        calls = [make(x, w, dy, r) for x, dy, r in zip(xs, dys, rs, strict=True)]
    else:
        make = rmsnorm_peers.holding(rmsnorm_peers.providers(None)["torch.compile"])
        calls = [make(x, w) for x in xs]
    ms = time_calls(calls).time_ms
    return ms if math.isfinite(ms) else float("nan")


if __name__ == "__main__":
    sys.exit(main())
