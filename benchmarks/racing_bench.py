"""What racing in the Timing stage saves, and what it costs in accuracy (one GPU run).

The engine hands every candidate the per-case best times so far; the Timing stage stops
timing a case after its first batches when they are slower than ``race_margin`` x that
best (``fitness.Timing``). This script measures the trade on real genomes, side by side in
one run: the genomes (the RMSNorm Problem's seeds) are scored twice by one Evaluator,

1. ``full``: no incumbents, every case timed in full;
2. ``raced``: with the per-case best of pass 1 as incumbents (the situation of a search
   whose champions are already known),

and the two passes are compared: Timing-stage seconds and wall seconds per pass, how many
cases were raced, the raced cases' times against their full times (the error of a median
over fewer batches), the same ratio for the cases timed in full in both passes (the run's
own noise), each genome's fitness ratio, and whether every case keeps its champion.

    python benchmarks/racing_bench.py --out $OUT/racing.json
    python benchmarks/racing_bench.py --backward --dtypes bfloat16
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def row_of(genome_id: str, ev: Any) -> dict[str, Any]:
    """The facts of one Evaluation this benchmark compares (JSON-ready)."""
    cases = ev.metrics.get("cases", {}) if ev.ok else {}
    return {"genome": genome_id, "status": ev.status.value, "fitness": ev.fitness,
            "timing_s": float((ev.stage_times or {}).get("timing", 0.0)),
            "cases": {k: {"time_ms": c.get("time_ms"), "raced": bool(c.get("raced"))} for k, c in cases.items()}}


def _fastest(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[float, str]]:
    """``{case key: (lowest time_ms, genome id)}`` over the rows' finite, positive times."""
    out: dict[str, tuple[float, str]] = {}
    for r in rows:
        for k, c in r["cases"].items():
            t = c.get("time_ms")
            if isinstance(t, (int, float)) and math.isfinite(t) and t > 0 and (k not in out or t < out[k][0]):
                out[k] = (float(t), r["genome"])
    return out


def per_case_best(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``{case key: lowest time_ms}`` over the OK rows."""
    return {k: t for k, (t, _) in _fastest(rows).items()}


def _spread(xs: Sequence[float]) -> dict[str, float | int | None]:
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def compare(full: Sequence[Mapping[str, Any]], raced: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The two passes side by side (rows from :func:`row_of`, the same genomes in both).

    Returns:
        ``timing_s`` and ``raced_cases``/``cases`` per pass, ``timing_ratio`` (raced pass's
        Timing seconds over the full pass's), ``raced_time_ratio`` and ``full_time_ratio``
        (time in pass 2 over time in pass 1 for the raced cases and for the cases timed in
        full both times: median, min, max), ``fitness_ratio`` (per OK genome) and
        ``champions_kept`` (cases whose fastest genome is the same in both passes).
    """
    by_id = {r["genome"]: r for r in full}
    raced_r, full_r, fit_r = [], [], []
    for r in raced:
        f = by_id.get(r["genome"])
        if f is None or r["status"] != "ok" or f["status"] != "ok":
            continue
        if r["fitness"] and f["fitness"]:
            fit_r.append(r["fitness"] / f["fitness"])
        for k, c in r["cases"].items():
            t0 = f["cases"].get(k, {}).get("time_ms")
            if not t0 or not c.get("time_ms"):
                continue
            (raced_r if c["raced"] else full_r).append(c["time_ms"] / t0)
    t_full = sum(r["timing_s"] for r in full)
    t_race = sum(r["timing_s"] for r in raced)
    ch_full = {k: g for k, (_, g) in _fastest(full).items()}
    ch_race = {k: g for k, (_, g) in _fastest(raced).items()}
    return {"timing_s": {"full": t_full, "raced": t_race},
            "timing_ratio": t_race / t_full if t_full > 0 else None,
            "cases": sum(len(r["cases"]) for r in raced),
            "raced_cases": sum(1 for r in raced for c in r["cases"].values() if c["raced"]),
            "raced_time_ratio": _spread(raced_r), "full_time_ratio": _spread(full_r),
            "fitness_ratio": _spread(fit_r),
            "champions_kept": sum(1 for k, g in ch_full.items() if ch_race.get(k) == g), "champion_cases": len(ch_full)}


def render(summary: Mapping[str, Any], walls: Mapping[str, float]) -> str:
    """A few lines for stdout."""
    def sp(d: Mapping[str, Any]) -> str:
        if not d["n"]:
            return "none"
        return f"median {d['median']:.4f}, min {d['min']:.4f}, max {d['max']:.4f} (n={d['n']})"
    ts = summary["timing_s"]
    return "\n".join([
        f"Timing stage seconds: full {ts['full']:.1f}, raced {ts['raced']:.1f}, ratio "
        f"{summary['timing_ratio']:.3f}; wall per pass: full {walls['full']:.1f} s, raced {walls['raced']:.1f} s",
        f"raced cases: {summary['raced_cases']} of {summary['cases']}",
        f"time ratio pass 2 / pass 1, raced cases: {sp(summary['raced_time_ratio'])}",
        f"time ratio pass 2 / pass 1, cases timed in full both times: {sp(summary['full_time_ratio'])}",
        f"fitness ratio pass 2 / pass 1: {sp(summary['fitness_ratio'])}",
        f"per-case champions kept: {summary['champions_kept']} of {summary['champion_cases']}",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backward", action="store_true", help="the backward Problem's seeds and shapes")
    ap.add_argument("--dtypes", default=None, help="comma list (default: the Problem's)")
    ap.add_argument("--margin", type=float, default=None, help="Timing race_margin (default: the stage's)")
    ap.add_argument("--out", type=Path, default=None, help="JSON with every row and the summary")
    args = ap.parse_args(argv)

    from evo.types import Genome
    from examples.rmsnorm_problem import make_backward_problem, make_forward_problem
    from fitness import Evaluator, visible_devices

    if not visible_devices():
        print("racing_bench: no CUDA device", file=sys.stderr)
        return 2
    dtypes = args.dtypes.split(",") if args.dtypes else None
    problem = make_backward_problem(dtypes=dtypes) if args.backward else make_forward_problem(dtypes=dtypes)
    genomes: list[Genome] = list(problem.seeds)
    options = {"race_margin": args.margin} if args.margin is not None else None
    passes: dict[str, list[dict[str, Any]]] = {}
    walls: dict[str, float] = {}
    with Evaluator(problem, seed=11, options=options) as ev:
        ev.evaluate(genomes[0])  # worker start-up and the copy measurement stay out of both passes
        for name in ("full", "raced"):
            inc = per_case_best(passes["full"]) if name == "raced" else None
            t0 = time.perf_counter()
            futs = [(g.id, ev.submit(g, incumbents=inc)) for g in genomes]
            passes[name] = [row_of(gid, f.result()) for gid, f in futs]
            walls[name] = time.perf_counter() - t0
            print(f"pass {name}: {len(genomes)} genomes in {walls[name]:.1f} s", flush=True)
    summary = compare(passes["full"], passes["raced"])
    print(render(summary, walls))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"problem": problem.name, "host": platform.node(), "walls_s": walls,
                                        "summary": summary, "passes": passes}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
