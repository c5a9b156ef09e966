"""The Timing stage's fresh inputs for the RMSNorm Problems: deferred draws vs arrays, side by side.

Every evaluation fills each timed case's input buffers twice (warm-up and timed contents). With
arrays, ``make_inputs`` draws float32 values and the harness then rounds them into the buffers
(for a bfloat16 x: 4 bytes written, 4 read and 2 written per element); with a deferred draw
(``fitness.normal_draw``) the harness draws x (and the backward's dy) straight into the buffer
(2 bytes written). This runs the harness's own fill (``fitness._gate._fill_inputs``: draw,
store, checksums) into one set of buffers per case, both ways in alternating order, and checks that
both store the same bits (the same seed must give the same inputs either way)::

    python benchmarks/inputs_bench.py                                  # forward, the 33 timed cases
    python benchmarks/inputs_bench.py --backward --dtypes bfloat16 --repeats 5
    python benchmarks/inputs_bench.py --shapes 32768x1024,8192x262144

Prints one line per case (median seconds of each way, ratio, same bits) and the totals; ``--out``
writes them as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import normal_bench  # noqa: E402
from sidebyside import alternate, medians  # noqa: E402


def parse_shapes(text: str) -> list[dict[str, int]]:
    """``"32768x1024,8192x262144"`` -> ``[{"M": 32768, "N": 1024}, ...]``; a clear error otherwise."""
    shapes = normal_bench.parse_shapes(text)
    if any(len(s) != 2 for s in shapes):
        raise SystemExit(f"--shapes {text!r}: give MxN shapes, e.g. 32768x1024,8192x262144")
    return [{"M": m, "N": n} for m, n in shapes]


def eager(make_inputs: Callable[..., Mapping[str, Any]]) -> Callable[..., dict[str, Any]]:
    """``make_inputs`` with every deferred draw drawn as a float32 array (the former way)."""
    from fitness import materialize

    def inputs(case: Any, rng: Any, xp: Any) -> dict[str, Any]:
        return materialize(make_inputs(case, rng, xp), xp)

    return inputs


def compare_case(backend: Any, problem: Any, case: Any, repeats: int) -> dict[str, Any]:
    """Both ways on ``case``, alternating, into one set of buffers (the harness's fill: draw, store,
    checksums); their median seconds and whether the stored bits agree for one seed."""
    from fitness._device import GUARD_BYTES, make_canary
    from fitness._gate import _fill_inputs, _new_set, _scalars

    xp = backend.xp
    xp.get_default_memory_pool().free_all_blocks()  # the previous case's buffers
    ways = {"arrays": dataclasses.replace(problem, make_inputs=eager(problem.make_inputs)), "deferred": problem}
    cs = _new_set(backend, list(problem.signature(case)), _scalars(problem, case), make_canary(1, GUARD_BYTES, xp))

    def fill(prob: Any, seed: int) -> dict[str, int]:
        _fill_inputs(backend, prob, case, cs, seed)
        return dict(cs.in_sums)

    fill(problem, 1)  # compiles the fused kernels outside the timed repeats
    same = fill(ways["arrays"], 77) == fill(ways["deferred"], 77)
    seeds = itertools.count(1000)  # a new seed per fill, as every evaluation draws anew
    order = [(name, lambda prob=prob: fill(prob, next(seeds))) for name, prob in ways.items()]
    times = alternate(order, repeats, backend.synchronize, xp.get_default_memory_pool().free_all_blocks)
    med = medians(times)
    return {"case": case.key, "arrays_s": med["arrays"], "deferred_s": med["deferred"],
            "arrays_range": [min(times["arrays"]), max(times["arrays"])],
            "deferred_range": [min(times["deferred"]), max(times["deferred"])],
            "ratio": med["arrays"] / med["deferred"] if med["deferred"] > 0 else float("inf"),
            "same_bits": same}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backward", action="store_true", help="the backward Problem (x, w, dy, rstd)")
    ap.add_argument("--shapes", default="", help="MxN list (default: the Problem's timed shapes)")
    ap.add_argument("--dtypes", default="bfloat16,float16,float32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write the rows and totals as JSON")
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes) if args.shapes else None
    dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = sorted(set(dtypes) - {"bfloat16", "float16", "float32"})
    if unknown or not dtypes:
        raise SystemExit(f"--dtypes {args.dtypes!r}: use bfloat16, float16 and/or float32")
    if args.repeats < 1:
        raise SystemExit("--repeats must be 1 or more")
    from fitness._device import gpu_available

    if not gpu_available():
        raise SystemExit("inputs_bench needs a usable CUDA device (cupy sees none here)")
    from evo.types import Case
    from examples.rmsnorm_problem import make_backward_problem, make_forward_problem
    from fitness._device import CupyBackend

    make = make_backward_problem if args.backward else make_forward_problem
    problem = make(timed=shapes) if shapes else make()
    backend = CupyBackend()
    cp = backend.xp
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, cupy {cp.__version__}, "
          f"{'backward' if args.backward else 'forward'}, {args.repeats} repeats")
    rows = []
    for dtype in dtypes:
        for shape in problem.timed_shapes:
            row = compare_case(backend, problem, Case(dict(shape), dtype), args.repeats)
            rows.append(row)
            print(f"{row['case']}: arrays {row['arrays_s']:.4f} s, deferred {row['deferred_s']:.4f} s, "
                  f"{row['ratio']:.2f}x, same bits: {row['same_bits']}", flush=True)
    total = {k: sum(r[k] for r in rows) for k in ("arrays_s", "deferred_s")}
    print(f"all {len(rows)} cases, one fill each: arrays {total['arrays_s']:.3f} s, deferred {total['deferred_s']:.3f} s "
          f"({total['arrays_s'] / max(total['deferred_s'], 1e-12):.2f}x); same bits in every case: "
          f"{all(r['same_bits'] for r in rows)}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "total": total}, indent=1))
    return 0 if all(r["same_bits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
