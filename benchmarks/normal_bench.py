"""The fused normal generator (``fitness.random_normal`` on cupy): one division per element vs none.

The Timing stage draws every case's inputs anew for each evaluation (twice: warm-up and timed
contents), and the draw was the largest part of its inputs (run 30's report, H100:
``inputs/draw`` 0.399 s of 0.808 s per evaluation). The generator's first form found each
element's row for its per-row scale and shift with a 64-bit division per element and per
vector; the current one steps row and column along the grid stride. Both forms run here on
the same seeds and shapes, in alternating order, and their outputs are compared bit for bit
(the current form must draw exactly the values the first one drew)::

    python benchmarks/normal_bench.py                            # 32768x1024, 8192x262144
    python benchmarks/normal_bench.py --shapes 1000x1001 --repeats 7 --plain

Prints one line per shape: min-max seconds of each form, elements per second of the current
one, the ratio of the medians, and whether the bits agree. ``--store bfloat16,float32`` adds,
per shape and dtype, an input stored from a deferred draw (``fitness.normal_draw``): float32
values then ``store_into`` against the draw written straight into the buffer's storage.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from sidebyside import alternate, medians, versus  # noqa: E402

#: The generator's first form: the row of every element by a 64-bit division (the oracle).
FIRST_FORM = r"""
typedef unsigned long long u64;
__device__ __forceinline__ u64 splitmix64(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
extern "C" __global__ void normal_first(float* __restrict__ out, long long n, u64 seed,
                                        const float* __restrict__ scale, const float* __restrict__ shift,
                                        long long row_len) {
    long long pairs = (n + 1) >> 1;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += stride) {
        u64 z = splitmix64(seed ^ splitmix64((u64)p));
        float u1 = ((float)(z >> 40) + 1.0f) * 5.9604644775390625e-08f;
        float u2 = (float)(z & 0xFFFFFFull) * 5.9604644775390625e-08f;
        float r = sqrtf(-2.0f * logf(u1));
        float s, c;
        sincospif(2.0f * u2, &s, &c);
        float v[2] = {r * c, r * s};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            long long i = 2 * p + h;
            if (i < n) {
                float x = v[h];
                if (scale) x *= scale[i / row_len];
                if (shift) x += shift[i / row_len];
                out[i] = x;
            }
        }
    }
}
"""

_FIRST: dict[str, Any] = {}


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """``"32768x1024,7"`` -> ``[(32768, 1024), (7,)]``; a clear error otherwise."""
    shapes: list[tuple[int, ...]] = []
    for part in text.split(","):
        try:
            shape = tuple(int(d) for d in part.strip().lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes {text!r}: give shapes like 32768x1024 or 1000003, comma-separated") from None
        if not shape or any(d < 1 for d in shape):
            raise SystemExit(f"--shapes {text!r}: every dimension must be 1 or more")
        shapes.append(shape)
    return shapes


def first_form(cp: Any, seed: int, shape: tuple[int, ...], scale: Any = None, shift: Any = None) -> Any:
    """The first form's values for ``seed`` and ``shape`` (launched as ``Fused.normal`` launches)."""
    from fitness._fused import BLOCK, GRID

    fn = _FIRST.get("fn")
    if fn is None:
        fn = _FIRST["fn"] = cp.RawModule(code=FIRST_FORM, options=("--std=c++17",)).get_function("normal_first")
    out = cp.empty(shape, dtype=cp.float32)
    n = int(out.size)
    row_len = max(1, n // shape[0])
    ptrs = [cp.uint64(0) if v is None else cp.ascontiguousarray(v, dtype=cp.float32) for v in (scale, shift)]
    grid = max(1, min(GRID * 8, -(-((n + 1) // 2) // BLOCK)))
    fn((grid,), (BLOCK,), (out, cp.int64(n), cp.uint64(seed & (2**64 - 1)), ptrs[0], ptrs[1], cp.int64(row_len)))
    return out


def _fused(cp: Any) -> Any:
    from fitness._fused import fused_for

    fused = fused_for(cp)
    if fused is None:
        raise RuntimeError("the fused kernels did not build on this device")
    return fused


def _row_vectors(cp: Any, rows: int, per_row: bool) -> tuple[Any, Any]:
    """(scale, shift) of ``rows`` values each, or (None, None) without ``per_row``."""
    if not per_row:
        return None, None
    return cp.linspace(0.5, 3.0, rows, dtype=cp.float32), cp.linspace(-1.0, 1.0, rows, dtype=cp.float32)


def same_values(cp: Any, seed: int, shape: tuple[int, ...], *, per_row: bool = True) -> bool:
    """Whether the current generator draws the first form's bits for ``seed`` and ``shape``
    (with a per-row scale and shift unless ``per_row`` is false)."""
    scale, shift = _row_vectors(cp, shape[0], per_row)
    now = _fused(cp).normal(seed, shape, scale=scale, shift=shift)
    first = first_form(cp, seed, shape, scale, shift)
    return bool(cp.array_equal(now.view(cp.uint32), first.view(cp.uint32)))


def compare(cp: Any, shape: tuple[int, ...], repeats: int, *, per_row: bool = True) -> str:
    """Both forms on ``shape``, alternating; a line of their times and whether the bits agree."""
    fused = _fused(cp)
    sync = cp.cuda.runtime.deviceSynchronize
    scale, shift = _row_vectors(cp, shape[0], per_row)
    same = same_values(cp, 12345, shape, per_row=per_row)
    cp.get_default_memory_pool().free_all_blocks()
    order: list[tuple[str, Callable[[], Any]]] = [
        ("first", lambda: first_form(cp, 7, shape, scale, shift)),
        ("current", lambda: fused.normal(7, shape, scale=scale, shift=shift)),
    ]
    for _, fn in order:  # compiles and allocates outside the timed repeats
        fn()
    times = alternate(order, repeats, sync, cp.get_default_memory_pool().free_all_blocks)
    rate = math.prod(shape) / medians(times)["current"] / 1e9
    return f"{versus(times, 'first', 'current')} (current: {rate:.1f} G elements/s), same bits: {same}"


def compare_store(cp: Any, shape: tuple[int, ...], dtype: str, repeats: int) -> str:
    """An input stored from a deferred draw: float32 values then ``store_into`` vs the draw
    written straight into the buffer's storage (``NormalDraw.store_into``); times and bits."""
    from fitness import normal_draw
    from fitness._dtypes import storage_dtype, store_into

    sync = cp.cuda.runtime.deviceSynchronize
    draw = normal_draw(9, shape, scale=_row_vectors(cp, shape[0], True)[0])
    dst = cp.empty(draw.size, dtype=storage_dtype(dtype))
    bits = f"u{dst.itemsize}"

    def two_step() -> None:
        store_into(dst, draw.values(cp).reshape(-1), dtype, cp)

    def straight() -> None:
        draw.store_into(dst, dtype, cp)

    two_step()
    want = dst.copy()
    straight()
    same = bool(cp.array_equal(want.view(bits), dst.view(bits)))
    del want
    times = alternate([("values then store", two_step), ("straight into storage", straight)], repeats, sync,
                      cp.get_default_memory_pool().free_all_blocks)
    return f"{versus(times, 'values then store', 'straight into storage')}, same bits: {same}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="32768x1024,8192x262144", help="comma list of shapes, e.g. 32768x1024")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--plain", action="store_true", help="no per-row scale and shift")
    ap.add_argument("--store", default="", metavar="DTYPES",
                    help="also compare storing a deferred draw in these dtypes (e.g. bfloat16,float32): "
                         "float32 values then store_into vs straight into the storage")
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    stores = [d for d in args.store.split(",") if d]
    unknown = sorted(set(stores) - {"float32", "float16", "bfloat16", "float64"})
    if unknown:
        raise SystemExit(f"--store {args.store!r}: unknown dtype(s) {unknown}; use float32, float16, bfloat16, float64")
    if args.repeats < 1:
        raise SystemExit("--repeats must be 1 or more")
    from fitness._device import gpu_available

    if not gpu_available():
        raise SystemExit("normal_bench needs a usable CUDA device (cupy sees none here)")
    import cupy as cp

    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, cupy {cp.__version__}")
    for shape in shapes:
        label = "x".join(str(d) for d in shape)
        print(f"{label}{'' if args.plain else ' (per-row scale and shift)'}: "
              f"{compare(cp, shape, args.repeats, per_row=not args.plain)}", flush=True)
        for dtype in stores:
            print(f"{label} {dtype} input: {compare_store(cp, shape, dtype, args.repeats)}", flush=True)
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
