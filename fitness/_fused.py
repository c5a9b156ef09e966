"""Single-pass device kernels for the gate's hot paths (CuPy only).

The gate's array logic in :mod:`fitness._dtypes` and :mod:`fitness._gate` is written once
for ``numpy`` and ``cupy`` with whole-array operations. On multi-GiB buffers those take
many passes over memory (float64 temporaries, one kernel per operation) and dominate the
cost of an evaluation. The kernels here do the same work in one pass each:

* :meth:`Fused.checksum` - the position-weighted checksum of :func:`fitness._dtypes.checksum`
  (integer sums modulo 2**64: the result is bit-identical whatever the order);
* :meth:`Fused.compare_norms` - pass 1 of :func:`fitness._gate.compare` straight from the
  output's storage (float32, float16, bfloat16 bits or float64) against a float32 or
  float64 reference: squared error and reference norms in float64, non-finite and
  special-value counts. Partial sums are per block on a fixed grid, so the result is
  deterministic;
* :meth:`Fused.f32_to_bf16` / :meth:`Fused.bf16_to_f32` - the round-to-nearest-even
  conversions of :mod:`fitness._dtypes`;
* :meth:`Fused.normal` - standard normal values from a seed (the fresh inputs of
  :func:`fitness.random_normal` and :class:`fitness.NormalDraw`), in float32 or written
  straight into a float16 or bfloat16 buffer.

:func:`fused_for` returns ``None`` for numpy (and when the kernels cannot be built, with a
warning), and callers then take the whole-array path; the two paths agree (GPU tests
check them against each other). :data:`SOURCE` compiles with plain ``nvcc`` as well, which
the CPU test suite checks.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

__all__ = ["FUSED_DTYPES", "NORMAL_DTYPES", "SOURCE", "Fused", "fused_for"]

log = logging.getLogger(__name__)

#: Threads per block of every kernel here.
BLOCK = 256
#: Blocks of the grid-stride reductions (fixed, so partial sums are reproducible).
GRID = 1024

#: CUDA C++ of the kernels (no includes: half conversions through PTX).
SOURCE = r"""
typedef unsigned long long u64;

__device__ __forceinline__ float half_bits_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

template <int KIND> struct Load;
template <> struct Load<0> { typedef float T;          static __device__ double get(T v) { return (double)v; } };
template <> struct Load<1> { typedef unsigned short T; static __device__ double get(T v) { return (double)half_bits_to_float(v); } };
template <> struct Load<2> { typedef unsigned short T; static __device__ double get(T v) { return (double)__uint_as_float(((unsigned int)v) << 16); } };
template <> struct Load<3> { typedef double T;         static __device__ double get(T v) { return v; } };

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ u64 warp_sum_u(u64 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

// sum(word[i] * (2*i + 1)) mod 2^64 over n words; 16-byte loads when `words` is 16-byte aligned.
extern "C" __global__ void __launch_bounds__(256) checksum_u32(const unsigned int* __restrict__ words, long long n,
                                                               u64* __restrict__ out) {
    __shared__ u64 part[8];
    u64 acc = 0;
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long head = 0;
    if ((((unsigned long long)words) & 15ull) == 0) {
        long long nq = n >> 2;
        const uint4* q = reinterpret_cast<const uint4*>(words);
        for (long long i = tid; i < nq; i += stride) {
            uint4 v = q[i];
            u64 w0 = 8ull * (u64)i + 1ull;  // weight of word 4i is 2*(4i)+1
            acc += (u64)v.x * w0 + (u64)v.y * (w0 + 2ull) + (u64)v.z * (w0 + 4ull) + (u64)v.w * (w0 + 6ull);
        }
        head = nq << 2;
    }
    for (long long i = head + tid; i < n; i += stride) acc += (u64)words[i] * (2ull * (u64)i + 1ull);
    acc = warp_sum_u(acc);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 s = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) s += part[w];
        atomicAdd(out, s);
    }
}

