"""Shared fixtures for the host-side fitness tests: realistic kernels and small Problems."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from evo.space import Choice, ParamSpace
from evo.types import Genome, Problem

# A realistic RMSNorm-style kernel: vector loads through the non-coherent path, warp
# shuffles, rsqrt.approx, streaming stores, and a cluster barrier with mapa.
REALISTIC_KERNEL = r"""
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef THREADS
#define THREADS 256
#endif

namespace detail {
struct alignas(16) F4 { float x, y, z, w; };

template <int N>
struct Pow2 { static constexpr int value = N; };

constexpr int kWarp = 32;  // a constexpr variable is fine

static __device__ __forceinline__ F4 ldg_nc_v4(const float* p) {
    F4 v;
    asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

static __device__ __forceinline__ void st_cs(float* p, float v) {
    asm volatile("st.global.cs.f32 [%0], %1;" :: "l"(p), "f"(v) : "memory");
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float other;
        asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(other) : "f"(v), "r"(o));
        v += other;
    }
    return v;
}

__device__ __forceinline__ float rsqrt_approx(float x) {
    float y;
    asm("rsqrt.approx.f32 %0, %1;" : "=f"(y) : "f"(x));  /* { unbalanced in a comment */
    return y;
}

__device__ __forceinline__ uint32_t peer_smem(uint32_t addr, uint32_t rank) {
    uint32_t out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
    return out;
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
}  // namespace detail

extern "C" __global__ void __launch_bounds__(THREADS) kernel(const float* __restrict__ x,
                                                            const float* __restrict__ w,
                                                            float* __restrict__ y, int n) {
    __shared__ float partial[THREADS / 32];
    const float* row = x + (size_t)blockIdx.x * n;
    float acc = 0.f;
    for (int i = threadIdx.x * 4; i + 3 < n; i += THREADS * 4) {
        detail::F4 v = detail::ldg_nc_v4(row + i);
        acc += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    acc = detail::warp_sum(acc);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = acc;
    __syncthreads();
    float total = 0.f;
    for (int i = 0; i < THREADS / 32; ++i) total += partial[i];
    (void)detail::peer_smem(0u, 0u);
    float r = detail::rsqrt_approx(total / n + 1e-6f);
    const char* note = "braces in strings { do not count";
    (void)note;
    for (int i = threadIdx.x; i < n; i += THREADS) {
        detail::st_cs(y + (size_t)blockIdx.x * n + i, row[i] * r * w[i]);
    }
}
"""

SIMPLE_KERNEL = r"""
extern "C" __global__ void kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not on PATH")


def nvrtc_usable() -> bool:
    """Whether CuPy is importable and libnvrtc answers (no GPU needed)."""
    import importlib.util

    from fitness import toolkit_version

    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        toolkit_version("nvrtc")
    except RuntimeError:
        return False
    return True


needs_nvrtc = pytest.mark.skipif(not nvrtc_usable(), reason="cupy or libnvrtc not available")


def group_alive(pgid: int) -> list[int]:
    """Pids of processes in group ``pgid`` that are not dead (zombies count as dead).

    Reads /proc, because in some containers PID 1 never reaps orphans, so a killed
    group can linger as zombies that ``os.killpg(pgid, 0)`` still finds.
    """
    import os

    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            alive.append(int(entry))
    return alive


def make_inputs_ok(case, rng, xp):
    """Inputs for the tiny scale problem."""
    return {"x": xp.asarray(rng.standard_normal(case["n"]), dtype=xp.float32)}


def reference_ok(inputs, case, xp):
    """Expected output of the scale kernel."""
    return {"y": 2.0 * inputs["x"]}


def reference_raises(inputs, case, xp):
    """A reference with a bug: it indexes a missing input."""
    return {"y": inputs["missing"]}


def host_problem(**changes) -> Problem:
    """A small Problem that host-only tests can validate without the GPU contract."""
    kw = dict(
        name="scale",
        params=ParamSpace({"THREADS": Choice([128, 256])}),
        check_shapes=({"n": 7}, {"n": 1024}),
        dtypes=("float32",),
        objective="geomean_speed",
        make_inputs=make_inputs_ok,
        reference=reference_ok,
    )
    kw.update(changes)
    return Problem(**kw)


@pytest.fixture
def problem() -> Problem:
    return host_problem()


@pytest.fixture
def simple_genome() -> Genome:
    return Genome(SIMPLE_KERNEL, {"THREADS": 128})


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
