"""Every forward variant the search may try compiles for sm_90a without spills (sampled).

The space is too large to compile whole (about 10^5 compile-relevant combinations), so the
test compiles the seeds, the corners of the register-tile constraint and a seeded random
sample; a spill-free result is required (bound: 0 spill bytes).
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from evo.types import Genome
from examples.rmsnorm_problem import KERNEL_DIR, forward_param_space, make_backward_problem, make_forward_problem

from .conftest import nvcc_compile, nvcc_ptx

SPILL_BOUND = 0


def _spills(log: str) -> int:
    return sum(int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log))


def _defines(p: dict) -> list[str]:
    return Genome("x", p).defines()


def _corner_cases() -> list[dict]:
    base = dict(make_forward_problem().seeds[0].params)
    out = []
    for threads, vecs in ((1024, 1), (512, 4), (256, 8), (128, 16)):
        out.append(dict(base, THREADS=threads, TPR=threads, MAX_VECS=vecs, VEC_BYTES=16, STAGE=0,
                        CLUSTER=16 if threads == 1024 else 1, LOAD_HINT=3, STORE_HINT=1))
    # the full 32 KB register tile at 512 threads in a cluster and at 1024 threads (64 registers per thread)
    out.append(dict(base, THREADS=512, TPR=512, MAX_VECS=4, VEC_BYTES=16, STAGE=0, CLUSTER=2, LOAD_HINT=2))
    out.append(dict(base, THREADS=1024, TPR=1024, MAX_VECS=2, VEC_BYTES=16, STAGE=0, CLUSTER=2, LOAD_HINT=3))
    out.append(dict(base, THREADS=1024, TPR=256, MAX_VECS=4, VEC_BYTES=8, STAGE=1, CLUSTER=1, LOAD_HINT=5))
    out.append(dict(base, THREADS=1024, TPR=1024, MAX_VECS=4, VEC_BYTES=8, STAGE=3, CLUSTER=1, RSQRT_APPROX=0,
                    PERSISTENT=0, PIPE=2, TILE_ROWS=1, LOAD_HINT=3))
    out.append(dict(base, THREADS=1024, TPR=1024, MAX_VECS=2, VEC_BYTES=16, STAGE=3, CLUSTER=4, RSQRT_APPROX=1,
                    PERSISTENT=1, PIPE=1, TILE_ROWS=1, LOAD_HINT=0))
    # the largest register tiles OCCUPANCY allows (64 registers per thread)
    out.append(dict(base, THREADS=128, TPR=32, MAX_VECS=2, VEC_BYTES=16, STAGE=0, OCCUPANCY=8))
    out.append(dict(base, THREADS=256, TPR=256, MAX_VECS=4, VEC_BYTES=16, STAGE=3, OCCUPANCY=4, PIPE=2,
                    TILE_ROWS=2))
    # STAGE 4 at the edge of its register rule
    out.append(dict(base, THREADS=128, TPR=32, MAX_VECS=1, VEC_BYTES=16, STAGE=4, TILE_ROWS=4, OCCUPANCY=8))
    out.append(dict(base, THREADS=256, TPR=32, MAX_VECS=4, VEC_BYTES=16, STAGE=4, TILE_ROWS=4, OCCUPANCY=0))
    out.append(dict(base, THREADS=128, TPR=32, MAX_VECS=2, VEC_BYTES=16, STAGE=4, TILE_ROWS=8, OCCUPANCY=0))
    # STAGE 3 with the weight slice in shared memory: a 16-CTA cluster, and one CTA per row
    out.append(dict(base, THREADS=512, TPR=512, MAX_VECS=4, VEC_BYTES=16, STAGE=3, CLUSTER=16, PERSISTENT=1,
                    PIPE=3, TILE_ROWS=1, WSMEM=1, LOAD_HINT=3))
    out.append(dict(base, THREADS=256, TPR=256, MAX_VECS=4, VEC_BYTES=16, STAGE=3, CLUSTER=1, PERSISTENT=4,
                    PIPE=2, TILE_ROWS=2, WSMEM=1))
    # STAGE 3 batches of 8 and 16 vectors where the register budget is 128 or more
    out.append(dict(base, THREADS=256, TPR=256, MAX_VECS=8, VEC_BYTES=16, STAGE=3, CLUSTER=8, OCCUPANCY=2,
                    PIPE=1, TILE_ROWS=1, LOAD_HINT=3))
    out.append(dict(base, THREADS=128, TPR=128, MAX_VECS=16, VEC_BYTES=16, STAGE=3, CLUSTER=1, PERSISTENT=2,
                    PIPE=2, TILE_ROWS=2))
    # STAGE 2 with the two-pass L2 policy (a second policy register), a 4-CTA cluster
    out.append(dict(base, THREADS=512, TPR=512, MAX_VECS=2, VEC_BYTES=16, STAGE=2, CLUSTER=4, OCCUPANCY=2,
                    LOAD_HINT=4, STORE_HINT=1))
    # STAGE 2 at 1024 threads: two 16-byte loads per batch in 64 registers, with and without a cluster
    out.append(dict(base, THREADS=1024, TPR=1024, MAX_VECS=2, VEC_BYTES=16, STAGE=2, CLUSTER=4, OCCUPANCY=0,
                    LOAD_HINT=5, STORE_HINT=1))
    out.append(dict(base, THREADS=1024, TPR=1024, MAX_VECS=2, VEC_BYTES=16, STAGE=2, CLUSTER=1, OCCUPANCY=0,
                    LOAD_HINT=0, STORE_HINT=0))
    # STAGE 2 at 32 registers (2048 threads per SM): the lean form the occupancy rule admits
    for threads, hint in ((1024, 5), (512, 0), (256, 4)):
        out.append(dict(base, THREADS=threads, TPR=threads, MAX_VECS=1, VEC_BYTES=16, STAGE=2, CLUSTER=1,
                        OCCUPANCY=2048 // threads, LOAD_HINT=hint, STORE_HINT=2, RSQRT_APPROX=0))
    # STAGE 0 with one vector per thread at 32 registers (the lean path and its two-pass reads of longer rows)
    for threads, tpr, vec, hint, store in ((1024, 1024, 16, 5, 0), (512, 512, 16, 0, 1), (256, 256, 16, 4, 2),
                                           (128, 128, 16, 3, 1), (64, 64, 16, 5, 1), (256, 32, 16, 1, 1),
                                           (1024, 16, 16, 5, 1), (64, 4, 4, 0, 0), (512, 64, 8, 3, 2)):
        out.append(dict(base, THREADS=threads, TPR=tpr, MAX_VECS=1, VEC_BYTES=vec, STAGE=0, CLUSTER=1,
                        OCCUPANCY=2048 // threads, LOAD_HINT=hint, STORE_HINT=store, RSQRT_APPROX=1))
    # the lean path with PREFETCH (the next row's vector in flight, weights kept): still 32 registers
    for threads, tpr, vec, hint in ((1024, 1024, 16, 5), (256, 256, 16, 3), (128, 128, 16, 0), (256, 32, 16, 4),
                                    (512, 64, 16, 1), (1024, 16, 16, 5), (256, 32, 8, 3), (64, 4, 4, 0)):
        out.append(dict(base, THREADS=threads, TPR=tpr, MAX_VECS=1, VEC_BYTES=vec, STAGE=0, CLUSTER=1,
                        OCCUPANCY=2048 // threads, LOAD_HINT=hint, STORE_HINT=1, RSQRT_APPROX=1, PREFETCH=1))
    # STAGE 2 with PREFETCH (a second vector of x in flight): 64 registers, with and without a cluster
    for threads, occ, cluster, hint in ((1024, 0, 1, 5), (512, 2, 4, 3), (256, 4, 1, 4), (128, 8, 1, 0)):
        out.append(dict(base, THREADS=threads, TPR=threads, MAX_VECS=1, VEC_BYTES=16, STAGE=2, CLUSTER=cluster,
                        OCCUPANCY=occ, LOAD_HINT=hint, STORE_HINT=1, PREFETCH=1))
    # one-warp CTAs at 64 registers (OCCUPANCY 32: 32 CTAs per SM): the largest tiles the rules admit
    out.append(dict(base, THREADS=32, TPR=32, MAX_VECS=1, VEC_BYTES=16, STAGE=4, TILE_ROWS=4, OCCUPANCY=32))
    out.append(dict(base, THREADS=32, TPR=32, MAX_VECS=2, VEC_BYTES=16, STAGE=0, OCCUPANCY=32, LOAD_HINT=3))
    out.append(dict(base, THREADS=32, TPR=32, MAX_VECS=4, VEC_BYTES=16, STAGE=3, OCCUPANCY=32, PIPE=2,
                    TILE_ROWS=2, LOAD_HINT=3))
    out.append(dict(base, THREADS=64, TPR=64, MAX_VECS=1, VEC_BYTES=16, STAGE=2, CLUSTER=1, OCCUPANCY=32,
                    LOAD_HINT=5, STORE_HINT=1))
    return out


@pytest.mark.parametrize("change", [{"TPR": 32}, {"LOAD_HINT": 2, "THREADS": 256, "TPR": 256, "OCCUPANCY": 8},
                                    {"LOAD_HINT": 1}, {"PREFETCH": 1}], ids=["rows-per-cta", "ld-cg", "ld-nc", "prefetch"])
def test_lean_reread_rule_is_needed(tmp_path: Path, change: dict) -> None:
    """What the 2048-thread STAGE 2 rule forbids (several rows per CTA, ld.global.cg or .nc, PREFETCH) does spill."""
    base = dict(make_forward_problem().seeds[0].params)
    lean = dict(base, THREADS=1024, TPR=1024, MAX_VECS=1, VEC_BYTES=16, STAGE=2, CLUSTER=1, OCCUPANCY=2,
                LOAD_HINT=4, STORE_HINT=1)
    space = forward_param_space()
    assert space.is_valid(lean)
    params = dict(lean, **change)
    assert not space.is_valid(params)
    assert _spills(nvcc_compile("rmsnorm_fwd.cu", _defines(params), tmp_path)) > 0


@pytest.mark.parametrize("change", [{"LOAD_HINT": 2}, {"RSQRT_APPROX": 0}, {"PREFETCH": 1, "LOAD_HINT": 3},
                                    {"PREFETCH": 1, "LOAD_HINT": 0}],
                         ids=["ld-cg", "precise-rsqrt", "prefetch-evict-first", "prefetch-default"])
def test_lean_regs_rule_is_needed(tmp_path: Path, change: dict) -> None:
    """What the 2048-thread STAGE 0 rule (one vector per thread) forbids does spill."""
    base = dict(make_forward_problem().seeds[0].params)
    lean = dict(base, THREADS=1024, TPR=32, MAX_VECS=1, VEC_BYTES=16, STAGE=0, CLUSTER=1, OCCUPANCY=2,
                LOAD_HINT=5, STORE_HINT=1, RSQRT_APPROX=1)
    space = forward_param_space()
    assert space.is_valid(lean)
    assert _spills(nvcc_compile("rmsnorm_fwd.cu", _defines(lean), tmp_path)) == 0
    params = dict(lean, **change)
    assert not space.is_valid(params)
    assert space.is_valid(dict(params, OCCUPANCY=0))  # no launch bound: ptxas takes what it needs
    assert _spills(nvcc_compile("rmsnorm_fwd.cu", _defines(params), tmp_path)) > 0


@pytest.mark.parametrize("change", [{"MAX_VECS": 8, "CLUSTER": 8}, {"MAX_VECS": 16}])
def test_pipe_batch_rule_is_needed(tmp_path: Path, change: dict) -> None:
    """What the STAGE 3 batch rule forbids (more than 64 bytes of loads per batch at 64 registers) does spill."""
    base = dict(make_forward_problem().seeds[0].params)
    ok = dict(base, THREADS=128, TPR=128, MAX_VECS=4, VEC_BYTES=16, STAGE=3, PERSISTENT=0, OCCUPANCY=0, PIPE=1,
              TILE_ROWS=1, LOAD_HINT=3)
    space = forward_param_space()
    assert space.is_valid(ok)
    params = dict(ok, **change)
    assert not space.is_valid(params)
    assert space.is_valid(dict(params, OCCUPANCY=2))  # 255 registers
    assert _spills(nvcc_compile("rmsnorm_fwd.cu", _defines(params), tmp_path)) > 0


@pytest.mark.parametrize("change", [{"LOAD_HINT": 2, "CLUSTER": 4}, {"MAX_VECS": 8, "VEC_BYTES": 4},
                                    {"STAGE": 3, "CLUSTER": 2, "RSQRT_APPROX": 0, "PIPE": 2, "TILE_ROWS": 2, "PERSISTENT": 0}],
                         ids=["ld-cg-cluster", "eight-vectors", "pipe-cluster-precise"])
def test_reg_tile_rule_is_needed(tmp_path: Path, change: dict) -> None:
    """What the 1024-thread register-tile rule keeps at half the budget does spill with the full 32 KB."""
    base = dict(make_forward_problem().seeds[0].params)
    ok = dict(base, THREADS=1024, TPR=1024, MAX_VECS=2, VEC_BYTES=16, STAGE=0, CLUSTER=1, OCCUPANCY=0,
              PERSISTENT=1, LOAD_HINT=3, STORE_HINT=1, RSQRT_APPROX=1)
    space = forward_param_space()
    assert space.is_valid(ok)
    assert _spills(nvcc_compile("rmsnorm_fwd.cu", _defines(ok), tmp_path)) == 0
    params = dict(ok, **change)
    assert not space.is_valid(params), space.violations(params)
    half = dict(params, MAX_VECS=params["MAX_VECS"] // 2)
    assert space.is_valid(half), space.violations(half)
    assert _spills(nvcc_compile("rmsnorm_fwd.cu", _defines(params), tmp_path)) > 0


def test_forward_variants_compile_without_spills(tmp_path: Path) -> None:
    prob = make_forward_problem()
    space = forward_param_space()
    rng = np.random.default_rng(7)
    combos = [dict(g.params) for g in prob.seeds] + _corner_cases() + [space.sample(rng) for _ in range(2)]
    for p in combos:
        assert space.is_valid(p), p

    def one(i_p: tuple[int, dict]) -> tuple[dict, int, str]:
        i, p = i_p
        d = tmp_path / str(i)
        d.mkdir()
        log = nvcc_compile("rmsnorm_fwd.cu", _defines(p), d)
        return p, _spills(log), log

    with ThreadPoolExecutor(2) as ex:
        results = list(ex.map(one, enumerate(combos)))
    bad = [(p, s) for p, s, _ in results if s > SPILL_BOUND]
    assert not bad, f"variants spill: {bad}"
    assert all("registers" in log for _, _, log in results)


def test_two_pass_load_policy(tmp_path: Path) -> None:
    """LOAD_HINT 4 reads a row that is read twice first with an L2 evict_last policy, then evict_first;
    LOAD_HINT 3 uses evict_first for both reads (and never creates an evict_last policy); LOAD_HINT 5
    is 4 plus L1 priorities: the first read L1::evict_last, every other x load L1::evict_first."""
    base = dict(make_forward_problem().seeds[0].params, THREADS=512, TPR=512, STAGE=2, MAX_VECS=1,
                OCCUPANCY=2, STORE_HINT=1)
    ptx = {}
    for hint in (3, 4, 5):
        d = tmp_path / str(hint)
        d.mkdir()
        ptx[hint] = nvcc_ptx("rmsnorm_fwd.cu", _defines(dict(base, LOAD_HINT=hint)), d)
    assert "L2::evict_first" in ptx[3] and "L2::evict_last" not in ptx[3]
    assert "L2::evict_first" in ptx[4] and "L2::evict_last" in ptx[4]
    # both reads of a row carry a policy operand: ld.global.L2::cache_hint only, no plain ld.global.v4
    assert re.search(r"ld\.global\.L2::cache_hint\.v4", ptx[4])
    assert not re.search(r"ld\.global\.v4\.u32", ptx[4])
    assert "L1::evict" not in ptx[3] + ptx[4]
    assert "L2::evict_last" in ptx[5]
    assert re.search(r"ld\.global\.L1::evict_last\.L2::cache_hint\.v4", ptx[5])  # first read: kept in L1
    assert re.search(r"ld\.global\.L1::evict_first\.L2::cache_hint\.v4", ptx[5])  # second read: let go
    assert not re.search(r"ld\.global\.(L2::cache_hint\.)?v4", ptx[5])  # no x load without an L1 priority


def test_invalid_combination_fails_to_compile(tmp_path: Path) -> None:
    """The kernel's own #error guards catch a combination the constraints forbid."""
    p = dict(make_forward_problem().seeds[0].params, CLUSTER=4)  # TPR != THREADS
    with pytest.raises(AssertionError, match="CLUSTER > 1 needs one row per CTA"):
        nvcc_compile("rmsnorm_fwd.cu", _defines(p), tmp_path)


