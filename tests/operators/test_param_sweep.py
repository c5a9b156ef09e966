"""param_sweep: one-knob neighbours that the archive has not seen, in a seeded random order."""

from __future__ import annotations

import pytest

from evo.space import Bool, Choice, Constraint, FloatRange, IntRange, ParamSpace
from evo.types import Genome, Problem
from operators import OperatorError, ParamMutation, ParamSweep, resolve
from operators.testing import CONTRACT_SOURCE, OperatorContract, make_context, make_record


class TestParamSweepContract(OperatorContract):
    def make_operator(self) -> ParamSweep:
        return ParamSweep(n_children=3)


def _tv_small(p):
    return p["THREADS"] * p["VEC"] <= 1024


SPACE = ParamSpace({"THREADS": Choice([64, 128, 256, 512]), "VEC": Choice([1, 2, 4, 8]), "U": IntRange(1, 9, 2),
                    "F": FloatRange(0.0, 1.0), "B": Bool()},
                   (Constraint("THREADS * VEC <= 1024", _tv_small),))
PROBLEM = Problem(name="t", params=SPACE, check_shapes=({"N": 7},))
PARENT = {"THREADS": 256, "VEC": 2, "U": 5, "F": 0.5, "B": False}


class _Seen:
    """An archive view that knows a set of genome ids."""

    def __init__(self, ids=()) -> None:
        self.ids = set(ids)

    def __contains__(self, gid: object) -> bool:
        return gid in self.ids


def _diff(a: dict, b: dict) -> set[str]:
    return {k for k in a if a[k] != b[k] or isinstance(a[k], bool) != isinstance(b[k], bool)}


def test_neighbourhood_is_every_valid_single_change() -> None:
    nb = ParamSweep().neighbours(Genome(CONTRACT_SOURCE, PARENT), SPACE)
    assert all(len(_diff(PARENT, n)) == 1 and SPACE.is_valid(n) for n in nb)
    threads = sorted(n["THREADS"] for n in nb if n["THREADS"] != PARENT["THREADS"])
    vec = sorted(n["VEC"] for n in nb if n["VEC"] != PARENT["VEC"])
    assert threads == [64, 128, 512]  # the whole line along a Choice
    assert vec == [1, 4]  # 8 breaks THREADS * VEC <= 1024: left out, not repaired
    assert sorted(n["U"] for n in nb if n["U"] != 5) == [3, 7]  # int range: neighbouring steps
    assert [n["B"] for n in nb if n["B"] != PARENT["B"]] == [True]
    assert len(nb) == len({tuple(sorted(n.items())) for n in nb})


def test_calls_walk_the_neighbourhood_without_repeats_then_say_local_optimum() -> None:
    op = ParamSweep(n_children=2)
    parent = make_record(Genome(CONTRACT_SOURCE, PARENT))
    total = len(op.neighbours(parent.genome, SPACE))
    seen = _Seen()
    got: list[str] = []
    for call in range(total):
        try:
            props = op.propose([parent], make_context(PROBLEM, call, archive=seen))
        except OperatorError as e:
            assert "local optimum" in str(e)
            break
        for p in props:
            assert p.genome.id not in seen and p.note  # the note names the one change
            seen.ids.add(p.genome.id)  # the engine archives what it evaluates
            got.append(p.genome.id)
    assert len(got) == total and len(set(got)) == total
    with pytest.raises(OperatorError, match="local optimum"):
        op.propose([parent], make_context(PROBLEM, 99, archive=seen))


def test_same_seed_same_order_and_registered_name() -> None:
    parent = make_record(Genome(CONTRACT_SOURCE, PARENT))
    a = [p.genome.id for p in ParamSweep(n_children=4).propose([parent], make_context(PROBLEM, 3))]
    b = [p.genome.id for p in ParamSweep(n_children=4).propose([parent], make_context(PROBLEM, 3))]
    assert a == b
    assert isinstance(resolve("param_sweep"), ParamSweep)
    with pytest.raises(ValueError):
        ParamSweep(n_children=0)


def test_no_valid_neighbour_is_an_operator_error() -> None:
    space = ParamSpace({"A": Choice([1, 2])}, (Constraint("A == 1", lambda p: p["A"] == 1),))
    prob = Problem(name="t", params=space, check_shapes=({"N": 7},))
    with pytest.raises(OperatorError, match="no valid one-knob neighbour"):
        ParamSweep().propose([make_record(Genome(CONTRACT_SOURCE, {"A": 1}))], make_context(prob, 0))


def _climb(op, score, start: dict, budget: int, seed: int) -> tuple[float, int, int]:
    """Greedy climb from the best so far: (best score, proposals, proposals already seen)."""
    seen = _Seen()
    best = dict(start)
    best_s = score(best)
    dups = 0
    for n in range(1, budget + 1):
        parent = make_record(Genome(CONTRACT_SOURCE, best))
        try:
            child = op.propose([parent], make_context(LAND, seed * 1000 + n, archive=seen))[0].genome
        except OperatorError:
            return best_s, n, dups
        dups += child.id in seen.ids
        seen.ids.add(child.id)
        s = score(dict(child.params))
        if s > best_s:
            best, best_s = dict(child.params), s
    return best_s, budget, dups


LAND = Problem(name="land", params=ParamSpace({k: Choice(list(range(8))) for k in "ABCD"}), check_shapes=({"N": 7},))


def _separable(p: dict) -> float:
    # each knob has its own best value; no knob interacts with another
    return -sum((p[k] - t) ** 2 for k, t in zip("ABCD", (6, 1, 3, 7), strict=True))


def test_sweep_finds_and_certifies_the_optimum_without_repeats() -> None:
    """On a separable landscape the sweep reaches the optimum, proves it (every one-knob
    neighbour tried: the operator says local optimum) and never proposes a genome twice;
    one-knob mutation, given the same budget, re-proposes genomes it has seen (the engine
    skips those as duplicates) and has no way to say it is done."""
    start = {"A": 0, "B": 7, "C": 0, "D": 0}
    for seed in range(5):
        best, n, dups = _climb(ParamSweep(), _separable, start, 400, seed)
        assert best == 0 and dups == 0 and n < 400  # stopped by "local optimum", not by the budget
        assert n <= 4 * 4 * 7 + 1  # each improvement at most re-walks one neighbourhood (4 knobs x 7 values)
        _, m, mdups = _climb(ParamMutation(p_neighbour=0.3), _separable, start, n, seed)
        assert m == n and mdups > 0
