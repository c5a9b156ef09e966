// RMSNorm backward, deterministic, one launch.
//
// Buffers: x [M*N], w [N] float32, dy [M*N], rstd [M] float32 (in); dx [M*N], dw [N] float32 (out);
// ws (workspace, float32): WS_HEADER words (a ticket counter) then up to PARTS_MAX rows of N partial
// sums of dw. The harness hands ws over all zeros and the kernel must return it all zeros.
// Scalars: M, N, dtype_code (0 fp32, 1 fp16, 2 bf16; with -DDTYPE_CODE the build holds that dtype's
// body alone, see DTC below).
//
// ALGO 0 (column CTAs + row CTAs; ws unused). Grid = ceil(N/32) + M CTAs of THREADS threads:
//   * CTAs [0, ceil(N/32)) each own 32 columns of dw; warp k sums rows k, k+W, ... (W = THREADS/32),
//     then the W partials are added in warp order through shared memory: a fixed order, so dw is
//     bitwise reproducible without atomics.
//   * CTA ceil(N/32) + i computes row i of dx: pass 1 reduces dot = sum_j w_j dy_j x_j,
//     pass 2 re-reads the row (L1/L2-hot) and writes dx_j = rstd*w_j*dy_j - x_j*rstd^3*dot/N.
//   The dw CTAs read x and dy a second time (5 M*N element transfers instead of 3).
//
// ALGO 1 (persistent rows, per-CTA partials, last CTAs reduce). Grid = G CTAs (G <= PARTS_MAX):
//   * CTA b takes rows b, b+G, ...; each thread owns fixed 16-byte column chunks (c = tid + k*THREADS),
//     holds up to MAX_CHUNKS chunks of x and dy in registers (else re-reads them for pass 2), writes dx
//     and adds dy*x*rstd to its columns' dw accumulators (shared memory when SMEM_DW and
//     N <= SMEM_DW_COLS, else the CTA's partial row in ws): x and dy are read once.
//   * Each CTA then stores its partial row in ws, fences and takes a ticket; the CTAs holding the last
//     K = min(REDUCERS, G, max(1, G / (2 * CTAS_PER_SM))) tickets wait until all G partials are in,
//     each sums its 1/K of the columns over the G partials in a fixed order (dw is bitwise
//     reproducible): CTA order, or, with fewer columns than threads, THREADS / L groups of threads
//     (L column lanes) each summing every (THREADS / L)-th partial, added in group order; clears
//     them, and the last of them resets the ticket. At most K CTAs ever wait,
//     at most half the SMs (G <= CTAS_PER_SM per SM) while at least one CTA fits on each, so the
//     CTAs they wait for always get an SM, on any GPU.
//   * TREE (S > 0): the partial rows are first summed in groups of S consecutive CTAs: each CTA takes
//     a ticket of its group (header word 1 + group), and the group's last CTA sums the group's S
//     partials in CTA order into the group's first partial row, clears the others and resets the
//     group's ticket; only these Gn = ceil(G / S) group sums then go through the last-tickets reduction
//     above (K = min(REDUCERS, Gn, max(1, G / (2 * CTAS_PER_SM))); in group order: still bitwise
//     reproducible). No CTA waits in the group step. The groups are summed while other CTAs
//     still stream their rows, so the reduction after the last CTA reads S times fewer partials.
//   N not a multiple of the 16-byte chunk, or unaligned pointers: the same with element accesses.
//
// Knobs: ALGO, THREADS (128..1024), UNROLL (ALGO 0: independent loads in flight per thread), LOAD_HINT
// (0 default, 1 ld.global.nc, 2 ld.global.cg), MAX_CHUNKS, CTAS_PER_SM (launch), SMEM_DW, REDUCERS,
// PREFETCH (ALGO 1, rows held in registers: load the CTA's (or warp's) next row before reducing this
// one, so short rows keep two rows of loads in flight per thread), ROW_WARP (ALGO 1: 0 a CTA per row;
// 1, 2 or 4: that many warps per row when N / E <= MAX_CHUNKS * 32 * ROW_WARP, dw accumulated in
// registers; see rows_warp), TREE (ALGO 1: 0, or S: partials summed in groups of S CTAs first),
// STAGES (ALGO 1, rows held in registers: 0, or S: each thread copies its own chunks of its group's rows
// S rows ahead into shared memory with cp.async and reads them back from there; see Stages below),
// DW_REGS (ALGO 1, a CTA per row held in registers: 1 keeps the thread's dw sums in registers, as
// ROW_WARP does, and adds them to the accumulators once at the end; 0 adds each row's to them),
// SPLIT (ALGO 1 with ROW_WARP, TREE and STAGES 0: 1, or S = 2 or 4 CTAs of a cluster share each row,
// each holding a contiguous 1/S of its chunks, so a long row needs 1/S of the registers and two CTAs
// can share an SM; the dot product is summed over the cluster through distributed shared memory,
// see row_sum; the S CTAs write disjoint columns of one partial row, so G / S rows are reduced),
// DTYPE_BUILD (read by the harness, not the kernel: 1 builds the genome once per dtype with
// -DDTYPE_CODE, that dtype's body alone; 0 once for all three, see DTC below).
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
#ifndef ALGO
#define ALGO 0
#endif
#ifndef MAX_CHUNKS
#define MAX_CHUNKS 4
#endif
#ifndef SMEM_DW
#define SMEM_DW 1
#endif
#ifndef CTAS_PER_SM
#define CTAS_PER_SM 2
#endif
#ifndef REDUCERS
#define REDUCERS 32
#endif
#ifndef PREFETCH
#define PREFETCH 0
#endif
#ifndef ROW_WARP
#define ROW_WARP 0
#endif
#ifndef TREE
#define TREE 0
#endif
#ifndef STAGES
#define STAGES 0
#endif
#ifndef DW_REGS
#define DW_REGS 0
#endif
#ifndef SPLIT
#define SPLIT 1
#endif
#if SPLIT != 1 && SPLIT != 2 && SPLIT != 4
#error "SPLIT must be 1, 2 or 4 CTAs per row"
#endif
#if ALGO != 1 && SPLIT != 1  // a knob of ALGO 1 only (the space pins it to 1 under ALGO 0, and so does the kernel)
#undef SPLIT
#define SPLIT 1
#endif
#if SPLIT > 1 && (ROW_WARP != 0 || TREE != 0 || STAGES != 0)
#error "SPLIT > 1 needs ALGO 1 with ROW_WARP 0, TREE 0 and STAGES 0"
#endif
#if STAGES < 0 || STAGES > 3
#error "STAGES must be 0 (rows loaded into registers) or 1..3 rows staged ahead in shared memory"
#endif
#if STAGES > 0 && PREFETCH  // STAGES replaces PREFETCH (the next rows wait in shared memory, not in
#undef PREFETCH             // registers): the space pins PREFETCH to 0 under STAGES, and so does the kernel
#define PREFETCH 0
#endif
#if TREE < 0 || TREE > 32
#error "TREE must be 0 (flat) or a group size of at most 32 CTAs"
#endif
#if TREE > 0 && (528 + TREE - 1) / TREE > 255
#error "TREE groups need ceil(528 / TREE) ticket words after word 0 of the 256-word header: TREE >= 3"
#endif
#if ROW_WARP != 0 && ROW_WARP != 1 && ROW_WARP != 2 && ROW_WARP != 4
#error "ROW_WARP must be 0, 1, 2 or 4"
#endif
#if ALGO == 1 && ROW_WARP > 1 && (THREADS % (32 * ROW_WARP) != 0 || THREADS / (32 * ROW_WARP) > 8)
#error "ROW_WARP > 1 needs THREADS a multiple of 32 * ROW_WARP, at most 8 row groups (named barriers 1..8)"
#endif
#define WARPS (THREADS / 32)
#define WS_HEADER 256     // words of ws before the partial rows: word 0 the ticket counter, words 1.. the
                          // TREE groups' tickets (ceil(G / TREE) <= WS_HEADER - 1 for G <= 528, TREE >= 3)