def _cubins(kernel: str, params: tuple[dict, ...], tmp: Path) -> list[bytes]:
    """The cubin of ``kernel`` for each params dict (compiled in subfolders of ``tmp``)."""
    out = []
    for j, p in enumerate(params):
        d = tmp / str(j)
        d.mkdir(parents=True)
        nvcc_compile(kernel, _defines(p), d)
        out.append((d / (kernel + ".cubin")).read_bytes())
    return out


def _bwd(**kw: int) -> dict:
    return dict(make_backward_problem().seeds[0].params, **kw)


@pytest.mark.parametrize("params", [_bwd(THREADS=1024, UNROLL=8, LOAD_HINT=2), _bwd(THREADS=128, UNROLL=1, LOAD_HINT=1),
                                    # ALGO 1 at the edge of its register rule, and the largest tiles
                                    _bwd(ALGO=1, THREADS=1024, MAX_CHUNKS=2, LOAD_HINT=1),
                                    _bwd(ALGO=1, THREADS=512, MAX_CHUNKS=8, SMEM_DW=0, REDUCERS=64),
                                    _bwd(ALGO=1, THREADS=256, MAX_CHUNKS=8, LOAD_HINT=2, REDUCERS=8),
                                    _bwd(ALGO=1, THREADS=128, MAX_CHUNKS=8, CTAS_PER_SM=4),
                                    # PREFETCH and ROW_WARP at the edges of their register rules
                                    _bwd(ALGO=1, THREADS=512, MAX_CHUNKS=2, PREFETCH=1),
                                    _bwd(ALGO=1, THREADS=128, MAX_CHUNKS=8, PREFETCH=1, LOAD_HINT=1),
                                    _bwd(ALGO=1, THREADS=128, MAX_CHUNKS=8, PREFETCH=1, ROW_WARP=1),
                                    _bwd(ALGO=1, THREADS=512, MAX_CHUNKS=4, ROW_WARP=1, LOAD_HINT=2),
                                    _bwd(ALGO=1, THREADS=1024, MAX_CHUNKS=2, ROW_WARP=1),
                                    _bwd(ALGO=1, THREADS=1024, MAX_CHUNKS=2, ROW_WARP=4),
                                    _bwd(ALGO=1, THREADS=512, MAX_CHUNKS=4, ROW_WARP=2),
                                    _bwd(ALGO=1, THREADS=128, MAX_CHUNKS=8, PREFETCH=1, ROW_WARP=4),
                                    # TREE's group sums (16 partials per thread in flight) at those edges
                                    _bwd(ALGO=1, THREADS=1024, MAX_CHUNKS=2, LOAD_HINT=1, TREE=16),
                                    _bwd(ALGO=1, THREADS=128, MAX_CHUNKS=8, PREFETCH=1, ROW_WARP=4, TREE=16),
                                    _bwd(ALGO=1, THREADS=512, MAX_CHUNKS=2, PREFETCH=1, TREE=4),
                                    # STAGES (rows staged in shared memory) by CTA and by warps, at the
                                    # largest register tiles
                                    _bwd(ALGO=1, THREADS=256, MAX_CHUNKS=2, STAGES=2, TREE=8),
                                    _bwd(ALGO=1, THREADS=512, MAX_CHUNKS=8, CTAS_PER_SM=1, STAGES=1),
                                    _bwd(ALGO=1, THREADS=256, MAX_CHUNKS=2, ROW_WARP=2, TREE=8, STAGES=3),
                                    _bwd(ALGO=1, THREADS=512, MAX_CHUNKS=4, ROW_WARP=2, STAGES=1, LOAD_HINT=2),
                                    _bwd(ALGO=1, THREADS=128, MAX_CHUNKS=8, ROW_WARP=4, STAGES=3),
                                    # DW_REGS (dw sums in registers, a CTA per row) at its rule's edges
                                    _bwd(ALGO=1, THREADS=256, MAX_CHUNKS=8, DW_REGS=1),
                                    _bwd(ALGO=1, THREADS=512, MAX_CHUNKS=4, DW_REGS=1, STAGES=1),
                                    _bwd(ALGO=1, THREADS=256, MAX_CHUNKS=2, DW_REGS=1, PREFETCH=1),
                                    _bwd(ALGO=1, THREADS=256, MAX_CHUNKS=2, DW_REGS=1, STAGES=2, TREE=8),
                                    # SPLIT (a row over a cluster of 2 or 4 CTAs), with PREFETCH and DW_REGS
                                    _bwd(ALGO=1, THREADS=256, MAX_CHUNKS=8, CTAS_PER_SM=2, SPLIT=2, REDUCERS=64),
                                    _bwd(ALGO=1, THREADS=256, MAX_CHUNKS=4, SPLIT=4, PREFETCH=1),
                                    _bwd(ALGO=1, THREADS=1024, MAX_CHUNKS=2, SPLIT=4, LOAD_HINT=1),
                                    _bwd(ALGO=1, THREADS=128, MAX_CHUNKS=2, CTAS_PER_SM=4, SPLIT=2, PREFETCH=1,
                                         DW_REGS=1, SMEM_DW=0)])
