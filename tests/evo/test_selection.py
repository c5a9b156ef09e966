"""Parent selection strategies and islands."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from evo._islands import Islands
from evo._selection import Curiosity, Entry, cell_key, select


def _pool() -> list[Entry]:
    return [Entry(f"g{i}", float(i), f"{i},0") for i in range(5)]


def _counts(strategy: str, curiosity: Curiosity | None = None, n: int = 4000) -> collections.Counter[str]:
    rng = np.random.default_rng(0)
    c: collections.Counter[str] = collections.Counter()
    for _ in range(n):
        c[select(_pool(), 1, rng, strategy, curiosity)[0].id] += 1
    return c


def test_uniform_is_flat() -> None:
    c = _counts("uniform")
    assert set(c) == {f"g{i}" for i in range(5)}
    assert max(c.values()) / min(c.values()) < 1.3


def test_fitness_is_rank_weighted() -> None:
    c = _counts("fitness")
    # weights 5:4:3:2:1 for fitness 4..0
    assert c["g4"] > c["g3"] > c["g2"] > c["g1"] > c["g0"]
    assert 3.5 < c["g4"] / c["g0"] < 7.0


def test_curiosity_favours_productive_cells() -> None:
    cur = Curiosity()
    for _ in range(6):
        cur.update("2,0", True)
    for _ in range(4):
        cur.update("4,0", False)
    c = _counts("curiosity", cur)
    assert c["g2"] > 2 * c["g0"]
    assert c["g4"] > 0  # never starved
    assert c["g4"] < c["g0"]
    cur2 = Curiosity()
    cur2.load(cur.state())
    assert cur2.score("2,0") == 6.0 and cur2.score("4,0") == -2.0


def test_distinct_parents_and_edge_cases() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        a, b = select(_pool(), 2, rng, "fitness")
        assert a.id != b.id
    assert select([], 2, rng) == []
    one = [Entry("only", 1.0)]
    assert [e.id for e in select(one, 2, rng)] == ["only", "only"]
    with pytest.raises(ValueError, match="unknown selection strategy"):
        select(_pool(), 1, rng, "best")
    assert cell_key((3, 1)) == "3,1" and cell_key(None) == "-"


def test_islands_keep_elites_and_migrate_in_a_ring() -> None:
    isl = Islands(3)
    isl.add(0, Entry("a", 1.0, "0"))
    assert not isl.add(0, Entry("a2", 0.5, "0"))  # worse in the same cell
    assert isl.add(0, Entry("b", 3.0, "1"))
    isl.add(1, Entry("c", 2.0, "0"))
    assert isl.best(0).id == "b" and isl.best(2) is None
    moved = isl.migrate()
    assert (0, 1, "b") in moved and (1, 2, "c") in moved
    assert "b" in {e.id for e in isl.entries(1)}
    assert [e.id for e in isl.entries(2)] == ["c"]
    restored = Islands(3)
    restored.load(isl.state())
    assert restored.state() == isl.state()
    assert Islands(1).migrate() == []
    with pytest.raises(ValueError):
        Islands(0)
