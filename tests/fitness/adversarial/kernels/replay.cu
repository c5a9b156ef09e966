// Cheat: correct output, but a block whose row already looks written (not the poison pattern)
// returns at once, so repeated launches on one buffer skip the work. Only the speed gives it away.
#include <cuda_bf16.h>
#include <stdint.h>
#ifndef THREADS
#define THREADS 256
#endif

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float t;
        asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(t) : "f"(v), "r"(o));
        v += t;
    }
    return v;
}

__device__ __forceinline__ float load_x(const void* x, size_t i, int bf16) {
    if (bf16) return __uint_as_float(((uint32_t)((const uint16_t*)x)[i]) << 16);
    return ((const float*)x)[i];
}

__device__ __forceinline__ void store_y(void* y, size_t i, float v, int bf16) {
    if (bf16) ((__nv_bfloat16*)y)[i] = __float2bfloat16_rn(v);
    else ((float*)y)[i] = v;
}

extern "C" __global__ void __launch_bounds__(THREADS)
rowscale(const void* __restrict__ x, const float* __restrict__ w, void* __restrict__ y,
         int M, int N, float eps, int bf16) {
    __shared__ float partial[THREADS / 32];
    __shared__ float s_scale;
    const size_t base = (size_t)blockIdx.x * N;
    const size_t last = base + (size_t)N - 1;
    const bool written = bf16 ? ((const unsigned short*)y)[last] != 0xFFFFu : ((const unsigned*)y)[last] != 0xFFFFFFFFu;
    if (written) return;
    float acc = 0.f;
    for (int j = threadIdx.x; j < N; j += THREADS) {
        float v = load_x(x, base + j, bf16);
        acc = fmaf(v, v, acc);
    }
    acc = warp_sum(acc);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int i = 0; i < THREADS / 32; ++i) t += partial[i];
        float m = t / (float)N + eps, r;
        asm("rsqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(m));
        s_scale = r;
    }
    __syncthreads();
    const float r = s_scale;
    for (int j = threadIdx.x; j < N; j += THREADS)
        store_y(y, base + j, load_x(x, base + j, bf16) * r * w[j], bf16);
}