def test_backward_compiles(tmp_path: Path, params: dict) -> None:
    assert make_backward_problem().params.is_valid(params)
    log = nvcc_compile("rmsnorm_bwd.cu", _defines(params), tmp_path)
    assert _spills(log) == 0


def test_backward_sampled_assignments_compile(tmp_path: Path) -> None:
    """Valid assignments as drawn (not canonical: knobs of the other algorithm set at random) compile:
    the kernel's guards of one algorithm's knobs do not fire under the other."""
    space = make_backward_problem().params
    rng = np.random.default_rng(5)
    draws = [space.sample(rng) for _ in range(12)]
    assert any(d["ALGO"] == 0 and d["ROW_WARP"] > 1 and d["THREADS"] > 256 * d["ROW_WARP"] for d in draws)

    def one(i: int) -> int:
        d = tmp_path / str(i)
        d.mkdir()
        return _spills(nvcc_compile("rmsnorm_bwd.cu", _defines(draws[i]), d))

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(one, range(len(draws)))) == [0] * len(draws)


def test_backward_register_rule_is_needed(tmp_path: Path) -> None:
    """What the constraint forbids (ALGO 1, 1024 threads, 4 chunks) does spill."""
    params = _bwd(ALGO=1, THREADS=1024, MAX_CHUNKS=4)
    assert not make_backward_problem().params.is_valid(params)
    assert _spills(nvcc_compile("rmsnorm_bwd.cu", _defines(params), tmp_path)) > 0


