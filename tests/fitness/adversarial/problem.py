"""The adversarial suite's Problem: "rowscale", an RMSNorm-like row normalisation.

``y[i, j] = x[i, j] * rsqrt(mean(x[i, :]**2) + eps) * w[j]`` with ``x`` and ``y`` in the
case's storage dtype (float32 or bfloat16) and ``w`` in float32. Kernel arguments:
``(const void* x, const float* w, void* y, int M, int N, float eps, int is_bf16)``, one
block of ``THREADS`` threads per row.

Every callable is a top-level function so the Problem pickles into spawned workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from evo.space import Choice, ParamSpace
from evo.types import DTYPE_BYTES, ArgSpec, Case, DeviceInfo, Genome, Launch, Problem
from fitness import random_normal

EPS = 1e-6
KERNELS = Path(__file__).with_name("kernels")

#: Checked shapes: one row, a single column, odd N, N not a multiple of 4, N > block.
CHECK_SHAPES: tuple[dict[str, int], ...] = (
    {"M": 1, "N": 1024},
    {"M": 3, "N": 1},
    {"M": 7, "N": 777},
    {"M": 64, "N": 1026},
    {"M": 5, "N": 4099},
)
TIMED_SHAPES: tuple[dict[str, int], ...] = ({"M": 4096, "N": 1024},)
#: QuACK's 11 forward shapes (the RMSNorm benchmark matrix).
STANDARD_SHAPES: tuple[dict[str, int], ...] = tuple(
    [{"M": 32768, "N": n} for n in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)]
    + [{"M": 16384, "N": 131072}, {"M": 8192, "N": 262144}])


def signature(case: Case) -> list[ArgSpec]:
    """x (M*N, case dtype), w (N, float32) in; y (M*N, case dtype) out."""
    m, n = case["M"], case["N"]
    return [ArgSpec("x", m * n, case.dtype, "in"), ArgSpec("w", n, "float32", "in"),
            ArgSpec("y", m * n, case.dtype, "out")]


def scalars(case: Case) -> list[tuple[str, int | float]]:
    """M, N, eps and the bf16 flag."""
    return [("int32", case["M"]), ("int32", case["N"]), ("float32", EPS),
            ("int32", 1 if case.dtype == "bfloat16" else 0)]


def make_inputs(case: Case, rng: Any, xp: Any) -> dict[str, Any]:
    """Heavy-tailed rows (per-row scale e^(1.5 z)), a non-zero mean, weights around 1."""
    m, n = case["M"], case["N"]
    scale = xp.exp(1.5 * rng.standard_normal(size=m, dtype=xp.float32)).astype(xp.float32)
    x = random_normal(rng, (m, n), xp, scale=scale, shift=0.25 * scale)  # one pass on the GPU
    w = (1.0 + 0.5 * rng.standard_normal(size=n, dtype=xp.float32)).astype(xp.float32)
    return {"x": x.reshape(-1), "w": w}


def reference(inputs: Mapping[str, Any], case: Case, xp: Any) -> dict[str, Any]:
    """float32 reference from the stored inputs (the mean of squares in float64)."""
    m, n = case["M"], case["N"]
    x = inputs["x"].reshape(m, n).astype(xp.float32, copy=False)  # upcast already: no second copy
    ms = xp.mean(x * x, axis=1, dtype=xp.float64)
    r = (1.0 / xp.sqrt(ms + EPS)).astype(xp.float32)
    y = x * r[:, None]
    y *= inputs["w"].astype(xp.float32)[None, :]
    return {"y": y.reshape(-1)}


def launch(params: Mapping[str, Any], case: Case, device: DeviceInfo) -> Launch:
    """One block of THREADS threads per row."""
    return Launch(grid=(case["M"], 1, 1), block=(int(params["THREADS"]), 1, 1))


def bytes_moved(case: Case) -> int:
    """Read x, write y, read w once."""
    return 2 * case["M"] * case["N"] * DTYPE_BYTES[case.dtype] + 4 * case["N"]


def make_problem(*, check_shapes: Iterable[Mapping[str, int]] = CHECK_SHAPES,
                 timed_shapes: Iterable[Mapping[str, int]] = TIMED_SHAPES,
                 dtypes: Iterable[str] = ("float32", "bfloat16"), objective: Any = "geomean_fraction") -> Problem:
    """The rowscale Problem with chosen shapes and dtypes."""
    return Problem(
        name="rowscale",
        description="y[i,j] = x[i,j] * rsqrt(mean(x[i,:]^2) + eps) * w[j]; x, y in the case dtype, w float32.",
        params=ParamSpace({"THREADS": Choice([64, 128, 256, 512, 1024])}),
        check_shapes=tuple(check_shapes),
        timed_shapes=tuple(timed_shapes),
        dtypes=tuple(dtypes),
        tolerances={"float32": 1e-5, "bfloat16": 1.6e-2, "float16": 2e-3},
        signature=signature,
        scalars=scalars,
        make_inputs=make_inputs,
        reference=reference,
        launch=launch,
        bytes_moved=bytes_moved,
        objective=objective,
    )


def problem() -> Problem:
    """The default suite problem (5 check shapes + 1 timed shape, float32 and bfloat16)."""
    return make_problem()


def standard_problem(dtypes: Iterable[str] = ("bfloat16",)) -> Problem:
    """The problem timed over the 11 standard RMSNorm shapes (for the benchmark)."""
    return make_problem(check_shapes=CHECK_SHAPES[:3], timed_shapes=STANDARD_SHAPES, dtypes=dtypes)


def genome(name: str, threads: int = 256) -> Genome:
    """The genome of kernel file ``kernels/<name>.cu`` (entry ``rowscale``)."""
    return Genome((KERNELS / f"{name}.cu").read_text(), {"THREADS": threads}, entry="rowscale")
