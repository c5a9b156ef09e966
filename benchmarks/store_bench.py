"""Storing drawn inputs in the buffers' types on the device: two passes vs ``store_into``.

The Timing stage draws every case's inputs anew for each evaluation and stores them in the
buffers' storage types (run 27's report, H100: ``inputs/store`` 0.329 s of 1.035 s of inputs per
evaluation). The former path rounded into a new array and copied that into the buffer
(``buf[...] = to_storage(values)``: for float32, a copy of a copy); ``store_into`` rounds
straight into the buffer. Both run here on the same float32 values, in alternating order, and
their results are compared bit for bit::

    python benchmarks/store_bench.py                              # 2**27 and 2**31 elements
    python benchmarks/store_bench.py --sizes 134217728 --repeats 7

Prints one line per size and dtype: min-max seconds of each path and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from sidebyside import alternate, versus  # noqa: E402


def _compare(cp: Any, values: Any, dtype: str, repeats: int, sync: Callable[[], Any]) -> str:
    """Both paths on ``values`` into one destination, alternating; a line of their times."""
    from fitness._dtypes import storage_dtype, store_into, to_storage

    dst = cp.empty(values.size, dtype=storage_dtype(dtype).name)

    def two_pass() -> None:
        dst[...] = to_storage(values, dtype, cp)

    def one_pass() -> None:
        store_into(dst, values, dtype, cp)

    one_pass()
    ref = dst.copy()
    two_pass()
    same = bool(cp.array_equal(ref.view(cp.uint8), dst.view(cp.uint8)))
    del ref
    times = alternate([("two passes", two_pass), ("store_into", one_pass)], repeats, sync)
    return f"{versus(times, 'two passes', 'store_into')}, same bits: {same}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=f"{1 << 27},{1 << 31}", help="comma list of element counts")
    ap.add_argument("--dtypes", default="float32,float16,bfloat16")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        raise SystemExit(f"--sizes {args.sizes!r}: give element counts, e.g. 134217728,2147483648") from None
    if args.repeats < 1:
        raise SystemExit("--repeats must be 1 or more")
    from fitness._device import gpu_available

    if not gpu_available():
        raise SystemExit("store_bench needs a usable CUDA device (cupy sees none here)")
    import cupy as cp
    import numpy as np

    from fitness import random_normal

    sync = cp.cuda.runtime.deviceSynchronize
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, cupy {cp.__version__}")
    for n in sizes:
        values = random_normal(np.random.default_rng(n), (n,), cp)
        for dtype in args.dtypes.split(","):
            print(f"n={n} {dtype}: {_compare(cp, values, dtype, args.repeats, sync)}", flush=True)
        del values
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
