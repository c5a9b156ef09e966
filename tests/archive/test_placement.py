"""The archive's fast cell placement agrees with ``Problem.descriptor_values`` + ``axis.index``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archive import Archive, InvalidRecordError
from archive._archive import _placer
from evo.space import CategoricalAxis, Choice, IntRange, NumericAxis, ParamSpace, SpaceError
from evo.types import Evaluation, Genome, Problem, Record, Status

CATEGORIES = ["a", 1, 1.0, True, None, 2.5, (1, 2), "b"]


def _problem(**kw: Any) -> Problem:
    axes = kw.pop("descriptors", (
        NumericAxis("registers", 0, 256, 8, source="resources"),
        NumericAxis("occupancy", -1.5, 2.25, 5),  # no source: params, then resources, then metrics
        CategoricalAxis("variant", CATEGORIES, source="params"),
    ))
    return Problem(name="placement", params=ParamSpace({"variant": Choice(["a", "b"]), "t": IntRange(1, 8)}),
                   check_shapes=({"N": 1},), descriptors=axes, **kw)


def _slow(problem: Problem, genome: Genome, ev: Evaluation) -> tuple[tuple[int, ...], dict[str, Any]]:
    values = problem.descriptor_values(genome, ev)
    return tuple(int(a.index(values[a.name])) for a in problem.descriptors), values


valid_numbers = st.one_of(st.integers(-10**6, 10**6), st.floats(-1e6, 1e6), st.integers(-2, 300),
                          st.floats(-2.0, 3.0), st.sampled_from([0, 256, -1.5, 2.25, 255.99999, 1e300, -0.0]))
numbers = st.one_of(valid_numbers, valid_numbers, valid_numbers, valid_numbers, valid_numbers, valid_numbers,
                    valid_numbers, st.floats(), st.booleans(),
                    st.integers(-300, 300).map(np.int64), st.floats(-1e3, 1e3).map(np.float32), st.just("12"),
                    st.none(), st.integers(10**20, 10**30))
categories = st.one_of(st.sampled_from(CATEGORIES), st.sampled_from(CATEGORIES),
                       st.sampled_from([0, 1.5, "c", False, np.int64(1), [1]]), st.floats(allow_nan=True))
places = st.sampled_from(["params", "resources", "metrics", "params", "resources", "metrics", "missing"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(registers=numbers, occupancy=numbers, variant=categories,
       where=places, drop_registers=st.sampled_from([False, False, False, True]))
def test_fast_placement_matches_general_path(registers: Any, occupancy: Any, variant: Any, where: str,
                                             drop_registers: bool) -> None:
    problem = _problem()
    place = _placer(problem)
    assert place is not None
    params: dict[str, Any] = {"variant": variant, "t": 2}
    resources: dict[str, Any] = {} if drop_registers else {"registers": registers}
    metrics: dict[str, Any] = {}
    if where == "params":
        params["occupancy"] = occupancy
    elif where == "resources":
        resources["occupancy"] = occupancy
    elif where == "metrics":
        metrics["occupancy"] = occupancy
    genome = Genome("k", params)
    ev = Evaluation(Status.OK, fitness=1.0, resources=resources, metrics=metrics)
    try:
        expected: Any = _slow(problem, genome, ev)
    except (SpaceError, OverflowError, KeyError) as e:
        expected = type(e)
    got = place(genome, ev)
    if got is None:
        return  # the archive then runs the general path itself
    assert not isinstance(expected, type), f"fast path placed what the general path refuses ({expected})"
    assert got == expected
    assert [type(v) for v in got[1].values()] == [type(v) for v in expected[1].values()]


@pytest.mark.parametrize(("registers", "occupancy", "variant"), [
    (10, 0.5, "a"), (10.0, -3.0, 1), (255, 2.25, 1.0), (0, 0, True), (3, 1, None), (300, 1, (1, 2)),
    (-7, 1, "b"), (3, 2.2499, 2.5), (256.0, -0.0, 1)])
def test_usual_values_take_the_fast_path(registers: Any, occupancy: Any, variant: Any) -> None:
    problem = _problem()
    place = _placer(problem)
    assert place is not None
    genome = Genome("k", {"variant": variant, "t": 2, "occupancy": occupancy})
    ev = Evaluation(Status.OK, fitness=1.0, resources={"registers": registers})
    got = place(genome, ev)
    assert got is not None and got == _slow(problem, genome, ev)


def test_archive_uses_general_path_for_the_rest(tmp_path: Any) -> None:
    problem = _problem()
    ar = Archive(problem)
    g = Genome("k", {"variant": np.int64(1), "t": 2, "occupancy": np.float64(0.3)})
    rec = ar.add(Record(g, Evaluation(Status.OK, fitness=1.0, resources={"registers": np.int32(40)}))).record
    assert rec.cell == _slow(problem, g, rec.evaluation)[0]
    bad = Record(Genome("k2", {"variant": "zzz", "t": 2, "occupancy": 1}),
                 Evaluation(Status.OK, fitness=1.0, resources={"registers": 3}))
    with pytest.raises(InvalidRecordError, match="'zzz' is not one of"):
        ar.add(bad)
    nan = Record(Genome("k3", {"variant": "a", "occupancy": math.nan}),
                 Evaluation(Status.OK, fitness=1.0, resources={"registers": 3}))
    with pytest.raises(InvalidRecordError, match="NaN"):
        ar.add(nan)
    ar.close()


def test_no_fast_path_when_overridden_or_ambiguous() -> None:
    class Custom(Problem):
        def descriptor_values(self, genome: Genome, evaluation: Evaluation) -> dict[str, Any]:
            return {"registers": 1.0}

    custom = Custom(name="c", params=ParamSpace({}), check_shapes=({"N": 1},),
                    descriptors=(NumericAxis("registers", 0, 4, 4),))
    assert _placer(custom) is None
    twice = _problem(descriptors=(NumericAxis("x", 0, 1, 2, source="params"), NumericAxis("x", 0, 1, 2)))
    assert _placer(twice) is None
    odd_source = _problem(descriptors=(NumericAxis("x", 0, 1, 2, source="elsewhere"),))
    assert _placer(odd_source) is None
    with pytest.raises(InvalidRecordError, match="unknown source"):
        Archive(odd_source).add(Record(Genome("k", {"x": 0.5}), Evaluation(Status.OK, fitness=1.0)))