#define SMEM_DW_COLS 40960 // dw accumulators in shared memory up to this N (examples/rmsnorm_problem.py agrees)

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

// A 16-bit element's float value from its bits (DT 1 fp16, DT 2 bf16).
template <int DT>
__device__ __forceinline__ float half_bits(unsigned b) {
    if (DT == 1) return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
    return __uint_as_float(b << 16);
}

template <int DT>
__device__ __forceinline__ float ld_elem(const void* base, long long i) {
    if (DT == 0) return ldx(static_cast<const float*>(base) + i);
    return half_bits<DT>(ldx(static_cast<const unsigned short*>(base) + i));
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

// --------------------------------------------------------------------------- ALGO 1

template <int DT>
struct Chunk {
    static constexpr int E = DT == 0 ? 4 : 8;  // elements per 16 bytes
};

template <int DT>
__device__ __forceinline__ uint4 ld16(const void* base, long long elem) {
    return ldx(reinterpret_cast<const uint4*>(static_cast<const char*>(base) + elem * (DT == 0 ? 4 : 2)));
}

template <int DT>
__device__ __forceinline__ void unpack(uint4 v, float (&f)[Chunk<DT>::E]) {
    if constexpr (DT == 0) {
        f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y);
        f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
    } else {
        const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            f[2 * k] = half_bits<DT>(u[k] & 0xffffu);
            f[2 * k + 1] = half_bits<DT>(u[k] >> 16);
        }
    }
}

template <int DT>
__device__ __forceinline__ unsigned to_bits(float v) {
    if (DT == 1) return __half_as_ushort(__float2half_rn(v));
    unsigned short b;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(v));
    return b;
}

template <int DT>
__device__ __forceinline__ void st16(void* base, long long elem, const float (&f)[Chunk<DT>::E]) {
    uint4 v;
    if constexpr (DT == 0) {
        v = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
    } else {
        unsigned u[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) u[k] = to_bits<DT>(f[2 * k]) | (to_bits<DT>(f[2 * k + 1]) << 16);
        v = make_uint4(u[0], u[1], u[2], u[3]);
    }
    *reinterpret_cast<uint4*>(static_cast<char*>(base) + elem * (DT == 0 ? 4 : 2)) = v;
}

