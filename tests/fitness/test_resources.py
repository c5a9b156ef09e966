"""Resources parsed from real ptxas reports."""

from __future__ import annotations

from evo.types import Genome, Status
from fitness import Compile, Job, Resources, StageContext, compile_genome, parse_ptxas_report, ptxas_entries
from tests.fitness.conftest import SIMPLE_KERNEL, host_problem, needs_nvcc

LOCAL_ARRAY = r"""
extern "C" __global__ void kernel(const float* x, float* y, int n) {
    float a[48];
    #pragma unroll
    for (int j = 0; j < 48; j++) a[j] = x[threadIdx.x + j * n];
    float s = 0.f;
    #pragma unroll
    for (int j = 0; j < 48; j++) s += a[j] * a[(j * 5) % 48];
    #pragma unroll
    for (int j = 0; j < 48; j++) y[j * n + threadIdx.x] = a[j] + s;
}
extern "C" __global__ void helper_kernel(float* y) { y[0] = 1.f; }
"""

OLD_FORMAT = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'kernel' for 'sm_80'
ptxas info    : Function properties for kernel
    16 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 40 registers, 2048 bytes smem, 368 bytes cmem[0], 8 bytes cmem[2]
"""


@needs_nvcc
def test_registers_from_a_real_compile():
    r = compile_genome(Genome(SIMPLE_KERNEL), host_problem())
    res = parse_ptxas_report(r.log, "kernel")
    assert res is not None and res["registers"] > 0
    assert res["spill_bytes"] == 0 and res["stack_bytes"] == 0


@needs_nvcc
def test_spills_and_stack_with_a_register_cap():
    problem = host_problem(compile_options=("-maxrregcount=24",))
    r = compile_genome(Genome(LOCAL_ARRAY), problem)
    assert r.ok, r.log
    assert ptxas_entries(r.log) == ["helper_kernel", "kernel"] or set(ptxas_entries(r.log)) == {"helper_kernel",
                                                                                                  "kernel"}
    res = parse_ptxas_report(r.log, "kernel")
    assert res is not None
    assert res["registers"] == 24
    assert res["stack_bytes"] > 0
    assert res["spill_store_bytes"] > 0 and res["spill_load_bytes"] > 0
    assert res["spill_bytes"] == res["spill_store_bytes"] + res["spill_load_bytes"]
    other = parse_ptxas_report(r.log, "helper_kernel")
    assert other is not None and other["spill_bytes"] == 0


def test_old_format_with_cmem():
    res = parse_ptxas_report(OLD_FORMAT, "kernel")
    assert res == {"registers": 40, "shared_bytes": 2048, "cmem_bytes": 376, "stack_bytes": 16,
                   "spill_store_bytes": 4, "spill_load_bytes": 8, "spill_bytes": 12, "barriers": 0}
    assert parse_ptxas_report(OLD_FORMAT, "other") is None


@needs_nvcc
def test_stage_missing_entry_is_compile_error(tmp_path):
    src = SIMPLE_KERNEL.replace("void kernel(", "void renamed(")
    job = Job(Genome(src), host_problem())
    ctx = StageContext(options={"cache_dir": str(tmp_path)})
    comp = Compile().run(job, ctx)
    assert comp.ok
    job.data.update(comp.data)
    res = Resources().run(job, ctx)
    assert not res.ok and res.status is Status.COMPILE_ERROR
    assert res.artifacts["reason"].startswith("entry kernel not found in cubin")
    assert "renamed" in res.artifacts["reason"]
