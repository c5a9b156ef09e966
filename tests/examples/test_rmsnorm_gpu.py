"""GPU tests (need a CUDA device; skip themselves otherwise).

A small direct harness (cupy) launches genomes exactly as the Problem describes (buffers,
scalars, launch), with poisoned outputs, so the kernels can be checked before
fitness.Evaluator exists; when it does, the seeds also go through it.

Kernels are compiled as the Compile stage compiles them (:func:`fitness.compile_genome`, nvcc
for the problem's target), once per genome per process; the tests that check many genomes
compile them all first, in parallel (one nvcc process per CPU). The module checks about 100
genomes and nvcc takes 1.4-2.3 s for one on the development VM, so compiling them one by one
(as cupy's RawModule did here before) is likely most of the 330 s its first 28 tests took on
the lent H200 in the thirteenth session.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from evo.types import Case, Genome, Problem
from examples.rmsnorm_problem import make_backward_problem, make_forward_problem
from fitness import materialize

pytestmark = pytest.mark.gpu

_CUBINS: dict[tuple[str, str], bytes] = {}  # (genome id, build) -> cubin, compiled by this process
_KERNELS: dict[tuple[str, str], tuple[Any, Any]] = {}  # (genome id, build) -> (loaded module, its entry function)


def _compile(prob: Problem, genomes: Iterable[Genome]) -> None:
    """Compile every build of the genomes not compiled yet (one, or one per dtype with DTYPE_BUILD 1),
    in parallel (nvcc subprocesses), as the Compile stage does."""
    from fitness import compile_genome

    todo = {(g.id, b): g for g in genomes for b in prob.builds(g.params) if (g.id, b) not in _CUBINS}
    if not todo:
        return
    with ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1)) as ex:
        results = list(ex.map(lambda kg: compile_genome(kg[1], prob, dtype=kg[0][1] or None), todo.items()))
    for key, res in zip(todo, results, strict=True):
        assert res.ok, f"{todo[key].params} build {key[1]!r}: compile failed ({res.reason}):\n{res.log[-3000:]}"
        _CUBINS[key] = res.cubin


def _kernel(prob: Problem, genome: Genome, dtype: str) -> Any:
    """The genome's entry function for cases of ``dtype``, loaded from the cubin of that dtype's build
    (compiled first if this process has not)."""
    import cupy as cp

    key = (genome.id, prob.build_for(genome.params, dtype))
    if key not in _KERNELS:
        _compile(prob, [genome])
        module = cp.cuda.function.Module()
        module.load(_CUBINS[key])
        _KERNELS[key] = (module, module.get_function(genome.entry))  # the module keeps the function valid
    return _KERNELS[key][1]


def _flat(values: dict) -> dict:
    return {k: v.reshape(-1) for k, v in values.items()}


def _inputs(prob: Problem, case: Case, rng: np.random.Generator, xp: Any) -> dict:
    """``make_inputs`` drawn (deferred draws too) and flattened: float32 arrays by name."""
    return _flat(materialize(prob.make_inputs(case, rng, xp), xp))


def _store(cp, a, dtype: str):
    """float32 array -> device array in the storage dtype (bf16 as uint16, round to nearest even)."""
    a = cp.asarray(a, dtype=cp.float32)
    if dtype == "float32":
        return a
    if dtype == "float16":
        return a.astype(cp.float16)
    b = a.view(cp.uint32)
    return ((b + cp.uint32(0x7FFF) + ((b >> 16) & cp.uint32(1))) >> 16).astype(cp.uint16)


def _load(cp, a, dtype: str):
    if dtype == "bfloat16":
        return (a.astype(cp.uint32) << 16).view(cp.float32)
    return a.astype(cp.float32)


def run_case(prob: Problem, genome: Genome, case: Case, seed: int = 0,
             offsets: dict[str, int] | None = None) -> dict[str, float]:
    """Launch ``genome`` on ``case``; return ||out-ref||/||ref|| per output (NaN-poisoned outputs).

    ``offsets``: buffers (by name) handed over as views that start that many elements into a
    larger allocation, i.e. not 16-byte aligned (as a user's tensor slice may be)."""
    import cupy as cp

    raw = _inputs(prob, case, np.random.default_rng(seed), cp)
    outs, ref = launch_case(prob, genome, case, raw, offsets)
    errs = {}
    for name, out in outs.items():
        r = cp.asarray(ref[name], dtype=cp.float32)
        assert bool(cp.isfinite(out).all()), f"{name}: non-finite (unwritten?) elements for {case.key}"
        errs[name] = float(cp.linalg.norm(out - r) / cp.linalg.norm(r))
    return errs


def launch_case(prob: Problem, genome: Genome, case: Case, raw: dict, offsets: dict[str, int] | None = None):
    """Launch ``genome`` on ``case`` with inputs ``raw`` (float32 values by name, stored in each
    buffer's dtype); return (outputs as float32 by name, the reference on the stored inputs)."""
    import cupy as cp

    def shifted(name: str, buf):
        o = (offsets or {}).get(name, 0)
        if not o:
            return buf
        big = cp.empty(buf.size + o, dtype=buf.dtype)
        big[o:] = buf
        return big[o:]

    sig = prob.signature(case)
    bufs, stored = [], {}
    for a in sig:
        if a.role == "in":
            buf = _store(cp, raw[a.name], a.dtype)
            stored[a.name] = _load(cp, buf, a.dtype)
        elif a.role == "workspace":  # handed over all zeros, returned all zeros
            buf = cp.zeros(a.numel, dtype=cp.float32 if a.dtype == "float32" else cp.uint8)
        else:
            buf = _store(cp, cp.full(a.numel, cp.nan, dtype=cp.float32), a.dtype)
        bufs.append(shifted(a.name, buf))
    ref = prob.reference(stored, case, cp)
    kern = _kernel(prob, genome, case.dtype)
    L = prob.launch(dict(genome.params), case, None)
    if L.cluster is not None and L.cluster[0] > 8:  # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        cp.cuda.driver.funcSetAttribute(kern.ptr, 14, 1)
    if L.shared_mem:  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (48 KB in all by default, static included)
        cp.cuda.driver.funcSetAttribute(kern.ptr, 8, int(L.shared_mem))
    ctypes = {"int32": np.int32, "float32": np.float32, "int64": np.int64, "uint32": np.uint32}
    scalars = tuple(ctypes[t](v) for t, v in prob.scalars(case))
    kern(L.grid, L.block, tuple(bufs) + scalars, shared_mem=L.shared_mem)
    cp.cuda.runtime.deviceSynchronize()
    outs = {}
    for a, buf in zip(sig, bufs, strict=True):
        if a.role == "workspace":
            assert int(cp.count_nonzero(buf)) == 0, f"{a.name}: workspace not returned all zeros for {case.key}"
        if a.role == "out":
            outs[a.name] = _load(cp, buf, a.dtype)
    return outs, ref


SMALL = [{"M": 1, "N": 1}, {"M": 3, "N": 7}, {"M": 17, "N": 1000}, {"M": 6, "N": 1026}, {"M": 33, "N": 4099},
         {"M": 1, "N": 65537}, {"M": 64, "N": 8192}, {"M": 4, "N": 262144}]
DTYPES = ["bfloat16", "float16", "float32"]


def _check(prob: Problem, genome: Genome, shapes=SMALL, offsets: dict[str, int] | None = None) -> None:
    for shape in shapes:
        for dt in DTYPES:
            case = Case(shape, dt)
            errs = run_case(prob, genome, case, offsets=offsets)
            for name, e in errs.items():
                assert e <= prob.tolerances[dt], f"{genome.params} {case.key} {name}: rel err {e:.3g}"


def test_reference_on_the_device_matches_numpy(cuda_device) -> None:
    """The references' fused cupy paths (sum of squares, scaling) agree with the numpy ones."""
    import cupy as cp

    from examples.rmsnorm_problem import EPS, bwd_make_inputs, fwd_make_inputs, fwd_reference

    for i, shape in enumerate(SMALL + [{"M": 300, "N": 3000}]):
        case = Case(shape, "float32")
        inp = _flat(materialize(fwd_make_inputs(case, np.random.default_rng(i), np), np))
        want = fwd_reference(inp, case, np)["y"]
        dev = {k: cp.asarray(v) for k, v in inp.items()}
        got = fwd_reference(dev, case, cp)["y"]
        assert got.dtype == cp.float32 and got.shape == want.shape
        np.testing.assert_allclose(cp.asnumpy(got), want, rtol=3e-7, atol=0, err_msg=case.key)
        chunked = fwd_reference(dev, case, cp, fused=False)["y"]  # the path benchmarks/rmsnorm_reference_bench.py times
        np.testing.assert_allclose(cp.asnumpy(chunked), want, rtol=3e-7, atol=0, err_msg=case.key)
        bwd = bwd_make_inputs(case, np.random.default_rng(i), cp)  # rstd from the fused reduction
        x = cp.asnumpy(bwd["x"]).reshape(shape["M"], shape["N"]).astype(np.float64)
        rstd = 1.0 / np.sqrt((x * x).mean(axis=1) + EPS)
        np.testing.assert_allclose(cp.asnumpy(bwd["rstd"]), rstd.astype(np.float32), rtol=3e-7, err_msg=case.key)


def test_forward_seeds(cuda_device) -> None:
    prob = make_forward_problem()
    _compile(prob, prob.seeds)
    for g in prob.seeds:
        _check(prob, g)


def test_forward_full_register_tiles(cuda_device) -> None:
    """The 32 KB register tiles the relaxed rule admits (512 threads in a cluster, 1024 threads in
    STAGE 0, 1 and 3, alone and in clusters) are correct, the long rows held across the cluster included."""
    prob = make_forward_problem()
    base = dict(prob.seeds[0].params, VEC_BYTES=16, PERSISTENT=0, OCCUPANCY=0, STORE_HINT=1)
    variants = [
        dict(base, THREADS=512, MAX_VECS=4, STAGE=0, CLUSTER=2, LOAD_HINT=2),
        dict(base, THREADS=1024, MAX_VECS=2, STAGE=0, CLUSTER=16, LOAD_HINT=3, RSQRT_APPROX=0),
        dict(base, THREADS=1024, MAX_VECS=4, VEC_BYTES=8, STAGE=1, CLUSTER=4, LOAD_HINT=5),
        dict(base, THREADS=1024, MAX_VECS=2, STAGE=3, CLUSTER=2, LOAD_HINT=0, PIPE=1, TILE_ROWS=1, PERSISTENT=1),
        dict(base, THREADS=1024, MAX_VECS=4, VEC_BYTES=8, STAGE=3, CLUSTER=1, RSQRT_APPROX=0, PIPE=2, TILE_ROWS=1),
    ]
    variants = [dict(p, TPR=p["THREADS"]) for p in variants]
    assert all(prob.params.is_valid(p) for p in variants), [prob.params.violations(p) for p in variants]
    genomes = [prob.seeds[0].with_params(**p) for p in variants]
    _compile(prob, genomes)
    for g in genomes:
        _check(prob, g, SMALL + [{"M": 3, "N": 32768 + 8}, {"M": 2, "N": 131072}])


def test_forward_sampled_params(cuda_device) -> None:
    prob = make_forward_problem()
    rng = np.random.default_rng(11)
    genomes = [prob.seeds[0].with_params(**prob.params.sample(rng)) for _ in range(12)]
    _compile(prob, genomes)
    for g in genomes:
        _check(prob, g, SMALL[:6])


PIPE_SHAPES = [{"M": 1, "N": 8}, {"M": 2, "N": 2048}, {"M": 37, "N": 760}, {"M": 3, "N": 40968},
               {"M": 130, "N": 1024}, {"M": 5, "N": 131072}]
"""Shapes whose rows are whole 16-byte chunks in every dtype (the STAGE 3 bulk-copy path), including
slices a cluster cannot split evenly (40968) and a partial last tile."""


def _check_sampled(stage: int, seed: int, shapes, count: int = 16) -> None:
    """``count`` sampled genomes of the forward space with STAGE == ``stage``, on ``shapes``."""
    prob = make_forward_problem()
    rng = np.random.default_rng(seed)
    genomes: list[Genome] = []
    while len(genomes) < count:
        p = prob.params.sample(rng)
        if p["STAGE"] == stage:
            genomes.append(prob.seeds[0].with_params(**p))
    _compile(prob, genomes)
    for g in genomes:
        _check(prob, g, shapes)


def test_forward_pipeline_sampled(cuda_device) -> None:
    """STAGE 3 over sampled knobs: the bulk-copy path and its fallback (odd N) in every dtype."""
    _check_sampled(3, 5, PIPE_SHAPES + SMALL[1:4])


def test_forward_rowtile_sampled(cuda_device) -> None:
    """STAGE 4 over sampled knobs: short rows in registers, and the fallback for long or odd rows."""
    _check_sampled(4, 9, PIPE_SHAPES[:3] + [{"M": 70, "N": 256}] + SMALL[1:4])


def test_forward_one_warp_ctas(cuda_device) -> None:
    """THREADS 32 (a CTA of one warp, up to 32 per SM, with OCCUPANCY 16 or 32 at 128 or 64 registers):
    sampled genomes of every stage, and the short-row forms of one warp per row or half a warp."""
    prob = make_forward_problem()
    rng = np.random.default_rng(23)
    genomes: list[Genome] = []
    for stage in range(5):
        found = 0
        while found < 2:
            p = prob.params.sample(rng)
            if p["STAGE"] == stage and p["THREADS"] == 32:
                genomes.append(prob.seeds[0].with_params(**p))
                found += 1
    for knobs in ({"TPR": 32, "STAGE": 4, "MAX_VECS": 1, "TILE_ROWS": 4, "OCCUPANCY": 32},
                  {"TPR": 16, "STAGE": 4, "MAX_VECS": 2, "TILE_ROWS": 1, "OCCUPANCY": 32},
                  {"TPR": 32, "STAGE": 0, "MAX_VECS": 2, "OCCUPANCY": 32}):
        genomes.append(prob.seeds[0].with_params(THREADS=32, VEC_BYTES=16, CLUSTER=1, PERSISTENT=0, **knobs))
    for g in genomes:
        assert prob.params.is_valid(dict(g.params)), g.params
    _compile(prob, genomes)
    for g in genomes:
        _check(prob, g, SMALL[:6] + PIPE_SHAPES[:3] + [{"M": 70, "N": 256}])


LEAN_SHAPES = [{"M": 1, "N": 8}, {"M": 70, "N": 256}, {"M": 37, "N": 512}, {"M": 130, "N": 1024},
               {"M": 33, "N": 2048}, {"M": 9, "N": 4096}, {"M": 5, "N": 8192}, {"M": 3, "N": 2056}]
"""Rows of whole vectors that the lean STAGE 0 path holds (one vector per thread, up to TPR of them)
and rows longer than that (read twice, by vectors), for THREADS from 64 to 1024."""


@pytest.mark.parametrize("offsets", [None, {"x": 1, "y": 1}, {"w": 1}], ids=["aligned", "x-y-off", "w-off"])
def test_forward_lean_one_vector(cuda_device, offsets: dict[str, int] | None) -> None:
    """STAGE 0 with one vector per thread (rmsnorm_lean): at 32 registers (2048 threads per SM) with
    every load hint the rule admits, one or several rows per CTA, 4- to 16-byte vectors; without
    launch bounds with ld.global.cg and the precise rsqrt; a persistent grid. Rows it holds, longer
    rows (two passes by vectors), odd N and views off the 16-byte grid (two passes by elements)."""
    prob = make_forward_problem()
    base = dict(prob.seeds[0].params, STAGE=0, MAX_VECS=1, CLUSTER=1, PERSISTENT=0, VEC_BYTES=16, RSQRT_APPROX=1)
    params = [dict(base, THREADS=t, TPR=tpr, VEC_BYTES=vb, OCCUPANCY=2048 // t, LOAD_HINT=h, STORE_HINT=sh)
              for t, tpr, vb, h, sh in ((64, 64, 16, 5, 1), (128, 128, 16, 0, 0), (256, 256, 16, 4, 1),
                                        (512, 512, 16, 3, 2), (1024, 1024, 16, 5, 1), (256, 32, 16, 1, 1),
                                        (1024, 16, 8, 4, 1), (64, 4, 4, 0, 0))]
    params += [dict(base, THREADS=128, TPR=64, OCCUPANCY=0, VEC_BYTES=8, LOAD_HINT=2, STORE_HINT=0, RSQRT_APPROX=0),
               dict(base, THREADS=512, TPR=512, OCCUPANCY=0, PERSISTENT=2, LOAD_HINT=3, STORE_HINT=1)]
    for p in params:
        assert prob.params.is_valid(p), p
    genomes = [prob.seeds[0].with_params(**p) for p in params]
    _compile(prob, genomes)
    for g in genomes:
        _check(prob, g, SMALL[:4] + LEAN_SHAPES, offsets=offsets)


@pytest.mark.parametrize("offsets", [None, {"x": 1, "y": 1}], ids=["aligned", "x-y-off"])
def test_forward_lean_prefetch(cuda_device, offsets: dict[str, int] | None) -> None:
    """PREFETCH 1 on the lean path (the next row's vector loaded before this row is reduced, the
    weights kept in registers): persistent grids that walk several steps of rows (the last step
    partly empty, groups of a CTA past the last row), one and several rows per CTA, and a grid of one
    row per CTA; rows longer than the groups and views off the grid take the two-pass path."""
    prob = make_forward_problem()
    base = dict(prob.seeds[0].params, STAGE=0, MAX_VECS=1, CLUSTER=1, VEC_BYTES=16, RSQRT_APPROX=1, PREFETCH=1,
                STORE_HINT=1)
    params = [dict(base, THREADS=256, TPR=256, OCCUPANCY=8, PERSISTENT=1, LOAD_HINT=3),
              dict(base, THREADS=256, TPR=32, OCCUPANCY=8, PERSISTENT=1, LOAD_HINT=4),
              dict(base, THREADS=256, TPR=32, OCCUPANCY=0, PERSISTENT=1, LOAD_HINT=1),
              dict(base, THREADS=1024, TPR=1024, OCCUPANCY=2, PERSISTENT=2, LOAD_HINT=5),
              dict(base, THREADS=128, TPR=128, OCCUPANCY=16, PERSISTENT=0, LOAD_HINT=0),
              dict(base, THREADS=64, TPR=4, VEC_BYTES=4, OCCUPANCY=32, PERSISTENT=4, LOAD_HINT=4)]
    for p in params:
        assert prob.params.is_valid(p), p
    genomes = [prob.seeds[0].with_params(**p) for p in params]
    _compile(prob, genomes)
    steps = [{"M": 3001, "N": 256}, {"M": 700, "N": 2048}, {"M": 1999, "N": 1024}, {"M": 5000, "N": 64}]
    for g in genomes:
        _check(prob, g, SMALL[:4] + LEAN_SHAPES + steps, offsets=offsets)


@pytest.mark.parametrize("hint", [4, 5])
def test_forward_two_pass_policy(cuda_device, hint: int) -> None:
    """LOAD_HINT 4 (first read evict_last, second evict_first) and 5 (the same in L1 too) on the
    paths that read a row twice: STAGE 2 with a CTA (512 and 1024 threads, the latter also at 32
    registers, two CTAs per SM) and with a 4-CTA cluster per row, STAGE 0 and 3 falling back to it."""
    prob = make_forward_problem()
    base = dict(prob.seeds[0].params, LOAD_HINT=hint, STORE_HINT=1, VEC_BYTES=16)
    params = (dict(base, THREADS=512, TPR=512, STAGE=2, MAX_VECS=1, OCCUPANCY=2),
              dict(base, THREADS=1024, TPR=1024, STAGE=2, MAX_VECS=2, OCCUPANCY=0),
              dict(base, THREADS=1024, TPR=1024, STAGE=2, MAX_VECS=1, OCCUPANCY=2),  # 32 registers
              dict(base, THREADS=512, TPR=512, STAGE=2, MAX_VECS=2, CLUSTER=4, OCCUPANCY=2),
              dict(base, THREADS=128, TPR=32, STAGE=0, MAX_VECS=1),
              dict(base, THREADS=128, TPR=128, STAGE=3, MAX_VECS=4, CLUSTER=8, PIPE=1, TILE_ROWS=1))
    for p in params:
        assert prob.params.is_valid(p), p
    _compile(prob, [prob.seeds[0].with_params(**p) for p in params])
    for p in params:
        _check(prob, prob.seeds[0].with_params(**p), SMALL + [{"M": 9, "N": 32768}])


@pytest.mark.parametrize("offsets", [None, {"x": 1, "y": 1}, {"x": 1, "y": 3}], ids=["aligned", "alike", "differ"])
def test_forward_prefetch(cuda_device, offsets: dict[str, int] | None) -> None:
    """PREFETCH 1 (STAGE 2's second pass loads the next vector before storing the current one): the
    last vector, rows of fewer vectors than threads, the weight-unaligned loop (x and y alike but
    off the grid) and the all-scalar rows, with and without a cluster."""
    prob = make_forward_problem()
    base = dict(prob.seeds[0].params, STAGE=2, MAX_VECS=1, VEC_BYTES=16, STORE_HINT=1, PREFETCH=1)
    for p in (dict(base, THREADS=1024, TPR=1024, LOAD_HINT=5, OCCUPANCY=0),
              dict(base, THREADS=512, TPR=512, LOAD_HINT=3, CLUSTER=4, OCCUPANCY=2),
              dict(base, THREADS=128, TPR=128, LOAD_HINT=0, OCCUPANCY=8)):
        assert prob.params.is_valid(p), p
        _check(prob, prob.seeds[0].with_params(**p), SMALL + [{"M": 9, "N": 32768}], offsets=offsets)


CLUSTER_PIPES = [
    # persistent: a cluster walks many tiles, so both exchange buffers are reused many times
    {"THREADS": 64, "CLUSTER": 8, "PERSISTENT": 1, "PIPE": 2, "TILE_ROWS": 1},
    {"THREADS": 256, "CLUSTER": 4, "PERSISTENT": 4, "PIPE": 2, "TILE_ROWS": 2},
    {"THREADS": 512, "CLUSTER": 2, "PERSISTENT": 2, "PIPE": 1, "TILE_ROWS": 2},
    # more rows per tile than an exchange holds (64 // 16 = 4), and ranks with no chunk of short rows
    {"THREADS": 128, "CLUSTER": 16, "PERSISTENT": 0, "PIPE": 1, "TILE_ROWS": 8},
    {"THREADS": 64, "CLUSTER": 16, "PERSISTENT": 1, "PIPE": 3, "TILE_ROWS": 1},
]


@pytest.mark.parametrize("knobs", CLUSTER_PIPES, ids=lambda k: "-".join(f"{v}" for v in k.values()))
def test_forward_cluster_exchange(cuda_device, knobs: dict[str, int]) -> None:
    """STAGE 3 with a cluster: the ranks push their partial sums into each other's shared memory
    (st.async) and wait on their own barrier. Every dtype and shape (short rows leave ranks without
    a chunk; the fallback for odd N), and the same sum, to the bit, in every rank of a row: with
    float32 x of powers of two and w = 1, y / x is the row's rstd exactly, so it must not vary
    along the row."""
    import cupy as cp

    prob = make_forward_problem()
    p = dict(prob.seeds[0].params, STAGE=3, VEC_BYTES=16, LOAD_HINT=3, STORE_HINT=1, MAX_VECS=4, OCCUPANCY=0,
             **knobs)
    p["TPR"] = p["THREADS"]
    assert prob.params.is_valid(p), prob.params.violations(p)
    genome = prob.seeds[0].with_params(**p)
    _check(prob, genome, SMALL + PIPE_SHAPES + [{"M": 300, "N": 4096}])
    rng = np.random.default_rng(7)
    case = Case({"M": 70, "N": 20480}, "float32")
    x = np.ldexp(rng.choice([-1.0, 1.0], size=(70, 20480)), rng.integers(-3, 4, size=(70, 20480)))
    outs, _ = launch_case(prob, genome, case, {"x": cp.asarray(x.reshape(-1), dtype=cp.float32),
                                                "w": cp.ones(20480, dtype=cp.float32)})
    ratio = (outs["y"].reshape(70, 20480) / cp.asarray(x, dtype=cp.float32)).get()
    assert (ratio == ratio[:, :1]).all(), f"{p}: rstd differs along a row (ranks disagree)"


@pytest.mark.parametrize("woff", [0, 1, 2])
def test_forward_pipeline_weights_alignment(cuda_device, woff: int) -> None:
    """STAGE 3 tests the weights' 16-byte alignment once per CTA and then loads them without a
    per-vector test: aligned weights, and weights 4 and 8 bytes off (the general loads), with and
    without a cluster, from registers and from shared memory."""
    prob = make_forward_problem()
    base = dict(prob.seeds[0].params, STAGE=3, VEC_BYTES=16, LOAD_HINT=3, STORE_HINT=1, OCCUPANCY=0, PIPE=1)
    for p in (dict(base, THREADS=128, TPR=128, CLUSTER=16, MAX_VECS=4, TILE_ROWS=1),
              dict(base, THREADS=256, TPR=256, CLUSTER=1, MAX_VECS=4, TILE_ROWS=2),
              dict(base, THREADS=128, TPR=32, CLUSTER=1, MAX_VECS=2, TILE_ROWS=8)):
        assert prob.params.is_valid(p), p
        _check(prob, prob.seeds[0].with_params(**p), PIPE_SHAPES + [{"M": 9, "N": 32768}],
               offsets={"w": woff} if woff else None)


@pytest.mark.parametrize("woff", [0, 1, 2])
def test_forward_rowtile_whole_steps(cuda_device, woff: int) -> None:
    """STAGE 4 runs a CTA's whole steps without per-row or per-vector tests when every thread holds
    MAX_VECS vectors of a row and the weights are 16-byte aligned, and the rest (the last partial
    step, other N, weights 4 or 8 bytes off) through the tested loop: exact fits at N = 256-2K with
    M a multiple of the step and not, from registers (WCACHE) and from L1, and N one vector short."""
    prob = make_forward_problem()
    base = dict(prob.seeds[0].params, STAGE=4, VEC_BYTES=16, CLUSTER=1, PERSISTENT=0, LOAD_HINT=1, STORE_HINT=1)
    params = (dict(base, THREADS=32, TPR=32, MAX_VECS=1, TILE_ROWS=4, OCCUPANCY=32),
              dict(base, THREADS=32, TPR=32, MAX_VECS=2, TILE_ROWS=2, OCCUPANCY=16),
              dict(base, THREADS=32, TPR=32, MAX_VECS=4, TILE_ROWS=1, OCCUPANCY=32),
              dict(base, THREADS=128, TPR=32, MAX_VECS=8, TILE_ROWS=1, OCCUPANCY=2, LOAD_HINT=3),
              dict(base, THREADS=256, TPR=16, MAX_VECS=2, TILE_ROWS=2, OCCUPANCY=4))
    for p in params:
        assert prob.params.is_valid(p), p
    genomes = [prob.seeds[0].with_params(**p) for p in params]
    _compile(prob, genomes)
    shapes = [{"M": m, "N": n} for n in (256, 512, 1024, 2048, 248) for m in (1, 64, 70, 2053)]
    for g in genomes:
        _check(prob, g, shapes, offsets={"w": woff} if woff else None)


@pytest.mark.parametrize("offsets", [{"x": 1, "y": 3}, {"x": 1, "y": 1}, {"x": 0, "y": 2}],
                         ids=["x-y-differ", "x-y-alike", "y-only"])
def test_forward_misaligned_views(cuda_device, offsets: dict[str, int]) -> None:
    """x and y views that start off the 16-byte grid (elements into an allocation): alike, the rows
    take the scalar head, vector body and tail; differently, every element the scalar path."""
    prob = make_forward_problem()
    _compile(prob, prob.seeds)
    for g in prob.seeds:
        _check(prob, g, SMALL[:6] + [{"M": 9, "N": 32768}], offsets=offsets)


def test_backward_misaligned_views(cuda_device) -> None:
    """The backward seeds with x, dy and dx views off the 16-byte grid (the element-access path)."""
    prob = make_backward_problem()
    _compile(prob, prob.seeds)
    for g in prob.seeds:
        _check(prob, g, [{"M": 3, "N": 7}, {"M": 17, "N": 1000}, {"M": 40, "N": 1024}],
               offsets={"x": 1, "dy": 2, "dx": 3})


def test_forward_timed_shape_sample(cuda_device) -> None:
    prob = make_forward_problem()
    _check(prob, prob.seeds[1], [{"M": 32768, "N": 4096}, {"M": 8192, "N": 262144}])


def test_backward_seed(cuda_device) -> None:
    prob = make_backward_problem()
    _check(prob, prob.seeds[0], [s for s in SMALL[:-1] if s["N"] > 1] + [{"M": 2048, "N": 1024}])


def test_backward_persistent_seeds(cuda_device) -> None:
    """ALGO 1 (per-CTA partials, last CTAs reduce): odd N, M=1, unaligned chunks, N past the smem limit."""
    prob = make_backward_problem()
    shapes = [s for s in SMALL[:-1] if s["N"] > 1] + [{"M": 2048, "N": 1024}, {"M": 700, "N": 4096},
                                                       {"M": 5, "N": 40968}, {"M": 9000, "N": 1024}]
    _compile(prob, prob.seeds[1:])
    for g in prob.seeds[1:]:
        _check(prob, g, shapes)


def test_backward_sampled_params(cuda_device) -> None:
    prob = make_backward_problem()
    rng = np.random.default_rng(5)
    genomes = [prob.seeds[0].with_params(**prob.params.sample(rng)) for _ in range(8)]
    _compile(prob, genomes)
    for g in genomes:
        _check(prob, g, [{"M": 3, "N": 7}, {"M": 300, "N": 2048}, {"M": 2, "N": 1026}])


def test_backward_row_warp_sampled(cuda_device) -> None:
    """ALGO 1 with 1, 2 or 4 warps per row (and PREFETCH) over sampled knobs: rows that fit the
    group's chunks in every dtype, many rows per group, M below the group count, and the fallbacks."""
    prob = make_backward_problem()
    rng = np.random.default_rng(11)
    shapes = [{"M": 3000, "N": 1024}, {"M": 5, "N": 256}, {"M": 1, "N": 64}, {"M": 300, "N": 40},
              {"M": 7, "N": 1026}, {"M": 64, "N": 4096}]
    genomes: list[Genome] = []
    while len(genomes) < 9:
        p = dict(prob.params.sample(rng), ALGO=1, ROW_WARP=[1, 2, 4][len(genomes) % 3])
        if prob.params.is_valid(p):
            genomes.append(prob.seeds[0].with_params(**p))
    _compile(prob, genomes)
    for g in genomes:
        _check(prob, g, shapes)


@pytest.mark.parametrize("tree", [4, 8, 16])
def test_backward_tree(cuda_device, tree: int) -> None:
    """TREE (the partials summed in groups of CTAs first): grids that split into whole groups and not
    (M below the grid, a last group of 1), rows in registers, by warps and past the shared-memory
    limit, odd N; the group tickets must come back zero (the workspace check), and dw must be
    bitwise the same in two launches of one input set."""
    import cupy as cp

    prob = make_backward_problem()
    base = dict(prob.seeds[0].params, ALGO=1, TREE=tree)
    params = (dict(base, THREADS=256, MAX_CHUNKS=2, CTAS_PER_SM=2, ROW_WARP=2),
              dict(base, THREADS=128, MAX_CHUNKS=1, CTAS_PER_SM=4, PREFETCH=1, REDUCERS=64),
              dict(base, THREADS=512, MAX_CHUNKS=8, CTAS_PER_SM=1, SMEM_DW=0, REDUCERS=8))
    genomes = [prob.seeds[0].with_params(**p) for p in params]
    for g in genomes:
        assert prob.params.is_valid(dict(g.params)), g.params
    _compile(prob, genomes)
    shapes = [{"M": 1, "N": 1024}, {"M": tree + 1, "N": 1024}, {"M": 3000, "N": 1024}, {"M": 9000, "N": 4096},
              {"M": 17, "N": 1000}, {"M": 5, "N": 40968}]
    for g in genomes:
        _check(prob, g, shapes)
        case = Case({"M": 5000, "N": 2048}, "bfloat16")
        raw = _inputs(prob, case, np.random.default_rng(7), cp)
        first, _ = launch_case(prob, g, case, raw)
        again, _ = launch_case(prob, g, case, raw)
        assert cp.array_equal(first["dw"], again["dw"]), f"{g.params}: dw differs between two launches"


def _check_backward_and_relaunch(prob: Problem, g: Genome, shapes) -> tuple[dict, Case, dict]:
    """``g`` against the reference on ``shapes`` and on misaligned views, then launched twice on one
    input set (5000 x 2048 bf16): dw bitwise the same. Returns the first launch's outputs, its case
    and its inputs."""
    import cupy as cp

    _check(prob, g, shapes)
    _check(prob, g, [{"M": 40, "N": 1024}], offsets={"x": 1, "dy": 2, "dx": 3})
    case = Case({"M": 5000, "N": 2048}, "bfloat16")
    raw = _inputs(prob, case, np.random.default_rng(9), cp)
    first, _ = launch_case(prob, g, case, raw)
    again, _ = launch_case(prob, g, case, raw)
    assert cp.array_equal(first["dw"], again["dw"]), f"{g.params}: dw differs between two launches"
    return first, case, raw


def test_backward_stages(cuda_device) -> None:
    """STAGES (rows staged ahead in shared memory by cp.async): by CTA and by 1 or 2 warps, 1-3 slots,
    rings that wrap many times (M far above the grid), M below the grid and M = 1, a 128 KB fp32 row
    next to 64 KB of dw, rows that are not staged (not whole chunks, past the registers, past the dw
    limit, misaligned views), and dw bitwise the same in two launches; DW_REGS (dw sums in registers)
    with and without STAGES, its dw bitwise that of the same genome without it."""
    import cupy as cp

    from examples.rmsnorm_problem import bwd_stage_bytes

    prob = make_backward_problem()
    base = dict(prob.seeds[0].params, ALGO=1)
    params = (dict(base, THREADS=256, MAX_CHUNKS=2, CTAS_PER_SM=2, STAGES=2, TREE=8),
              dict(base, THREADS=512, MAX_CHUNKS=8, CTAS_PER_SM=1, STAGES=1),
              dict(base, THREADS=256, MAX_CHUNKS=2, CTAS_PER_SM=2, ROW_WARP=2, TREE=8, STAGES=3),
              dict(base, THREADS=128, MAX_CHUNKS=4, CTAS_PER_SM=3, ROW_WARP=1, STAGES=2, REDUCERS=64),
              dict(base, THREADS=128, MAX_CHUNKS=1, CTAS_PER_SM=4, STAGES=3, SMEM_DW=0),
              dict(base, THREADS=256, MAX_CHUNKS=2, CTAS_PER_SM=2, STAGES=2, TREE=8, DW_REGS=1),
              dict(base, THREADS=512, MAX_CHUNKS=4, CTAS_PER_SM=1, DW_REGS=1, SMEM_DW=0))
    genomes = [prob.seeds[0].with_params(**p) for p in params]
    for g in genomes:
        assert prob.params.is_valid(dict(g.params)), g.params
    staged = [(0, Case({"M": 9000, "N": 4096}, "bfloat16")), (1, Case({"M": 64, "N": 16384}, "float32")),
              (2, Case({"M": 3000, "N": 1024}, "bfloat16")), (3, Case({"M": 3000, "N": 1024}, "float32")),
              (4, Case({"M": 3000, "N": 1024}, "bfloat16"))]
    for i, case in staged:
        assert bwd_stage_bytes(params[i], case) > 0, (params[i], case)
    _compile(prob, genomes)
    shapes = [{"M": 1, "N": 1024}, {"M": 5, "N": 256}, {"M": 3000, "N": 1024}, {"M": 9000, "N": 4096},
              {"M": 64, "N": 16384}, {"M": 17, "N": 1002}, {"M": 5, "N": 40968}]
    for g in genomes:
        first, case, raw = _check_backward_and_relaunch(prob, g, shapes)
        if g.params["DW_REGS"]:
            plain, _ = launch_case(prob, g.with_params(DW_REGS=0), case, raw)
            assert cp.array_equal(first["dw"], plain["dw"]), f"{g.params}: DW_REGS changed dw"
            assert cp.array_equal(first["dx"], plain["dx"]), f"{g.params}: DW_REGS changed dx"


def test_backward_split(cuda_device) -> None:
    """SPLIT (a row over a cluster of 2 or 4 CTAs, the dot product summed through distributed shared
    memory): vector and element paths, shares of unequal size and empty ones (N = 256 bf16 over 4 CTAs
    of 256 threads), M = 1 (one cluster), dw past the shared-memory limit (the cluster's CTAs write
    disjoint columns of one workspace row), misaligned views, and dw bitwise the same in two launches."""
    prob = make_backward_problem()
    base = dict(prob.seeds[0].params, ALGO=1)
    params = [dict(base, THREADS=256, MAX_CHUNKS=8, CTAS_PER_SM=2, SPLIT=2, REDUCERS=64),
              dict(base, THREADS=256, MAX_CHUNKS=4, CTAS_PER_SM=2, SPLIT=4, PREFETCH=1, REDUCERS=64),
              dict(base, THREADS=128, MAX_CHUNKS=2, CTAS_PER_SM=4, SPLIT=2, PREFETCH=1, REDUCERS=64),
              dict(base, THREADS=1024, MAX_CHUNKS=2, CTAS_PER_SM=1, SPLIT=4, LOAD_HINT=1),
              dict(base, THREADS=256, MAX_CHUNKS=2, CTAS_PER_SM=2, SPLIT=2, DW_REGS=1, SMEM_DW=0, REDUCERS=8)]
    genomes = [prob.seeds[0].with_params(**p) for p in params]
    for g in genomes:
        assert prob.params.is_valid(dict(g.params)), g.params
    _compile(prob, genomes)
    shapes = [{"M": 1, "N": 1024}, {"M": 5, "N": 256}, {"M": 3000, "N": 1024}, {"M": 9000, "N": 4096},
              {"M": 64, "N": 16384}, {"M": 17, "N": 1002}, {"M": 5, "N": 40968}, {"M": 700, "N": 24}]
    for g in genomes:
        _check_backward_and_relaunch(prob, g, shapes)


def test_backward_seeds_through_evaluator(cuda_device) -> None:
    """Every backward seed passes the gate and Timing (the workspace contract included)."""
    fitness = pytest.importorskip("fitness")
    prob = make_backward_problem(timed=[{"M": 4096, "N": 4096}], dtypes=["bfloat16"])
    ev = fitness.Evaluator(prob)
    try:
        for g in prob.seeds:
            res = ev.evaluate(g)
            assert res.ok, (dict(g.params), res.reason)
    finally:
        ev.close()


def test_backward_dispatch_supplies_the_workspace(cuda_device, tmp_path) -> None:
    """An exported backward module runs with the workspace left out, twice (returned zeroed)."""
    import importlib.util

    import cupy as cp

    from evo.export import export_module
    from evo.types import Evaluation, Record, Status

    prob = make_backward_problem(timed=[{"M": 512, "N": 1024}], dtypes=["float32"])
    g = prob.seeds[1]
    rec = Record(g, Evaluation(Status.OK, fitness=1.0, metrics={"cases": {"M=512,N=1024:float32": {"time_ms": 1.0}}}))
    path = export_module([rec], prob, tmp_path / "bwd_dispatch.py")
    spec = importlib.util.spec_from_file_location("bwd_dispatch", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    case = Case({"M": 512, "N": 1024}, "float32")
    raw = _inputs(prob, case, np.random.default_rng(3), cp)
    ins = {k: cp.asarray(v, dtype=cp.float32) for k, v in raw.items()}
    ref = prob.reference(ins, case, cp)
    for _ in range(2):
        dx = cp.full(512 * 1024, cp.nan, dtype=cp.float32)
        dw = cp.full(1024, cp.nan, dtype=cp.float32)
        mod.run(ins["x"], ins["w"], ins["dy"], ins["rstd"], dx, dw, shape={"M": 512, "N": 1024}, dtype="float32")
        cp.cuda.runtime.deviceSynchronize()
        for got, name in ((dx, "dx"), (dw, "dw")):
            want = cp.asarray(ref[name])
            assert float(cp.linalg.norm(got - want) / cp.linalg.norm(want)) < prob.tolerances["float32"]
    assert all(int(cp.count_nonzero(w)) == 0 for w in mod._ws.values()) and len(mod._ws) == 1


def test_seeds_through_evaluator(cuda_device) -> None:
    fitness = pytest.importorskip("fitness")
    if not hasattr(fitness, "Evaluator"):
        pytest.skip("fitness.Evaluator not available yet")
    prob = make_forward_problem(timed=[{"M": 4096, "N": 4096}])
    ev = fitness.Evaluator(prob)
    try:
        for g in prob.seeds:
            res = ev.evaluate(g)
            assert res.ok, res.reason
    finally:
        ev.close()


def test_dtype_builds(cuda_device) -> None:
    """DTYPE_BUILD 1 (a build per dtype, -DDTYPE_CODE): every forward seed and every backward seed so
    built is correct on every dtype (each case runs its dtype's cubin), and through the evaluator
    (three builds, each case its own) the gate and Timing pass, with the resources the largest."""
    fitness = pytest.importorskip("fitness")
    fwd, bwd = make_forward_problem(), make_backward_problem()
    fwd_g = [g.with_params(DTYPE_BUILD=1) for g in fwd.seeds]
    bwd_g = [g.with_params(DTYPE_BUILD=1) for g in bwd.seeds]
    _compile(fwd, fwd_g)
    _compile(bwd, bwd_g)
    for g in fwd_g:
        _check(fwd, g, [{"M": 3, "N": 7}, {"M": 17, "N": 1000}, {"M": 33, "N": 4099}, {"M": 64, "N": 8192},
                        {"M": 4, "N": 65537}])
    for g in bwd_g:
        _check(bwd, g, [{"M": 1, "N": 1024}, {"M": 17, "N": 1002}, {"M": 3000, "N": 4096}])
    for prob, g in ((make_forward_problem(timed=[{"M": 4096, "N": 4096}]), fwd_g[0]),
                    (make_backward_problem(timed=[{"M": 4096, "N": 4096}]), bwd_g[5])):
        ev = fitness.Evaluator(prob)
        try:
            res = ev.evaluate(g)
            assert res.ok, (dict(g.params), res.reason)
            assert set(res.metrics["cases"]) == {c.key for c in prob.timed_cases()}
        finally:
            ev.close()


def _resident_cluster_genome(prob: Problem) -> Genome:
    """A persistent STAGE 3 genome of 16-CTA clusters (weights in shared memory): a grid that asks
    for PERSISTENT * SMs CTAs, more than 16-CTA clusters can usually run at once."""
    p = dict(prob.seeds[0].params, STAGE=3, VEC_BYTES=16, LOAD_HINT=3, STORE_HINT=1, MAX_VECS=4, OCCUPANCY=0,
             THREADS=128, TPR=128, CLUSTER=16, PERSISTENT=2, WSMEM=1, PIPE=2, TILE_ROWS=1, PREFETCH=0)
    assert prob.params.is_valid(p), prob.params.violations(p)
    return prob.seeds[0].with_params(**p)


def test_forward_resident_grid_through_evaluator(cuda_device) -> None:
    """A persistent cluster grid runs with no more clusters than fit at once: the gate asks the
    driver (cuOccupancyMaxActiveClusters), launches whole clusters within it, passes, and Timing
    records the grid it ran."""
    import cupy as cp

    import fitness

    shape = {"M": 2048, "N": 65536}
    prob = make_forward_problem(timed=[shape], dtypes=["bfloat16"])
    g = _resident_cluster_genome(prob)
    sms = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["multiProcessorCount"]
    asked = prob.launch(dict(g.params), Case(shape, "bfloat16"), {"sm_count": sms})
    assert asked.resident and asked.cluster == (16, 1, 1)
    ev = fitness.Evaluator(prob)
    try:
        res = ev.evaluate(g)
    finally:
        ev.close()
    assert res.ok, res.reason
    ran = res.metrics["cases"]["M=2048,N=65536:bfloat16"]["grid"]
    assert 16 <= ran <= asked.grid[0] and ran % 16 == 0, (ran, asked.grid)


def test_forward_resident_grid_in_the_dispatch(cuda_device, tmp_path) -> None:
    """An exported module caps a resident launch the same way (asked once per device and launch
    shape) and computes y right, twice."""
    import importlib.util

    import cupy as cp

    from evo.export import export_module
    from evo.types import Evaluation, Record, Status

    shape = {"M": 300, "N": 65536}
    prob = make_forward_problem(timed=[shape], dtypes=["float32"])
    g = _resident_cluster_genome(prob)
    key = "M=300,N=65536:float32"
    rec = Record(g, Evaluation(Status.OK, fitness=1.0, metrics={"cases": {key: {"time_ms": 1.0}}}))
    path = export_module([rec], prob, tmp_path / "fwd_dispatch.py")
    spec = importlib.util.spec_from_file_location("fwd_dispatch", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    case = Case(shape, "float32")
    raw = _inputs(prob, case, np.random.default_rng(5), cp)
    ins = {k: cp.asarray(v, dtype=cp.float32) for k, v in raw.items()}
    want = cp.asarray(prob.reference(ins, case, cp)["y"])
    for _ in range(2):
        y = cp.full(300 * 65536, cp.nan, dtype=cp.float32)
        mod.run(ins["x"], ins["w"], y, shape=shape, dtype="float32")
        cp.cuda.runtime.deviceSynchronize()
        assert float(cp.linalg.norm(y - want) / cp.linalg.norm(want)) < prob.tolerances["float32"]
    assert len(mod._fits) == 1 and all(v is not None and v > 0 and v % 16 == 0 for v in mod._fits.values()), mod._fits


def test_dispatch_runs_the_exported_cubin_else_nvrtc(cuda_device, tmp_path) -> None:
    """The module runs the cubin built at export time; without one, or with one this GPU does
    not load, it compiles the source with NVRTC; y is right every way, on two dtypes."""
    import base64
    import importlib.util
    import zlib

    import cupy as cp

    from evo.export import export_module
    from evo.types import Evaluation, Record, Status

    shape = {"M": 37, "N": 4100}
    prob = make_forward_problem(timed=[shape], dtypes=["float32", "bfloat16"])
    g = prob.seeds[0]
    metrics = {"cases": {f"M=37,N=4100:{dt}": {"time_ms": 1.0} for dt in ("float32", "bfloat16")}}
    rec = Record(g, Evaluation(Status.OK, fitness=1.0, metrics=metrics))

    def load(name: str, **kw: Any) -> Any:
        path = export_module([rec], prob, tmp_path / f"{name}.py", **kw)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    def check(mod: Any, dtype: str) -> None:
        case = Case(shape, dtype)
        raw = _inputs(prob, case, np.random.default_rng(7), cp)
        x, w = _store(cp, raw["x"], dtype), _store(cp, raw["w"], "float32")
        want = cp.asarray(prob.reference({"x": _load(cp, x, dtype), "w": w}, case, cp)["y"], dtype=cp.float32)
        y = _store(cp, cp.full(x.size, cp.nan, dtype=cp.float32), dtype)
        mod.run(x, w, y, shape=shape, dtype=dtype)
        cp.cuda.runtime.deviceSynchronize()
        got = _load(cp, y, dtype)
        assert bool(cp.isfinite(got).all())
        assert float(cp.linalg.norm(got - want) / cp.linalg.norm(want)) < prob.tolerances[dtype]

    built = load("d_cubin")
    for dtype in ("float32", "bfloat16"):
        check(built, dtype)
        assert built.origin(shape, dtype).startswith("cubin: nvcc 13."), built.origin(shape, dtype)
    assert len(built._cache) == 1  # one binary serves both dtypes

    plain = load("d_src", binaries=False)
    check(plain, "float32")
    assert plain.origin(shape, "float32") == "nvrtc for this GPU (no exported cubin)"

    broken = load("d_broken")
    key = broken.GENOMES[0]["binary"]
    broken._BINARIES[key] = base64.b64encode(zlib.compress(b"\x7fELF not a cubin")).decode()
    check(broken, "bfloat16")
    assert broken.origin(shape, "bfloat16").startswith("nvrtc for this GPU (the exported cubin did not load")
