"""RMSNorm forward and backward Problems for Hopper (sm_90a).

Forward: ``y = x * rsqrt(mean(x**2) + eps) * w`` with ``x``, ``y`` of shape M x N in the
storage dtype (bfloat16, float16 or float32), ``w`` a float32 vector of N, ``eps = 1e-6``
and float32 accumulation. The byte model is the peers' (QuACK, INT21):
``2*M*N*elem + 4*N``.

Backward: from ``x``, ``w``, ``dy`` and the saved ``rstd`` (float32, M) compute
``dx`` (M x N, storage dtype) and ``dw`` (N, float32, summed over rows). See
``docs/rmsnorm.md`` for the kernel designs and every knob.

Every harness callable here is a top-level function so the Problems pickle into spawned
GPU workers (the worker re-imports this module by name, so keep ``examples``' parent
directory on ``sys.path``, as the example script does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evo.space import CategoricalAxis, Choice, Condition, Constraint, NumericAxis, ParamSpace
from evo.types import DTYPE_BYTES, ArgSpec, Case, DeviceInfo, Genome, Launch, Problem
from fitness import normal_draw, random_normal

__all__ = [
    "BLOCK_SMEM_OPTIN",
    "BWD_ENTRY",
    "CHECK_SHAPES",
    "DTYPE_CODES",
    "EPS",
    "FWD_ENTRY",
    "KERNEL_DIR",
    "SMEM_CAP",
    "TIMED_SHAPES",
    "bwd_bytes_moved",
    "bwd_dw_smem_bytes",
    "bwd_launch",
    "bwd_make_inputs",
    "bwd_reference",
    "bwd_scalars",
    "bwd_signature",
    "bwd_stage_bytes",
    "forward_param_space",
    "fwd_bytes_moved",
    "fwd_launch",
    "fwd_make_inputs",
    "fwd_reference",
    "fwd_scalars",
    "fwd_signature",
    "make_backward_problem",
    "make_forward_problem",
    "pipe_rows",
    "pipe_slice_bytes",
    "rmsnorm_numpy",
]

EPS = 1e-6
KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
FWD_ENTRY = "rmsnorm_fwd"
BWD_ENTRY = "rmsnorm_bwd"
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
SMEM_CAP = 48 * 1024
"""Largest dynamic shared memory a STAGE 1 launch asks for (with the kernel's static arrays it can
exceed the default 48 KB per CTA; the evaluator and the exported module then raise the limit)."""
DEFAULT_SM_COUNT = 132

TIMED_SHAPES: tuple[dict[str, int], ...] = tuple(
    [{"M": 32768, "N": n} for n in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)]
    + [{"M": 16384, "N": 131072}, {"M": 8192, "N": 262144}]
)
CHECK_SHAPES: tuple[dict[str, int], ...] = (
    {"M": 1, "N": 1},
    {"M": 3, "N": 7},
    {"M": 2, "N": 8},
    {"M": 5, "N": 256},
    {"M": 17, "N": 1000},
    {"M": 6, "N": 1026},
    {"M": 199, "N": 760},
    {"M": 33, "N": 4099},
    {"M": 1, "N": 65537},
    {"M": 7, "N": 131071},
)
TOLERANCES = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
EXCHANGE_SLOTS = 64
"""Partial sums one tile's cluster exchange holds in the kernel (STAGE 3, ``XROWS``): a cluster's
tile has at most ``EXCHANGE_SLOTS // CLUSTER`` rows."""
REG_TILE_BYTES = 32768
"""Upper bound on ``MAX_VECS * VEC_BYTES * THREADS`` (half that for the 1024-thread forms that
spill at 64 registers per thread: see ``reg_tile_budget``): beyond it ptxas spills (measured,
nvcc 13.0, sm_90a)."""

_DESCRIPTION = """\
RMSNorm forward on Hopper: y[i, j] = x[i, j] * rsqrt(mean_j(x[i, :]**2) + eps) * w[j], eps = 1e-6.
x, y: M x N row-major in the storage dtype (float32, float16 or bfloat16 stored as uint16); w: N float32.
Accumulate in float32. Kernel signature: (const void* x, const float* w, void* y, int M, int N,
float eps, int dtype_code) with dtype_code 0 float32, 1 float16, 2 bfloat16. Rows of odd N are not
16-byte aligned; M may be 1; N may be any positive int. Params arrive as -D defines; launch: see fwd_launch.
Memory bound: the target is HBM bandwidth (bytes 2*M*N*elem + 4*N)."""


# --------------------------------------------------------------------------- helpers


def _p(params: Mapping[str, Any], name: str) -> int:
    return int(params[name])


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _sm_count(device: DeviceInfo | Mapping[str, Any] | None) -> int:
    if device is None:
        return DEFAULT_SM_COUNT
    n = device.get("sm_count", 0) if isinstance(device, Mapping) else getattr(device, "sm_count", 0)
    return int(n) if n else DEFAULT_SM_COUNT


def _host_rng(rng: Any) -> np.random.Generator:
    """A numpy Generator: ``rng`` itself, or one seeded from a device (cupy) generator."""
    if isinstance(rng, np.random.Generator):
        return rng
    draw = rng.integers(0, 2**62, size=1)
    return np.random.default_rng(int(draw.get()[0] if hasattr(draw, "get") else draw[0]))


def _host(a: Any, xp: Any) -> Any:
    """``a`` as an ``xp`` array (device arrays are copied to the host when ``xp`` is numpy)."""
    if xp is np and hasattr(a, "get"):
        return a.get()
    return xp.asarray(a)


def _normal(rng: np.random.Generator, xp: Any, shape: tuple[int, ...], scale: Any = None) -> Any:
    """Standard normal float32 array on ``xp``, rows times ``scale`` (one fused pass on the GPU)."""
    return random_normal(rng, shape, xp, scale=scale)


def _row_scales(rng: np.random.Generator, m: int) -> np.ndarray:
    """Per-row scales: mostly 1, about 5% heavy-tailed large rows and 2% tiny rows."""
    s = np.ones(m, dtype=np.float32)
    u = rng.random(m)
    big = u < 0.05
    s[big] = np.exp(rng.uniform(np.log(4.0), np.log(60.0), int(big.sum()))).astype(np.float32)
    tiny = (u >= 0.05) & (u < 0.07)
    s[tiny] = np.float32(1e-3)
    return s


_CUPY_KERNELS: dict[str, Any] = {}


def _cupy_kernel(name: str) -> Any:
    """The reference's fused cupy kernels, built once per process (cupy is imported only here).

    ``sumsq``: sum of squares per row, each element widened to float64 before it is squared
    and added (one read of x, no temporaries); ``scale``: ``(x * rstd[row]) * w[col]`` in
    float32, the two products rounded as the unfused expression rounds them.
    """
    if name not in _CUPY_KERNELS:
        import cupy as cp

        if name == "sumsq":
            _CUPY_KERNELS[name] = cp.ReductionKernel("T x", "float64 y", "(double)x * (double)x", "a + b", "y = a",
                                                     "0", "rmsnorm_ref_sumsq", reduce_type="double")
        else:
            _CUPY_KERNELS[name] = cp.ElementwiseKernel("float32 x, float32 r, float32 w", "float32 y",
                                                       "float t = x * r; y = t * w", "rmsnorm_ref_scale")
    return _CUPY_KERNELS[name]


def _is_cupy(xp: Any) -> bool:
    return getattr(xp, "__name__", "") == "cupy"


def _rms_rows(x: Any, xp: Any, chunk_elems: int = 1 << 24, fused: bool = True) -> Any:
    """mean(x**2) per row with float64 accumulation, in row chunks to bound temporaries.

    On cupy (``fused``) one fused reduction reads x once (the evaluator computes a reference
    for every timed set, and at the long rows the unfused passes over float64 temporaries cost
    more device time than timing the kernel)."""
    m, n = x.shape
    if fused and _is_cupy(xp) and m and n:
        return _cupy_kernel("sumsq")(x, axis=1) / n
    out = xp.empty(m, dtype=xp.float64)
    step = max(1, chunk_elems // max(n, 1))
    for i in range(0, m, step):
        blk = x[i : i + step].astype(xp.float64)
        out[i : i + step] = (blk * blk).mean(axis=1)
    return out


def rmsnorm_numpy(x: np.ndarray, w: np.ndarray, eps: float = EPS) -> np.ndarray:
    """Float64 RMSNorm of a 2-D array (the test oracle)."""
    x64 = np.asarray(x, dtype=np.float64)
    r = 1.0 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + eps)
    return x64 * r * np.asarray(w, dtype=np.float64)[None, :]


