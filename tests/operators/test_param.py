"""Parameter operators: validity, repair and rejection, diffs, determinism, and the contract suite."""

from __future__ import annotations

import numpy as np
import pytest

from evo.space import Bool, Choice, Constraint, FloatRange, IntRange, ParamSpace
from evo.types import Genome, Problem
from operators import OperatorError, ParamCrossover, ParamMutation, ParamRandom, Proposal, param_diff
from operators._param import _constraint_keys, _offending
from operators.testing import CONTRACT_SOURCE, OperatorContract, contract_problem, make_context, make_record

# --------------------------------------------------------------------------- contract suite


class TestParamMutationContract(OperatorContract):
    def make_operator(self) -> ParamMutation:
        return ParamMutation()


class TestParamMutationManyContract(OperatorContract):
    def make_operator(self) -> ParamMutation:
        return ParamMutation(n_changes=3, p_neighbour=0.3, n_children=4)


class TestParamCrossoverContract(OperatorContract):
    def make_operator(self) -> ParamCrossover:
        return ParamCrossover()


class TestParamRandomContract(OperatorContract):
    def make_operator(self) -> ParamRandom:
        return ParamRandom()


# --------------------------------------------------------------------------- helpers


def _problem(params: dict, constraints: tuple = ()) -> Problem:
    return Problem(name="t", params=ParamSpace(params, constraints), check_shapes=({"N": 7},))


def _rec(params: dict, source: str = CONTRACT_SOURCE):
    return make_record(Genome(source, params))


def _changed(old: dict, new) -> set[str]:
    return {k for k in old if old[k] != new[k] or isinstance(old[k], bool) != isinstance(new[k], bool)}


def _tv_small(p):
    return p["THREADS"] * p["VEC"] <= 1024


def _x_is_two(p):
    return p["X"] == 2


def _x_lt_y(p):
    return p["X"] < p["Y"]


# --------------------------------------------------------------------------- param_diff


def test_param_diff_formats_changes_in_order():
    old = {"threads": 256, "vec": 4, "fast": True, "alpha": 0.5}
    new = {"threads": 512, "vec": 8, "fast": False, "alpha": 0.5}
    assert param_diff(old, new) == "threads 256->512, vec 4->8, fast true->false"


def test_param_diff_added_removed_and_equal():
    assert param_diff({"a": 1}, {"a": 1}) == "no param change"
    assert param_diff({"a": 1}, {"a": 1, "b": "cg"}) == "b (unset)->cg"
    assert param_diff({"a": 1, "b": 2}, {"a": 1}) == "b 2->(unset)"
    assert param_diff({"x": 0.1}, {"x": 1 / 3}) == "x 0.1->0.333333"


def test_param_diff_keeps_bool_apart_from_int():
    assert param_diff({"f": 1}, {"f": True}) == "f 1->true"
    assert param_diff({"f": True}, {"f": True}) == "no param change"


# --------------------------------------------------------------------------- mutation


def test_mutation_changes_between_one_and_n_params():
    prob = _problem({k: Choice(range(10)) for k in "abcdef"})
    parent = _rec({k: 5 for k in "abcdef"})
    counts = set()
    for seed in range(60):
        (child,) = ParamMutation(n_changes=3).propose([parent], make_context(prob, seed))
        n = len(_changed(dict(parent.genome.params), child.genome.params))
        assert 1 <= n <= 3
        counts.add(n)
        assert child.note == param_diff(parent.genome.params, child.genome.params)
        assert set(child.meta["changes"]) == _changed(dict(parent.genome.params), child.genome.params)
    assert counts == {1, 2, 3}


def test_mutation_neighbour_moves_vs_random_draws():
    prob = _problem({"t": Choice([32, 64, 128, 256, 512, 1024, 2048]), "u": IntRange(1, 64)})
    parent = _rec({"t": 256, "u": 32})
    near, far = set(), set()
    for seed in range(80):
        (c1,) = ParamMutation(p_neighbour=1.0).propose([parent], make_context(prob, seed))
        near.add((c1.genome.params["t"], c1.genome.params["u"]))
        (c2,) = ParamMutation(p_neighbour=0.0).propose([parent], make_context(prob, seed))
        far.add((c2.genome.params["t"], c2.genome.params["u"]))
    assert near == {(128, 32), (512, 32), (256, 31), (256, 33)}
    assert len(far) > 10  # random draws reach far values