// dx of one 16-byte chunk, and its dy*x*rstd added to the chunk's dw accumulators.
template <int DT>
__device__ __forceinline__ void finish_chunk(uint4 xv, uint4 gv, const float* w, void* dx, float* acc, long long base,
                                             int c, float r, float coef) {
    constexpr int E = Chunk<DT>::E;
    float xf[E], gf[E], o[E];
    unpack<DT>(xv, xf);
    unpack<DT>(gv, gf);
    float4* ap = reinterpret_cast<float4*>(acc + c * E);
    const float4* wp = reinterpret_cast<const float4*>(w + c * E);
#pragma unroll
    for (int q = 0; q < E / 4; ++q) {
        const float4 ww = __ldg(wp + q);
        const float wv[4] = {ww.x, ww.y, ww.z, ww.w};
        const float4 a = ap[q];
        float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = 4 * q + e;
            o[i] = r * gf[i] * wv[e] - xf[i] * coef;
            av[e] = fmaf(gf[i], xf[i] * r, av[e]);
        }
        ap[q] = make_float4(av[0], av[1], av[2], av[3]);
    }
    st16<DT>(dx, base + static_cast<long long>(c) * E, o);
}

// One row's dot = sum_j w_j dy_j x_j, reduced over the CTA; red holds 2*WARPS floats (alternating by row).
__device__ __forceinline__ float block_sum(float v, float* red, int& parity) {
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) red[parity * WARPS + (threadIdx.x >> 5)] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < WARPS; ++k) s += red[parity * WARPS + k];
    parity ^= 1;  // the next row writes the other half: a thread cannot be two barriers ahead
    return s;
}

#if SPLIT > 1
// SPLIT: a row shared by the SPLIT CTAs of a cluster (each holds its own contiguous share of the row's
// columns), so its dot product is summed over the cluster.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// One row's dot over the cluster: each warp's sum goes to slot (parity, rank, warp) of every CTA's red
// (2 * SPLIT * WARPS floats) by st.shared::cluster, one cluster barrier, then every thread adds the
// SPLIT * WARPS slots in rank and warp order, so every CTA of the cluster gets the same bits. Slots
// alternate by row: a CTA writes row i + 2's only after the barrier of row i + 1, which every thread
// of the cluster reaches after reading row i's.
__device__ __forceinline__ float row_sum(float v, float* red, int& parity) {
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) {
        unsigned rank;
        asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
        const unsigned local = static_cast<unsigned>(
            __cvta_generic_to_shared(red + (parity * SPLIT + rank) * WARPS + (threadIdx.x >> 5)));
#pragma unroll
        for (unsigned r = 0; r < SPLIT; ++r) {
            unsigned ra;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(local), "r"(r));
            asm volatile("st.shared::cluster.f32 [%0], %1;" : : "r"(ra), "f"(v) : "memory");
        }
    }
    cluster_sync();
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < SPLIT * WARPS; ++k) s += red[parity * SPLIT * WARPS + k];
    parity ^= 1;
    return s;
}
#else
__device__ __forceinline__ float row_sum(float v, float* red, int& parity) { return block_sum(v, red, parity); }
#endif

// This thread's chunks (c = first + k * stride < nch) of one row of x and dy, into registers.
template <int DT>
__device__ __forceinline__ void load_chunks(const void* x, const void* dy, long long base, int nch, int first,
                                            int stride, uint4 (&xr)[MAX_CHUNKS], uint4 (&gr)[MAX_CHUNKS]) {
    constexpr int E = Chunk<DT>::E;
#pragma unroll
    for (int k = 0; k < MAX_CHUNKS; ++k) {
        const int c = first + k * stride;
        if (c < nch) {
            xr[k] = ld16<DT>(x, base + static_cast<long long>(c) * E);
            gr[k] = ld16<DT>(dy, base + static_cast<long long>(c) * E);
        }
    }
}

// This thread's chunks of the row at base, into xr and gr. With PREFETCH they were loaded ahead into
// xn and gn, and the chunks of the thread's next row (at base + ahead, if has_next) are loaded there now.
template <int DT>
__device__ __forceinline__ void take_row(const void* x, const void* dy, long long base, long long ahead,
                                         bool has_next, int nch, int first, int stride, uint4 (&xr)[MAX_CHUNKS],
                                         uint4 (&gr)[MAX_CHUNKS], uint4 (&xn)[MAX_CHUNKS],
                                         uint4 (&gn)[MAX_CHUNKS]) {
#if PREFETCH
#pragma unroll
    for (int k = 0; k < MAX_CHUNKS; ++k) {
        xr[k] = xn[k];
        gr[k] = gn[k];
    }
    if (has_next) load_chunks<DT>(x, dy, base + ahead, nch, first, stride, xn, gn);
#else
    load_chunks<DT>(x, dy, base, nch, first, stride, xr, gr);
#endif
}

// f(i, x_i, dy_i, w_i) for the E elements of chunk c held in registers (xv of x, gv of dy), its weights
// read as float4s.
template <int DT, typename F>
__device__ __forceinline__ void each_element(uint4 xv, uint4 gv, const float* w, int c, F&& f) {
    constexpr int E = Chunk<DT>::E;
    float xf[E], gf[E];
    unpack<DT>(xv, xf);
    unpack<DT>(gv, gf);
    const float4* wp = reinterpret_cast<const float4*>(w + c * E);
#pragma unroll
    for (int q = 0; q < E / 4; ++q) {
        const float4 ww = __ldg(wp + q);
        const float wv[4] = {ww.x, ww.y, ww.z, ww.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) f(4 * q + e, xf[4 * q + e], gf[4 * q + e], wv[e]);
    }
}