# --------------------------------------------------------------------------- forward contract


def fwd_signature(case: Case) -> list[ArgSpec]:
    """Buffers: x (in), w (in, float32), y (out)."""
    m, n = case["M"], case["N"]
    return [ArgSpec("x", m * n, case.dtype, "in"), ArgSpec("w", n, "float32", "in"),
            ArgSpec("y", m * n, case.dtype, "out")]


def fwd_scalars(case: Case) -> list[tuple[str, int | float]]:
    """Scalars: M, N, eps, dtype_code."""
    return [("int32", case["M"]), ("int32", case["N"]), ("float32", EPS), ("int32", DTYPE_CODES[case.dtype])]


def fwd_make_inputs(case: Case, rng: np.random.Generator, xp: Any = np) -> dict[str, Any]:
    """x: standard normal rows, some scaled large (heavy tail) or tiny; w: standard normal.

    x is a deferred draw (:func:`fitness.normal_draw`, M x N): the harness draws it straight
    into the input buffer in the case's dtype; ``fitness.materialize`` gives its array."""
    m, n = case["M"], case["N"]
    rng = _host_rng(rng)
    x = normal_draw(rng, (m, n), scale=_row_scales(rng, m))
    w = _normal(rng, xp, (n,))
    return {"x": x, "w": w}


def fwd_reference(inputs: Mapping[str, Any], case: Case, xp: Any = np, *, fused: bool = True) -> dict[str, Any]:
    """y in float32 from the stored inputs (mean of squares accumulated in float64).

    ``fused=False`` takes the chunked whole-array passes on cupy too (the comparison of
    benchmarks/rmsnorm_reference_bench.py); numpy always does."""
    m, n = case["M"], case["N"]
    x = _host(inputs["x"], xp).reshape(m, n).astype(xp.float32, copy=False)
    w = _host(inputs["w"], xp).astype(xp.float32, copy=False)
    rstd = (1.0 / xp.sqrt(_rms_rows(x, xp, fused=fused) + EPS)).astype(xp.float32)
    if fused and _is_cupy(xp):
        return {"y": _cupy_kernel("scale")(x, rstd[:, None], w[None, :]).reshape(-1)}
    y = (x * rstd[:, None]) * w[None, :]
    return {"y": y.reshape(-1)}


def _elems_per_vec(params: Mapping[str, Any], dtype: str) -> int:
    return _p(params, "VEC_BYTES") // DTYPE_BYTES[dtype]