@pytest.mark.parametrize("kw", [{"THREADS": 1024, "MAX_CHUNKS": 2, "PREFETCH": 1},
                                {"THREADS": 512, "MAX_CHUNKS": 4, "PREFETCH": 1},
                                {"THREADS": 512, "MAX_CHUNKS": 8, "ROW_WARP": 1}])
def test_backward_prefetch_and_row_warp_rules_are_needed(tmp_path: Path, kw: dict) -> None:
    """What the PREFETCH and ROW_WARP constraints forbid does spill (and is valid without them)."""
    params = _bwd(ALGO=1, **kw)
    assert not make_backward_problem().params.is_valid(params)
    assert make_backward_problem().params.is_valid(dict(params, PREFETCH=0, ROW_WARP=0))
    assert _spills(nvcc_compile("rmsnorm_bwd.cu", _defines(params), tmp_path)) > 0


def test_backward_stages_rule_is_needed(tmp_path: Path) -> None:
    """What the STAGES constraint forbids (1024 threads, 64 registers each) spills; 512 threads do not."""
    params = _bwd(ALGO=1, THREADS=1024, MAX_CHUNKS=2, ROW_WARP=4, STAGES=3)
    assert not make_backward_problem().params.is_valid(params)
    assert make_backward_problem().params.is_valid(dict(params, STAGES=0))
    assert _spills(nvcc_compile("rmsnorm_bwd.cu", _defines(params), tmp_path)) > 0