// This thread's part of sum_j w_j dy_j x_j over its chunks (c = first + k * stride < nch) held in registers.
template <int DT>
__device__ __forceinline__ float chunks_dot(const uint4 (&xr)[MAX_CHUNKS], const uint4 (&gr)[MAX_CHUNKS],
                                            const float* w, int nch, int first, int stride) {
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < MAX_CHUNKS; ++k) {
        const int c = first + k * stride;
        if (c < nch) each_element<DT>(xr[k], gr[k], w, c, [&](int, float x, float g, float wv) {
            dot = fmaf(x, g * wv, dot);
        });
    }
    return dot;
}

// dx of chunk c held in registers (xv of x, gv of dy), and its dy*x*rstd added to the thread's own
// dw sums s in registers (its columns are the same in every row: ROW_WARP, DW_REGS).
template <int DT>
__device__ __forceinline__ void finish_chunk_regs(uint4 xv, uint4 gv, const float* w, void* dx, long long base, int c,
                                                  float r, float coef, float (&s)[Chunk<DT>::E]) {
    constexpr int E = Chunk<DT>::E;
    float o[E];
    each_element<DT>(xv, gv, w, c, [&](int i, float xv_, float g, float wv) {
        o[i] = r * g * wv - xv_ * coef;
        s[i] = fmaf(g, xv_ * r, s[i]);
    });
    st16<DT>(dx, base + static_cast<long long>(c) * E, o);
}

// The thread's dw sums of its chunks (c = first + k * stride < nch), added to the accumulators acc.
template <int DT>
__device__ __forceinline__ void add_sums(const float (&a)[MAX_CHUNKS][Chunk<DT>::E], float* acc, int nch, int first,
                                         int stride) {
    constexpr int E = Chunk<DT>::E;
#pragma unroll
    for (int k = 0; k < MAX_CHUNKS; ++k) {
        const int c = first + k * stride;
        if (c < nch) {
#pragma unroll
            for (int e = 0; e < E; ++e) acc[c * E + e] += a[k][e];
        }
    }
}

// ---- STAGES: rows staged ahead in shared memory.
// The launch gives, after the dw accumulators (N floats with SMEM_DW, else none), STAGES slots of
// `groups` rows of x and dy each (slot s, group g: x at ((s * groups + g) * 2) * rowbytes, dy right
// after) when they fit (examples/rmsnorm_problem.py: bwd_stage_bytes); else nothing, and the rows are
// loaded into registers as without STAGES. A thread copies only its own chunks and reads back only
// those, so cp.async.wait_group alone orders them (no barrier for the data). The copy that refills a
// slot is issued after the row's barrier (bar.sync / __syncwarp: the thread's reads of the slot are
// performed before it), one commit group per row always (empty past the last row), so at row i of a
// group STAGES + i groups are committed and wait_group(STAGES - 1) means row i has landed.
__device__ __forceinline__ unsigned dynamic_smem_bytes() {
    unsigned v;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
    return v;
}

__device__ __forceinline__ void cp_async16(unsigned smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(smem), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" : : : "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" : : "n"(N) : "memory"); }

__device__ __forceinline__ uint4 ld_shared16(unsigned a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a)
                 : "memory");
    return v;
}

// One row group's ring of STAGES slots; a thread's chunks c = first + k * STRIDE < nch of rows first,
// first + step, ... (shared addresses: 32-bit, this thread's first chunk of slot 0 in `mine`).
template <int DT, int STRIDE>
struct Stages {
    unsigned mine = 0;  // shared address of this thread's first chunk (x) in slot 0
    unsigned slot = 0;  // byte offset of the current slot
    unsigned rowbytes, slot_bytes;
    bool on = false;    // the launch gave the staging memory

    // STAGES slots of `groups` rows each after `skip` bytes of the dynamic shared memory, if given.
    __device__ Stages(char* dyn, unsigned skip, int groups, int grp, int N, int first)
        : rowbytes(static_cast<unsigned>(N) * (DT == 0 ? 4u : 2u)),
          slot_bytes(static_cast<unsigned>(groups) * 2u * static_cast<unsigned>(N) * (DT == 0 ? 4u : 2u)) {
        on = STAGES > 0 && dynamic_smem_bytes() >= skip + STAGES * slot_bytes;
        mine = static_cast<unsigned>(__cvta_generic_to_shared(dyn)) + skip + grp * 2u * rowbytes + first * 16u;
    }

    // This thread's chunks of the row at base (elements) into the slot at byte offset `at`.
    __device__ __forceinline__ void copy(const void* x, const void* dy, long long base, int nch, int first,
                                         unsigned at) const {
        constexpr int ES = DT == 0 ? 4 : 2;
        const char* xs = static_cast<const char*>(x) + base * ES + first * 16;
        const char* gs = static_cast<const char*>(dy) + base * ES + first * 16;
#pragma unroll
        for (int k = 0; k < MAX_CHUNKS; ++k) {
            if (first + k * STRIDE < nch) {
                cp_async16(mine + at + k * STRIDE * 16, xs + k * STRIDE * 16);
                cp_async16(mine + at + rowbytes + k * STRIDE * 16, gs + k * STRIDE * 16);
            }
        }
    }