// Pass 1 of the comparison: per-block partial ||out-ref||^2 and ||ref||^2 (finite references only),
// and counts[0] += outputs non-finite where the reference is finite,
//     counts[1] += elements where the reference is NaN/Inf and the output differs.
template <int KIND, typename R>
__global__ void __launch_bounds__(256) compare_norms(const typename Load<KIND>::T* __restrict__ out,
                                                     const R* __restrict__ ref, long long n,
                                                     double* __restrict__ partial, u64* __restrict__ counts) {
    __shared__ double se[8], sr[8];
    __shared__ u64 sn[8], ss[8];
    double err = 0.0, rs = 0.0;
    u64 nonfinite = 0, special = 0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double o = Load<KIND>::get(out[i]);
        double r = (double)ref[i];
        bool rnan = r != r, onan = o != o;
        bool rinf = !rnan && (r - r != 0.0), oinf = !onan && (o - o != 0.0);
        bool rfin = !rnan && !rinf, ofin = !onan && !oinf;
        if (rfin) {
            rs += r * r;
            if (ofin) { double d = o - r; err += d * d; } else { nonfinite += 1; }
        } else if (rnan) {
            special += onan ? 0 : 1;
        } else {
            special += (o == r) ? 0 : 1;
        }
    }
    err = warp_sum_d(err); rs = warp_sum_d(rs);
    nonfinite = warp_sum_u(nonfinite); special = warp_sum_u(special);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { se[warp] = err; sr[warp] = rs; sn[warp] = nonfinite; ss[warp] = special; }
    __syncthreads();
    if (threadIdx.x == 0) {
        double e = 0.0, q = 0.0; u64 a = 0, b = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) { e += se[w]; q += sr[w]; a += sn[w]; b += ss[w]; }
        partial[2 * blockIdx.x] = e;
        partial[2 * blockIdx.x + 1] = q;
        if (a) atomicAdd(&counts[0], a);
        if (b) atomicAdd(&counts[1], b);
    }
}

