"""Islands: separate parent pools over one archive, with periodic migration.

Every island keeps its own small MAP-Elites view (cell -> best genome id and fitness)
built from the children proposed on that island. Parents are drawn from the island's
own pool, so lines of descent evolve apart; the archive still holds every record.
Every ``migration_interval`` evaluations each island's best elite is copied into the
next island's pool (ring topology), which spreads good genomes without merging the
populations. An island whose pool is still empty borrows parents from the whole archive.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evo._selection import Entry

__all__ = ["Islands"]


class Islands:
    """Parent pools of ``n`` islands.

    Args:
        n: Number of islands (>= 1).
    """

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"islands must be >= 1, got {n}")
        self.n = int(n)
        self.pools: list[dict[str, tuple[str, float]]] = [{} for _ in range(self.n)]
        self.migrations = 0

    def add(self, island: int, entry: Entry) -> bool:
        """Offer an OK record to an island's pool; True when it became the cell's elite there."""
        pool = self.pools[island % self.n]
        cur = pool.get(entry.cell)
        if cur is None or entry.fitness > cur[1]:
            pool[entry.cell] = (entry.id, float(entry.fitness))
            return True
        return False

    def entries(self, island: int) -> list[Entry]:
        """The island's elites (sorted by cell key, so draws are reproducible)."""
        pool = self.pools[island % self.n]
        return [Entry(pool[c][0], pool[c][1], c) for c in sorted(pool)]

    def best(self, island: int) -> Entry | None:
        """The island's best elite, or None while its pool is empty."""
        es = self.entries(island)
        return max(es, key=lambda e: e.fitness) if es else None

    def migrate(self) -> list[tuple[int, int, str]]:
        """Copy each island's best into the next island's pool (ring).

        Returns:
            ``(from_island, to_island, genome_id)`` for each copy made.
        """
        if self.n < 2:
            return []
        bests = [self.best(i) for i in range(self.n)]
        moved = []
        for i, b in enumerate(bests):
            if b is not None:
                dst = (i + 1) % self.n
                self.add(dst, b)
                moved.append((i, dst, b.id))
        self.migrations += 1
        return moved

    def state(self) -> dict[str, Any]:
        """Plain data for the engine state."""
        return {"n": self.n, "migrations": self.migrations,
                "pools": [{c: [v[0], v[1]] for c, v in p.items()} for p in self.pools]}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state` output (pools beyond ``n`` are folded into the last island)."""
        self.migrations = int(state.get("migrations", 0))
        for i, p in enumerate(state.get("pools", [])):
            for c, v in p.items():
                self.add(min(i, self.n - 1), Entry(str(v[0]), float(v[1]), str(c)))