    // The first STAGES rows of the group, one commit group each.
    __device__ __forceinline__ void start(const void* x, const void* dy, long long first_row, long long step, int M,
                                          int N, int nch, int first) const {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            const long long row = first_row + s * step;
            if (row < M) copy(x, dy, row * N, nch, first, s * slot_bytes);
            cp_async_commit();
        }
    }

    // This thread's chunks of the current row (the ring's next slot), into registers.
    __device__ __forceinline__ void take(int nch, int first, uint4 (&xr)[MAX_CHUNKS], uint4 (&gr)[MAX_CHUNKS]) const {
        cp_async_wait<(STAGES > 0 ? STAGES - 1 : 0)>();
#pragma unroll
        for (int k = 0; k < MAX_CHUNKS; ++k) {
            if (first + k * STRIDE < nch) {
                xr[k] = ld_shared16(mine + slot + k * STRIDE * 16);
                gr[k] = ld_shared16(mine + slot + rowbytes + k * STRIDE * 16);
            }
        }
    }

    // After the row's barrier: the slot just read takes the row STAGES ahead (`row`, if < M).
    __device__ __forceinline__ void refill(const void* x, const void* dy, long long row, int M, int N, int nch,
                                           int first) {
        if (row < M) copy(x, dy, row * N, nch, first, slot);
        cp_async_commit();
        slot = slot + slot_bytes == STAGES * slot_bytes ? 0u : slot + slot_bytes;
    }
};

// 16-byte chunks; acc: this CTA's dw accumulators (shared or its partial row in ws), N floats. The CTA
// takes chunks [lo, hi) of its rows (all of them, or with SPLIT its cluster rank's share): rows
// blockIdx.x / SPLIT, then every (gridDim.x / SPLIT)-th.
template <int DT>
__device__ void rows_vec(const void* x, const float* w, const void* dy, const float* rstd, void* dx, float* acc,
                         int M, int N, float* red, char* dyn, unsigned skip, int lo, int share_hi) {
    constexpr int E = Chunk<DT>::E;
    const int nch = N / E;
    // the CTA's chunks [lo, hi): with SPLIT 1 the whole row, spelt as nch and threadIdx.x
    const int hi = SPLIT > 1 ? share_hi : nch;
    const int first = SPLIT > 1 ? lo + static_cast<int>(threadIdx.x) : threadIdx.x;
    const bool in_regs = hi - lo <= MAX_CHUNKS * THREADS;
    const long long step = gridDim.x / SPLIT;
    int parity = 0;
    uint4 xr[MAX_CHUNKS], gr[MAX_CHUNKS];
    uint4 xn[MAX_CHUNKS], gn[MAX_CHUNKS];  // PREFETCH: the CTA's next row, loaded while this one is reduced
#if PREFETCH
    if (in_regs && blockIdx.x / SPLIT < M)
        load_chunks<DT>(x, dy, static_cast<long long>(blockIdx.x / SPLIT) * N, hi, first, THREADS, xn, gn);
#endif
    // DW_REGS: this thread's dw sums (its columns are the same in every row), added to acc at the end
    float a[DW_REGS ? MAX_CHUNKS : 1][DW_REGS ? E : 1];
#pragma unroll
    for (int k = 0; k < (DW_REGS ? MAX_CHUNKS : 1); ++k)
#pragma unroll
        for (int e = 0; e < (DW_REGS ? E : 1); ++e) a[k][e] = 0.f;
    Stages<DT, THREADS> st(dyn, skip, 1, 0, N, threadIdx.x);  // STAGES > 0: SPLIT 1, so [lo, hi) = [0, nch)
    const bool staged = STAGES > 0 && in_regs && st.on;
    if (staged) st.start(x, dy, blockIdx.x, step, M, N, nch, threadIdx.x);
    for (long long row = blockIdx.x / SPLIT; row < M; row += step) {
        const long long base = row * N;
        float dot = 0.f;
        if (staged) {
            st.take(nch, threadIdx.x, xr, gr);
            dot = chunks_dot<DT>(xr, gr, w, nch, threadIdx.x, THREADS);
        } else if (in_regs) {
            take_row<DT>(x, dy, base, step * N, row + step < M, hi, first, THREADS, xr, gr, xn, gn);
            dot = chunks_dot<DT>(xr, gr, w, hi, first, THREADS);
        } else {
            for (int c = first; c < hi; c += THREADS) {
                float xf[E], gf[E];
                unpack<DT>(ld16<DT>(x, base + static_cast<long long>(c) * E), xf);
                unpack<DT>(ld16<DT>(dy, base + static_cast<long long>(c) * E), gf);
#pragma unroll
                for (int e = 0; e < E; ++e) dot = fmaf(xf[e], gf[e] * __ldg(w + c * E + e), dot);
            }
        }
        dot = row_sum(dot, red, parity);
        if (staged) st.refill(x, dy, row + STAGES * step, M, N, nch, threadIdx.x);  // after block_sum's barrier
        const float r = __ldg(rstd + row);
        const float coef = r * r * r * dot / static_cast<float>(N);
        if (in_regs) {
#pragma unroll
            for (int k = 0; k < MAX_CHUNKS; ++k) {
                const int c = first + k * THREADS;
                if (c < hi) {
#if DW_REGS
                    finish_chunk_regs<DT>(xr[k], gr[k], w, dx, base, c, r, coef, a[k]);
#else
                    finish_chunk<DT>(xr[k], gr[k], w, dx, acc, base, c, r, coef);
#endif
                }
            }
        } else {  // re-read (L1/L2-hot)
            for (int c = first; c < hi; c += THREADS)
                finish_chunk<DT>(ld16<DT>(x, base + static_cast<long long>(c) * E),
                                 ld16<DT>(dy, base + static_cast<long long>(c) * E), w, dx, acc, base, c, r, coef);
        }
    }
#if DW_REGS
    // each column is this thread's alone, and acc holds zeros: the same sums, bit for bit
    if (in_regs) add_sums<DT>(a, acc, hi, first, THREADS);
#endif
}

