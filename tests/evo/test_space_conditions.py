"""Conditional params (evo.space.Condition): canonical forms, the engine's dedup, the operators."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from evo.engine import Budget, Engine, EngineConfig
from evo.space import Choice, Condition, IntRange, ParamSpace, SpaceError
from evo.types import Genome, Problem
from operators import ParamCrossover, ParamMutation, ParamSweep, Proposal
from operators.testing import CONTRACT_SOURCE, make_context, make_record
from tests.evo.cpu_problem import ParamsExecutor, make_problem


def _fast_path(p):  # top level: picklable
    return p["MODE"] == "fast"


def _space() -> ParamSpace:
    return ParamSpace(
        {"MODE": Choice(["fast", "safe"]), "DEPTH": Choice([1, 2, 3, 4]), "THREADS": IntRange(64, 256, step=64)},
        conditions=(Condition("DEPTH", _fast_path, 2, "DEPTH only on the fast path"),),
    )


def test_active_and_canonical() -> None:
    sp = _space()
    fast = {"MODE": "fast", "DEPTH": 3, "THREADS": 128}
    safe = {"MODE": "safe", "DEPTH": 3, "THREADS": 128}
    assert sp.active(fast) == ["MODE", "DEPTH", "THREADS"]
    assert sp.active(safe) == ["MODE", "THREADS"]
    assert sp.canonical(fast) == fast  # active: kept
    assert sp.canonical(safe) == dict(safe, DEPTH=2)  # inactive: the default
    assert sp.canonical({"MODE": "safe"}) == {"MODE": "safe"}  # absent params stay absent
    assert sp.is_valid(safe)  # a non-canonical assignment is still a valid one


def test_conditions_are_checked_at_construction() -> None:
    params = {"MODE": Choice(["fast", "safe"]), "DEPTH": Choice([1, 2])}
    with pytest.raises(SpaceError, match="unknown param 'WIDTH'"):
        ParamSpace(params, conditions=(Condition("WIDTH", _fast_path, 1),))
    with pytest.raises(SpaceError, match="default 3 is outside"):
        ParamSpace(params, conditions=(Condition("DEPTH", _fast_path, 3),))
    with pytest.raises(SpaceError, match="two conditions"):
        ParamSpace(params, conditions=(Condition("DEPTH", _fast_path, 1), Condition("DEPTH", _fast_path, 2)))


def test_a_failing_condition_counts_as_active() -> None:
    sp = _space()
    assert "DEPTH" in sp.active({"DEPTH": 3})  # MODE missing: cannot tell, so the param matters
    assert sp.canonical({"DEPTH": 3}) == {"DEPTH": 3}


def test_conditions_leave_the_fingerprint_alone() -> None:
    """Adding conditions keeps an archive resumable: they change dedup, not scoring."""
    sp = _space()
    bare = ParamSpace(sp.params, sp.constraints)
    assert sp.describe() == bare.describe()
    base = make_problem()
    assert (dataclasses.replace(base, params=ParamSpace(base.params.params, base.params.constraints,
                                                        conditions=(Condition("UNROLL", _vec_one, 1),))).fingerprint()
            == base.fingerprint())


def _vec_one(p):
    return p["VEC"] == 1


def _problem() -> Problem:
    return Problem(name="t", params=_space(), check_shapes=({"N": 7},))


def test_mutation_leaves_inactive_params_alone() -> None:
    prob = _problem()
    parent = make_record(Genome(CONTRACT_SOURCE, {"MODE": "safe", "DEPTH": 2, "THREADS": 128}))
    for seed in range(40):
        for p in ParamMutation(n_changes=2, n_children=3).propose([parent], make_context(prob, seed)):
            g = p.genome if isinstance(p, Proposal) else p
            if g.params["MODE"] == "safe":
                assert g.params["DEPTH"] == 2, g.params  # never the only change, never a change at all


def test_sweep_skips_inactive_params() -> None:
    sp = _space()
    g = Genome(CONTRACT_SOURCE, {"MODE": "safe", "DEPTH": 2, "THREADS": 128})
    changed = {next(k for k in c if c[k] != g.params[k]) for c in ParamSweep().neighbours(g, sp)}
    assert changed == {"MODE", "THREADS"}


def test_crossover_mixes_canonical_parents() -> None:
    """Parents that differ only in an inactive param have nothing to mix."""
    prob = _problem()
    a = make_record(Genome(CONTRACT_SOURCE, {"MODE": "safe", "DEPTH": 1, "THREADS": 128}))
    b = make_record(Genome(CONTRACT_SOURCE, {"MODE": "safe", "DEPTH": 4, "THREADS": 128}))
    with pytest.raises(Exception, match="same params"):
        ParamCrossover().propose([a, b], make_context(prob, 0))


def test_engine_never_evaluates_a_behavioural_duplicate(tmp_path: Path) -> None:
    """An operator that only moves an inactive knob proposes the parent again: skipped, counted."""
    base = make_problem()
    space = ParamSpace(base.params.params, base.params.constraints,
                       conditions=(Condition("UNROLL", _vec_one, 1, "UNROLL only with VEC 1"),))
    seed = Genome(base.seeds[0].source, dict(base.seeds[0].params, VEC=2, UNROLL=1), entry=base.seeds[0].entry)
    # a seed written with an inactive knob off its default is stored in canonical form
    odd_seed = Genome(seed.source, dict(seed.params, THREADS=448, UNROLL=4), entry=seed.entry)
    assert seed.params["THREADS"] != 448
    problem = dataclasses.replace(base, params=space, seeds=(seed, odd_seed))

    def inactive_only(parents, ctx):  # type: ignore[no-untyped-def]
        p = dict(parents[0].genome.params)
        if p["VEC"] == 1:  # UNROLL is active here: a real change
            return [Genome(parents[0].genome.source, dict(p, THREADS=64 if p["THREADS"] != 64 else 128),
                           entry=parents[0].genome.entry)]
        return [Genome(parents[0].genome.source, dict(p, UNROLL=u), entry=parents[0].genome.entry) for u in (2, 4, 8)]

    def real_change(parents, ctx):  # type: ignore[no-untyped-def]
        p = dict(parents[0].genome.params)
        return [Genome(parents[0].genome.source, dict(p, VEC=1, UNROLL=2), entry=parents[0].genome.entry)]

    ex = ParamsExecutor()
    cfg = EngineConfig(islands=1, in_flight=2)
    with Engine(problem, str(tmp_path / "a"), operators=[inactive_only, real_change], evaluator=ex, config=cfg) as eng:
        eng.run(Budget(evaluations=4), progress=False)
        assert eng.stats()["duplicates"] >= 3
        assert len(ex.submitted) == len(set(ex.submitted)) == len(eng.archive)
        for rec in eng.archive:
            assert dict(rec.genome.params) == space.canonical(rec.genome.params)
        assert odd_seed.id not in eng.archive
        assert Genome(odd_seed.source, space.canonical(odd_seed.params), entry=odd_seed.entry).id in eng.archive


def test_run_stops_when_the_operators_find_nothing_new(tmp_path: Path) -> None:
    """A space smaller than the budget: the run ends with a reason instead of spinning."""
    base = make_problem()
    tiny = ParamSpace({"UNROLL": Choice((1, 2)), "VEC": Choice((1,)), "THREADS": Choice((128,))})
    problem = dataclasses.replace(base, params=tiny)
    ex = ParamsExecutor()
    cfg = EngineConfig(islands=1, in_flight=2, stall_rounds=50)
    with Engine(problem, str(tmp_path / "a"), operators=[ParamMutation()], evaluator=ex, config=cfg) as eng:
        eng.run(Budget(evaluations=20), progress=False)
        assert len(eng.archive) == 2  # every genome the space holds
        assert eng.last_run["stop"].startswith("no new genomes")
    with pytest.raises(ValueError, match="stall_rounds"):
        EngineConfig(stall_rounds=0)
