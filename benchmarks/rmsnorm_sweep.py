"""Sweep of RMSNorm forward variants through the real Evaluator (one GPU run).

Every variant is a full genome of the example's kernel family; each goes through the whole
gate (static checks, compile, resources, correctness on every check shape, timing of every
timed shape), exactly as the engine would score it. The point is design-space exploration
by a person (which knobs matter where), the way Kernel Tuner sweeps a grid; the engine's
search is still what produces the example's archive.

    python benchmarks/rmsnorm_sweep.py --set pipe --dtypes bfloat16 --out $OUT/sweep
    python benchmarks/rmsnorm_sweep.py --set short --shapes 256,512,1024,2048 --count 80
    python benchmarks/rmsnorm_sweep.py --set long --shapes 16384,32768,65536,131072,262144 --count 90
    python benchmarks/rmsnorm_sweep.py --set reread --shapes 32768,65536,131072,262144 --count 80
    python benchmarks/rmsnorm_sweep.py --set cluster --shapes 32768,65536,131072,262144 --count 90
    python benchmarks/rmsnorm_sweep.py --set policy --shapes 8192,16384,32768,65536,131072,262144 --count 36
    python benchmarks/rmsnorm_sweep.py --set regtile --shapes 16384,32768,65536,131072,262144 --count 40
    python benchmarks/rmsnorm_sweep.py --variants my_variants.json --limit 300
    python benchmarks/rmsnorm_sweep.py --set seeds --source old_rmsnorm_fwd.cu --out sweep-old
    python benchmarks/rmsnorm_sweep.py --render sweep-out/sweep.jsonl > sweep.md
    python benchmarks/rmsnorm_sweep.py --compare sweep-out/sweep.jsonl sweep-old/sweep.jsonl > compare.md

Writes ``sweep.jsonl`` (one line per evaluation, as it finishes) and ``sweep.md`` (variants
by geometric-mean fraction of copy, one column per timed shape, and the best per shape).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from evo.types import Genome, Status  # noqa: E402
from examples.rmsnorm_problem import (  # noqa: E402
    FWD_ENTRY,
    FWD_SEED_PARAMS,
    REG_TILE_BYTES,
    SMEM_CAP,
    TIMED_SHAPES,
    forward_source,
    make_forward_problem,
)

BASE: dict[str, int] = dict(FWD_SEED_PARAMS[0])


def _grid(base: Mapping[str, int], **axes: list[int]) -> Iterator[dict[str, int]]:
    names = list(axes)
    for values in itertools.product(*(axes[n] for n in names)):
        yield dict(base, **dict(zip(names, values, strict=True)))


def _sample(space: Any, grid: list[dict[str, int]], k: int, rng: np.random.Generator,
            exclude: Sequence[dict[str, int]] = ()) -> list[dict[str, int]]:
    """``k`` variants of ``grid`` that ``space`` accepts and ``exclude`` lacks, drawn without replacement."""
    valid = [p for p in grid if space.is_valid(p) and p not in exclude]
    return [valid[int(i)] for i in rng.permutation(len(valid))[:k]]


def pipe_set(limit: int, seed: int = 0) -> list[dict[str, int]]:
    """STAGE 3 variants per row-length regime, a seeded sample of each grid, plus the STAGE 3 seeds."""
    space = make_forward_problem(dtypes=["bfloat16"]).params
    p3 = dict(BASE, STAGE=3, VEC_BYTES=16, STORE_HINT=1, MAX_VECS=4)
    hints = {"LOAD_HINT": [0, 3], "STORE_HINT": [0, 1]}
    regimes = [
        list(_grid(p3, THREADS=[128, 256], TPR=[8, 16, 32], TILE_ROWS=[8, 16, 32, 64], PIPE=[1, 2, 3, 4],
                   PERSISTENT=[0, 2, 4, 8], **hints)),                      # short rows: a group per row
        list(_grid(dict(p3, TPR=0), THREADS=[128, 256, 512], TILE_ROWS=[1, 2, 4], PIPE=[1, 2, 3, 4],
                   PERSISTENT=[0, 1, 2, 4], **hints)),                      # mid rows: a CTA per row
        list(_grid(dict(p3, TPR=0), CLUSTER=[2, 4, 8, 16], THREADS=[128, 256, 512], TILE_ROWS=[1, 2],
                   PIPE=[1, 2, 3], PERSISTENT=[0, 1, 2], **hints)),         # long rows: a cluster per row
    ]
    rng = np.random.default_rng(seed)
    out: list[dict[str, int]] = [dict(p) for p in FWD_SEED_PARAMS if p["STAGE"] == 3]
    per = max(1, (limit - len(out)) // len(regimes))
    for grid in regimes:
        out.extend(_sample(space, [dict(p, TPR=p["THREADS"]) if p["TPR"] == 0 else p for p in grid], per, rng,
                           exclude=out))
    return out


def short_set(limit: int, seed: int = 0) -> list[dict[str, int]]:
    """Short rows (N <= 2K): STAGE 0 and STAGE 4 register tiles, STAGE 3 one-shot tiles, with OCCUPANCY."""
    space = make_forward_problem(dtypes=["bfloat16"]).params
    grids = [
        list(_grid(dict(BASE, STAGE=0, VEC_BYTES=16, PERSISTENT=0), THREADS=[64, 128, 256], TPR=[8, 16, 32],
                   MAX_VECS=[1, 2], OCCUPANCY=[0, 4, 8], STORE_HINT=[0, 1], LOAD_HINT=[0, 1])),
        list(_grid(dict(BASE, STAGE=3, VEC_BYTES=16, PERSISTENT=0, PIPE=1, MAX_VECS=4), THREADS=[64, 128, 256],
                   TPR=[8, 16, 32], TILE_ROWS=[4, 8, 16, 32], OCCUPANCY=[0, 4, 8], LOAD_HINT=[0, 3])),
        list(_grid(dict(BASE, STAGE=4, VEC_BYTES=16), THREADS=[64, 128, 256], TPR=[8, 16, 32],
                   MAX_VECS=[1, 2, 4], TILE_ROWS=[1, 2, 4, 8], OCCUPANCY=[0, 4, 8], STORE_HINT=[0, 1],
                   PERSISTENT=[0, 1, 2, 4])),  # a persistent grid: no second wave of CTAs
    ]
    rng = np.random.default_rng(seed)
    out: list[dict[str, int]] = [dict(p) for p in FWD_SEED_PARAMS[:3]]
    per = max(1, (limit - len(out)) // len(grids))
    for grid in grids:
        out.extend(_sample(space, grid, per, rng, exclude=out))
    return out


def long_set(limit: int, seed: int = 0) -> list[dict[str, int]]:
    """Long rows (N >= 16K): STAGE 3, a CTA or a cluster per row, the weights in shared memory or not."""
    space = make_forward_problem(dtypes=["bfloat16"]).params
    p3 = dict(BASE, STAGE=3, VEC_BYTES=16, MAX_VECS=4, OCCUPANCY=0)
    grid = list(_grid(p3, CLUSTER=[1, 2, 4, 8, 16], THREADS=[128, 256, 512], TILE_ROWS=[1, 2], PIPE=[1, 2, 3, 4],
                      PERSISTENT=[0, 1, 2], WSMEM=[0, 1], LOAD_HINT=[0, 3], STORE_HINT=[0, 1]))
    out = [dict(p) for p in FWD_SEED_PARAMS if p["STAGE"] == 3 and p["TPR"] == p["THREADS"] >= 256]
    grid = [dict(q, TPR=q["THREADS"]) for q in grid]
    return out + _sample(space, grid, max(0, limit - len(out)), np.random.default_rng(seed), exclude=out)


def reread_set(limit: int, seed: int = 0) -> list[dict[str, int]]:
    """Long rows by the STAGE 2 path (the row read twice, the second time mostly from L2).

    The long-row winners of ``--set long`` ran this path with one load per batch; a thread
    then has one 16-byte load in flight, about 16 KB per SM at 1024 threads. This set asks
    whether more loads per batch (MAX_VECS), more threads, another cluster size or plain
    L2 policy (LOAD_HINT 0 against 3's evict-first, which may evict a row before its second
    read) do better.
    """
    space = make_forward_problem(dtypes=["bfloat16"]).params
    p2 = dict(BASE, STAGE=2, VEC_BYTES=16, PERSISTENT=0, WSMEM=0)
    grid = list(_grid(p2, CLUSTER=[1, 2, 4, 8], THREADS=[256, 512, 1024], MAX_VECS=[1, 2, 4, 8],
                      OCCUPANCY=[0, 2], LOAD_HINT=[0, 3], STORE_HINT=[0, 1]))
    out = [dict(p) for p in FWD_SEED_PARAMS if p["STAGE"] == 2]
    grid = [dict(q, TPR=q["THREADS"]) for q in grid]
    return out + _sample(space, grid, max(0, limit - len(out)), np.random.default_rng(seed), exclude=out)


def cluster_set(limit: int, seed: int = 0) -> list[dict[str, int]]:
    """Long rows held on chip by a cluster: STAGE 0 (registers) and STAGE 1 (shared memory).

    Each CTA of a CLUSTER-CTA cluster holds its slice of one row, so x is read once and the
    partial sums meet through distributed shared memory (the layout the fastest peers use
    for N >= 64K). Only tiles that hold a whole slice of at least one timed row length
    enter (registers: ``THREADS * MAX_VECS * 16 B * CLUSTER >= row``; shared memory: the
    slice within the STAGE 1 cap), so no variant falls back to re-reading everywhere.
    """
    space = make_forward_problem(dtypes=["bfloat16"]).params
    rows = [n * 2 for n in (32768, 65536, 131072, 262144)]  # bf16 row bytes of the long shapes
    base = dict(BASE, VEC_BYTES=16, PERSISTENT=0, OCCUPANCY=0, WSMEM=0)
    first = [dict(base, STAGE=0, THREADS=256, TPR=256, MAX_VECS=8, CLUSTER=c, LOAD_HINT=0, STORE_HINT=1)
             for c in (2, 4, 8, 16)]
    grid = [dict(q, TPR=q["THREADS"]) for q in itertools.chain(
        _grid(dict(base, STAGE=0), CLUSTER=[2, 4, 8, 16], THREADS=[128, 256, 512], MAX_VECS=[2, 4, 8, 16],
              LOAD_HINT=[0, 1, 3], STORE_HINT=[0, 1]),
        _grid(dict(base, STAGE=1), CLUSTER=[2, 4, 8, 16], THREADS=[128, 256, 512, 1024], MAX_VECS=[2, 4, 8],
              LOAD_HINT=[0, 3], STORE_HINT=[0, 1]))]

    def holds(p: dict[str, int]) -> bool:
        if p["STAGE"] == 0:
            return any(p["THREADS"] * p["MAX_VECS"] * 16 * p["CLUSTER"] >= r for r in rows)
        return any(r // p["CLUSTER"] <= SMEM_CAP for r in rows)

    out = [p for p in first if space.is_valid(p)]
    grid = [p for p in grid if holds(p)]
    return out + _sample(space, grid, max(0, limit - len(out)), np.random.default_rng(seed), exclude=out)


def policy_set(limit: int, seed: int = 0) -> list[dict[str, int]]:
    """The rows read twice (STAGE 2) under four cache policies, side by side: each sampled
    configuration of the ``reread`` grid at LOAD_HINT 0 (none), 3 (evict-first for both reads), 4 (the
    first read evict-last, so the row waits in L2 for the second, which lets it go) and 5 (4 in L1 too).
    """
    space = make_forward_problem(dtypes=["bfloat16"]).params
    p2 = dict(BASE, STAGE=2, VEC_BYTES=16, PERSISTENT=0, WSMEM=0, STORE_HINT=1)
    grid = [dict(q, TPR=q["THREADS"]) for q in _grid(p2, CLUSTER=[1, 2, 4, 8], THREADS=[256, 512, 1024],
                                                     MAX_VECS=[1, 2, 4], OCCUPANCY=[0, 2])]
    configs: list[dict[str, int]] = []
    for p in FWD_SEED_PARAMS:  # seeds that differ only in LOAD_HINT are one configuration here
        if p["STAGE"] == 2 and dict(p, LOAD_HINT=3) not in configs:
            configs.append(dict(p, LOAD_HINT=3))
    configs += _sample(space, [dict(p, LOAD_HINT=3) for p in grid], max(0, limit // 4 - len(configs)),
                      np.random.default_rng(seed), exclude=configs)
    return [dict(p, LOAD_HINT=h) for p in configs for h in (0, 3, 4, 5)][:max(limit, 4)]


def regtile_set(limit: int, seed: int = 0) -> list[dict[str, int]]:
    """The full 32 KB register tile at 512 and 1024 threads, alone and in clusters of 2-16 CTAs.

    Rows of 32 KB (bf16 16K) to 512 KB (bf16 256K, fp32 128K) held in registers and read once:
    ``reg_tile_budget`` admits these tiles since ptxas was found to keep them without spills at
    64 registers per thread (they were held to 16 KB before). STAGE 0 (registers) and STAGE 1
    (the chunk in shared memory when it outgrows the tile); LOAD_HINT 3 (evict-first), 0, then 5.
    On the H100 (``rmsnorm_sweep-2026-12-07-s29-h100-regtile.md``) the best of them per case reached
    0.72-0.92 of the long rows' best genomes (STAGE 2 re-reads, STAGE 3 clusters of 128-256
    threads): one 1024-thread CTA fills an SM's registers, and a cluster of them spreads one row
    over 2-16 SMs.
    """
    space = make_forward_problem(dtypes=["bfloat16"]).params
    base = dict(BASE, VEC_BYTES=16, PERSISTENT=0, OCCUPANCY=0, WSMEM=0, STORE_HINT=1, RSQRT_APPROX=1)
    grid = [dict(q, TPR=q["THREADS"], MAX_VECS=REG_TILE_BYTES // (16 * q["THREADS"])) for q in
            _grid(base, LOAD_HINT=[3, 0, 5], STAGE=[0, 1], THREADS=[1024, 512], CLUSTER=[1, 2, 4, 8, 16])]
    valid = [p for p in grid if space.is_valid(p)]
    return valid[:max(limit, 0)]


SETS = {"pipe": pipe_set, "short": short_set, "long": long_set, "reread": reread_set, "cluster": cluster_set,
        "policy": policy_set, "regtile": regtile_set}
"""The built-in variant sets by ``--set`` name (``seeds`` is the Problem's seed genomes)."""


def _geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else 0.0


_KNOBS = {"STAGE": "ST", "THREADS": "TH", "TPR": "TPR", "CLUSTER": "CL", "PIPE": "PI", "TILE_ROWS": "TR",
          "PERSISTENT": "PE", "MAX_VECS": "MV", "VEC_BYTES": "VB", "LOAD_HINT": "LH", "STORE_HINT": "SH",
          "OCCUPANCY": "OC", "WSMEM": "WS", "RSQRT_APPROX": "RA", "PREFETCH": "PF", "DTYPE_BUILD": "DB"}
"""The forward knobs a variant's name shows, each under its own short label."""


def _variant_name(params: Mapping[str, Any]) -> str:
    """One variant's knobs, e.g. ``ST0 TH256 TPR256 ... PF1``: every forward knob, each label distinct."""
    return " ".join(f"{short}{params.get(k, '-')}" for k, short in _KNOBS.items())


def render_comparison(new: list[dict[str, Any]], old: list[dict[str, Any]]) -> str:
    """Time ratios ``old / new`` (> 1: ``new`` faster) of the variants two sweeps share, per case.

    Compares times per launch, not fractions of copy: each sweep's worker measures its own
    copy ceiling, and a different ceiling moves every fraction of a run alike. Meant for two
    sweeps of the same variants in one device session (e.g. ``--source`` with the previous
    kernel), where the ratio is the change's effect; variants that failed in either are listed.
    """
    def key(r: Mapping[str, Any]) -> str:
        return json.dumps(r["params"], sort_keys=True)

    before = {key(r): r for r in old}
    shared = [(r, before[key(r)]) for r in new if key(r) in before]
    keys = next((list(a["cases"]) for a, b in shared if a["cases"] and b["cases"]), [])
    short = [k.split(",N=")[1].split(":")[0] if ",N=" in k else k for k in keys]
    lines = ["| variant | regs new / old | " + " | ".join(short) + " | geomean |",
             "| --- | ---: | " + " | ".join("---:" for _ in keys) + " | ---: |"]
    failed = []
    ratios: list[tuple[float, str]] = []
    for a, b in shared:
        if not a["cases"] or not b["cases"]:
            failed.append(f"{_variant_name(a['params'])}: new {a['status']}, old {b['status']}")
            continue
        rs = [b["cases"][k]["time_ms"] / a["cases"][k]["time_ms"] if k in a["cases"] and k in b["cases"] else None
              for k in keys]
        g = _geomean([x for x in rs if x])
        ratios.append((g, f"| {_variant_name(a['params'])} | {a['registers']} / {b['registers']} | "
                       + " | ".join("-" if x is None else f"{x:.3f}" for x in rs) + f" | {g:.3f} |"))
    lines += [row for _, row in sorted(ratios, key=lambda t: -t[0])]
    lines += [f"\nFAILED {f}" for f in failed]
    return "\n".join(lines) + f"\n\n{len(ratios)} variants in both sweeps; ratio = old time / new time.\n"


def sweep_header(device: Any, dtypes: Sequence[str], source: str, variants: int, collected: int,
                 when: datetime.datetime | None = None) -> str:
    """The lines above a sweep's table: when, on which GPU (and its measured copy bandwidth, the
    ceiling the fractions are of), which dtypes and kernel source, and how many variants came back.

    ``device`` is the Evaluator's :class:`evo.types.DeviceInfo` (None when no variant reached the GPU).
    """
    when = when or datetime.datetime.now(datetime.timezone.utc)
    if device is None:
        machine = "no variant reached the GPU (device unknown)"
    else:
        machine = f"{device.name}, {device.sm_count} SMs, copy {device.copy_gbps / 1e3:.3f} TB/s (measured by the worker)"
    return (f"# RMSNorm forward sweep ({when:%Y-%m-%d %H:%M} UTC)\n\n"
            f"Machine: {machine}. Dtypes: {', '.join(dtypes)}. Kernel: {source}. "
            f"{collected} of {variants} variants collected. Cells: fraction of the copy bandwidth, from the "
            "Timing stage; regs: registers per thread (spill bytes when ptxas spilled).\n\n")


def render_markdown(rows: list[dict[str, Any]], keys: list[str] | None = None) -> str:
    """The sweep table: variants by geometric-mean fraction of copy, one column per case, best per case.

    ``keys`` (case keys, in column order) default to those of the first successful row. A
    variant that spilled shows its spill bytes beside its registers.
    """
    if keys is None:
        keys = next((list(r["cases"]) for r in rows if r["cases"]), [])
    ok = [r for r in rows if r["cases"]]
    ok.sort(key=lambda r: -_geomean([r["cases"].get(k, {}).get("fraction") or 0 for k in keys]))
    short = [k.split(",N=")[1].split(":")[0] if ",N=" in k else k for k in keys]
    lines = ["| variant | regs | geomean | " + " | ".join(short) + " |",
             "| --- | ---: | ---: | " + " | ".join("---:" for _ in keys) + " |"]
    for r in ok:
        fr = [r["cases"].get(k, {}).get("fraction") for k in keys]
        name = _variant_name(r["params"])
        regs = f"{r['registers']} ({r['spill']} B spill)" if r.get("spill") else f"{r['registers']}"
        lines.append(f"| {name} | {regs} | {_geomean([f or 0 for f in fr]):.3f} | "
                     + " | ".join("-" if f is None else f"{f:.3f}" for f in fr) + " |")
    best = [max((r["cases"].get(k, {}).get("fraction") or 0 for r in ok), default=0) for k in keys]
    lines.append("| **best per shape** | | | " + " | ".join(f"**{b:.3f}**" for b in best) + " |")
    failed = [r for r in rows if not r["cases"]]
    for r in failed:
        lines.append(f"\nFAILED {r['status']}: {r['params']}: {r['reason']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="pipe", choices=[*SETS, "seeds"], help="built-in variant set")
    ap.add_argument("--shapes", default="all", help="'all' or a comma list of N values to time (M as in the matrix)")
    ap.add_argument("--variants", type=Path, help="JSON list of param dicts (overrides --set)")
    ap.add_argument("--count", type=int, default=120, help="variants in the built-in set")
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--limit", type=float, default=400.0, help="stop submitting after this many seconds")
    ap.add_argument("--out", type=Path, default=Path("sweep-out"))
    ap.add_argument("--source", type=Path, help="kernel file to sweep instead of examples/kernels/rmsnorm_fwd.cu "
                    "(e.g. an earlier revision, to compare two in one device session)")
    ap.add_argument("--render", type=Path, metavar="JSONL", help="only print the table of a finished sweep's sweep.jsonl")
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("NEW", "OLD"),
                    help="only print time ratios OLD/NEW of two finished sweeps' sweep.jsonl (same variants)")
    args = ap.parse_args(argv)
    if args.compare:
        for f in args.compare:
            if not f.is_file():
                raise SystemExit(f"--compare: {f} is not a file (give two sweep.jsonl files)")
        new, old = ([json.loads(line) for line in f.read_text().splitlines() if line.strip()] for f in args.compare)
        print(render_comparison(new, old), end="")
        return 0
    if args.render:
        print(render_markdown([json.loads(line) for line in args.render.read_text().splitlines() if line.strip()]),
              end="")
        return 0

    from fitness import Evaluator

    timed = None
    if args.shapes != "all":
        ns = {int(n) for n in args.shapes.split(",")}
        timed = [t for t in TIMED_SHAPES if t["N"] in ns]
        if not timed:
            raise SystemExit(f"--shapes {args.shapes}: no standard shape has these N")
    problem = make_forward_problem(timed=timed, dtypes=args.dtypes.split(","))
    if args.variants:
        variants = json.loads(args.variants.read_text())
    elif args.set == "seeds":
        variants = [dict(p) for p in FWD_SEED_PARAMS]
    else:
        variants = SETS[args.set](args.count)
    bad = [p for p in variants if not problem.params.is_valid(p)]
    if bad:
        raise SystemExit(f"{len(bad)} variants break the space's rules, e.g. {bad[0]}: "
                         f"{problem.params.violations(bad[0])}")
    if args.source is not None and not args.source.is_file():
        raise SystemExit(f"--source {args.source}: no such kernel file (give a .cu file, e.g. an earlier "
                         "revision from 'git show REV:examples/kernels/rmsnorm_fwd.cu > old.cu')")
    args.out.mkdir(parents=True, exist_ok=True)
    src = args.source.read_text() if args.source else forward_source()
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    print(f"{len(variants)} variants, {len(problem.timed_cases())} timed cases each", flush=True)
    with Evaluator(problem, seed=3) as ev, (args.out / "sweep.jsonl").open("w") as log:
        futures = [(p, ev.submit(Genome(src, p, entry=FWD_ENTRY))) for p in variants]
        for i, (p, fut) in enumerate(futures):
            if time.perf_counter() - t0 > args.limit:
                print(f"time limit: {len(futures) - i} variants not collected", flush=True)
                break
            r = fut.result()
            cases = r.metrics.get("cases", {}) if r.status is Status.OK else {}
            row = {"params": p, "status": r.status.value, "reason": (r.reason or "")[:300],
                   "fitness": r.fitness, "registers": r.resources.get("registers"),
                   "spill": r.resources.get("spill_bytes", 0),
                   "cases": {k: {"fraction": c.get("fraction"), "time_ms": c.get("time_ms")} for k, c in cases.items()}}
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(f"[{i + 1}/{len(futures)} {time.perf_counter() - t0:.0f}s] {r.status.value} "
                  f"fit={r.fitness if r.fitness is None else round(r.fitness, 4)} {p}", flush=True)
        for _, fut in futures:
            fut.cancel()
        device = ev.device_info
    keys = [c.key for c in problem.timed_cases()]
    text = sweep_header(device, args.dtypes.split(","), str(args.source or "examples/kernels/rmsnorm_fwd.cu"),
                        len(variants), len(rows)) + render_markdown(rows, keys)
    (args.out / "sweep.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