def test_mutation_handles_every_param_kind():
    prob = _problem({"c": Choice(["ca", "cg", "nc"]), "i": IntRange(8, 256, log=True), "f": FloatRange(0.0, 1.0),
                     "b": Bool()})
    parent = _rec({"c": "cg", "i": 32, "f": 0.5, "b": False})
    for seed in range(40):
        out = ParamMutation(n_changes=4, n_children=3).propose([parent], make_context(prob, seed))
        assert 1 <= len(out) <= 3
        assert len({c.genome.id for c in out}) == len(out)
        for c in out:
            assert prob.params.is_valid(c.genome.params), c.genome.params
            assert c.genome.id != parent.id
            assert c.genome.source == parent.genome.source


def test_mutation_repairs_constraint_keeping_the_chosen_change():
    # THREADS*VEC <= 1024: moving VEC up from (256, 4) forces THREADS down.
    prob = _problem({"THREADS": Choice([64, 128, 256, 512]), "VEC": Choice([1, 2, 4, 8])}, (Constraint("THREADS * VEC <= 1024", _tv_small),))
    parent = _rec({"THREADS": 256, "VEC": 4})
    repaired = kept = 0
    for seed in range(60):
        (c,) = ParamMutation(p_neighbour=1.0).propose([parent], make_context(prob, seed))
        p = c.genome.params
        assert p["THREADS"] * p["VEC"] <= 1024
        if c.meta["repaired"]:
            repaired += 1
            assert "VEC 4->" in c.note and "THREADS 256->" in c.note
            # the move chose VEC 4->8 (or THREADS 256->512); repair re-draws the other one first
            kept += (p["VEC"] == 8 and p["THREADS"] <= 128) or (p["THREADS"] == 512 and p["VEC"] <= 2)
    assert repaired > 5 and kept >= 0.8 * repaired, (repaired, kept)


def test_mutation_rejects_with_the_violated_constraint_named():
    prob = _problem({"X": Choice([1, 2, 3])}, (Constraint("X == 2", _x_is_two),))
    with pytest.raises(OperatorError, match=r"violates constraint: X == 2"):
        ParamMutation(max_tries=4).propose([_rec({"X": 2})], make_context(prob, 0))


def test_mutation_without_repair_rejects_invalid_child():
    prob = _problem({"X": IntRange(0, 9), "Y": IntRange(0, 9)}, (Constraint("X < Y", _x_lt_y),))
    errors = 0
    for seed in range(30):
        try:
            (c,) = ParamMutation(repair=False).propose([_rec({"X": 4, "Y": 5})], make_context(prob, seed))
        except OperatorError as e:
            assert "X < Y" in str(e)
            errors += 1
        else:
            assert c.genome.params["X"] < c.genome.params["Y"]
            assert c.meta["repaired"] == []
    assert 0 < errors < 30


def test_mutation_parent_params_outside_space():
    prob = _problem({"X": IntRange(0, 9)})
    with pytest.raises(OperatorError, match=r"params \['BOGUS'\].*does not define"):
        ParamMutation().propose([_rec({"X": 1, "BOGUS": 3})], make_context(prob, 0))
    # a missing param is drawn; an out-of-range one is repaired
    (c,) = ParamMutation().propose([_rec({})], make_context(prob, 0))
    assert prob.params.is_valid(c.genome.params)
    (c,) = ParamMutation().propose([_rec({"X": 99})], make_context(prob, 0))
    assert prob.params.is_valid(c.genome.params) and "X 99->" in c.note


def test_mutation_fixed_space_is_an_operator_error():
    prob = _problem({"X": Choice([4]), "Y": IntRange(3, 3)})
    with pytest.raises(OperatorError, match="no param"):
        ParamMutation().propose([_rec({"X": 4, "Y": 3})], make_context(prob, 0))


def test_mutation_argument_checks():
    with pytest.raises(ValueError, match="n_changes"):
        ParamMutation(n_changes=0)
    with pytest.raises(ValueError, match="p_neighbour"):
        ParamMutation(p_neighbour=1.5)
    prob = contract_problem()
    with pytest.raises(ValueError, match="takes 1 parent"):
        ParamMutation().propose([], make_context(prob, 0))


def test_mutation_uses_only_ctx_rng():
    prob = contract_problem()
    parent = _rec(prob.params.sample(np.random.default_rng(3)))
    a = ParamMutation(n_changes=2, n_children=3).propose([parent], make_context(prob, 11))
    np.random.seed(99)
    b = ParamMutation(n_changes=2, n_children=3).propose([parent], make_context(prob, 11))
    c = ParamMutation(n_changes=2, n_children=3).propose([parent], make_context(prob, 12))
    assert [x.genome.id for x in a] == [x.genome.id for x in b]
    assert [x.genome.id for x in a] != [x.genome.id for x in c]


# --------------------------------------------------------------------------- crossover


