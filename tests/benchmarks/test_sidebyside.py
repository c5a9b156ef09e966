"""benchmarks/sidebyside.py: the alternating order, the rounds hook and the summary line."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import sidebyside  # noqa: E402


def test_alternate_reverses_every_other_round_and_calls_the_hook() -> None:
    calls: list[str] = []
    syncs: list[int] = []
    rounds: list[int] = []
    order = [("a", lambda: calls.append("a")), ("b", lambda: calls.append("b")), ("c", lambda: calls.append("c"))]
    times = sidebyside.alternate(order, 3, lambda: syncs.append(1), lambda: rounds.append(len(calls)))
    assert calls == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert rounds == [3, 6, 9] and len(syncs) == 2 * 9
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(t >= 0 for v in times.values() for t in v)


def test_versus_line_and_medians() -> None:
    times = {"old": [3.0, 1.0, 2.0], "new": [1.0, 0.5, 2.0]}
    assert sidebyside.medians(times) == {"old": 2.0, "new": 1.0}
    assert sidebyside.versus(times, "old", "new") == "old 1.0000-3.0000 s, new 0.5000-2.0000 s, median ratio 2.00x"
