"""StaticCheck: one test per rule, realistic kernels accepted."""

from __future__ import annotations

import pytest

from evo.types import Genome, Status
from fitness import Job, StageContext, StaticCheck, static_violations
from tests.fitness.conftest import REALISTIC_KERNEL, SIMPLE_KERNEL, host_problem

P = host_problem()


def violations(src: str, **kw) -> list[str]:
    kw.setdefault("allowed_includes", P.allowed_includes)
    kw.setdefault("forbidden_sregs", P.forbidden_sregs)
    return static_violations(src, **kw)


def wrap(body: str, prelude: str = "") -> str:
    return prelude + '\nextern "C" __global__ void kernel(float* y, int n) {\n' + body + "\n}\n"


def test_realistic_kernel_passes():
    assert violations(REALISTIC_KERNEL) == []
    assert violations(SIMPLE_KERNEL) == []


@pytest.mark.parametrize("src", [
    # extern "C" block form, launch bounds and cluster dims before the name
    'extern "C" {\n__global__ void __launch_bounds__(128, 2) kernel(float* y) { y[0] = 1.f; }\n}\n',
    'extern "C" __global__ void __cluster_dims__(2, 1, 1) kernel(float* y) { y[0] = 1.f; }\n',
    # template device helper and struct with member functions, static __device__ helper
    'template <int N> __device__ int twice() { return 2 * N; }\n'
    'struct Acc { float v; __device__ void add(float x) { v += x; } };\n'
    'static __device__ float sq(float x) { return x * x; }\n'
    '__constant__ float table[4] = {1.f, 2.f, 3.f, 4.f};\n'
    'constexpr int kTile = 128;\n'
    + wrap("Acc a{0.f}; a.add(sq(y[0])); y[0] = a.v + table[0] + twice<kTile>();"),
    # #pragma and a comment mentioning cudaMalloc( and printf( are fine
    wrap("#pragma unroll 4\n  for (int i = 0; i < 4; ++i) y[i] = 0.f; // not cudaMalloc( nor printf(\n"),
])
def test_allowed_forms_pass(src):
    assert violations(src) == []


@pytest.mark.parametrize("src, rule", [
    ('__host__ __device__ float f(float x) { return x; }\n' + wrap("y[0] = f(1.f);"), "host code: '__host__'"),
    ("int main() { return 0; }\n" + wrap("y[0] = 1.f;"), "host code: a 'main('"),
    ("float helper(float x) { return x; }\n" + wrap("y[0] = 1.f;"), "function 'helper' is defined at namespace"),
    ("namespace ns { int helper(int a) { return a; } }\n" + wrap("y[0] = 1.f;"), "function 'helper'"),
    ("template <typename T> T twice(T a) { return a + a; }\n" + wrap("y[0] = 1.f;"), "function 'twice'"),
    (wrap("float* p; cudaMalloc(&p, 4);"), "runtime API call 'cudaMalloc('"),
    (wrap("cuMemAlloc(0, 4);"), "driver API call 'cuMemAlloc('"),
    (wrap("cudaStream_t s; (void)s;"), "streams and events"),
    ("__global__ void child(float* y) {}\n" + wrap("child<<<1, 1>>>(y);"), "dynamic parallelism"),
    (wrap("cublasSgemm(0);"), "library: 'cublasSgemm'"),
    (wrap("cufftExecC2C(0);"), "library"),
    (wrap("curandGenerateUniform(0, y, n);"), "cuRAND host API"),
    (wrap("thrust::fill(y, y + n, 0.f);"), "Thrust"),
    (wrap("float* p = (float*)malloc(16); free(p);"), "'malloc('"),
    (wrap("float* p = new float[4]; delete[] p;"), "'new'"),
    (wrap('printf("hi %d", n);'), "'printf('"),
    ("#define CAT(a, b) a##b\n" + wrap("y[0] = 1.f;"), "token pasting"),
    ("#include <cublas_v2.h>\n" + wrap("y[0] = 1.f;"), "'#include cublas_v2.h' is not allowed"),
    ('#include "my_header.cuh"\n' + wrap("y[0] = 1.f;"), "'#include my_header.cuh'"),
    (wrap('unsigned t; asm volatile("mov.u32 %0, %%clock;" : "=r"(t)); y[0] = t;'), "'%clock' is forbidden"),
    (wrap('unsigned long long t; asm("mov.u64 %0, %%globaltimer;" : "=l"(t)); y[0] = t;'), "'%globaltimer'"),
    (wrap("y[0] = (float)clock64();"), "builtin reading '%clock64'"),
    ('__global__ void kernel(float* y) { y[0] = 1.f; }\n', "entry: no definition"),
    ('extern "C" __global__ void other(float* y) { y[0] = 1.f; }\n', "entry: no definition"),
    ('extern "C" __device__ void kernel(float* y) { y[0] = 1.f; }\n', "entry: no definition"),
])
def test_each_rule_rejects(src, rule):
    found = violations(src)
    assert any(rule in v for v in found), found


def test_clock_allowed_when_not_forbidden():
    src = wrap('unsigned t; asm volatile("mov.u32 %0, %%clock;" : "=r"(t)); y[0] = t;')
    assert violations(src, forbidden_sregs=()) == []
    assert violations(src, forbidden_sregs=("%clock64",)) == []  # %clock is not %clock64


def test_allowed_includes_follow_the_problem():
    src = "#include <cuda/barrier>\n" + wrap("y[0] = 1.f;")
    assert violations(src)  # not in the default list
    assert violations(src, allowed_includes=("cuda/barrier",)) == []


PTX_OK = """
.version 8.0
.target sm_90a
.address_size 64
.visible .entry kernel(.param .u64 y) {
    .reg .b64 %rd<2>;
    .reg .f32 %f<2>;
    ld.param.u64 %rd1, [y];
    mov.f32 %f1, 0f3F800000;
    st.global.f32 [%rd1], %f1;
    ret;
}
"""


def test_ptx_rules():
    assert violations(PTX_OK, language="ptx") == []
    assert any("%clock" in v for v in violations(PTX_OK.replace("mov.f32 %f1, 0f3F800000;",
                                                                "mov.u32 %r1, %clock;"), language="ptx"))
    two = PTX_OK + PTX_OK.replace(".entry kernel", ".entry sneaky")
    assert any("sneaky" in v for v in violations(two, language="ptx"))
    assert any("no `.entry kernel`" in v for v in violations(PTX_OK.replace("kernel", "k2"), language="ptx"))
    ext = ".extern .func (.param .b32 r) vprintf (.param .b64 a, .param .b64 b);\n" + PTX_OK
    assert any("external declarations" in v for v in violations(ext, language="ptx"))


def test_stage_rejects_with_reason_artifact():
    stage = StaticCheck()
    assert stage.where == "host" and not stage.needs_gpu
    ok = stage.run(Job(Genome(SIMPLE_KERNEL), P), StageContext())
    assert ok.ok
    bad = stage.run(Job(Genome(wrap("cudaDeviceSynchronize();")), P), StageContext())
    assert not bad.ok and bad.status is Status.REJECTED
    assert "cudaDeviceSynchronize" in bad.artifacts["reason"]