// Round-to-nearest-even float32 -> bfloat16 bits; NaN stays a quiet NaN.
__device__ __forceinline__ unsigned short bf16_bits(float x) {
    unsigned int b = __float_as_uint(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((b >> 16) | 0x40u);
    return (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// Round-to-nearest-even float32 -> float16 bits (out of range: +-inf, as the hardware does).
__device__ __forceinline__ unsigned short f16_bits(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

extern "C" __global__ void f32_to_bf16(const float* __restrict__ x, unsigned short* __restrict__ y, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = bf16_bits(x[i]);
}

// Stores of generated values in a storage type: 0 float32, 1 float16 bits, 2 bfloat16 bits;
// `two` writes elements i and i+1 with one store (the caller checks the alignment).
template <int K> struct Store;
template <> struct Store<0> {
    typedef float T;
    static __device__ __forceinline__ void one(T* o, float a) { *o = a; }
    static __device__ __forceinline__ void two(T* o, float a, float b) { *reinterpret_cast<float2*>(o) = make_float2(a, b); }
};
template <> struct Store<1> {
    typedef unsigned short T;
    static __device__ __forceinline__ void one(T* o, float a) { *o = f16_bits(a); }
    static __device__ __forceinline__ void two(T* o, float a, float b) {
        *reinterpret_cast<unsigned int*>(o) = (unsigned int)f16_bits(a) | ((unsigned int)f16_bits(b) << 16);
    }
};
template <> struct Store<2> {
    typedef unsigned short T;
    static __device__ __forceinline__ void one(T* o, float a) { *o = bf16_bits(a); }
    static __device__ __forceinline__ void two(T* o, float a, float b) {
        *reinterpret_cast<unsigned int*>(o) = (unsigned int)bf16_bits(a) | ((unsigned int)bf16_bits(b) << 16);
    }
};

// Standard normal float32 values from a counter-based generator (splitmix64 of seed + pair
// index, Box-Muller), optionally out = z * scale[row] + shift[row] for rows of row_len,
// written in the storage type of Store<K> (rounded once, from the float32 value).
__device__ __forceinline__ u64 splitmix64(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Rows of a thread's elements as it walks pairs p, p + stride, ...: element 2p lies at (row, col)
// of rows of len elements; each step adds 2 * stride = dq rows + dr columns (dr < len), so there
// is no division per pair. Host-callable: the CPU tests walk it against i / len.
struct RowWalk {
    long long row, col, dq, dr, len;
    __host__ __device__ RowWalk(long long p, long long stride, long long row_len) : len(row_len) {
        row = (2 * p) / len; col = 2 * p - row * len;
        dq = (2 * stride) / len; dr = 2 * stride - dq * len;
    }
    __host__ __device__ long long second() const { return col + 1 == len ? row + 1 : row; }  // row of 2p + 1
    __host__ __device__ void step() {
        col += dr; row += dq;
        if (col >= len) { col -= len; row += 1; }
    }
};

template <int K>
__global__ void normal_into(typename Store<K>::T* __restrict__ out, long long n, u64 seed,
                            const float* __restrict__ scale, const float* __restrict__ shift, long long row_len) {
    long long pairs = (n + 1) >> 1;
    long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    if (p >= pairs) return;
    const bool per_row = scale != nullptr || shift != nullptr;
    const bool vec = (((unsigned long long)out) & (2 * sizeof(typename Store<K>::T) - 1)) == 0;
    RowWalk walk(p, stride, row_len);
    for (; p < pairs; p += stride) {
        u64 z = splitmix64(seed ^ splitmix64((u64)p));
        float u1 = ((float)(z >> 40) + 1.0f) * 5.9604644775390625e-08f;  // (0, 1]
        float u2 = (float)(z & 0xFFFFFFull) * 5.9604644775390625e-08f;   // [0, 1)
        float r = sqrtf(-2.0f * logf(u1));
        float s, c;
        sincospif(2.0f * u2, &s, &c);
        float v[2] = {r * c, r * s};
        long long i = 2 * p;
        bool both = i + 1 < n;
        if (per_row) {
            long long rows[2] = {walk.row, walk.second()};
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (h == 1 && !both) break;
                float x = v[h];
                if (scale) x *= scale[rows[h]];
                if (shift) x += shift[rows[h]];
                v[h] = x;
            }
            walk.step();
        }
        if (both && vec) {
            Store<K>::two(out + i, v[0], v[1]);  // i even: aligned as out is
        } else {
            Store<K>::one(out + i, v[0]);
            if (both) Store<K>::one(out + i + 1, v[1]);
        }
    }
}

extern "C" __global__ void bf16_to_f32(const unsigned short* __restrict__ x, float* __restrict__ y, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = __uint_as_float(((unsigned int)x[i]) << 16);
}
"""

_KINDS = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
#: Problem dtypes whose outputs :meth:`Fused.compare_norms` reads from storage.
FUSED_DTYPES = frozenset(_KINDS)
_REFS = {"float32": "float", "float64": "double"}
#: Storage kinds :meth:`Fused.normal` writes (``Store<K>`` in :data:`SOURCE`).
_NORMAL_KINDS = {"float32": 0, "float16": 1, "bfloat16": 2}
#: Problem dtypes :meth:`Fused.normal` can write straight into.
NORMAL_DTYPES = frozenset(_NORMAL_KINDS)
_NAMES = tuple(f"compare_norms<{k}, {r}>" for k in range(4) for r in ("float", "double")) + tuple(
    f"normal_into<{k}>" for k in range(3))


class Fused:
    """The compiled kernels on the current CuPy device (build with :func:`fused_for`)."""

    def __init__(self, cupy: Any) -> None:
        self.cp = cupy
        self.module = cupy.RawModule(code=SOURCE, options=("--std=c++17",), name_expressions=_NAMES)
        self._fns: dict[str, Any] = {}

    def _fn(self, name: str) -> Any:
        fn = self._fns.get(name)
        if fn is None:
            fn = self.module.get_function(name)
            self._fns[name] = fn
        return fn

    @staticmethod
    def _grid(n: int) -> int:
        return max(1, min(GRID * 8, -(-n // BLOCK)))

    def checksum(self, words: Any) -> int:
        """``sum(words[i] * (2*i+1)) mod 2**64`` of a contiguous uint32 array, as an int."""
        cp = self.cp
        out = cp.zeros(1, dtype=cp.uint64)
        n = int(words.size)
        if n:
            grid = max(1, min(GRID, -(-n // (4 * BLOCK))))
            self._fn("checksum_u32")((grid,), (BLOCK,), (words, cp.int64(n), out))
        return int(out.get()[0])

    def compare_norms(self, stored: Any, dtype: str, ref: Any) -> tuple[float, float, int, int]:
        """(sum of squared errors, sum of squared references, non-finite, special mismatches).

        Args:
            stored: The output buffer in its storage dtype (flat, contiguous).
            dtype: Its Problem dtype: float32, float16, bfloat16 or float64.
            ref: The reference, flat, float32 or float64 (other dtypes are converted).
        """
        cp = self.cp
        kind = _KINDS[dtype]
        if ref.dtype.name not in _REFS:
            ref = ref.astype(cp.float32)
        ref = cp.ascontiguousarray(ref.reshape(-1))
        stored = cp.ascontiguousarray(stored.reshape(-1))
        n = int(stored.size)
        partial = cp.zeros(2 * GRID, dtype=cp.float64)
        counts = cp.zeros(2, dtype=cp.uint64)
        if n:
            grid = max(1, min(GRID, -(-n // BLOCK)))
            fn = self._fn(f"compare_norms<{kind}, {_REFS[ref.dtype.name]}>")
            fn((grid,), (BLOCK,), (stored, ref, cp.int64(n), partial, counts))
        sums = partial.reshape(GRID, 2).sum(axis=0).get()
        c = counts.get()
        return float(sums[0]), float(sums[1]), int(c[0]), int(c[1])

    def f32_to_bf16(self, x: Any, out: Any = None) -> Any:
        """bfloat16 bit patterns (uint16) of a float32 array, same shape (written into ``out``,
        a C-contiguous uint16 array of that shape, when given)."""
        cp = self.cp
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        if out is None:
            y = cp.empty(x.shape, dtype=cp.uint16)
        elif out.dtype != cp.uint16 or out.shape != x.shape or not out.flags.c_contiguous:
            raise ValueError(f"f32_to_bf16: out must be C-contiguous uint16 of shape {x.shape}, "
                             f"got {out.dtype} {out.shape}")
        else:
            y = out
        n = int(x.size)
        if n:
            self._fn("f32_to_bf16")((self._grid(n),), (BLOCK,), (x, y, cp.int64(n)))
        return y

    def normal(self, seed: int, shape: tuple[int, ...], scale: Any = None, shift: Any = None, *,
               dtype: str = "float32", out: Any = None) -> Any:
        """Standard normal values of ``shape`` from ``seed`` (one pass, counter-based).

        ``scale`` / ``shift``: optional float32 vectors of ``shape[0]`` applied per row
        (``z * scale[i] + shift[i]``). The float32 values are the same whatever ``dtype``;
        ``dtype`` (float32, float16 or bfloat16) rounds them once into its storage
        (float32, float16, bfloat16 bits as uint16), the bits ``to_storage`` gives.

        Args:
            seed: The generator's seed (its low 64 bits).
            shape: Output shape; rows are ``shape[0]``.
            scale: Optional per-row multipliers.
            shift: Optional per-row offsets, added after scaling.
            dtype: Storage to write.
            out: A C-contiguous array of that storage with ``prod(shape)`` elements to write
                into (any shape); a new array of ``shape`` when omitted.

        Raises:
            ValueError: an unknown ``dtype``, an ``out`` of the wrong type or size, or
                per-row vectors without one value per row.
        """
        from fitness._dtypes import storage_dtype  # _dtypes imports this module

        cp = self.cp
        if dtype not in _NORMAL_KINDS:
            raise ValueError(f"normal: dtype {dtype!r} is not one of {sorted(_NORMAL_KINDS)}")
        store = storage_dtype(dtype).name
        n = math.prod(int(d) for d in shape)
        if out is None:
            out = cp.empty(shape, dtype=store)
        elif out.dtype != store or out.size != n or not out.flags.c_contiguous:
            raise ValueError(f"normal: out must be C-contiguous {store} with {n} elements for {dtype} values, "
                             f"got {out.dtype} x {out.size}")
        row_len = max(1, n // shape[0]) if shape and shape[0] else 1
        rows = shape[0] if shape else 1
        ptrs: list[Any] = []
        for v in (scale, shift):
            if v is None:
                ptrs.append(cp.uint64(0))  # a null pointer: no per-row scale / shift
                continue
            v = cp.ascontiguousarray(cp.asarray(v, dtype=cp.float32).reshape(-1))
            if v.size != rows:
                raise ValueError(f"per-row vector has {v.size} values for {rows} rows")
            ptrs.append(v)
        if n:
            grid = max(1, min(GRID * 8, -(-((n + 1) // 2) // BLOCK)))
            args = (out, cp.int64(n), cp.uint64(int(seed) & (2**64 - 1)), ptrs[0], ptrs[1], cp.int64(row_len))
            self._fn(f"normal_into<{_NORMAL_KINDS[dtype]}>")((grid,), (BLOCK,), args)
        return out

    def bf16_to_f32(self, bits: Any) -> Any:
        """float32 values of bfloat16 bit patterns (uint16), same shape."""
        cp = self.cp
        bits = cp.ascontiguousarray(bits, dtype=cp.uint16)
        y = cp.empty(bits.shape, dtype=cp.float32)
        n = int(bits.size)
        if n:
            self._fn("bf16_to_f32")((self._grid(n),), (BLOCK,), (bits, y, cp.int64(n)))
        return y


_LOCK = threading.Lock()
_CACHE: dict[int, Fused | None] = {}


def fused_for(xp: Any) -> Fused | None:
    """The fused kernels for array module ``xp`` on its current device, or ``None``.

    ``None`` for numpy, and when the kernels fail to build (logged once as a warning:
    the gate then takes its slower whole-array path).
    """
    if getattr(xp, "__name__", "") != "cupy":
        return None
    try:
        dev = int(xp.cuda.runtime.getDevice())
    except Exception:  # noqa: BLE001 - no usable device: whole-array path
        return None
    with _LOCK:
        if dev in _CACHE:
            return _CACHE[dev]
        try:
            fused: Fused | None = Fused(xp)
            fused._fn("checksum_u32")  # compiles the module now
        except Exception as exc:  # noqa: BLE001
            log.warning("fused gate kernels unavailable (%s: %s); using the slower whole-array path",
                        type(exc).__name__, exc)
            fused = None
        _CACHE[dev] = fused
        return fused