def fwd_launch(params: Mapping[str, Any], case: Case, device: DeviceInfo | Mapping[str, Any] | None = None) -> Launch:
    """Grid of row groups (times CLUSTER CTAs each), THREADS per CTA, staging shared memory.

    Non-persistent: one group per ``THREADS // TPR`` rows (STAGE 3: per tile of rows).
    Persistent (``PERSISTENT = k``): ``k * SM count`` CTAs at most, and a resident launch
    (:class:`~evo.types.Launch`), so the harness runs no more than fit the device at once
    (with 16-CTA clusters that can be fewer than one per SM: a cluster must fit one GPC);
    the kernel strides over the rows either way. STAGE 1 asks for the row chunks in dynamic
    shared memory when they fit :data:`SMEM_CAP`, else for none (the kernel then re-reads
    global memory). STAGE 3
    asks for ``PIPE`` buffers of ``rows`` row slices, ``rows`` the most (up to TILE_ROWS)
    that let ``max(k, 1)`` CTAs share an SM's shared memory; when not even one row fits, or
    the rows are not 16-byte multiples, it asks for none and the kernel falls back to STAGE 2.
    """
    m, n = case["M"], case["N"]
    threads, tpr, cluster = _p(params, "THREADS"), _p(params, "TPR"), _p(params, "CLUSTER")
    stage, k = _p(params, "STAGE"), _p(params, "PERSISTENT")
    rpc = threads // tpr
    groups = -(-m // rpc)
    shared = 0
    if stage == 1:
        e = _elems_per_vec(params, case.dtype)
        vecs = _cdiv(_cdiv(n, e), cluster)  # vectors per CTA per row (upper bound)
        need = rpc * vecs * _p(params, "VEC_BYTES")
        shared = need if need <= SMEM_CAP else 0
    elif stage == 3:
        rows = pipe_rows(params, case)
        if rows:
            shared = pipe_weight_bytes(params, case) + _p(params, "PIPE") * rows * pipe_slice_bytes(params, case)
            groups = -(-m // rows)
    elif stage == 4:
        groups = -(-m // (rpc * _p(params, "TILE_ROWS")))
    if k > 0:
        groups = min(groups, max(1, k * _sm_count(device) // cluster))
    return Launch(grid=(groups * cluster, 1, 1), block=(threads, 1, 1), shared_mem=shared,
                  cluster=(cluster, 1, 1) if cluster > 1 else None, resident=k > 0)


SM_SMEM = 228 * 1024
"""Shared memory per SM on Hopper (bytes)."""
BLOCK_SMEM_OPTIN = 227 * 1024
"""Largest dynamic shared memory one CTA may opt in to on Hopper (bytes)."""


def _smem_per_cta(ctas_per_sm: int, static: int) -> int:
    """Dynamic shared memory each of ``max(ctas_per_sm, 1)`` CTAs sharing an SM may ask for, after
    the system's 1 KB per CTA and ``static`` bytes of the kernel's static arrays (the per-CTA opt-in
    limit counts those too)."""
    return min(BLOCK_SMEM_OPTIN, SM_SMEM // max(ctas_per_sm, 1) - 1024) - static


def pipe_slice_bytes(params: Mapping[str, Any], case: Case) -> int:
    """STAGE 3: bytes of one row that one CTA of the cluster holds (whole 16-byte chunks)."""
    row = case["N"] * DTYPE_BYTES[case.dtype]
    return _cdiv(row // 16, _p(params, "CLUSTER")) * 16


def pipe_weight_bytes(params: Mapping[str, Any], case: Case) -> int:
    """STAGE 3 with WSMEM 1: bytes of the float32 weight slice at the front of shared memory."""
    if not params.get("WSMEM", 0):
        return 0
    return pipe_slice_bytes(params, case) // DTYPE_BYTES[case.dtype] * 4


def pipe_rows(params: Mapping[str, Any], case: Case) -> int:
    """STAGE 3: rows per tile the launch provides for (0: the kernel falls back to STAGE 2).

    At most TILE_ROWS (with a cluster at most ``EXCHANGE_SLOTS // CLUSTER``: the partial sums
    one exchange of the kernel holds), and no more than lets ``max(PERSISTENT, 1)`` CTAs of
    ``PIPE`` buffers each (after the weight slice, with WSMEM 1) fit one SM's shared memory
    (1 KB per CTA is the system's, 2 KB is left for the kernel's static arrays).
    """
    row = case["N"] * DTYPE_BYTES[case.dtype]
    if row % 16:
        return 0
    slice_b = pipe_slice_bytes(params, case)
    per_cta = _smem_per_cta(_p(params, "PERSISTENT"), 2 * 1024)
    per_cta -= pipe_weight_bytes(params, case)
    rows = per_cta // (_p(params, "PIPE") * slice_b) if slice_b and per_cta > 0 else 0
    cap = _p(params, "TILE_ROWS")
    if _p(params, "CLUSTER") > 1:
        cap = min(cap, EXCHANGE_SLOTS // _p(params, "CLUSTER"))
    return max(0, min(rows, cap, case["M"]))


def fwd_bytes_moved(case: Case) -> int:
    """``2*M*N*elem + 4*N``: read x, write y, read the float32 weight once."""
    m, n = case["M"], case["N"]
    return 2 * m * n * DTYPE_BYTES[case.dtype] + 4 * n


# --------------------------------------------------------------------------- forward space


def _c_tpr_divides(p: Mapping[str, Any]) -> bool:
    return int(p["TPR"]) <= int(p["THREADS"]) and int(p["THREADS"]) % int(p["TPR"]) == 0


def _c_cluster_one_row(p: Mapping[str, Any]) -> bool:
    return int(p["CLUSTER"]) == 1 or int(p["TPR"]) == int(p["THREADS"])


def _c_reg_tile(p: Mapping[str, Any]) -> bool:
    return int(p["MAX_VECS"]) * int(p["VEC_BYTES"]) * int(p["THREADS"]) <= reg_tile_budget(p)


def reg_tile_budget(p: Mapping[str, Any]) -> int:
    """Bytes of x a CTA may hold in registers (``MAX_VECS * VEC_BYTES * THREADS``) without spills.

    ``REG_TILE_BYTES`` up to 512 threads and in STAGE 2 (one batch of loads, not a row: two 16-byte
    vectors fit 64 registers at 1024 threads). At 1024 threads (64 registers per thread) the full
    budget holds in STAGE 0, 1 and 3 with at most 4 vectors per thread, except STAGE 0 with
    ld.global.cg (LOAD_HINT 2) in a cluster of 4 or more and STAGE 3 in a cluster with the precise
    rsqrt, which spill 8-16 and 8-32 bytes there; those, 8 vectors of 4 bytes (12-140 bytes of
    spills) and STAGE 4 (as before, not probed) get half (ptxas, nvcc 13.0, sm_90a).
    """
    threads, stage = int(p["THREADS"]), int(p["STAGE"])
    if threads <= 512 or stage == 2:
        return REG_TILE_BYTES
    cluster = int(p["CLUSTER"])
    full = (stage in (0, 1, 3) and int(p["MAX_VECS"]) <= 4
            and not (stage == 0 and int(p["LOAD_HINT"]) == 2 and cluster >= 4)
            and not (stage == 3 and cluster > 1 and int(p["RSQRT_APPROX"]) == 0))
    return REG_TILE_BYTES if full else REG_TILE_BYTES // 2


def _c_pipe_registers(p: Mapping[str, Any]) -> bool:
    return int(p["STAGE"]) != 3 or int(p["PERSISTENT"]) * int(p["THREADS"]) <= 1024


def register_budget(p: Mapping[str, Any]) -> int:
    """Registers per thread ptxas may use under the kernel's ``__launch_bounds__`` minimum of CTAs
    per SM (its MIN_BLOCKS: OCCUPANCY; else, in STAGE 3, PERSISTENT CTAs of a persistent grid or
    1024 threads' worth of CTAs without one; else 1), at most 255."""
    threads, occ, k = int(p["THREADS"]), int(p["OCCUPANCY"]), int(p["PERSISTENT"])
    pipe = int(p["STAGE"]) == 3
    if occ > 0:
        blocks = occ
    elif pipe and k > 1 and k * threads <= 2048:
        blocks = k
    elif pipe and k == 0 and threads < 1024:
        blocks = 1024 // threads
    else:
        blocks = 1
    return min(255, 65536 // (blocks * threads))


def _c_pipe_batch(p: Mapping[str, Any]) -> bool:
    if int(p["STAGE"]) != 3:
        return True
    return int(p["MAX_VECS"]) * int(p["VEC_BYTES"]) <= 64 or register_budget(p) >= 128


def _lean_reread(p: Mapping[str, Any]) -> bool:
    """STAGE 2 at 32 registers (2048 threads per SM) without spills: one row per CTA, one 16-byte
    load per batch, no cluster, LOAD_HINT 0, 3, 4 or 5 (ptxas, nvcc 13.0, sm_90a: several rows per
    CTA spill; ld.global.cg spills 8 bytes at 256 and 512 threads though not at 1024, and
    ld.global.nc 24-36 bytes at every thread count; tests/examples/test_rmsnorm_compile.py);
    without PREFETCH (its second vector spills there)."""
    return (int(p["STAGE"]) == 2 and int(p["MAX_VECS"]) == 1 and int(p["VEC_BYTES"]) == 16
            and int(p["CLUSTER"]) == 1 and int(p["TPR"]) == int(p["THREADS"]) and int(p["LOAD_HINT"]) in (0, 3, 4, 5)
            and int(p["PREFETCH"]) == 0)


def _lean_regs(p: Mapping[str, Any]) -> bool:
    """STAGE 0 at 32 registers without spills: one vector per thread (MAX_VECS 1, the kernel's
    ``rmsnorm_lean`` path), no cluster, rsqrt.approx, any LOAD_HINT but 2 (nvcc 13.0, sm_90a,
    every THREADS, TPR and VEC_BYTES; ld.global.cg spills 8 bytes with 16-byte vectors and
    TPR <= 32, and the precise 1/sqrtf 8-68 bytes in many forms); with PREFETCH 1, 16-byte
    vectors and TPR <= 32 only LOAD_HINT 4 or 5 (0, 1 and 3 spill 8-16 bytes at every THREADS;
    TPR >= 64 and 4- or 8-byte vectors spill with none)."""
    if not (int(p["STAGE"]) == 0 and int(p["MAX_VECS"]) == 1 and int(p["CLUSTER"]) == 1
            and int(p["RSQRT_APPROX"]) == 1 and int(p["LOAD_HINT"]) != 2):
        return False
    # PREFETCH (weights and the next row's vector held too): with 16-byte vectors and TPR <= 32
    # ptxas spills 8-16 bytes unless the load carries the two-read policy (LOAD_HINT 4 or 5)
    return not (int(p["PREFETCH"]) == 1 and int(p["TPR"]) <= 32 and int(p["VEC_BYTES"]) == 16
                and int(p["LOAD_HINT"]) in (0, 1, 3))


def _c_occupancy(p: Mapping[str, Any]) -> bool:
    occ = int(p["OCCUPANCY"])
    if occ == 0:
        return True
    if occ * int(p["THREADS"]) == 2048 and (_lean_reread(p) or _lean_regs(p)):
        return True
    small_tile = int(p["STAGE"]) in (3, 4) or int(p["MAX_VECS"]) * int(p["VEC_BYTES"]) <= 32
    return occ * int(p["THREADS"]) <= 1024 and small_tile


def _c_row_tile(p: Mapping[str, Any]) -> bool:
    if int(p["STAGE"]) != 4:
        return True
    if int(p["CLUSTER"]) != 1 or int(p["TPR"]) > 32:
        return False
    tile = int(p["TILE_ROWS"]) * int(p["MAX_VECS"]) * int(p["VEC_BYTES"])
    return tile * 3 // 8 + 40 <= register_budget(p)


def _a_pipeline(p: Mapping[str, Any]) -> bool:
    return int(p["STAGE"]) == 3


def _a_prefetch(p: Mapping[str, Any]) -> bool:
    """STAGE 2 with one load per batch, or the lean path (STAGE 0, one vector, no cluster)."""
    if int(p["MAX_VECS"]) != 1:
        return False
    return int(p["STAGE"]) == 2 or (int(p["STAGE"]) == 0 and int(p["CLUSTER"]) == 1)


def _a_row_tiles(p: Mapping[str, Any]) -> bool:
    return int(p["STAGE"]) in (3, 4)


def forward_param_space() -> ParamSpace:
    """The forward kernel's knobs and the rules a valid assignment follows."""
    return ParamSpace(
        params={
            "THREADS": Choice([32, 64, 128, 256, 512, 1024]),
            "TPR": Choice([4, 8, 16, 32, 64, 128, 256, 512, 1024]),
            "VEC_BYTES": Choice([4, 8, 16]),
            "LOAD_HINT": Choice([0, 1, 2, 3, 4, 5]),
            "STORE_HINT": Choice([0, 1, 2]),
            "STAGE": Choice([0, 1, 2, 3, 4]),
            "MAX_VECS": Choice([1, 2, 4, 8, 16]),
            "CLUSTER": Choice([1, 2, 4, 8, 16]),
            "PERSISTENT": Choice([0, 1, 2, 4, 8]),
            "RSQRT_APPROX": Choice([0, 1]),
            "PIPE": Choice([1, 2, 3, 4]),
            "TILE_ROWS": Choice([1, 2, 4, 8, 16, 32, 64]),
            "OCCUPANCY": Choice([0, 2, 4, 8, 16, 32]),
            "WSMEM": Choice([0, 1]),
            "PREFETCH": Choice([0, 1]),
            "DTYPE_BUILD": Choice([0, 1], default=0),
        },
        constraints=(
            Constraint("TPR (threads per row) divides THREADS", _c_tpr_divides),
            Constraint("CLUSTER > 1 needs one row per CTA: TPR == THREADS", _c_cluster_one_row),
            Constraint(f"MAX_VECS * VEC_BYTES * THREADS <= {REG_TILE_BYTES} ({REG_TILE_BYTES // 2} at 1024 threads "
                       "in STAGE 4, with MAX_VECS 8 or more, in STAGE 0 with LOAD_HINT 2 and CLUSTER >= 4, and "
                       "in STAGE 3 with CLUSTER > 1 and RSQRT_APPROX 0): register tile without spills "
                       "(reg_tile_budget)", _c_reg_tile),
            Constraint("STAGE 3: PERSISTENT * THREADS <= 1024 (the CTAs of an SM share its registers; at 2048 "
                       "threads ptxas has 32 per thread and spills)", _c_pipe_registers),
            Constraint("OCCUPANCY > 0: OCCUPANCY * THREADS <= 1024 (64 registers per thread or more) and, "
                       "outside STAGE 3, MAX_VECS * VEC_BYTES <= 32 (a larger register tile spills at 64); or "
                       "OCCUPANCY * THREADS == 2048 (32 registers) with MAX_VECS 1 and CLUSTER 1, and either "
                       "STAGE 2 with VEC_BYTES 16, TPR == THREADS, LOAD_HINT 0, 3, 4 or 5 and PREFETCH 0, or "
                       "STAGE 0 with RSQRT_APPROX 1, LOAD_HINT != 2 and, with PREFETCH 1, 16-byte vectors and "
                       "TPR <= 32, LOAD_HINT 4 or 5 (the forms that do not spill there)",
                       _c_occupancy),
            Constraint("STAGE 3: MAX_VECS * VEC_BYTES <= 64 (the batch of loads it holds), or a register budget of "
                       "at least 128 (register_budget: OCCUPANCY or a persistent grid): at 64 registers 8 x 16 B "
                       "spill 16-36 bytes and 16 x 16 B 712-820 (nvcc 13.0, sm_90a)", _c_pipe_batch),
            Constraint("STAGE 4: CLUSTER 1, TPR <= 32, and TILE_ROWS * MAX_VECS * VEC_BYTES * 3/8 + 40 registers "
                       "within 65536 / (max(OCCUPANCY, 1) * THREADS) (at most 255): the row tile without spills",
                       _c_row_tile),
        ),
        # Knobs only some stages read: elsewhere they change neither the cubin nor the launch
        # (tests/examples/test_rmsnorm_compile.py compares the cubins), so the engine sets them
        # to these defaults and never spends an evaluation on a genome that differs only there.
        conditions=(
            Condition("PIPE", _a_pipeline, 2, "PIPE only with STAGE 3"),
            Condition("WSMEM", _a_pipeline, 0, "WSMEM only with STAGE 3"),
            Condition("TILE_ROWS", _a_row_tiles, 8, "TILE_ROWS only with STAGE 3 or 4"),
            Condition("PREFETCH", _a_prefetch, 0, "PREFETCH only with MAX_VECS 1 and STAGE 2, or STAGE 0 and CLUSTER 1"),
        ),
    )


FWD_SEED_PARAMS: tuple[dict[str, int], ...] = (
    # many short rows, no staging: a warp per row, four rows per CTA, register tile of 4 x 16 B
    {"THREADS": 128, "TPR": 32, "VEC_BYTES": 16, "LOAD_HINT": 0, "STORE_HINT": 0, "STAGE": 0, "MAX_VECS": 4,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 8,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 3 (bulk copies into shared memory), short rows: a warp per row, tiles of 8 rows
    {"THREADS": 256, "TPR": 32, "VEC_BYTES": 16, "LOAD_HINT": 0, "STORE_HINT": 0, "STAGE": 3, "MAX_VECS": 4,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 8,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 3, the shortest rows: half a warp per row, one buffer, L2 evict-first loads
    {"THREADS": 128, "TPR": 16, "VEC_BYTES": 16, "LOAD_HINT": 3, "STORE_HINT": 0, "STAGE": 3, "MAX_VECS": 4,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 1, "TILE_ROWS": 8,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 3, 2K-4K rows: a CTA of 128 threads per row, tiles of 2 rows, many CTAs per SM
    {"THREADS": 128, "TPR": 128, "VEC_BYTES": 16, "LOAD_HINT": 0, "STORE_HINT": 0, "STAGE": 3, "MAX_VECS": 4,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 1, "TILE_ROWS": 2,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 3, 8K rows: a CTA of 256 threads per row
    {"THREADS": 256, "TPR": 256, "VEC_BYTES": 16, "LOAD_HINT": 0, "STORE_HINT": 0, "STAGE": 3, "MAX_VECS": 4,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 1, "TILE_ROWS": 2,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 3, 16K-32K rows: a CTA of 512 threads per row
    {"THREADS": 512, "TPR": 512, "VEC_BYTES": 16, "LOAD_HINT": 3, "STORE_HINT": 0, "STAGE": 3, "MAX_VECS": 4,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 1, "TILE_ROWS": 2,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 3, long rows: each CTA of a 2-CTA cluster holds half a row, two CTAs per SM
    {"THREADS": 512, "TPR": 512, "VEC_BYTES": 16, "LOAD_HINT": 3, "STORE_HINT": 1, "STAGE": 3, "MAX_VECS": 4,
     "CLUSTER": 2, "PERSISTENT": 2, "RSQRT_APPROX": 1, "PIPE": 1, "TILE_ROWS": 2,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 4 (rows in registers), N=256: 16 threads per row, two rows each in flight, 4 CTAs per SM
    {"THREADS": 256, "TPR": 16, "VEC_BYTES": 16, "LOAD_HINT": 1, "STORE_HINT": 1, "STAGE": 4, "MAX_VECS": 2,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 2,
     "OCCUPANCY": 4, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 4, N=512: a warp per row, four rows each in flight
    {"THREADS": 128, "TPR": 32, "VEC_BYTES": 16, "LOAD_HINT": 0, "STORE_HINT": 0, "STAGE": 4, "MAX_VECS": 2,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 4,
     "OCCUPANCY": 4, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 0, N=1K: a warp per row, one vector per thread, 8 CTAs of 128 threads per SM
    {"THREADS": 128, "TPR": 32, "VEC_BYTES": 16, "LOAD_HINT": 0, "STORE_HINT": 1, "STAGE": 0, "MAX_VECS": 1,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 8,
     "OCCUPANCY": 8, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 4, N=2K: a warp per row, the whole row (8 vectors per thread) in flight
    {"THREADS": 128, "TPR": 32, "VEC_BYTES": 16, "LOAD_HINT": 3, "STORE_HINT": 1, "STAGE": 4, "MAX_VECS": 8,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 1,
     "OCCUPANCY": 2, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 3, N=16K: a CTA of 256 threads per row, one row per tile, streaming stores
    {"THREADS": 256, "TPR": 256, "VEC_BYTES": 16, "LOAD_HINT": 0, "STORE_HINT": 1, "STAGE": 3, "MAX_VECS": 4,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 1, "TILE_ROWS": 1,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 2, N=16K-32K: a CTA of 512 threads per row, one 16-byte load per batch, two CTAs per SM;
    # the first read of a row keeps it in L2 (evict_last) for the second (LOAD_HINT 4: at fp32 32K
    # 0.84-0.87 of copy against 0.68-0.70 with LOAD_HINT 0 or 3, rmsnorm_sweep-2026-12-03-policy-repeat*)
    {"THREADS": 512, "TPR": 512, "VEC_BYTES": 16, "LOAD_HINT": 4, "STORE_HINT": 1, "STAGE": 2, "MAX_VECS": 1,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 8,
     "OCCUPANCY": 2, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 2, N >= 128K: the same, a quarter row per CTA of a 4-CTA cluster, L2 evict-first loads
    {"THREADS": 512, "TPR": 512, "VEC_BYTES": 16, "LOAD_HINT": 3, "STORE_HINT": 1, "STAGE": 2, "MAX_VECS": 1,
     "CLUSTER": 4, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 8,
     "OCCUPANCY": 2, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 3, N=128K: an 8-CTA cluster per row, each CTA's 32 KB slice one bulk copy, L2 evict-first
    # loads (the float32 weights, re-read by every row, stay in L2)
    {"THREADS": 128, "TPR": 128, "VEC_BYTES": 16, "LOAD_HINT": 3, "STORE_HINT": 1, "STAGE": 3, "MAX_VECS": 4,
     "CLUSTER": 8, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 1, "TILE_ROWS": 1,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 3, fp32 N=256K: a 16-CTA cluster per row, 256 threads per CTA (64 KB slices)
    {"THREADS": 256, "TPR": 256, "VEC_BYTES": 16, "LOAD_HINT": 3, "STORE_HINT": 1, "STAGE": 3, "MAX_VECS": 4,
     "CLUSTER": 16, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 1, "TILE_ROWS": 1,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 2, 128 KB rows (fp32 32K, bf16 64K): one CTA of 1024 threads per SM, whose row stays in
    # the SM's L1 for the second read (LOAD_HINT 5: L1::evict_last, then evict_first): fp32 32K 0.99
    # of copy against 0.87-0.89 with LOAD_HINT 4 (rmsnorm_sweep-2026-12-03-l1.md)
    {"THREADS": 1024, "TPR": 1024, "VEC_BYTES": 16, "LOAD_HINT": 5, "STORE_HINT": 1, "STAGE": 2, "MAX_VECS": 1,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 8,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 2, 32 KB rows (bf16 16K, fp32 8K): four CTAs of 256 threads per SM, with and without the
    # L1 priorities (bf16 16K 0.995 of copy with LOAD_HINT 4, bf16 8K 0.995 and fp32 8K 1.008 with 5)
    {"THREADS": 256, "TPR": 256, "VEC_BYTES": 16, "LOAD_HINT": 4, "STORE_HINT": 1, "STAGE": 2, "MAX_VECS": 1,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 8,
     "OCCUPANCY": 4, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    {"THREADS": 256, "TPR": 256, "VEC_BYTES": 16, "LOAD_HINT": 5, "STORE_HINT": 1, "STAGE": 2, "MAX_VECS": 1,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 8,
     "OCCUPANCY": 4, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 2, 64 KB rows (16-bit 32K): two CTAs of 1024 threads per SM at 32 registers, two rows per
    # SM's L1 (bf16/fp16 32K 0.934/0.936 of copy against 0.929/0.935 for 2 x 512 threads in the same
    # sweep, rmsnorm_sweep-2026-12-03-lean.md: a start for the search, not yet a gain)
    {"THREADS": 1024, "TPR": 1024, "VEC_BYTES": 16, "LOAD_HINT": 4, "STORE_HINT": 1, "STAGE": 2, "MAX_VECS": 1,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 8,
     "OCCUPANCY": 2, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 2, rows larger than L1 (fp32 64K, 16-bit 128K): one CTA of 1024 threads per SM, the next
    # vector's load issued before the current one's store in the second pass (fp32 64K 0.842 of copy
    # against 0.702 without, bf16 / fp16 128K 0.754 / 0.664 against 0.654 / 0.653, in one device call:
    # rmsnorm_sweep-2026-12-03-prefetch.md)
    {"THREADS": 1024, "TPR": 1024, "VEC_BYTES": 16, "LOAD_HINT": 5, "STORE_HINT": 1, "STAGE": 2, "MAX_VECS": 1,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 8,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 1, "DTYPE_BUILD": 0},
    # STAGE 3 with the partial sums pushed to the cluster's CTAs (st.async), 32 KB of x per CTA and
    # tile, 128 threads: 16-bit 256K and fp32 128K (16 CTAs x 1 row), 16-bit 64K (8 CTAs x 2 rows),
    # fp32 64K (16 CTAs x 2 rows): 0.875 / 0.910 / 0.905 / 0.906 of copy (rmsnorm_sweep-2026-12-03-exchange-long.md)
    {"THREADS": 128, "TPR": 128, "VEC_BYTES": 16, "LOAD_HINT": 3, "STORE_HINT": 1, "STAGE": 3, "MAX_VECS": 4,
     "CLUSTER": 16, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 1, "TILE_ROWS": 1,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    {"THREADS": 128, "TPR": 128, "VEC_BYTES": 16, "LOAD_HINT": 3, "STORE_HINT": 1, "STAGE": 3, "MAX_VECS": 4,
     "CLUSTER": 8, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 1, "TILE_ROWS": 2,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    {"THREADS": 128, "TPR": 128, "VEC_BYTES": 16, "LOAD_HINT": 3, "STORE_HINT": 1, "STAGE": 3, "MAX_VECS": 4,
     "CLUSTER": 16, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 1, "TILE_ROWS": 2,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # the same with four rows per tile, normalised together (each vector's weights loaded once for
    # the four): 16-bit 64K 0.917 / 0.925 of copy against 0.900 / 0.902 for the best form before
    # (rmsnorm_sweep-2026-12-04-s13-wrows-compare.md)
    {"THREADS": 128, "TPR": 128, "VEC_BYTES": 16, "LOAD_HINT": 3, "STORE_HINT": 1, "STAGE": 3, "MAX_VECS": 4,
     "CLUSTER": 16, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 1, "TILE_ROWS": 4,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 4 with one-warp CTAs (up to 32 per SM; torch.compile's Triton kernel runs 1-warp CTAs at
    # N = 256-1K): N = 256 16-bit (4 rows of one vector each per thread, 64 registers), N = 256 fp32
    # and 512 (2 rows x 2 vectors), fp32 512 and 16-bit 1K (4 vectors), 16-bit 2K (8 vectors): 0.785,
    # 0.897, 0.942 / 0.929 and 0.951 of copy against 0.758, 0.883, 0.919 / 0.911 and 0.945 for the
    # previous champions in the same sweep (rmsnorm_sweep-2026-12-05-s15-onewarp.md)
    {"THREADS": 32, "TPR": 32, "VEC_BYTES": 16, "LOAD_HINT": 1, "STORE_HINT": 1, "STAGE": 4, "MAX_VECS": 1,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 4,
     "OCCUPANCY": 32, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    {"THREADS": 32, "TPR": 32, "VEC_BYTES": 16, "LOAD_HINT": 1, "STORE_HINT": 1, "STAGE": 4, "MAX_VECS": 2,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 2,
     "OCCUPANCY": 16, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    {"THREADS": 32, "TPR": 32, "VEC_BYTES": 16, "LOAD_HINT": 1, "STORE_HINT": 1, "STAGE": 4, "MAX_VECS": 4,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 1,
     "OCCUPANCY": 32, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    {"THREADS": 32, "TPR": 32, "VEC_BYTES": 16, "LOAD_HINT": 1, "STORE_HINT": 1, "STAGE": 4, "MAX_VECS": 8,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 1,
     "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 2 at 32 registers, 2048 threads per SM, one row per CTA of 128 or 256 threads (the
    # lean form of the occupancy rule; THREADS, TPR and OCCUPANCY change together, which mutations
    # seldom do): on the H100, 1K-4K, the 128-thread one 0.981-0.988 of copy at 2K (the one-warp
    # STAGE 4 seed 0.982-0.983 in the same sweep), the 256-thread one 0.998-1.003 at 4K
    # (rmsnorm_sweep-2026-12-06-s22-h100-stage2-2048threads.md)
    {"THREADS": 128, "TPR": 128, "VEC_BYTES": 16, "LOAD_HINT": 5, "STORE_HINT": 1, "STAGE": 2, "MAX_VECS": 1,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 8,
     "OCCUPANCY": 16, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    {"THREADS": 256, "TPR": 256, "VEC_BYTES": 16, "LOAD_HINT": 4, "STORE_HINT": 1, "STAGE": 2, "MAX_VECS": 1,
     "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 8,
     "OCCUPANCY": 8, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0},
    # STAGE 0 with one 16-byte vector per thread (the kernel's lean path) at 32 registers, 2048
    # threads per SM, one row per CTA of 64 to 1024 threads: each holds a whole row of 1 KB to 16 KB
    # (16-bit 512 to 8K, fp32 256 to 4K), read once, as many rows in flight per SM as CTAs. On the
    # H100 (rmsnorm_sweep-2026-12-06-s23-h100-lean.md) the 128-thread form reached 0.956 / 0.960 of
    # copy at 16-bit 1K against 0.962 / 0.963 for run 25's champion (0.972 with LOAD_HINT 3), the
    # 512-thread one 1.003 at fp32 4K, and won that case in search run 26
    *({"THREADS": t, "TPR": t, "VEC_BYTES": 16, "LOAD_HINT": 0, "STORE_HINT": 1, "STAGE": 0, "MAX_VECS": 1,
       "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 8,
       "OCCUPANCY": 2048 // t, "WSMEM": 0, "PREFETCH": 0, "DTYPE_BUILD": 0} for t in (64, 128, 256, 512, 1024)),
    # The lean path with PREFETCH 1 (the thread's weights loaded with its x vector, before the
    # reduction, and kept; with a persistent grid the next row's vector too), one row per CTA, the
    # L2 evict_first load: on the H100, bf16, the 128-thread form 0.970 of copy at 1K and the
    # 256-thread form 0.987 at 2K, against 0.966 / 0.976 without PREFETCH and 0.959 / 0.985 for
    # search run 30's champions of those cases in the same sweep
    # (rmsnorm_sweep-2026-12-07-s31-h100-lean-next.md)
    *({"THREADS": t, "TPR": t, "VEC_BYTES": 16, "LOAD_HINT": 3, "STORE_HINT": 1, "STAGE": 0, "MAX_VECS": 1,
       "CLUSTER": 1, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 2, "TILE_ROWS": 8,
       "OCCUPANCY": 2048 // t, "WSMEM": 0, "PREFETCH": 1, "DTYPE_BUILD": 0} for t in (128, 256)),
)
"""Starting points, one or more per row-length regime (the engine searches from all of them).
Each is the best variant, for the shapes its comment names, of a design-space sweep on the H200
(``benchmarks/rmsnorm_sweep.py``; tables in ``benchmarks/results/rmsnorm_sweep-*.md``) where it beat
the seeds before it; the comments name the later sweeps and their figures. The STAGE 3 seeds among
the first seven come from the first sweep (``rmsnorm_sweep-2026-12-02.md``), the next seven from ``-short.md``,
``-rowtile.md`` and ``-long.md`` of the same day. The two STAGE 2 seeds among them are what the best
long-row variants of that sweep ran: STAGE 3 genomes whose weight slice (WSMEM) left no room for a
row buffer, so the kernel took its STAGE 2 path with one load per batch (the same code and launch
as these genomes)."""


def forward_source() -> str:
    """The forward kernel source (examples/kernels/rmsnorm_fwd.cu)."""
    return (KERNEL_DIR / "rmsnorm_fwd.cu").read_text()


def dtype_defines(params: Mapping[str, Any], dtype: str) -> dict[str, int]:
    """The Problem's per-dtype build (``Problem.dtype_defines``): with ``DTYPE_BUILD`` 1 each dtype
    gets its own build, ``-DDTYPE_CODE=<code>``, holding that dtype's body alone; with 0 one build
    serves all three (the storage dtype picked at run time).

    Measured with nvcc 13.0 for sm_90a (ptxas -v, CPU): one body for all three dtypes can take
    more registers than the largest single-dtype body (the backward at 256 threads x 8 chunks with
    SPLIT 2: 164 registers, 128 for each dtype alone, so two CTAs fit an SM instead of one), and
    a single-dtype cubin is about a third of the size. A few forms spill 16-80 bytes in the
    16-bit or the fp32 build that do not in the shared one, which is why it is a knob."""
    return {"DTYPE_CODE": DTYPE_CODES[dtype]} if int(params.get("DTYPE_BUILD", 0)) else {}


def make_forward_problem(timed: Sequence[Mapping[str, int]] | None = None, dtypes: Sequence[str] | None = None,
                         quick: bool = False, check: Sequence[Mapping[str, int]] | None = None) -> Problem:
    """The RMSNorm forward Problem.

    Args:
        timed: Timed shapes (default: the 11 shapes of the standard matrix; every timed
            shape is also checked).
        dtypes: Storage dtypes (default bfloat16, float16, float32).
        quick: Time only N in {1024, 8192, 65536} at M = 32768 (a short search).
        check: Check shapes (default :data:`CHECK_SHAPES`: M=1, odd M and N, N not a
            multiple of any vector width).

    Returns:
        A validated Problem with one seed genome per row-length regime.
    """
    if timed is None:
        timed = [s for s in TIMED_SHAPES if s["N"] in (1024, 8192, 65536)] if quick else TIMED_SHAPES
    dts = tuple(dtypes) if dtypes is not None else ("bfloat16", "float16", "float32")
    for d in dts:
        if d not in DTYPE_CODES:
            raise ValueError(f"dtype {d!r} not supported by the RMSNorm kernels; use {sorted(DTYPE_CODES)}")
    src = forward_source()
    seeds = tuple(Genome(src, p, entry=FWD_ENTRY) for p in FWD_SEED_PARAMS)
    prob = Problem(
        name="rmsnorm_fwd_h100",
        description=_DESCRIPTION,
        params=forward_param_space(),
        check_shapes=tuple(check) if check is not None else CHECK_SHAPES,
        timed_shapes=tuple(timed),
        dtypes=dts,
        tolerances={d: TOLERANCES[d] for d in dts},
        target="sm_90a",
        dtype_defines=dtype_defines,
        signature=fwd_signature,
        scalars=fwd_scalars,
        make_inputs=fwd_make_inputs,
        reference=fwd_reference,
        launch=fwd_launch,
        bytes_moved=fwd_bytes_moved,
        objective="geomean_fraction",
        descriptors=(
            CategoricalAxis("CLUSTER", [1, 2, 4, 8, 16], source="params"),
            CategoricalAxis("STAGE", [0, 1, 2, 3, 4], source="params"),
            NumericAxis("registers", 0, 256, 8, source="resources"),
        ),
        seeds=seeds,
        extra={"eps": EPS, "weight_dtype": "float32", "byte_model": "2*M*N*elem + 4*N",
               "hardware": "H100/H200: 132 SMs, 50 MB L2, 228 KB shared memory per SM, clusters up to 16"},
    )
    return prob.validate()


# --------------------------------------------------------------------------- backward


BWD_WS_HEADER = 256
"""Words of the backward workspace before the partial rows (word 0 the ticket counter, words 1..
the tickets of the ``TREE`` groups; the kernel agrees)."""

BWD_PARTS_MAX = 528
"""Most CTAs of the persistent backward (ALGO 1): rows of dw partials in the workspace (4 per SM on 132 SMs)."""

BWD_SMEM_DW_COLS = 40960
"""Up to this N the persistent backward keeps its dw accumulators in shared memory (the kernel agrees)."""


def bwd_signature(case: Case) -> list[ArgSpec]:
    """Buffers: x, w (float32), dy, rstd (float32, M) in; dx, dw (float32, N) out; ws workspace.

    ``ws`` (float32): ``BWD_WS_HEADER`` words then ``min(M, BWD_PARTS_MAX)`` rows of N dw
    partial sums for the persistent kernel (ALGO 1); handed over and returned all zeros.
    """
    m, n = case["M"], case["N"]
    return [ArgSpec("x", m * n, case.dtype, "in"), ArgSpec("w", n, "float32", "in"),
            ArgSpec("dy", m * n, case.dtype, "in"), ArgSpec("rstd", m, "float32", "in"),
            ArgSpec("dx", m * n, case.dtype, "out"), ArgSpec("dw", n, "float32", "out"),
            ArgSpec("ws", BWD_WS_HEADER + min(m, BWD_PARTS_MAX) * n, "float32", "workspace")]


def bwd_scalars(case: Case) -> list[tuple[str, int | float]]:
    """Scalars: M, N, dtype_code."""
    return [("int32", case["M"]), ("int32", case["N"]), ("int32", DTYPE_CODES[case.dtype])]


def bwd_make_inputs(case: Case, rng: np.random.Generator, xp: Any = np) -> dict[str, Any]:
    """x as in the forward, dy standard normal, w standard normal, rstd of x (float32).

    dy is a deferred draw (:func:`fitness.normal_draw`, M x N; x is not: rstd is computed from it)."""
    m, n = case["M"], case["N"]
    rng = _host_rng(rng)
    x = _normal(rng, xp, (m, n), scale=_row_scales(rng, m))
    dy = normal_draw(rng, (m, n))
    w = _normal(rng, xp, (n,))
    rstd = (1.0 / xp.sqrt(_rms_rows(x, xp) + EPS)).astype(xp.float32)
    return {"x": x.reshape(-1), "w": w, "dy": dy, "rstd": rstd}


def bwd_reference(inputs: Mapping[str, Any], case: Case, xp: Any = np) -> dict[str, Any]:
    """dx = rstd * (w*dy - xhat * mean(xhat * w*dy)), dw = sum_rows(dy * xhat), float64 sums."""
    m, n = case["M"], case["N"]
    dx = xp.empty((m, n), dtype=xp.float32)
    dw = xp.zeros(n, dtype=xp.float64)
    w = _host(inputs["w"], xp).astype(xp.float64)
    x_all = _host(inputs["x"], xp).reshape(m, n)
    dy_all = _host(inputs["dy"], xp).reshape(m, n)
    rstd_all = _host(inputs["rstd"], xp).astype(xp.float64)
    step = max(1, (1 << 23) // max(n, 1))
    for i in range(0, m, step):
        x = x_all[i : i + step].astype(xp.float64)
        dy = dy_all[i : i + step].astype(xp.float64)
        r = rstd_all[i : i + step][:, None]
        xhat = x * r
        g = dy * w[None, :]
        c = (xhat * g).mean(axis=1, keepdims=True)
        dx[i : i + step] = (r * (g - xhat * c)).astype(xp.float32)
        dw += (dy * xhat).sum(axis=0)
    return {"dx": dx.reshape(-1), "dw": dw.astype(xp.float32)}


def bwd_launch(params: Mapping[str, Any], case: Case, device: DeviceInfo | Mapping[str, Any] | None = None) -> Launch:
    """ALGO 0: ``ceil(N / 32)`` dw column CTAs, then one CTA per row for dx. ALGO 1: a persistent
    grid of ``min(M, CTAS_PER_SM * SMs, BWD_PARTS_MAX)`` CTAs, with N float32 of dynamic shared
    memory for the dw accumulators when SMEM_DW and N <= BWD_SMEM_COLS (see docs/rmsnorm.md); with
    SPLIT = S > 1 clusters of S CTAs, each cluster taking the rows a CTA would (S times
    ``min(M, CTAS_PER_SM * SMs // S, BWD_PARTS_MAX // S)`` CTAs, so at least one cluster)."""
    m, n = case["M"], case["N"]
    threads = _p(params, "THREADS")
    if int(params.get("ALGO", 0)) == 0:
        return Launch(grid=(-(-n // 32) + m, 1, 1), block=(threads, 1, 1))
    split = int(params.get("SPLIT", 1))
    rows = max(1, min(m, _p(params, "CTAS_PER_SM") * _sm_count(device) // split, BWD_PARTS_MAX // split))
    smem = bwd_dw_smem_bytes(params, case) + bwd_stage_bytes(params, case)
    return Launch(grid=(rows * split, 1, 1), block=(threads, 1, 1), shared_mem=smem,
                  cluster=(split, 1, 1) if split > 1 else None)


def bwd_dw_smem_bytes(params: Mapping[str, Any], case: Case) -> int:
    """ALGO 1: bytes of dynamic shared memory for the dw accumulators (N float32 with SMEM_DW and
    N <= BWD_SMEM_DW_COLS, else 0); the staged rows (STAGES) come after them."""
    n = case["N"]
    return 4 * n if int(params.get("SMEM_DW", 1)) and n <= BWD_SMEM_DW_COLS else 0


def bwd_stage_bytes(params: Mapping[str, Any], case: Case) -> int:
    """ALGO 1 with STAGES = S: bytes of shared memory for S slots of staged rows, or 0 (not staged).

    The rows are staged where the kernel holds them in registers: rows of whole 16-byte chunks
    taken by ROW_WARP warps (``N / E <= MAX_CHUNKS * 32 * ROW_WARP``, a row per row group, ``WARPS /
    ROW_WARP`` groups) or by the CTA (``N / E <= MAX_CHUNKS * THREADS``, one row). A slot holds a row
    of x and one of dy per group, so S slots take ``S * groups * 2 * N * elem`` bytes. They are given
    only when, after the dw accumulators and the kernel's static arrays, they let CTAS_PER_SM CTAs
    share an SM (1 KB per CTA is the system's), at most the per-CTA limit; otherwise the kernel loads
    the rows into registers as without STAGES (it reads the size it was given).
    """
    stages = int(params.get("STAGES", 0))
    if int(params.get("ALGO", 0)) != 1 or stages <= 0:
        return 0
    row = case["N"] * DTYPE_BYTES[case.dtype]
    if row % 16:
        return 0
    nch, threads, chunks, rw = row // 16, _p(params, "THREADS"), _p(params, "MAX_CHUNKS"), int(params.get("ROW_WARP", 0))
    if rw and nch <= chunks * 32 * rw:
        groups = threads // 32 // rw
    elif nch <= chunks * threads:
        groups = 1
    else:
        return 0
    need = stages * groups * 2 * row
    per_cta = _smem_per_cta(_p(params, "CTAS_PER_SM"), 4 * threads + 16)  # static: red[THREADS] and the ticket
    return need if bwd_dw_smem_bytes(params, case) + need <= per_cta else 0


def bwd_bytes_moved(case: Case) -> int:
    """``3*M*N*elem + 4*M + 8*N``: read x and dy, write dx, read rstd, read w and write dw."""
    m, n = case["M"], case["N"]
    return 3 * m * n * DTYPE_BYTES[case.dtype] + 4 * m + 8 * n


def _b_persistent(p: Mapping[str, Any]) -> bool:
    return int(p["ALGO"]) == 1


def _b_columns(p: Mapping[str, Any]) -> bool:
    return int(p["ALGO"]) == 0


def _c_bwd_registers(p: Mapping[str, Any]) -> bool:
    return int(p["ALGO"]) == 0 or int(p["THREADS"]) < 1024 or int(p["MAX_CHUNKS"]) <= 2


def _c_bwd_prefetch(p: Mapping[str, Any]) -> bool:
    return int(p["ALGO"]) == 0 or not int(p["PREFETCH"]) or int(p["MAX_CHUNKS"]) * int(p["THREADS"]) <= 1024


def _c_bwd_row_warp(p: Mapping[str, Any]) -> bool:
    return int(p["ALGO"]) == 0 or not int(p["ROW_WARP"]) or int(p["MAX_CHUNKS"]) * int(p["THREADS"]) <= 2048


def _c_bwd_row_groups(p: Mapping[str, Any]) -> bool:
    return int(p["ALGO"]) == 0 or int(p["ROW_WARP"]) <= 1 or int(p["THREADS"]) <= 256 * int(p["ROW_WARP"])


def _c_bwd_stages(p: Mapping[str, Any]) -> bool:
    return int(p["ALGO"]) == 0 or not int(p["STAGES"]) or int(p["THREADS"]) <= 512


def _c_bwd_dw_regs(p: Mapping[str, Any]) -> bool:
    if int(p["ALGO"]) == 0 or not int(p["DW_REGS"]):
        return True
    tile = int(p["MAX_CHUNKS"]) * int(p["THREADS"])
    return int(p["THREADS"]) <= 512 and tile <= 2048 and (not int(p["PREFETCH"]) or tile <= 512)


def _c_bwd_split(p: Mapping[str, Any]) -> bool:
    return int(p["ALGO"]) == 0 or int(p["SPLIT"]) == 1 or not (int(p["ROW_WARP"]) or int(p["TREE"])
                                                            or int(p["STAGES"]))


def _b_prefetch(p: Mapping[str, Any]) -> bool:
    return int(p["ALGO"]) == 1 and not int(p["STAGES"])


def backward_param_space() -> ParamSpace:
    """The backward kernel's knobs (both algorithms) and the rules a valid assignment follows."""
    return ParamSpace(
        params={"ALGO": Choice([0, 1]), "THREADS": Choice([128, 256, 512, 1024]), "UNROLL": Choice([1, 2, 4, 8]),
                "LOAD_HINT": Choice([0, 1, 2]), "MAX_CHUNKS": Choice([1, 2, 4, 8]),
                "CTAS_PER_SM": Choice([1, 2, 3, 4]), "SMEM_DW": Choice([0, 1]), "REDUCERS": Choice([8, 32, 64]),
                "PREFETCH": Choice([0, 1]), "ROW_WARP": Choice([0, 1, 2, 4]), "TREE": Choice([0, 4, 8, 16]),
                "STAGES": Choice([0, 1, 2, 3]), "DW_REGS": Choice([0, 1]), "SPLIT": Choice([1, 2, 4]),
                "DTYPE_BUILD": Choice([0, 1], default=0)},
        constraints=(
            Constraint("ALGO 1 at 1024 threads: MAX_CHUNKS <= 2 (64 registers per thread; more chunks spill)",
                       _c_bwd_registers),
            Constraint("ALGO 1 with PREFETCH: MAX_CHUNKS * THREADS <= 1024 (two rows of chunks in registers; "
                       "more spills)", _c_bwd_prefetch),
            Constraint("ALGO 1 with ROW_WARP: MAX_CHUNKS * THREADS <= 2048 (dw accumulators in registers; "
                       "more spills)", _c_bwd_row_warp),
            Constraint("ALGO 1 with ROW_WARP > 1: THREADS <= 256 * ROW_WARP (at most 8 row groups, one named "
                       "barrier each)", _c_bwd_row_groups),
            Constraint("ALGO 1 with STAGES: THREADS <= 512 (at 1024 threads, 64 registers per thread, the "
                       "staging addresses spill)", _c_bwd_stages),
            Constraint("ALGO 1 with DW_REGS: THREADS <= 512 and MAX_CHUNKS * THREADS <= 2048, <= 512 with "
                       "PREFETCH (the dw sums in registers next to the rows; more spills)", _c_bwd_dw_regs),
            Constraint("ALGO 1 with SPLIT > 1 (a row over a cluster of CTAs): ROW_WARP 0, TREE 0 and STAGES 0",
                       _c_bwd_split),
        ),
        # Knobs one algorithm does not read (the engine pins them to these defaults there).
        conditions=(
            Condition("UNROLL", _b_columns, 4, "UNROLL only with ALGO 0"),
            Condition("MAX_CHUNKS", _b_persistent, 4, "MAX_CHUNKS only with ALGO 1"),
            Condition("CTAS_PER_SM", _b_persistent, 2, "CTAS_PER_SM only with ALGO 1"),
            Condition("SMEM_DW", _b_persistent, 1, "SMEM_DW only with ALGO 1"),
            Condition("REDUCERS", _b_persistent, 32, "REDUCERS only with ALGO 1"),
            Condition("PREFETCH", _b_prefetch, 0, "PREFETCH only with ALGO 1 and STAGES 0 (STAGES stages the "
                      "next rows in shared memory instead)"),
            Condition("ROW_WARP", _b_persistent, 0, "ROW_WARP only with ALGO 1"),
            Condition("TREE", _b_persistent, 0, "TREE only with ALGO 1"),
            Condition("STAGES", _b_persistent, 0, "STAGES only with ALGO 1"),
            Condition("DW_REGS", _b_persistent, 0, "DW_REGS only with ALGO 1"),
            Condition("SPLIT", _b_persistent, 1, "SPLIT only with ALGO 1"),
        ),
    )


BWD_SEED_PARAMS: dict[str, int] = {"ALGO": 0, "THREADS": 256, "UNROLL": 4, "LOAD_HINT": 0, "MAX_CHUNKS": 4,
                                   "CTAS_PER_SM": 2, "SMEM_DW": 1, "REDUCERS": 32, "PREFETCH": 0,
                                   "ROW_WARP": 0, "TREE": 0, "STAGES": 0, "DW_REGS": 0, "SPLIT": 1, "DTYPE_BUILD": 0}
"""The first backward seed: column and row CTAs (ALGO 0)."""

BWD_PERSISTENT_SEEDS: tuple[dict[str, int], ...] = (
    # 16-byte chunks in registers: THREADS * MAX_CHUNKS * (8 half / 4 float) columns of a row per CTA
    {"THREADS": 128, "MAX_CHUNKS": 1, "CTAS_PER_SM": 4},   # N = 1K (16-bit)
    {"THREADS": 128, "MAX_CHUNKS": 1, "CTAS_PER_SM": 4, "PREFETCH": 1, "REDUCERS": 64},  # 1K, next row in flight
    # a warp per row, dw in registers: N <= MAX_CHUNKS * 32 chunks (1K 16-bit with 4, 1K fp32 with 8)
    {"THREADS": 128, "MAX_CHUNKS": 4, "CTAS_PER_SM": 3, "PREFETCH": 1, "ROW_WARP": 1, "REDUCERS": 64},
    {"THREADS": 128, "MAX_CHUNKS": 8, "CTAS_PER_SM": 3, "ROW_WARP": 1, "REDUCERS": 64},
    {"THREADS": 256, "MAX_CHUNKS": 2, "CTAS_PER_SM": 2},   # N = 4K (16-bit), 2K (fp32)
    {"THREADS": 256, "MAX_CHUNKS": 8, "CTAS_PER_SM": 2},   # N = 16K (16-bit), 8K (fp32)
    {"THREADS": 512, "MAX_CHUNKS": 8, "CTAS_PER_SM": 1},   # N = 16K (fp32)
    # four warps per row (a named barrier per row group, not the CTA's): N = 4K (16-bit) with 4 chunks
    {"THREADS": 256, "MAX_CHUNKS": 4, "CTAS_PER_SM": 2, "ROW_WARP": 4, "REDUCERS": 64},
    {"THREADS": 128, "MAX_CHUNKS": 4, "CTAS_PER_SM": 3, "ROW_WARP": 4, "PREFETCH": 1, "REDUCERS": 64},
    # 1K (16-bit): two warps per row, the partials summed in groups of 8 CTAs while others still stream
    {"THREADS": 256, "MAX_CHUNKS": 2, "CTAS_PER_SM": 2, "ROW_WARP": 2, "TREE": 8},
)
"""Persistent (ALGO 1) seeds: x and dy read once, per-CTA dw partials reduced by the last CTAs."""


def make_backward_problem(timed: Sequence[Mapping[str, int]] | None = None, dtypes: Sequence[str] | None = None,
                          quick: bool = False) -> Problem:
    """The RMSNorm backward Problem (dx and dw; deterministic dw).

    Args:
        timed: Timed shapes (default M=32768 x N in 1024, 4096, 16384; quick: N=4096 only).
        dtypes: Storage dtypes (default bfloat16, float16, float32).
        quick: Fewer timed shapes.
    """
    if timed is None:
        timed = [{"M": 32768, "N": 4096}] if quick else [{"M": 32768, "N": n} for n in (1024, 4096, 16384)]
    dts = tuple(dtypes) if dtypes is not None else ("bfloat16", "float16", "float32")
    src = (KERNEL_DIR / "rmsnorm_bwd.cu").read_text()
    space = backward_param_space()
    tol = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
    prob = Problem(
        name="rmsnorm_bwd_h100",
        description=("RMSNorm backward: dx = rstd*(w*dy - xhat*mean_j(xhat*w*dy)), xhat = x*rstd; "
                     "dw[j] = sum_i dy[i,j]*xhat[i,j] (deterministic). Signature (x, w, dy, rstd, dx, dw, ws, "
                     "int M, int N, int dtype_code); ws is a workspace, handed over and returned all zeros."),
        params=space,
        check_shapes=tuple(s for s in CHECK_SHAPES[:-1] if s["N"] > 1),
        timed_shapes=tuple(timed),
        dtypes=dts,
        tolerances={d: tol[d] for d in dts},
        target="sm_90a",
        dtype_defines=dtype_defines,
        signature=bwd_signature,
        scalars=bwd_scalars,
        make_inputs=bwd_make_inputs,
        reference=bwd_reference,
        launch=bwd_launch,
        bytes_moved=bwd_bytes_moved,
        objective="geomean_fraction",
        descriptors=(CategoricalAxis("THREADS", [128, 256, 512, 1024], source="params"),
                     NumericAxis("registers", 0, 256, 8, source="resources")),
        seeds=(Genome(src, BWD_SEED_PARAMS, entry=BWD_ENTRY),) + tuple(
            Genome(src, {**BWD_SEED_PARAMS, "ALGO": 1, **p}, entry=BWD_ENTRY) for p in BWD_PERSISTENT_SEEDS),
        extra={"eps": EPS, "byte_model": "3*M*N*elem + 4*M + 8*N"},
    )
    return prob.validate()

