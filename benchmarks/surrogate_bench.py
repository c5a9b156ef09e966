"""How well the screening surrogate (``operators.ParamSurrogate``) predicts an archive's measured times.

``operators.Screened`` sends the GPU one child of a pool, the one the surrogate rates most
likely to set a new best time. Whether that beats sending a random child depends on how
well a model of the archive's own records predicts a new genome. Two measurements, on the
real per-case times an archive holds (no GPU needed)::

    python benchmarks/surrogate_bench.py runs/run26.lmdb
    python benchmarks/surrogate_bench.py runs/run26.lmdb --k 1,3,5,8 --min-change 0.02

* **leave one out**: each OK record predicted from all the others; per case, the rank
  correlation (Spearman) of predicted and measured log time over the records; the median,
  min and max over cases, and the median absolute error in log time;
* **child against parent, as the search saw it**: each operator child (not a seed) predicted
  from the records measured before it; per case where child and parent differ by more than
  ``--min-change`` in log time, whether the model had the sign of the change right. A random
  guess scores 50%; a predicted change of exactly zero counts as wrong (with ``k=1`` the
  nearest record is often the parent itself).

The param space is read from the archive's header (the Problem's description), so any
archive of the library works.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402


def space_from_header(desc: Mapping[str, Any]) -> Any:
    """The ParamSpace (without constraints) of a Problem description's ``params``."""
    from evo.space import Bool, Choice, FloatRange, IntRange, ParamSpace

    params = desc.get("params", {}).get("params", {})
    specs: dict[str, Any] = {}
    for name, d in params.items():
        kind = d.get("kind")
        if kind == "choice":
            specs[name] = Choice(d["values"])
        elif kind == "int":
            specs[name] = IntRange(int(d["low"]), int(d["high"]), step=int(d.get("step", 1)), log=bool(d.get("log")))
        elif kind == "float":
            specs[name] = FloatRange(float(d["low"]), float(d["high"]), log=bool(d.get("log")))
        elif kind == "bool":
            specs[name] = Bool()
        else:
            raise SystemExit(f"param {name!r}: unknown kind {kind!r} in the archive's header")
    if not specs:
        raise SystemExit("the archive's header describes no params: nothing to model")
    return ParamSpace(specs)


def _rank(x: Sequence[float]) -> np.ndarray:
    return np.argsort(np.argsort(np.asarray(x))).astype(float)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Rank correlation (ties broken by order; NaN for fewer than 3 points or a constant side)."""
    if len(a) < 3:
        return float("nan")
    ra, rb = _rank(a), _rank(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def leave_one_out(space: Any, records: Sequence[Any], k: int) -> dict[str, float]:
    """Per-case Spearman of leave-one-out predictions: median/min/max, and the median |log error|."""
    from operators import ParamSurrogate

    pred: dict[str, list[float]] = {}
    meas: dict[str, list[float]] = {}
    for i, r in enumerate(records):
        model = ParamSurrogate(space, k=k)
        for j, o in enumerate(records):
            if j != i:
                model.add_record(o)
        got = model.predict(r.genome.params)
        for key, t in r.evaluation.case_times().items():
            if key in got:
                pred.setdefault(key, []).append(got[key][0])
                meas.setdefault(key, []).append(math.log(t))
    rhos = [x for x in (spearman(pred[c], meas[c]) for c in pred) if math.isfinite(x)]
    errs = [float(np.median(np.abs(np.array(pred[c]) - np.array(meas[c])))) for c in pred]
    if not rhos:
        return {}
    return {"cases": len(rhos), "median": float(np.median(rhos)), "min": min(rhos), "max": max(rhos),
            "abs_log_err": float(np.median(errs))}


def child_vs_parent(space: Any, records: Sequence[Any], k: int, min_change: float) -> tuple[int, int]:
    """(right, wrong): the sign of each child's change from its parent, predicted from earlier records."""
    from operators import ParamSurrogate

    by_id = {r.genome.id: r for r in records}
    right = wrong = 0
    for r in records:
        if r.operator in ("seed", "warm_start") or not r.parents or r.parents[0] not in by_id:
            continue
        parent = by_id[r.parents[0]]
        model = ParamSurrogate(space, k=k)
        for o in records:
            if o.seq < r.seq:
                model.add_record(o)
        got = model.predict(r.genome.params)
        ct, pt = r.evaluation.case_times(), parent.evaluation.case_times()
        for key, t in ct.items():
            if key not in pt or key not in got:
                continue
            change = math.log(t) - math.log(pt[key])
            if abs(change) < min_change:
                continue
            if (got[key][0] - math.log(pt[key])) * change > 0:
                right += 1
            else:
                wrong += 1
    return right, wrong


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("archive", help="an archive (LMDB directory) of OK records with per-case times")
    ap.add_argument("--k", default="1,3,5,8", help="neighbour counts to try, comma-separated")
    ap.add_argument("--min-change", type=float, default=0.02,
                    help="child-parent changes smaller than this (in log time) are not scored")
    args = ap.parse_args(argv)
    try:
        ks = [int(x) for x in args.k.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--k takes comma-separated integers, got {args.k!r}")
    if not ks or min(ks) < 1:
        ap.error(f"--k needs integers >= 1, got {args.k!r}")

    from archive import Archive, ArchiveError

    try:
        arch = Archive.open_readonly(args.archive)
    except ArchiveError as e:
        print(f"surrogate_bench: {args.archive}: {e}", file=sys.stderr)
        return 2
    try:
        space = space_from_header(arch.header.get("problem", {}))
        records = [r for r in arch.records("ok") if r.evaluation.case_times()]
        device = (arch.header.get("device") or {}).get("name", "unknown device")
    finally:
        arch.close()
    if len(records) < 4:
        print(f"surrogate_bench: {args.archive} has {len(records)} OK records with per-case times; need 4 or more",
              file=sys.stderr)
        return 2
    children = sum(1 for r in records if r.operator not in ("seed", "warm_start") and r.parents)
    print(f"{args.archive}: {len(records)} OK records ({children} operator children), {len(space.params)} params, "
          f"times measured on {device}")
    for k in ks:
        loo = leave_one_out(space, records, k)
        right, wrong = child_vs_parent(space, records, k, args.min_change)
        share = f"{100 * right / (right + wrong):.1f}%" if right + wrong else "n/a"
        line = f"k={k}: "
        if loo:
            line += (f"leave-one-out Spearman median {loo['median']:.3f} (min {loo['min']:.3f}, max {loo['max']:.3f}, "
                     f"{loo['cases']} cases), median |log err| {loo['abs_log_err']:.3f}; ")
        line += f"child vs parent sign right {right} of {right + wrong} ({share})"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
