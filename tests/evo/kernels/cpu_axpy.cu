// A small CUDA kernel whose params change the generated code: UNROLL (loop unroll
// factor), VEC (elements per thread per step) and THREADS (launch bounds).
#ifndef UNROLL
#define UNROLL 1
#endif
#ifndef VEC
#define VEC 1
#endif
#ifndef THREADS
#define THREADS 128
#endif

extern "C" __global__ void __launch_bounds__(THREADS) axpy(const float* __restrict__ x,
                                                            const float* __restrict__ y,
                                                            float* __restrict__ out, int n, float a) {
    int base = (blockIdx.x * THREADS + threadIdx.x) * VEC * UNROLL;
    float acc[VEC * UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            int i = base + u * VEC + v;
            acc[u * VEC + v] = i < n ? a * x[i] + y[i] : 0.0f;
        }
    }
#pragma unroll
    for (int k = 0; k < VEC * UNROLL; ++k) {
        int i = base + k;
        if (i < n) out[i] = acc[k];
    }
}
