"""Input helpers for a Problem's ``make_inputs(case, rng, xp)``.

Every evaluation draws fresh inputs, and for memory-bound problems the timed shapes are
many GiB; drawing them with whole-array operations (a generator call, then scaling and
shifting passes) can cost more GPU time than timing the kernel. :func:`random_normal`
draws them in one pass on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fitness._fused import fused_for

__all__ = ["random_normal", "seed_from"]


def seed_from(rng: Any) -> int:
    """A 63-bit seed drawn from ``rng`` (a numpy Generator, a cupy Generator or an int)."""
    if isinstance(rng, (int, np.integer)):
        return int(rng) & (2**63 - 1)
    draw = rng.integers(0, 2**62, size=1)
    return int(draw.get()[0] if hasattr(draw, "get") else draw[0])


def random_normal(rng: Any, shape: int | Sequence[int], xp: Any = np, *, scale: Any = None,
                  shift: Any = None) -> Any:
    """Standard normal float32 values, optionally ``z * scale[row] + shift[row]``.

    On cupy the values come from a fused counter-based generator (one write pass, no
    temporaries); on numpy from ``numpy.random.default_rng``. Both are seeded from
    ``rng``, so an evaluation's secret seed determines them (the two modules give
    different values for one seed).

    Args:
        rng: Where the seed comes from (:func:`seed_from`).
        shape: Output shape; rows are ``shape[0]``.
        xp: ``numpy`` or ``cupy``.
        scale: Optional per-row multipliers (``shape[0]`` values, any array module).
        shift: Optional per-row offsets, added after scaling.

    Returns:
        A float32 ``xp`` array of ``shape``.

    Raises:
        ValueError: ``scale`` or ``shift`` does not have one value per row.
    """
    shp = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    seed = seed_from(rng)
    fused = fused_for(xp)
    if fused is not None:
        return fused.normal(seed, shp, scale=scale, shift=shift)
    out = np.random.default_rng(seed).standard_normal(shp, dtype=np.float32)
    rows = shp[0] if shp else 1
    tail = (rows,) + (1,) * (len(shp) - 1)
    for v, op in ((scale, np.multiply), (shift, np.add)):
        if v is None:
            continue
        host = np.asarray(v.get() if hasattr(v, "get") else v, dtype=np.float32).reshape(-1)
        if host.size != rows:
            raise ValueError(f"per-row vector has {host.size} values for {rows} rows")
        op(out, host.reshape(tail), out=out)
    return xp.asarray(out)
