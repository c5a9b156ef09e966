"""CPU emulation of the forward kernel's work split (head / vectors / tail, cluster ranks, rows).

A straight port of the index arithmetic in examples/kernels/rmsnorm_fwd.cu: every column of
every row must be read for the sum and written exactly once, for every alignment.
"""

from __future__ import annotations

import numpy as np
import pytest

from evo.types import Case
from examples.rmsnorm_problem import fwd_launch, rmsnorm_numpy


def emulate(x: np.ndarray, w: np.ndarray, p: dict, esz: int, x_off: int = 0, y_off: int = 0,
            eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """Run the kernel's index logic; return (y, write counts). x_off/y_off: base byte offsets mod 16."""
    m, n = x.shape
    vb, tpr, threads, cluster = p["VEC_BYTES"], p["TPR"], p["THREADS"], p["CLUSTER"]
    e = vb // esz
    rpc = threads // tpr
    launch = fwd_launch(p, Case({"M": m, "N": n}, {4: "float32", 2: "bfloat16"}[esz]), None)
    grid = launch.grid[0]
    assert launch.block[0] == threads and grid % cluster == 0
    groups = grid // cluster
    y = np.full((m, n), np.nan)
    writes = np.zeros((m, n), dtype=int)
    for g in range(groups):
        row0 = g * rpc
        while row0 < m:
            for r in range(rpc):
                row = row0 + r
                if row >= m:
                    continue
                ax = (x_off + row * n * esz) % vb
                ay = (y_off + row * n * esz) % vb
                if ax != ay or ax % esz:
                    head, nvec = n, 0
                else:
                    head = (vb - ax) // esz if ax else 0
                    head = min(head, n)
                    nvec = (n - head) // e
                body_end = head + nvec * e
                nscalar = n - nvec * e
                vpc = -(-nvec // cluster)
                acc_cols: list[int] = []
                for rank in range(cluster):
                    v0 = rank * vpc
                    nv_cta = min(max(nvec - v0, 0), vpc)
                    for t in range(tpr):
                        nmine = (nv_cta - 1 - t) // tpr + 1 if t < nv_cta else 0
                        for k in range(nmine):
                            c = head + (v0 + t + k * tpr) * e
                            acc_cols.extend(range(c, c + e))
                        s = rank + cluster * t
                        while s < nscalar:
                            acc_cols.append(s if s < head else s - head + body_end)
                            s += cluster * tpr
                cols = np.array(acc_cols, dtype=int)
                xs = x[row].astype(np.float64)
                rstd = 1.0 / np.sqrt((xs[cols] ** 2).sum() / n + eps)
                y[row, cols] = xs[cols] * rstd * w[cols]
                np.add.at(writes[row], cols, 1)
            row0 += groups * rpc
    return y, writes


CONFIGS = [
    {"THREADS": 128, "TPR": 32, "VEC_BYTES": 16, "CLUSTER": 1, "PERSISTENT": 0, "STAGE": 0},
    {"THREADS": 128, "TPR": 4, "VEC_BYTES": 8, "CLUSTER": 1, "PERSISTENT": 1, "STAGE": 2},
    {"THREADS": 64, "TPR": 64, "VEC_BYTES": 16, "CLUSTER": 4, "PERSISTENT": 0, "STAGE": 1},
    {"THREADS": 256, "TPR": 256, "VEC_BYTES": 4, "CLUSTER": 16, "PERSISTENT": 2, "STAGE": 0},
    {"THREADS": 64, "TPR": 16, "VEC_BYTES": 16, "CLUSTER": 1, "PERSISTENT": 8, "STAGE": 1},
]
SHAPES = [(1, 1), (3, 7), (2, 8), (5, 37), (17, 100), (4, 1031)]


@pytest.mark.parametrize("p", CONFIGS, ids=lambda p: "-".join(f"{v}" for v in p.values()))
@pytest.mark.parametrize("esz", [2, 4])
@pytest.mark.parametrize("offs", [(0, 0), (4, 4), (2, 6)])
def test_every_element_once(p: dict, esz: int, offs: tuple[int, int]) -> None:
    rng = np.random.default_rng(0)
    for m, n in SHAPES:
        if esz == 4 and offs[0] % 4:
            continue  # a float32 buffer is always 4-byte aligned
        x = rng.standard_normal((m, n))
        w = rng.standard_normal(n)
        y, writes = emulate(x, w, p, esz, *offs)
        assert (writes == 1).all(), f"shape {m}x{n}: columns written {np.unique(writes)} times"
        np.testing.assert_allclose(y, rmsnorm_numpy(x, w), rtol=1e-12, atol=1e-12)

