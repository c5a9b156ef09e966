"""Parent selection over an island's elites: uniform, fitness (rank-weighted), curiosity.

* ``"uniform"``: every elite equally likely (MAP-Elites' classic choice: diversity
  comes from the grid, not from selection pressure).
* ``"fitness"``: linear rank weighting; the best of ``k`` elites has weight ``k``, the
  worst weight 1, so pressure is bounded and independent of the fitness scale.
* ``"curiosity"``: the curiosity score of Cully & Demiris (2018), as used by QD
  libraries: a cell gains +1 each time a child of one of its elites entered the
  archive (new cell or improved cell) and loses 0.5 when a child did not; parents are
  drawn with weight ``score - min_score + 1`` so productive regions get more draws and
  nothing is starved.

Draws are without replacement when the pool is large enough, so a two-parent operator
gets two different parents.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["STRATEGIES", "Curiosity", "Entry", "cell_key", "select"]

STRATEGIES = ("uniform", "fitness", "curiosity")


def cell_key(cell: Sequence[int] | None) -> str:
    """Text key of an archive cell (``"3,1"``; ``"-"`` for no cell)."""
    return "-" if cell is None else ",".join(str(int(i)) for i in cell)


@dataclass(frozen=True)
class Entry:
    """A selectable parent: genome id, fitness and archive cell key."""

    id: str
    fitness: float
    cell: str = "-"


class Curiosity:
    """Per-cell curiosity scores (+``reward`` on success, -``penalty`` otherwise)."""

    def __init__(self, reward: float = 1.0, penalty: float = 0.5) -> None:
        self.reward = reward
        self.penalty = penalty
        self.scores: dict[str, float] = {}

    def update(self, cell: str, success: bool) -> None:
        """Credit (or debit) the cell whose elite was a parent."""
        self.scores[cell] = self.scores.get(cell, 0.0) + (self.reward if success else -self.penalty)

    def score(self, cell: str) -> float:
        """Current score of a cell (0 if never a parent)."""
        return self.scores.get(cell, 0.0)

    def state(self) -> dict[str, float]:
        """Plain data for the engine state."""
        return dict(self.scores)

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state` output."""
        self.scores = {str(k): float(v) for k, v in state.items()}


def _weights(entries: Sequence[Entry], strategy: str, curiosity: Curiosity | None) -> np.ndarray:
    k = len(entries)
    if strategy == "uniform":
        return np.ones(k)
    if strategy == "fitness":
        order = np.argsort([-e.fitness for e in entries], kind="stable")
        w = np.empty(k)
        w[order] = np.arange(k, 0, -1, dtype=float)
        return w
    if strategy == "curiosity":
        cur = curiosity or Curiosity()
        s = np.array([cur.score(e.cell) for e in entries], dtype=float)
        return s - s.min() + 1.0
    raise ValueError(f"unknown selection strategy {strategy!r}: use one of {STRATEGIES}")


def select(entries: Sequence[Entry], n: int, rng: np.random.Generator, strategy: str = "uniform",
           curiosity: Curiosity | None = None) -> list[Entry]:
    """Draw ``n`` parents from ``entries``.

    Args:
        entries: The pool (an island's elites).
        n: How many parents.
        rng: Random source.
        strategy: ``"uniform"``, ``"fitness"`` or ``"curiosity"``.
        curiosity: Scores for ``"curiosity"``.

    Returns:
        ``n`` entries, distinct when the pool has at least ``n``; empty if the pool is empty.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown selection strategy {strategy!r}: use one of {STRATEGIES}")
    if n <= 0 or not entries:
        return []
    w = _weights(entries, strategy, curiosity)
    p = w / w.sum()
    idx = rng.choice(len(entries), size=n, replace=len(entries) < n, p=p)
    return [entries[int(i)] for i in idx]