@pytest.mark.parametrize("kw", [{"THREADS": 1024, "MAX_CHUNKS": 2}, {"THREADS": 128, "MAX_CHUNKS": 8, "PREFETCH": 1}])
def test_backward_dw_regs_rule_is_needed(tmp_path: Path, kw: dict) -> None:
    """What the DW_REGS constraint forbids spills (and is valid with DW_REGS 0)."""
    params = _bwd(ALGO=1, DW_REGS=1, **kw)
    assert not make_backward_problem().params.is_valid(params)
    assert make_backward_problem().params.is_valid(dict(params, DW_REGS=0))
    assert _spills(nvcc_compile("rmsnorm_bwd.cu", _defines(params), tmp_path)) > 0


def test_backward_stages_is_live_and_replaces_prefetch(tmp_path: Path) -> None:
    """STAGES gives another cubin; under STAGES PREFETCH is dead: the space pins it to 0 and the
    kernel reads it as 0 (a sampled, non-canonical assignment compiles to the canonical cubin)."""
    space = make_backward_problem().params
    a = _bwd(ALGO=1, THREADS=256, MAX_CHUNKS=2, PREFETCH=1)
    b = dict(a, STAGES=2)
    assert space.canonical(a) == a and space.canonical(b) == dict(b, PREFETCH=0)
    cubins = _cubins("rmsnorm_bwd.cu", (a, space.canonical(b), b), tmp_path / "stages")
    assert cubins[0] != cubins[1] and cubins[1] == cubins[2]


