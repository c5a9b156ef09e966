"""The RMSNorm forward reference on the device: chunked whole-array passes vs fused kernels.

The evaluator computes the Problem's reference once per timed input set of every case of every
candidate, so at the long rows (2**31 elements per set) its passes over float64 temporaries
were a measured share of an evaluation's time (run 26's archive, H100: references 0.74 s of
3.81 s of Timing per evaluation). ``fwd_reference(..., fused=False)`` is the former path
(row chunks: widen to float64, square, mean; then two float32 products through a temporary),
``fused=True`` the current one (one float64 sum-of-squares reduction, one scaling kernel).
Both are timed here on the timed shapes' sizes, on the same float32 input, side by side,
and their outputs compared (the fused sums add in another order, so a row's rstd may differ
in its last bit)::

    python benchmarks/rmsnorm_reference_bench.py                 # five shapes, 3 repeats
    python benchmarks/rmsnorm_reference_bench.py --shapes 32768x4096,8192x262144 --repeats 5

Prints one line per shape: min-max seconds of each path, the ratio of the minima, and
max |y_fused - y_chunked| / max |y_chunked|; then the inputs' generator on the same size
(``fitness.random_normal``) with and without the per-row scale the forward's x carries: the
other large share of an evaluation's time at long rows (the inputs are drawn twice per case).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_SHAPES = "32768x256,32768x4096,32768x32768,16384x131072,8192x262144"


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"MxN,MxN"`` as (M, N) pairs.

    Raises:
        SystemExit: A shape that is not two positive integers joined by ``x``.
    """
    out = []
    for part in text.split(","):
        m_s, sep, n_s = part.strip().partition("x")
        if not sep or not m_s.isdigit() or not n_s.isdigit() or int(m_s) < 1 or int(n_s) < 1:
            raise SystemExit(f"--shapes: {part!r} is not MxN with positive integers (e.g. 32768x4096)")
        out.append((int(m_s), int(n_s)))
    return out


def time_calls(call: Callable[[int], Any], repeats: int, sync: Callable[[], Any]) -> tuple[list[float], Any]:
    """Seconds of ``call(1)`` ... ``call(repeats)``, each ended by ``sync()``, after an untimed ``call(0)``.

    Returns the times and the last call's result; each result is freed before the next call
    (at 2**31 elements one is 8 GiB).
    """
    call(0)
    sync()
    ts, out = [], None
    for i in range(1, repeats + 1):
        out = None
        t0 = time.perf_counter()
        out = call(i)
        sync()
        ts.append(time.perf_counter() - t0)
    return ts, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma list of MxN")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls of each path per shape (after one warm-up)")
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    if args.repeats < 1:
        ap.error(f"--repeats must be 1 or more (got {args.repeats})")
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - any reason there is no device ends here
        print(f"rmsnorm_reference_bench: no CUDA device through cupy ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    from evo.types import Case
    from examples.rmsnorm_problem import fwd_reference
    from fitness import random_normal

    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; cupy {cp.__version__}", flush=True)
    sync = cp.cuda.runtime.deviceSynchronize
    for m, n in shapes:
        case = Case({"M": m, "N": n}, "float32")
        inp = {"x": cp.random.standard_normal(m * n, dtype=cp.float32),
               "w": cp.random.standard_normal(n, dtype=cp.float32)}
        res = {}
        for fused in (False, True):
            ts, y = time_calls(lambda _i, a=inp, c=case, f=fused: fwd_reference(a, c, cp, fused=f)["y"], args.repeats,
                               sync)
            res[fused] = (min(ts), max(ts), y)
        old, new = res[False], res[True]
        diff = float(cp.abs(new[2] - old[2]).max() / cp.abs(old[2]).max())
        print(f"{m}x{n}: chunked {old[0] * 1e3:.2f}-{old[1] * 1e3:.2f} ms, fused {new[0] * 1e3:.2f}-{new[1] * 1e3:.2f} ms, "
              f"chunked/fused {old[0] / new[0]:.2f}, max|diff|/max|y| {diff:.2g}", flush=True)
        inp = res = old = new = y = None
        cp.get_default_memory_pool().free_all_blocks()
        scale = cp.ones(m, dtype=cp.float32)
        gen = {}
        for label, kw in (("unscaled", {}), ("scaled", {"scale": scale})):
            ts, _ = time_calls(lambda i, shape=(m, n), kw=kw: random_normal(1 + i, shape, cp, **kw), args.repeats, sync)
            gen[label] = min(ts)
        print(f"{m}x{n}: random_normal unscaled {gen['unscaled'] * 1e3:.2f} ms, scaled {gen['scaled'] * 1e3:.2f} ms",
              flush=True)
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