def test_crossover_takes_each_param_from_a_parent_and_differs_from_both():
    prob = _problem({k: IntRange(0, 9) for k in "abcdef"})
    pa = _rec({k: 1 for k in "abcdef"})
    pb = _rec({k: 8 for k in "abcdef"})
    for seed in range(40):
        (c,) = ParamCrossover().propose([pa, pb], make_context(prob, seed))
        p = c.genome.params
        assert set(p.values()) == {1, 8}
        assert c.genome.id not in (pa.id, pb.id)
        assert set(c.meta["from_second"]) == {k for k in p if p[k] == 8}
        assert c.note.startswith(param_diff(pa.genome.params, p))


def test_crossover_keeps_first_parent_source():
    prob = _problem({"a": IntRange(0, 9)})
    pa = _rec({"a": 1}, source="// A\n" + CONTRACT_SOURCE)
    pb = _rec({"a": 2}, source="// B is different code\n" + CONTRACT_SOURCE.replace("2.0f", "2.00f"))
    # one differing param and different sources: the only new child is A's source with B's value
    (c,) = ParamCrossover().propose([pa, pb], make_context(prob, 0))
    assert c.genome.source == pa.genome.source and c.genome.params["a"] == 2


def test_crossover_refuses_parents_it_cannot_mix():
    prob = _problem({"a": IntRange(0, 9), "b": IntRange(0, 9)})
    with pytest.raises(OperatorError, match="same params"):
        ParamCrossover().propose([_rec({"a": 1, "b": 2}), _rec({"a": 1, "b": 2}, source="// x\n")],
                                 make_context(prob, 0))
    with pytest.raises(OperatorError, match="one param only"):
        ParamCrossover().propose([_rec({"a": 1, "b": 2}), _rec({"a": 1, "b": 3})], make_context(prob, 0))


def test_crossover_repairs_against_constraints():
    prob = _problem({"THREADS": Choice([64, 128, 256, 512, 1024]), "VEC": Choice([1, 2, 4, 8]), "U": IntRange(0, 3)},
                    (Constraint("THREADS * VEC <= 1024", _tv_small),))
    pa = _rec({"THREADS": 1024, "VEC": 1, "U": 0})
    pb = _rec({"THREADS": 128, "VEC": 8, "U": 3})
    seen = set()
    for seed in range(40):
        (c,) = ParamCrossover().propose([pa, pb], make_context(prob, seed))
        p = c.genome.params
        assert p["THREADS"] * p["VEC"] <= 1024
        seen.add((p["THREADS"], p["VEC"], p["U"]))
    assert (1024, 8, 0) not in seen and len(seen) >= 3


def test_crossover_bias_checks():
    with pytest.raises(ValueError, match="bias"):
        ParamCrossover(bias=1.0)


# --------------------------------------------------------------------------- random


def test_random_draws_valid_new_params():
    prob = contract_problem()
    parent = _rec(prob.params.sample(np.random.default_rng(0)))
    ids = set()
    for seed in range(20):
        (c,) = ParamRandom().propose([parent], make_context(prob, seed))
        assert prob.params.is_valid(c.genome.params)
        assert c.genome.id != parent.id and isinstance(c, Proposal)
        ids.add(c.genome.id)
    assert len(ids) > 10


def test_random_on_a_one_point_space_is_an_operator_error():
    prob = _problem({"X": Choice([4])})
    with pytest.raises(OperatorError, match="every valid draw equalled the parent"):
        ParamRandom(max_tries=5).propose([_rec({"X": 4})], make_context(prob, 0))


def test_random_unsatisfiable_names_constraint():
    prob = _problem({"X": IntRange(0, 9), "Y": IntRange(0, 0)}, (Constraint("X < Y", _x_lt_y),))
    with pytest.raises(OperatorError, match="X < Y"):
        ParamRandom(max_tries=5).propose([_rec({"X": 0, "Y": 0})], make_context(prob, 0))


# --------------------------------------------------------------------------- internals


def test_constraint_keys_are_the_keys_it_reads():
    space = contract_problem().params
    c_tv, c_uv = space.constraints
    p = {"THREADS": 1024, "VEC": 8, "UNROLL": 1, "FAST": True}
    assert _constraint_keys(c_tv, p, space) == {"THREADS", "VEC"}
    assert _constraint_keys(c_uv, p, space) == {"UNROLL", "VEC"}
    bad, rules = _offending(space, p)
    assert bad == {"THREADS", "VEC"} and rules == ["violates constraint: THREADS * VEC <= 2048"]
    bad, rules = _offending(space, {**p, "VEC": 3})
    assert bad == {"VEC"} and "outside" in rules[0]