def test_backward_static_shared_memory_is_what_the_launch_allows_for(tmp_path: Path) -> None:
    """bwd_stage_bytes counts 4 * THREADS + 16 bytes of the kernel's static shared memory."""
    for threads in (128, 512):
        (tmp_path / str(threads)).mkdir()
        log = nvcc_compile("rmsnorm_bwd.cu", _defines(_bwd(ALGO=1, THREADS=threads, MAX_CHUNKS=2, STAGES=1)),
                           tmp_path / str(threads))
        assert {int(v) for v in re.findall(r"(\d+) bytes smem", log)} == {4 * threads + 16}


@pytest.mark.parametrize("kw", [{"ROW_WARP": 1}, {"TREE": 8}, {"STAGES": 1}])
def test_backward_split_rule_matches_the_kernel(tmp_path: Path, kw: dict) -> None:
    """SPLIT > 1 with ROW_WARP, TREE or STAGES is refused by the space and by the kernel; SPLIT 3 by the kernel."""
    params = _bwd(ALGO=1, THREADS=256, MAX_CHUNKS=2, SPLIT=2, **kw)
    space = make_backward_problem().params
    assert not space.is_valid(params) and space.is_valid(dict(params, SPLIT=1))
    with pytest.raises(AssertionError, match="SPLIT > 1 needs ALGO 1 with ROW_WARP 0, TREE 0 and STAGES 0"):
        nvcc_compile("rmsnorm_bwd.cu", _defines(params), tmp_path)
    with pytest.raises(AssertionError, match="SPLIT must be 1, 2 or 4"):
        nvcc_compile("rmsnorm_bwd.cu", _defines(dict(params, SPLIT=3, **{k: 0 for k in kw})), tmp_path)


