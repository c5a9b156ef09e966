"""CPU tests of the RMSNorm Problems: validation, constraints, launches, inputs and references."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from evo.types import Case, DeviceInfo
from examples.rmsnorm_problem import (
    BLOCK_SMEM_OPTIN,
    CHECK_SHAPES,
    SMEM_CAP,
    TIMED_SHAPES,
    bwd_launch,
    bwd_make_inputs,
    bwd_reference,
    fwd_bytes_moved,
    fwd_launch,
    fwd_make_inputs,
    fwd_reference,
    fwd_scalars,
    fwd_signature,
    make_backward_problem,
    make_forward_problem,
    pipe_rows,
    pipe_slice_bytes,
    pipe_weight_bytes,
    rmsnorm_numpy,
)
from fitness import NormalDraw, materialize


def test_forward_problem_validates_and_pickles() -> None:
    prob = make_forward_problem()
    assert len(prob.timed_shapes) == 11 and prob.timed_shapes == TIMED_SHAPES
    keys = {c.key for c in prob.check_cases()}
    assert "M=1,N=65537:float32" in keys and "M=8192,N=262144:bfloat16" in keys  # timed shapes are checked
    assert len(prob.timed_cases()) == 33
    # Genome params are MappingProxyType (not picklable in evo/types.py as of writing): pickle without seeds
    bare = dataclasses.replace(prob, seeds=())
    assert pickle.loads(pickle.dumps(bare)).fingerprint() == bare.fingerprint()
    for s in prob.seeds:
        assert prob.params.is_valid(s.params)


def test_quick_and_custom() -> None:
    assert [s["N"] for s in make_forward_problem(quick=True).timed_shapes] == [1024, 8192, 65536]
    p = make_forward_problem(timed=[{"M": 64, "N": 1000}], dtypes=["float32"])
    assert p.dtypes == ("float32",) and p.timed_cases()[0].key == "M=64,N=1000:float32"
    with pytest.raises(ValueError, match="not supported"):
        make_forward_problem(dtypes=["int8"])


def test_check_shapes_cover_the_hard_cases() -> None:
    ms = [s["M"] for s in CHECK_SHAPES]
    ns = [s["N"] for s in CHECK_SHAPES]
    assert 1 in ms and any(m % 2 for m in ms if m > 1)
    assert any(n % 2 for n in ns) and any(n % 8 for n in ns if n % 2 == 0)


@pytest.mark.parametrize("bad, rule", [
    ({"TPR": 512, "THREADS": 256}, "divides"),
    ({"CLUSTER": 4, "TPR": 32, "THREADS": 128}, "one row per CTA"),
    ({"MAX_VECS": 16, "THREADS": 1024, "VEC_BYTES": 16, "TPR": 1024}, "register tile"),
    ({"VEC_BYTES": 32}, "outside"),
])
def test_constraints_reject(bad: dict, rule: str) -> None:
    prob = make_forward_problem()
    params = dict(prob.seeds[0].params)
    params.update(bad)
    errs = prob.params.violations(params)
    assert errs and any(rule in e for e in errs), errs


def test_sampled_params_are_valid() -> None:
    space = make_forward_problem().params
    rng = np.random.default_rng(1)
    for _ in range(200):
        p = space.sample(rng)
        assert space.is_valid(p)
        assert p["CLUSTER"] == 1 or p["TPR"] == p["THREADS"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_launch_covers_every_row(dtype: str) -> None:
    space = make_forward_problem().params
    rng = np.random.default_rng(2)
    dev = DeviceInfo("H200", "9.0", sm_count=132)
    for _ in range(150):
        p = space.sample(rng)
        for shape in [*CHECK_SHAPES, *TIMED_SHAPES]:
            case = Case(shape, dtype)
            L = fwd_launch(p, case, dev)
            rpc = p["THREADS"] // p["TPR"]
            if p["STAGE"] == 3 and L.shared_mem:  # the kernel's unit is a tile of rows
                rpc = pipe_rows(p, case)
                assert L.shared_mem == pipe_weight_bytes(p, case) + p["PIPE"] * rpc * pipe_slice_bytes(p, case)
            if p["STAGE"] == 4:  # each group holds TILE_ROWS rows per CTA step
                rpc *= p["TILE_ROWS"]
            groups = L.grid[0] // p["CLUSTER"]
            assert L.grid[0] % p["CLUSTER"] == 0 and L.block == (p["THREADS"], 1, 1)
            assert groups >= 1 and groups * rpc <= max(shape["M"], rpc) + rpc - 1
            # the kernel strides by groups*rpc rows from g*rpc: the union covers every row
            rows = {g * rpc + r + i * groups * rpc for g in range(min(groups, 4)) for r in range(rpc)
                    for i in range(-(-shape["M"] // (groups * rpc)))} if shape["M"] < 300 else None
            if rows is not None and groups <= 4:
                assert set(range(shape["M"])) <= rows
            assert L.shared_mem <= (BLOCK_SMEM_OPTIN if p["STAGE"] == 3 else SMEM_CAP)
            assert (L.cluster is None) == (p["CLUSTER"] == 1)
            if p["PERSISTENT"] == 0:
                assert groups * rpc >= shape["M"]
            # a persistent grid is resident: the harness runs no more CTAs than fit at once
            assert L.resident == (p["PERSISTENT"] > 0)


def test_launch_stage_smem() -> None:
    p = {"THREADS": 256, "TPR": 256, "VEC_BYTES": 16, "STAGE": 1, "CLUSTER": 4, "PERSISTENT": 0}
    L = fwd_launch(p, Case({"M": 8, "N": 65536}, "bfloat16"))
    assert L.shared_mem == 65536 // 8 // 4 * 16  # 2048 vectors / 4 CTAs * 16 B
    big = fwd_launch(dict(p, CLUSTER=1), Case({"M": 8, "N": 262144}, "float32"))
    assert big.shared_mem == 0  # over the cap: the kernel re-reads global memory
    assert fwd_launch(dict(p, STAGE=0), Case({"M": 8, "N": 64}, "float32")).shared_mem == 0


def test_launch_pipeline_smem() -> None:
    """STAGE 3: PIPE buffers of whole row slices, sized so PERSISTENT CTAs share an SM."""
    p = {"THREADS": 256, "TPR": 256, "VEC_BYTES": 16, "STAGE": 3, "CLUSTER": 1, "PERSISTENT": 2, "PIPE": 3,
         "TILE_ROWS": 64}
    c = Case({"M": 32768, "N": 8192}, "bfloat16")  # 16 KB rows
    assert pipe_slice_bytes(p, c) == 16384
    rows = pipe_rows(p, c)
    assert rows == (114 * 1024 - 3 * 1024) // (3 * 16384) == 2
    L = fwd_launch(p, c, DeviceInfo("H200", "9.0", sm_count=132))
    assert L.shared_mem == 3 * 2 * 16384 and L.grid == (264, 1, 1)
    # a cluster splits the row into slices of whole 16-byte chunks
    pc = dict(p, CLUSTER=8, PERSISTENT=0, TILE_ROWS=1)
    c2 = Case({"M": 4, "N": 131072}, "float32")
    assert pipe_slice_bytes(pc, c2) == 131072 * 4 // 8
    assert fwd_launch(pc, c2).grid == (4 * 8, 1, 1)
    # rows that are not whole 16-byte chunks, or a slice too large for shared memory: no buffers
    assert fwd_launch(p, Case({"M": 4, "N": 1001}, "bfloat16")).shared_mem == 0
    assert fwd_launch(dict(p, PIPE=4), Case({"M": 4, "N": 262144}, "float32")).shared_mem == 0
    assert pipe_rows(p, Case({"M": 1, "N": 256}, "bfloat16")) == 1  # never more rows than M


def test_launch_pipeline_weight_slice() -> None:
    """WSMEM 1: the float32 weight slice comes first and the row buffers get what is left."""
    p = {"THREADS": 512, "TPR": 512, "VEC_BYTES": 16, "STAGE": 3, "CLUSTER": 16, "PERSISTENT": 1, "PIPE": 3,
         "TILE_ROWS": 2, "WSMEM": 1}
    c = Case({"M": 8192, "N": 262144}, "bfloat16")  # 512 KB rows: 32 KB per CTA of 16
    assert pipe_slice_bytes(p, c) == 32768
    assert pipe_weight_bytes(p, c) == 65536  # 16384 float32 weights
    assert pipe_weight_bytes(dict(p, WSMEM=0), c) == 0
    assert pipe_rows(p, c) == 1  # (225 KB - 64 KB) // (3 * 32 KB)
    assert fwd_launch(p, c).shared_mem == 65536 + 3 * 32768
    # a weight slice that leaves no room for one buffer: no buffers (STAGE 2 fallback)
    big = dict(p, CLUSTER=2, PIPE=1)
    assert pipe_rows(big, c) == 0 and fwd_launch(big, c).shared_mem == 0


def test_signature_scalars_bytes() -> None:
    c = Case({"M": 3, "N": 7}, "bfloat16")
    sig = fwd_signature(c)
    assert [(a.name, a.numel, a.dtype, a.role) for a in sig] == [
        ("x", 21, "bfloat16", "in"), ("w", 7, "float32", "in"), ("y", 21, "bfloat16", "out")]
    assert fwd_scalars(c) == [("int32", 3), ("int32", 7), ("float32", 1e-6), ("int32", 2)]
    assert fwd_bytes_moved(Case({"M": 32768, "N": 4096}, "float16")) == 2 * 32768 * 4096 * 2 + 4 * 4096


@pytest.mark.parametrize("shape", [{"M": 1, "N": 1}, {"M": 3, "N": 7}, {"M": 33, "N": 4099}])
def test_forward_reference_matches_float64(shape: dict) -> None:
    case = Case(shape, "float32")
    raw = fwd_make_inputs(case, np.random.default_rng(3), np)
    assert isinstance(raw["x"], NormalDraw) and raw["x"].shape == (shape["M"], shape["N"])
    inp = materialize(raw, np)
    assert inp["x"].shape == (shape["M"], shape["N"]) and inp["w"].shape == (shape["N"],)
    assert np.isfinite(inp["x"]).all()
    y = fwd_reference(inp, case, np)["y"]
    want = rmsnorm_numpy(inp["x"].reshape(shape["M"], shape["N"]), inp["w"]).reshape(-1)
    assert np.linalg.norm(y - want) / np.linalg.norm(want) < 1e-6
    # a wrong answer is far outside the float32 tolerance
    assert np.linalg.norm(np.zeros_like(y) - want) / np.linalg.norm(want) > 1e-5


def test_inputs_have_heavy_rows_and_fresh_draws() -> None:
    case = Case({"M": 400, "N": 64}, "float32")
    a = materialize(fwd_make_inputs(case, np.random.default_rng(4), np))["x"]
    b = materialize(fwd_make_inputs(case, np.random.default_rng(5), np))["x"]
    rms = np.sqrt((a.astype(np.float64) ** 2).mean(axis=1))
    assert rms.max() > 4 and rms.min() < 0.01 and not np.array_equal(a, b)
    assert np.abs(a).max() < 60000  # fits float16 storage


def test_backward_problem_and_reference() -> None:
    prob = make_backward_problem()
    assert prob.seeds and prob.params.is_valid(prob.seeds[0].params)
    m, n = 9, 13
    case = Case({"M": m, "N": n}, "float32")
    inp = materialize(bwd_make_inputs(case, np.random.default_rng(6), np))
    out = bwd_reference(inp, case, np)
    # finite differences of L = sum(dy * y) through the forward
    x = inp["x"].reshape(m, n).astype(np.float64)
    w = inp["w"].astype(np.float64)
    dy = inp["dy"].reshape(m, n).astype(np.float64)
    h = 1e-6
    i, j = 4, 5
    xp_, xm_ = x.copy(), x.copy()
    xp_[i, j] += h
    xm_[i, j] -= h
    num = ((rmsnorm_numpy(xp_, w) - rmsnorm_numpy(xm_, w)) * dy).sum() / (2 * h)
    assert abs(out["dx"].reshape(m, n)[i, j] - num) < 1e-3 * max(1.0, abs(num))
    wp, wm = w.copy(), w.copy()
    wp[j] += h
    wm[j] -= h
    numw = ((rmsnorm_numpy(x, wp) - rmsnorm_numpy(x, wm)) * dy).sum() / (2 * h)
    assert abs(out["dw"][j] - numw) < 1e-3 * max(1.0, abs(numw))
    L = bwd_launch(prob.seeds[0].params, case)
    assert L.grid[0] == 1 + m and L.block[0] == 256


def test_backward_persistent_launch_and_workspace() -> None:
    """ALGO 1: a grid of CTAS_PER_SM per SM (at most M and BWD_PARTS_MAX), dw accumulators in
    shared memory up to BWD_SMEM_DW_COLS, and a workspace row of partials per CTA."""
    from evo.types import DeviceInfo
    from examples.rmsnorm_problem import BWD_PARTS_MAX, BWD_SMEM_DW_COLS, BWD_WS_HEADER, bwd_signature

    prob = make_backward_problem()
    p = dict(prob.seeds[6].params)
    assert p["ALGO"] == 1 and p["CTAS_PER_SM"] == 2 and p["MAX_CHUNKS"] == 8
    dev = DeviceInfo("gpu", "9.0", sm_count=132)
    big = Case({"M": 32768, "N": 16384}, "bfloat16")
    L = bwd_launch(p, big, dev)
    assert L.grid == (264, 1, 1) and L.block == (256, 1, 1) and L.shared_mem == 4 * 16384
    assert bwd_launch(p, Case({"M": 5, "N": 16384}, "bfloat16"), dev).grid == (5, 1, 1)
    assert bwd_launch(dict(p, CTAS_PER_SM=4), big, DeviceInfo("gpu", "9.0", sm_count=200)).grid[0] == BWD_PARTS_MAX
    assert bwd_launch(p, Case({"M": 8, "N": BWD_SMEM_DW_COLS + 8}, "float32"), dev).shared_mem == 0
    assert bwd_launch(dict(p, SMEM_DW=0), big, dev).shared_mem == 0
    ws = bwd_signature(big)[-1]
    assert ws.role == "workspace" and ws.numel == BWD_WS_HEADER + BWD_PARTS_MAX * 16384
    assert bwd_signature(Case({"M": 3, "N": 7}, "float32"))[-1].numel == BWD_WS_HEADER + 3 * 7
    assert all(prob.params.is_valid(dict(g.params)) for g in prob.seeds) and len(prob.seeds) == 11
    # SPLIT: clusters of S CTAs take the rows a CTA would; one cluster at least; one partial row per cluster
    s2, s4 = dict(p, SPLIT=2), dict(p, SPLIT=4, MAX_CHUNKS=4)
    assert bwd_launch(s2, big, dev).grid == (264, 1, 1) and bwd_launch(s2, big, dev).cluster == (2, 1, 1)
    assert bwd_launch(s4, big, dev).grid == (264, 1, 1) and bwd_launch(s4, big, dev).cluster == (4, 1, 1)
    assert bwd_launch(s4, Case({"M": 1, "N": 16384}, "float32"), dev).grid == (4, 1, 1)
    assert bwd_launch(s2, Case({"M": 5, "N": 16384}, "float32"), dev).grid == (10, 1, 1)
    assert bwd_launch(dict(s4, CTAS_PER_SM=1), big, DeviceInfo("gpu", "9.0", sm_count=130)).grid == (128, 1, 1)
    assert bwd_launch(dict(s4, CTAS_PER_SM=4), big, DeviceInfo("gpu", "9.0", sm_count=200)).grid[0] == BWD_PARTS_MAX
    assert bwd_launch(p, big, dev).cluster is None


def test_backward_stage_bytes() -> None:
    """STAGES slots (x and dy rows per row group) come after the dw accumulators, only for rows held in
    registers, of whole 16-byte chunks, and only when CTAS_PER_SM CTAs of them share an SM."""
    from evo.types import DeviceInfo
    from examples.rmsnorm_problem import bwd_dw_smem_bytes, bwd_stage_bytes

    dev = DeviceInfo("gpu", "9.0", sm_count=132)
    base = dict(make_backward_problem().seeds[0].params, ALGO=1)
    p4k = dict(base, THREADS=256, MAX_CHUNKS=2, CTAS_PER_SM=2, STAGES=2)
    c4k = Case({"M": 32768, "N": 4096}, "bfloat16")
    assert bwd_stage_bytes(p4k, c4k) == 2 * 2 * 4096 * 2
    assert bwd_launch(p4k, c4k, dev).shared_mem == 4 * 4096 + 2 * 2 * 4096 * 2
    assert bwd_stage_bytes(dict(p4k, STAGES=0), c4k) == 0 and bwd_stage_bytes(dict(p4k, ALGO=0), c4k) == 0
    # a row past the registers (4K fp32 needs 1024 chunks > 2 * 256), or not of whole chunks: not staged
    assert bwd_stage_bytes(p4k, Case({"M": 64, "N": 4096}, "float32")) == 0
    assert bwd_stage_bytes(p4k, Case({"M": 64, "N": 1020}, "bfloat16")) == 0
    assert bwd_stage_bytes(p4k, Case({"M": 64, "N": 1028}, "float32")) == 2 * 2 * 1028 * 4
    # 16K fp32: one 128 KB slot next to 64 KB of dw fits one CTA per SM; two slots, or two CTAs, do not
    p16 = dict(base, THREADS=512, MAX_CHUNKS=8, CTAS_PER_SM=1, STAGES=1)
    c16 = Case({"M": 32768, "N": 16384}, "float32")
    assert bwd_dw_smem_bytes(p16, c16) == 65536 and bwd_stage_bytes(p16, c16) == 131072
    assert bwd_stage_bytes(dict(p16, STAGES=2), c16) == 0 and bwd_stage_bytes(dict(p16, CTAS_PER_SM=2), c16) == 0
    assert bwd_launch(dict(p16, STAGES=2), c16, dev).shared_mem == 65536
    # without dw in shared memory the two CTAs' slots fit: 16K bf16 at 2 CTAs per SM
    p16h = dict(base, THREADS=256, MAX_CHUNKS=8, CTAS_PER_SM=2, STAGES=1)
    c16h = Case({"M": 32768, "N": 16384}, "bfloat16")
    assert bwd_stage_bytes(p16h, c16h) == 0 and bwd_stage_bytes(dict(p16h, SMEM_DW=0), c16h) == 65536
    # by warps: a row per row group (WARPS / ROW_WARP groups) in each slot
    pw = dict(base, THREADS=256, MAX_CHUNKS=2, CTAS_PER_SM=2, ROW_WARP=2, STAGES=3)
    c1k = Case({"M": 32768, "N": 1024}, "bfloat16")
    assert bwd_stage_bytes(pw, c1k) == 3 * 4 * 2 * 1024 * 2
    # a row past the groups' registers goes to the CTA (rows_vec): one row per slot
    assert bwd_stage_bytes(pw, Case({"M": 64, "N": 4096}, "bfloat16")) == 3 * 2 * 4096 * 2


def test_backward_stages_pins_prefetch() -> None:
    """STAGES replaces PREFETCH (pinned to 0), is only read by ALGO 1, and needs THREADS <= 512."""
    space = make_backward_problem().params
    base = dict(make_backward_problem().seeds[0].params, ALGO=1, THREADS=256, MAX_CHUNKS=2, PREFETCH=1)
    assert space.canonical(dict(base, STAGES=1))["PREFETCH"] == 0
    assert space.canonical(base)["PREFETCH"] == 1
    assert space.canonical(dict(base, ALGO=0, STAGES=3))["STAGES"] == 0
    big = dict(base, THREADS=1024, PREFETCH=0)
    assert not space.is_valid(dict(big, STAGES=1)) and space.is_valid(big)


def test_backward_kernel_constants_match_the_problem() -> None:
    """The backward kernel's workspace header, shared-memory limit and grid bound are the Problem's,
    and every TREE choice leaves a ticket word after word 0 for each group of the largest grid."""
    import math
    import re

    from examples.rmsnorm_problem import BWD_PARTS_MAX, BWD_SMEM_DW_COLS, BWD_WS_HEADER, KERNEL_DIR

    src = (KERNEL_DIR / "rmsnorm_bwd.cu").read_text()
    assert int(re.search(r"#define WS_HEADER (\d+)", src).group(1)) == BWD_WS_HEADER
    assert int(re.search(r"#define SMEM_DW_COLS (\d+)", src).group(1)) == BWD_SMEM_DW_COLS
    grid, words = re.search(r"#if TREE > 0 && \((\d+) \+ TREE - 1\) / TREE > (\d+)", src).groups()
    assert int(grid) == BWD_PARTS_MAX and int(words) == BWD_WS_HEADER - 1
    trees = [t for t in make_backward_problem().params.params["TREE"].values if t]
    assert trees and all(math.ceil(BWD_PARTS_MAX / t) <= BWD_WS_HEADER - 1 for t in trees)
