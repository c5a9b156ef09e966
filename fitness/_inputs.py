"""Input helpers for a Problem's ``make_inputs(case, rng, xp)``.

Every evaluation draws fresh inputs, and for memory-bound problems the timed shapes are
many GiB; drawing them with whole-array operations (a generator call, then scaling and
shifting passes) can cost more GPU time than timing the kernel. :func:`random_normal`
draws them in one pass on the device, and :func:`normal_draw` defers the draw so that the
harness writes the values straight into an input buffer in its storage type (one write
of 2 bytes per bfloat16 element, where drawing float32 values and then storing them reads
and writes 10).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fitness._fused import fused_for

__all__ = ["NormalDraw", "materialize", "normal_draw", "random_normal", "seed_from"]


def seed_from(rng: Any) -> int:
    """A 63-bit seed drawn from ``rng`` (a numpy Generator, a cupy Generator or an int)."""
    if isinstance(rng, (int, np.integer)):
        return int(rng) & (2**63 - 1)
    draw = rng.integers(0, 2**62, size=1)
    return int(draw.get()[0] if hasattr(draw, "get") else draw[0])


def _shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)


@dataclass(frozen=True, eq=False)
class NormalDraw:
    """Standard normal float32 values not drawn yet (from :func:`normal_draw`).

    A Problem's ``make_inputs`` may return one for an input: the harness then draws the
    values straight into the input's buffer, rounded to its storage type, in one pass on
    the device (:meth:`store_into`). :meth:`values` gives the float32 array for any other
    use; :func:`materialize` does that for a whole ``make_inputs`` result. The values
    depend only on the seed, the shape and the per-row vectors: storing a draw gives the
    bits that storing its :meth:`values` gives.

    Attributes:
        seed: The generator's seed (from :func:`seed_from` of the caller's rng).
        shape: The values' shape; rows are ``shape[0]``.
        scale: Optional per-row multipliers (``shape[0]`` values, any array module).
        shift: Optional per-row offsets, added after scaling.
    """

    seed: int
    shape: tuple[int, ...]
    scale: Any = None
    shift: Any = None

    @property
    def size(self) -> int:
        """Number of values."""
        return math.prod(self.shape)

    def values(self, xp: Any = np) -> Any:
        """The float32 values as an ``xp`` array of :attr:`shape` (drawn now).

        On cupy they come from a fused counter-based generator (one write pass, no
        temporaries); on numpy from ``numpy.random.default_rng``; the two modules give
        different values for one seed.

        Raises:
            ValueError: ``scale`` or ``shift`` does not have one value per row.
        """
        shp = self.shape
        fused = fused_for(xp)
        if fused is not None:
            return fused.normal(self.seed, shp, scale=self.scale, shift=self.shift)
        out = np.random.default_rng(self.seed).standard_normal(shp, dtype=np.float32)
        rows = shp[0] if shp else 1
        tail = (rows,) + (1,) * (len(shp) - 1)
        for v, op in ((self.scale, np.multiply), (self.shift, np.add)):
            if v is None:
                continue
            host = np.asarray(v.get() if hasattr(v, "get") else v, dtype=np.float32).reshape(-1)
            if host.size != rows:
                raise ValueError(f"per-row vector has {host.size} values for {rows} rows")
            op(out, host.reshape(tail), out=out)
        return xp.asarray(out)

    def store_into(self, dst: Any, dtype: str, xp: Any) -> None:
        """Draw the values into ``dst``, rounded to the storage of ``dtype``.

        On cupy, for float32, float16 and bfloat16 buffers that are C-contiguous, the
        generator writes the storage directly (no float32 array); otherwise this is
        :func:`fitness._dtypes.store_into` of :meth:`values`. Both give the same bits.

        Args:
            dst: An array of ``storage_dtype(dtype)`` with :attr:`size` elements.
            dtype: The buffer's Problem dtype.
            xp: ``numpy`` or ``cupy``.

        Raises:
            ValueError: ``dst`` has the wrong dtype or element count, or the per-row
                vectors do not have one value per row.
        """
        from fitness._dtypes import check_destination, store_into
        from fitness._fused import NORMAL_DTYPES

        check_destination(dst, dtype, self.size)
        fused = fused_for(xp) if dtype in NORMAL_DTYPES else None
        if fused is not None and dst.flags.c_contiguous:
            fused.normal(self.seed, self.shape, scale=self.scale, shift=self.shift, dtype=dtype, out=dst)
            return
        store_into(dst, self.values(xp).reshape(-1), dtype, xp)


def normal_draw(rng: Any, shape: int | Sequence[int], *, scale: Any = None, shift: Any = None) -> NormalDraw:
    """A deferred :func:`random_normal`: takes its seed from ``rng`` now, draws later.

    ``random_normal(rng, shape, xp, scale=s, shift=t)`` equals
    ``normal_draw(rng, shape, scale=s, shift=t).values(xp)`` for the same ``rng`` state.
    Return it from ``make_inputs`` for a large input whose values nothing else in
    ``make_inputs`` reads: the Timing stage then spends one storage write per element on it.

    Args:
        rng: Where the seed comes from (:func:`seed_from`).
        shape: Values' shape; rows are ``shape[0]``.
        scale: Optional per-row multipliers (``shape[0]`` values, any array module).
        shift: Optional per-row offsets, added after scaling.
    """
    return NormalDraw(seed_from(rng), _shape(shape), scale, shift)


def materialize(values: Mapping[str, Any], xp: Any = np) -> dict[str, Any]:
    """``make_inputs``'s result with every :class:`NormalDraw` drawn as an ``xp`` float32 array."""
    return {k: (v.values(xp) if isinstance(v, NormalDraw) else v) for k, v in values.items()}


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
    return normal_draw(rng, shape, scale=scale, shift=shift).values(xp)
