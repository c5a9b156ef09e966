"""Side-by-side timing for the benchmarks: the ways being compared run in alternating order.

Each repeat runs every way once; odd repeats run them in reverse order, so drift of the
device (clocks, temperature, a neighbour's load) falls on all of them alike. Wall seconds
between device synchronisations, so each time is the device work issued by the way.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["alternate", "medians", "timed", "versus"]


def timed(fn: Callable[[], Any], sync: Callable[[], Any]) -> float:
    """Wall seconds of ``fn()`` between two calls of ``sync`` (a device synchronisation)."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def alternate(order: Sequence[tuple[str, Callable[[], Any]]], repeats: int, sync: Callable[[], Any],
              after_round: Callable[[], Any] | None = None) -> dict[str, list[float]]:
    """Seconds of every way, ``repeats`` times each, in alternating order.

    Args:
        order: ``(name, fn)`` of each way.
        repeats: Rounds (every way once per round).
        sync: The device synchronisation.
        after_round: Called after each round, untimed (e.g. to free a memory pool).
    """
    times: dict[str, list[float]] = {name: [] for name, _ in order}
    for r in range(repeats):
        for name, fn in order if r % 2 == 0 else order[::-1]:
            times[name].append(timed(fn, sync))
        if after_round is not None:
            after_round()
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """The median of each way's seconds."""
    return {k: statistics.median(v) for k, v in times.items()}


def versus(times: dict[str, list[float]], first: str, second: str) -> str:
    """``"<first> lo-hi s, <second> lo-hi s, median ratio R.RRx"`` (R: first's median over second's)."""
    med = medians(times)
    a, b = times[first], times[second]
    return (f"{first} {min(a):.4f}-{max(a):.4f} s, {second} {min(b):.4f}-{max(b):.4f} s, "
            f"median ratio {med[first] / med[second]:.2f}x")
