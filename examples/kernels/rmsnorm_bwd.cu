// RMSNorm backward, deterministic, one launch.
//
// Buffers: x [M*N], w [N] float32, dy [M*N], rstd [M] float32 (in); dx [M*N], dw [N] float32 (out).
// Scalars: M, N, dtype_code (0 fp32, 1 fp16, 2 bf16).
//
// Grid = ceil(N/32) + M CTAs of THREADS threads:
//   * CTAs [0, ceil(N/32)) each own 32 columns of dw; warp k sums rows k, k+W, ... (W = THREADS/32),
//     then the W partials are added in warp order through shared memory: a fixed order, so dw is
//     bitwise reproducible and needs no atomics, no workspace and no grid-wide sync.
//   * CTA ceil(N/32) + i computes row i of dx: pass 1 reduces dot = sum_j w_j dy_j x_j,
//     pass 2 re-reads the row (L1/L2-hot) and writes dx_j = rstd*w_j*dy_j - x_j*rstd^3*dot/N.
// The dw CTAs read x and dy a second time (5 M*N element transfers instead of 3); see docs/rmsnorm.md.
//
// Knobs: THREADS (128..1024), UNROLL (independent loads in flight per thread), LOAD_HINT
// (0 default, 1 ld.global.nc, 2 ld.global.cg).
#include <cuda_fp16.h>

#ifndef THREADS
#define THREADS 256
#endif
#ifndef UNROLL
#define UNROLL 4
#endif
#ifndef LOAD_HINT
#define LOAD_HINT 0
#endif
#if THREADS % 32 != 0 || THREADS < 32 || THREADS > 1024
#error "THREADS must be a multiple of 32 in [32, 1024]"
#endif
#define WARPS (THREADS / 32)

template <typename T>
__device__ __forceinline__ T ldx(const T* p) {
#if LOAD_HINT == 1
    return __ldg(p);
#elif LOAD_HINT == 2
    return __ldcg(p);
#else
    return *p;
#endif
}

template <int DT>
__device__ __forceinline__ float ld_elem(const void* base, long long i) {
    if (DT == 0) return ldx(static_cast<const float*>(base) + i);
    unsigned short b = ldx(static_cast<const unsigned short*>(base) + i);
    if (DT == 1) return __half2float(__ushort_as_half(b));
    return __uint_as_float(static_cast<unsigned>(b) << 16);
}

template <int DT>
__device__ __forceinline__ void st_elem(void* base, long long i, float v) {
    if (DT == 0) {
        static_cast<float*>(base)[i] = v;
    } else if (DT == 1) {
        static_cast<unsigned short*>(base)[i] = __half_as_ushort(__float2half_rn(v));
    } else {
        unsigned short b;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(v));
        static_cast<unsigned short*>(base)[i] = b;
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        float o;
        asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(o) : "f"(v), "r"(off));
        v += o;
    }
    return v;
}

template <int DT>
__device__ void dw_columns(const void* x, const void* dy, const float* rstd, float* dw, int M, int N, int tile,
                           float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int col = tile * 32 + lane;
    float acc = 0.f;
    if (col < N) {
        int i = warp;
        for (; i + (UNROLL - 1) * WARPS < M; i += UNROLL * WARPS) {
            float xv[UNROLL], gv[UNROLL], rv[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const long long idx = static_cast<long long>(i + u * WARPS) * N + col;
                xv[u] = ld_elem<DT>(x, idx);
                gv[u] = ld_elem<DT>(dy, idx);
                rv[u] = __ldg(rstd + i + u * WARPS);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) acc = fmaf(gv[u], xv[u] * rv[u], acc);
        }
        for (; i < M; i += WARPS) {
            const long long idx = static_cast<long long>(i) * N + col;
            acc = fmaf(ld_elem<DT>(dy, idx), ld_elem<DT>(x, idx) * __ldg(rstd + i), acc);
        }
    }
    red[warp * 32 + lane] = acc;
    __syncthreads();
    if (warp == 0 && col < N) {
        float s = 0.f;
        for (int k = 0; k < WARPS; ++k) s += red[k * 32 + lane];
        dw[col] = s;
    }
}

template <int DT>
__device__ void dx_row(const void* x, const float* w, const void* dy, const float* rstd, void* dx, int N,
                       long long row, float* red) {
    const long long base = row * N;
    float dot = 0.f;
    int j = threadIdx.x;
    for (; j + (UNROLL - 1) * THREADS < N; j += UNROLL * THREADS) {
        float a[UNROLL], b[UNROLL], c[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            a[u] = ld_elem<DT>(x, base + j + u * THREADS);
            b[u] = ld_elem<DT>(dy, base + j + u * THREADS);
            c[u] = __ldg(w + j + u * THREADS);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) dot = fmaf(a[u], b[u] * c[u], dot);
    }
    for (; j < N; j += THREADS) dot = fmaf(ld_elem<DT>(x, base + j), ld_elem<DT>(dy, base + j) * __ldg(w + j), dot);
    dot = warp_sum(dot);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = dot;
    __syncthreads();
    dot = 0.f;
#pragma unroll
    for (int k = 0; k < WARPS; ++k) dot += red[k];
    const float r = __ldg(rstd + row);
    const float coef = r * r * r * dot / static_cast<float>(N);
    for (j = threadIdx.x; j < N; j += THREADS) {
        const float xv = ld_elem<DT>(x, base + j);
        const float g = ld_elem<DT>(dy, base + j) * __ldg(w + j);
        st_elem<DT>(dx, base + j, r * g - xv * coef);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    rmsnorm_bwd(const void* __restrict__ x, const float* __restrict__ w, const void* __restrict__ dy,
                const float* __restrict__ rstd, void* __restrict__ dx, float* __restrict__ dw, int M, int N,
                int dtype_code) {
    __shared__ float red[THREADS];
    const int ntiles = (N + 31) / 32;
    const long long b = blockIdx.x;
    if (b < ntiles) {
        if (dtype_code == 0) dw_columns<0>(x, dy, rstd, dw, M, N, static_cast<int>(b), red);
        else if (dtype_code == 1) dw_columns<1>(x, dy, rstd, dw, M, N, static_cast<int>(b), red);
        else dw_columns<2>(x, dy, rstd, dw, M, N, static_cast<int>(b), red);
    } else {
        const long long row = b - ntiles;
        if (row >= M) return;
        if (dtype_code == 0) dx_row<0>(x, w, dy, rstd, dx, N, row, red);
        else if (dtype_code == 1) dx_row<1>(x, w, dy, rstd, dx, N, row, red);
        else dx_row<2>(x, w, dy, rstd, dx, N, row, red);
    }
}