// ROW_WARP (RW warps per row): group g of the CTA (RW warps, GT = 32 * RW threads) takes rows
// b * NG + g, then every (G * NG)-th (NG = WARPS / RW groups); thread t of the group holds chunks t,
// t + GT, ... (N / E <= MAX_CHUNKS * GT). The dot product needs shuffles and, with RW > 1, one
// exchange of RW floats behind the group's own named barrier (no CTA barrier per row). A thread's
// dw columns are the same in every row, so it accumulates them in registers; at the end the warps
// add theirs to acc (all zeros on entry) one warp after the other (warp order: reproducible).
template <int DT>
__device__ void rows_warp(const void* x, const float* w, const void* dy, const float* rstd, void* dx, float* acc,
                          int M, int N, float* red, char* dyn, unsigned skip) {
    constexpr int E = Chunk<DT>::E;
    constexpr int RW = ROW_WARP > 0 ? ROW_WARP : 1;
    constexpr int GT = 32 * RW;        // threads per row group
    constexpr int NG = WARPS / RW;     // row groups per CTA
    const int nch = N / E;
    const int warp = threadIdx.x >> 5;
    const int tg = threadIdx.x % GT, grp = threadIdx.x / GT;
    const long long first = static_cast<long long>(blockIdx.x) * NG + grp;
    const long long step = static_cast<long long>(gridDim.x) * NG;
    int parity = 0;
    float a[MAX_CHUNKS][E];
#pragma unroll
    for (int k = 0; k < MAX_CHUNKS; ++k)
#pragma unroll
        for (int e = 0; e < E; ++e) a[k][e] = 0.f;
    uint4 xr[MAX_CHUNKS], gr[MAX_CHUNKS];
    uint4 xn[MAX_CHUNKS], gn[MAX_CHUNKS];  // PREFETCH: the group's next row
#if PREFETCH
    if (first < M) load_chunks<DT>(x, dy, first * N, nch, tg, GT, xn, gn);
#endif
    Stages<DT, GT> st(dyn, skip, NG, grp, N, tg);
    const bool staged = STAGES > 0 && st.on;
    if (staged) st.start(x, dy, first, step, M, N, nch, tg);
    for (long long row = first; row < M; row += step) {
        const long long base = row * N;
        if (staged) st.take(nch, tg, xr, gr);
        else take_row<DT>(x, dy, base, step * N, row + step < M, nch, tg, GT, xr, gr, xn, gn);
        float dot = warp_sum(chunks_dot<DT>(xr, gr, w, nch, tg, GT));
        if constexpr (RW > 1) {  // the group's RW warp sums, alternating halves by row (as block_sum)
            float* gred = red + (grp * 2 + parity) * RW;
            if ((threadIdx.x & 31) == 0) gred[(threadIdx.x >> 5) % RW] = dot;
            asm volatile("bar.sync %0, %1;" : : "r"(1 + grp), "r"(GT) : "memory");
            dot = 0.f;
#pragma unroll
            for (int k = 0; k < RW; ++k) dot += gred[k];
            parity ^= 1;
        } else if (staged) {
            __syncwarp();  // the warp's reads of the slot are performed before the refill below
        }
        if (staged) st.refill(x, dy, row + STAGES * step, M, N, nch, tg);
        const float r = __ldg(rstd + row);
        const float coef = r * r * r * dot / static_cast<float>(N);
#pragma unroll
        for (int k = 0; k < MAX_CHUNKS; ++k) {
            const int c = tg + GT * k;
            if (c < nch) finish_chunk_regs<DT>(xr[k], gr[k], w, dx, base, c, r, coef, a[k]);
        }
    }
    for (int v = 0; v < WARPS; ++v) {
        if (warp == v) add_sums<DT>(a, acc, nch, tg, GT);
        __syncthreads();
    }
}