def test_backward_split_declares_its_cluster(tmp_path: Path) -> None:
    """SPLIT 2 compiles to another cubin whose kernel declares a 2-CTA cluster, as its launch asks."""
    from evo.types import Case
    from examples.rmsnorm_problem import bwd_launch

    a = _bwd(ALGO=1, THREADS=256, MAX_CHUNKS=8, CTAS_PER_SM=2)
    b = dict(a, SPLIT=2)
    cubins = _cubins("rmsnorm_bwd.cu", (a, b), tmp_path)
    assert cubins[0] != cubins[1]
    ptx = nvcc_ptx("rmsnorm_bwd.cu", _defines(b), tmp_path)
    assert re.search(r"\.reqnctapercluster\s+2,\s*1,\s*1", ptx)
    assert bwd_launch(b, Case({"M": 32768, "N": 16384}, "float32")).cluster == (2, 1, 1)


def test_backward_row_group_rule_matches_the_kernel(tmp_path: Path) -> None:
    """ROW_WARP > 1 with more than 8 row groups is refused by the space and by the kernel."""
    params = _bwd(ALGO=1, THREADS=1024, MAX_CHUNKS=1, ROW_WARP=2)
    assert not make_backward_problem().params.is_valid(params)
    with pytest.raises(AssertionError, match="at most 8 row groups"):
        nvcc_compile("rmsnorm_bwd.cu", _defines(params), tmp_path)


def test_backward_inactive_knobs_change_neither_cubin_nor_launch(tmp_path: Path) -> None:
    """The backward space's conditions are true: each algorithm ignores the other's knobs."""
    from evo.types import Case
    from examples.rmsnorm_problem import bwd_launch

    case = Case({"M": 4096, "N": 4096}, "bfloat16")
    pairs = [(_bwd(), _bwd(MAX_CHUNKS=8, CTAS_PER_SM=3, SMEM_DW=0, REDUCERS=8, PREFETCH=1, ROW_WARP=1, STAGES=2,
                           DW_REGS=1, SPLIT=2)),
             (_bwd(ALGO=1), _bwd(ALGO=1, UNROLL=1))]
    space = make_backward_problem().params
    for i, (a, b) in enumerate(pairs):
        assert space.canonical(b) == a
        cubins = _cubins("rmsnorm_bwd.cu", (a, b), tmp_path / f"bwd-{i}")
        assert cubins[0] == cubins[1], (a, b)
        assert bwd_launch(a, case) == bwd_launch(b, case)


def test_inactive_knobs_change_neither_cubin_nor_launch(tmp_path: Path) -> None:
    """The space's conditions are true: outside their stages PIPE, WSMEM, TILE_ROWS and PREFETCH are dead.

    The engine relies on it: it stores such genomes in canonical form and never evaluates two
    that differ only there (evo.space.Condition).
    """
    from evo.types import Case, DeviceInfo
    from examples.rmsnorm_problem import CHECK_SHAPES, TIMED_SHAPES, fwd_launch

    space = forward_param_space()
    dev = DeviceInfo("H200", "9.0", sm_count=132)
    seeds = [dict(g.params) for g in make_forward_problem().seeds]
    pairs = []
    for stage in (0, 2, 4):
        base = next(p for p in seeds if p["STAGE"] == stage)
        moved = dict(base, PIPE=4, WSMEM=1) if stage == 4 else dict(base, PIPE=4, WSMEM=1, TILE_ROWS=64)
        if stage != 2:
            moved["PREFETCH"] = 1
        assert space.is_valid(moved) and space.canonical(moved) == base
        pairs.append((base, moved))
    # STAGE 0 with one vector but a cluster is not the lean path: PREFETCH is dead there
    base = dict(next(p for p in seeds if p["STAGE"] == 0), MAX_VECS=1, CLUSTER=2, OCCUPANCY=0)
    base["TPR"] = base["THREADS"]
    moved = dict(base, PREFETCH=1)
    assert space.is_valid(moved) and space.canonical(moved) == base
    pairs.append((base, moved))
    # PREFETCH needs one vector per batch: with two it is dead
    base = dict(next(p for p in seeds if p["STAGE"] == 2 and p["OCCUPANCY"] == 0), MAX_VECS=2)
    moved = dict(base, PREFETCH=1)
    assert space.is_valid(moved) and space.canonical(moved) == dict(base, PREFETCH=0)
    pairs.append((dict(base, PREFETCH=0), moved))
    for i, (a, b) in enumerate(pairs):
        for shape in [*CHECK_SHAPES, *TIMED_SHAPES]:
            for dtype in ("bfloat16", "float32"):
                assert fwd_launch(a, Case(shape, dtype), dev) == fwd_launch(b, Case(shape, dtype), dev)
        cubins = _cubins("rmsnorm_fwd.cu", (a, b), tmp_path / f"fwd-{i}")
        assert cubins[0] == cubins[1], f"STAGE {a['STAGE']}: the inactive knobs changed the cubin"


def test_lean_prefetch_is_live(tmp_path: Path) -> None:
    """PREFETCH on the lean path (STAGE 0, one vector, no cluster) is a real choice: it is kept by
    the space's canonical form and gives another cubin."""
    space = forward_param_space()
    base = dict(make_forward_problem().seeds[0].params, THREADS=256, TPR=256, MAX_VECS=1, VEC_BYTES=16, STAGE=0,
                CLUSTER=1, OCCUPANCY=8, LOAD_HINT=3, STORE_HINT=1, RSQRT_APPROX=1, PREFETCH=0)
    moved = dict(base, PREFETCH=1)
    assert space.is_valid(moved) and space.canonical(moved) == moved
    cubins = _cubins("rmsnorm_fwd.cu", (base, moved), tmp_path)
    assert cubins[0] != cubins[1]


# --------------------------------------------------------------------------- a build per dtype (DTYPE_BUILD 1)

DTYPE_BUILD_SPILL_BOUND = 96
"""Bytes a DTYPE_BUILD 1 build may spill. ptxas 13.0 spills 16-80 bytes in the 16-bit or the fp32
build of a few forms whose shared build does not (e.g. STAGE 3 with 4 x 16 B batches, TILE_ROWS 1
and a cluster at 64 registers; the backward with STAGES 2-3): the space admits them, the spill is in
the record's resources and the search times them (DTYPE_BUILD 0 keeps the shared build)."""


def _gate_builds(kernel: str, prob, forms: list[dict]) -> list[tuple[dict, str, int, int]]:
    """(params, dtype, registers, spill bytes) of every build the gate makes of each form (DTYPE_BUILD 1)."""
    from fitness import compile_genome
    from fitness._resources import parse_ptxas_report

    src = (KERNEL_DIR / kernel).read_text()
    entry = prob.seeds[0].entry
    jobs = [(p, d) for p in forms for d in prob.builds(p)]
    assert len(jobs) == 3 * len(forms)  # a build per dtype

    def one(job: tuple[dict, str]) -> tuple[dict, str, int, int]:
        p, d = job
        r = compile_genome(Genome(src, p, entry=entry), prob, dtype=d)
        assert r.ok, (p, d, r.reason)
        res = parse_ptxas_report(r.log, entry)
        return p, d, res["registers"], res["spill_bytes"]

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, jobs))


def test_dtype_builds_compile_for_every_dtype() -> None:
    """Every forward and backward seed, and the backward's edge forms, with DTYPE_BUILD 1: each dtype's
    build compiles, and spills at most DTYPE_BUILD_SPILL_BOUND bytes (most none)."""
    fwd, bwd = make_forward_problem(), make_backward_problem()
    bwd_edges = [m.args[1] for m in test_backward_compiles.pytestmark if m.name == "parametrize"][0]
    results = (_gate_builds("rmsnorm_fwd.cu", fwd, [dict(g.params, DTYPE_BUILD=1) for g in fwd.seeds])
               + _gate_builds("rmsnorm_bwd.cu", bwd, [dict(g.params, DTYPE_BUILD=1) for g in bwd.seeds]
                              + [dict(p, DTYPE_BUILD=1) for p in bwd_edges]))
    worst = max(results, key=lambda r: r[3])
    assert worst[3] <= DTYPE_BUILD_SPILL_BOUND, worst
    assert sum(1 for r in results if r[3] == 0) >= 0.9 * len(results)


def test_a_dtype_build_takes_fewer_registers_than_the_shared_one(tmp_path: Path) -> None:
    """The reason for DTYPE_BUILD: the backward at 256 threads x 8 chunks over a 2-CTA cluster (LOAD_HINT 1,
    as the 16K fp32 champion) takes more than 128 registers with all three dtype bodies (one 256-thread
    CTA per SM where two were asked for), 128 or fewer in each dtype's build (two fit)."""
    prob = make_backward_problem()
    form = _bwd(ALGO=1, THREADS=256, MAX_CHUNKS=8, CTAS_PER_SM=2, SPLIT=2, REDUCERS=64, LOAD_HINT=1)
    shared = re.search(r"Used (\d+) registers", nvcc_compile("rmsnorm_bwd.cu", _defines(form), tmp_path))
    assert shared and int(shared.group(1)) > 128
    per_dtype = _gate_builds("rmsnorm_bwd.cu", prob, [dict(form, DTYPE_BUILD=1)])
    assert all(regs <= 128 and spills == 0 for _, _, regs, spills in per_dtype), per_dtype