// Element accesses (N not a multiple of the chunk, or unaligned buffers): elements [lo, hi) of the rows
// as in rows_vec.
template <int DT>
__device__ void rows_scalar(const void* x, const float* w, const void* dy, const float* rstd, void* dx, float* acc,
                            int M, int N, float* red, int lo, int hi) {
    const int j0 = lo + static_cast<int>(threadIdx.x);
    int parity = 0;
    for (long long row = blockIdx.x / SPLIT; row < M; row += gridDim.x / SPLIT) {
        const long long base = row * N;
        float dot = 0.f;
        for (int j = j0; j < hi; j += THREADS)
            dot = fmaf(ld_elem<DT>(x, base + j), ld_elem<DT>(dy, base + j) * __ldg(w + j), dot);
        dot = row_sum(dot, red, parity);
        const float r = __ldg(rstd + row);
        const float coef = r * r * r * dot / static_cast<float>(N);
        for (int j = j0; j < hi; j += THREADS) {
            const float xv = ld_elem<DT>(x, base + j), gv = ld_elem<DT>(dy, base + j);
            st_elem<DT>(dx, base + j, r * gv * __ldg(w + j) - xv * coef);
            acc[j] = fmaf(gv, xv * r, acc[j]);
        }
    }
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

template <int DT>
__device__ void persistent(const void* x, const float* w, const void* dy, const float* rstd, void* dx, float* dw,
                           float* ws, int M, int N, float* red, float* sdw) {
    constexpr int E = Chunk<DT>::E;
    unsigned* ticket = reinterpret_cast<unsigned*>(ws);
    float* parts = ws + WS_HEADER;
    // a partial row per CTA; with SPLIT one per cluster, each CTA writing only its own columns of it
    float* mine = parts + static_cast<long long>(blockIdx.x / SPLIT) * N;
    const bool use_smem = SMEM_DW && N <= SMEM_DW_COLS;
    float* acc = use_smem ? sdw : mine;  // mine is all zeros on entry (the workspace contract)
    if (use_smem) {
        for (int j = threadIdx.x; j < N; j += THREADS) sdw[j] = 0.f;
        __syncthreads();
    }
    const unsigned long long align = reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(dy)
                                   | reinterpret_cast<unsigned long long>(dx) | reinterpret_cast<unsigned long long>(w);
    // This CTA's columns of its rows: all of them, or with SPLIT its cluster rank's contiguous share
    // ([lo, hi) in chunks on the vector path, in elements on the scalar one; [plo, phi) in elements).
    const bool vec = N % E == 0 && (align & 15) == 0;
#if SPLIT > 1
    const int units = vec ? N / E : N;
    const int rank = static_cast<int>(blockIdx.x % SPLIT), share = (units + SPLIT - 1) / SPLIT;
    const int lo = min(units, rank * share), hi = min(units, lo + share);
    const int plo = vec ? lo * E : lo, phi = vec ? hi * E : hi;
    cluster_sync();  // every CTA of the cluster runs before its shared memory is written from another
#else
    const int lo = 0, hi = vec ? N / E : N, plo = 0, phi = N;
#endif
    if (vec) {
        char* dyn = reinterpret_cast<char*>(sdw);  // the dynamic shared memory: dw (if use_smem), then STAGES
        const unsigned skip = use_smem ? static_cast<unsigned>(N) * 4u : 0u;
        if (ROW_WARP && N / E <= MAX_CHUNKS * 32 * ROW_WARP)
            rows_warp<DT>(x, w, dy, rstd, dx, acc, M, N, red, dyn, skip);
        else
            rows_vec<DT>(x, w, dy, rstd, dx, acc, M, N, red, dyn, skip, lo, hi);
    } else {
        rows_scalar<DT>(x, w, dy, rstd, dx, acc, M, N, red, lo, hi);
    }
    if (use_smem) {
        __syncthreads();
        for (int j = plo + threadIdx.x; j < phi; j += THREADS) mine[j] = sdw[j];
    }
    // Publish this CTA's partial row, then take a ticket.
    __threadfence();
    __syncthreads();
    __shared__ unsigned s_ticket;
    const unsigned G = gridDim.x;
    // The reducers sum Gn partial rows, row p * S of parts for p < Gn: every CTA's (S = 1; with SPLIT
    // every cluster's), or with TREE the group sums, each in its group's first row. They wait for T
    // tickets: one per CTA, or with TREE one per group.
    constexpr unsigned S = TREE > 0 ? TREE : 1;
    const unsigned Gn = TREE > 0 ? (G + S - 1) / S : G / SPLIT;
    const unsigned T = TREE > 0 ? Gn : G;
    const long long pstride = static_cast<long long>(S) * N;
#if TREE > 0
    {
        const unsigned g = blockIdx.x / S, first = g * S, size = min(S, G - first);
        if (threadIdx.x == 0) s_ticket = atomicAdd(ticket + 1 + g, 1u);
        __syncthreads();
        if (s_ticket != size - 1) return;  // not the group's last: its partial row is published
        __threadfence();                  // the group's rows, each fenced before its CTA's ticket
        float* row0 = parts + static_cast<long long>(first) * N;
        for (int j = threadIdx.x; j < N; j += THREADS) {
            float v[S];
#pragma unroll
            for (unsigned u = 0; u < S; ++u) v[u] = u < size ? __ldcg(row0 + static_cast<long long>(u) * N + j) : 0.f;
            float s = v[0];
#pragma unroll
            for (unsigned u = 1; u < S; ++u) {
                if (u < size) {
                    s += v[u];
                    row0[static_cast<long long>(u) * N + j] = 0.f;
                }
            }
            row0[j] = s;
        }
        if (threadIdx.x == 0) ticket[1 + g] = 0u;  // every CTA of the group has taken its ticket
        __threadfence();
        __syncthreads();
    }
#endif
    if (threadIdx.x == 0) s_ticket = atomicAdd(ticket, 1u);
    __syncthreads();
    // K waiting CTAs must leave an SM slot free for the ones they wait for: G is at most
    // CTAS_PER_SM per SM, so G / (2 * CTAS_PER_SM) is at most half the SMs (one CTA fits per SM).
    const unsigned cap = G / (2u * CTAS_PER_SM) > 0 ? G / (2u * CTAS_PER_SM) : 1u;
    const unsigned K = min(min(Gn, static_cast<unsigned>(REDUCERS)), cap);
    const unsigned t = s_ticket;
    if (t < T - K) return;
    if (threadIdx.x == 0) {
        while (ld_acquire(ticket) < T) __nanosleep(64);
    }
    __syncthreads();
    const unsigned slice = t - (T - K);
    const int jlo = static_cast<int>(static_cast<long long>(N) * slice / K);
    const int jhi = static_cast<int>(static_cast<long long>(N) * (slice + 1) / K);
    // L column lanes (a power of two >= 8 covering the slice, at most THREADS) and PG = THREADS / L
    // partial groups: with fewer columns than threads (N / K small) the threads split the G partials
    // too, group g summing partials g, g + PG, ... in order; the groups' sums are then added in group
    // order through red.
    int L = 8;
    while (L < jhi - jlo && L < THREADS) L <<= 1;
    L = min(L, THREADS);
    const unsigned PG = THREADS / L;
    const int lane = threadIdx.x % L;
    const unsigned grp = threadIdx.x / L;
    for (int j0 = jlo; j0 < jhi; j0 += L) {
        const int j = j0 + lane;
        float s = 0.f;
        if (grp < PG && j < jhi) {
            unsigned p = grp;
            for (; p + 7u * PG < Gn; p += 8u * PG) {
                float v[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) v[u] = __ldcg(parts + (p + u * PG) * pstride + j);
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    s += v[u];
                    parts[(p + u * PG) * pstride + j] = 0.f;
                }
            }
            for (; p < Gn; p += PG) {
                s += __ldcg(parts + p * pstride + j);
                parts[p * pstride + j] = 0.f;
            }
        }
        if (PG == 1) {  // uniform over the CTA
            if (j < jhi) dw[j] = s;
        } else {
            red[threadIdx.x] = s;
            __syncthreads();
            if (grp == 0 && j < jhi) {
                for (unsigned g = 1; g < PG; ++g) s += red[g * L + lane];
                dw[j] = s;
            }
            __syncthreads();
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (atomicAdd(ticket, 1u) == T + K - 1) atomicExch(ticket, 0u);  // every reducer is past its wait
    }
}

// DTYPE_CODE (given with DTYPE_BUILD 1: the harness then builds once per dtype, see dtype_defines in
// examples/rmsnorm_problem.py): the storage dtype fixed at compile time, so a build holds that dtype's
// body alone and its registers are that body's (one body for all three can take more registers than
// the largest of them); without it the runtime dtype_code picks the body.
#ifdef DTYPE_CODE
#if DTYPE_CODE < 0 || DTYPE_CODE > 2
#error "DTYPE_CODE must be 0 (fp32), 1 (fp16) or 2 (bf16)"
#endif
#define DTC(code) DTYPE_CODE
#else
#define DTC(code) (code)
#endif

#if SPLIT > 1
#define KDIMS __cluster_dims__(SPLIT, 1, 1)
#else
#define KDIMS
#endif

extern "C" __global__ void KDIMS __launch_bounds__(THREADS)
    rmsnorm_bwd(const void* __restrict__ x, const float* __restrict__ w, const void* __restrict__ dy,
                const float* __restrict__ rstd, void* __restrict__ dx, float* __restrict__ dw, float* ws, int M,
                int N, int dtype_code) {
#if ALGO == 1
    __shared__ float red[THREADS];  // 2 * SPLIT * WARPS for the rows' dot products, THREADS for the dw reduction
    extern __shared__ float4 sdw4[];
    float* sdw = reinterpret_cast<float*>(sdw4);
    if (DTC(dtype_code) == 0) persistent<0>(x, w, dy, rstd, dx, dw, ws, M, N, red, sdw);
    else if (DTC(dtype_code) == 1) persistent<1>(x, w, dy, rstd, dx, dw, ws, M, N, red, sdw);
    else persistent<2>(x, w, dy, rstd, dx, dw, ws, M, N, red, sdw);
#else
    __shared__ float red[THREADS];
    const int ntiles = (N + 31) / 32;
    const long long b = blockIdx.x;
    if (b < ntiles) {
        if (DTC(dtype_code) == 0) dw_columns<0>(x, dy, rstd, dw, M, N, static_cast<int>(b), red);
        else if (DTC(dtype_code) == 1) dw_columns<1>(x, dy, rstd, dw, M, N, static_cast<int>(b), red);
        else dw_columns<2>(x, dy, rstd, dw, M, N, static_cast<int>(b), red);
    } else {
        const long long row = b - ntiles;
        if (row >= M) return;
        if (DTC(dtype_code) == 0) dx_row<0>(x, w, dy, rstd, dx, N, row, red);
        else if (DTC(dtype_code) == 1) dx_row<1>(x, w, dy, rstd, dx, N, row, red);
        else dx_row<2>(x, w, dy, rstd, dx, N, row, red);
    }
#endif
}
