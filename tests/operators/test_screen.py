"""Screened proposals: the surrogate of measured times, the screening wrapper, and its effect on a search."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import operators
from archive import Archive
from evo.engine import Engine, EngineConfig
from evo.space import Bool, CategoricalAxis, Choice, IntRange, ParamSpace
from evo.types import Evaluation, Genome, Problem, Record, Status
from operators import OperatorError, ParamMutation, ParamSurrogate, Proposal, Screened
from operators.testing import CONTRACT_SOURCE, OperatorContract, contract_problem, make_context

SHORT, LONG = "M=4096,N=256:float32", "M=64,N=65536:float32"
SPACE = ParamSpace({
    "THREADS": Choice([32, 64, 128, 256, 512, 1024]),
    "VEC": Choice([1, 2, 4, 8]),
    "UNROLL": IntRange(1, 8),
    "FAST": Bool(),
    "HINT": Choice(["none", "evict_first", "no_allocate"]),
})


def log_times(p: Mapping[str, Any]) -> dict[str, float]:
    """A landscape with a different optimum per case (log ms): THREADS 128 / 1024, VEC 8 / 2, ..."""
    t, v, u = math.log2(p["THREADS"]), math.log2(p["VEC"]), p["UNROLL"]
    short = 0.08 * (t - 7) ** 2 + 0.2 * (v - 3) ** 2 + 0.05 * abs(u - 2) + 0.15 * (not p["FAST"]) + \
        {"none": 0.0, "evict_first": 0.1, "no_allocate": 0.3}[p["HINT"]]
    long = 0.08 * (t - 10) ** 2 + 0.2 * (v - 1) ** 2 + 0.05 * abs(u - 6) + 0.15 * bool(p["FAST"]) + \
        {"none": 0.3, "evict_first": 0.0, "no_allocate": 0.1}[p["HINT"]]
    return {SHORT: short - 3.0, LONG: long}


def evaluation(p: Mapping[str, Any]) -> Evaluation:
    lt = log_times(p)
    return Evaluation(Status.OK, fitness=-sum(lt.values()) / len(lt),
                      metrics={"cases": {k: {"time_ms": math.exp(v)} for k, v in lt.items()}})


def problem(seeds: tuple[Genome, ...] = ()) -> Problem:
    return Problem(name="screen_landscape", params=SPACE, check_shapes=({"N": 256},),
                   descriptors=(CategoricalAxis("VEC", (1, 2, 4, 8), source="params"),), seeds=seeds)


def random_genomes(n: int, seed: int) -> list[Genome]:
    rng = np.random.default_rng(seed)
    out: dict[str, Genome] = {}
    while len(out) < n:
        g = Genome(CONTRACT_SOURCE, SPACE.sample(rng))
        out[g.id] = g
    return list(out.values())


def measured_archive(path: Path, genomes: list[Genome]) -> Archive:
    a = Archive(problem(), str(path))
    for g in genomes:
        a.add(Record(genome=g, evaluation=evaluation(g.params), operator="seed"))
    return a


def rank(x: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(x)).astype(float)


# --------------------------------------------------------------------------- the surrogate


def test_surrogate_ranks_held_out_genomes() -> None:
    train, test = random_genomes(60, 1), random_genomes(200, 2)
    model = ParamSurrogate(SPACE)
    for g in train:
        model.add(g.id, g.params, {k: math.exp(v) for k, v in log_times(g.params).items()})
    assert len(model) == 60 and sorted(model.cases) == sorted([SHORT, LONG])
    for key in (SHORT, LONG):
        pred = np.array([model.predict(g.params)[key][0] for g in test])
        true = np.array([log_times(g.params)[key] for g in test])
        rho = np.corrcoef(rank(pred), rank(true))[0, 1]
        assert rho > 0.6, (key, rho)  # a model of 60 points ranks 200 unseen ones


def test_surrogate_uncertainty_grows_away_from_measured_points() -> None:
    g = random_genomes(1, 3)[0]
    model = ParamSurrogate(SPACE, distance_penalty=0.1)
    model.add(g.id, g.params, {SHORT: 1.0})
    mu, sd = model.predict(g.params)[SHORT]
    assert mu == pytest.approx(0.0) and sd == pytest.approx(0.0)
    far = dict(g.params, FAST=not g.params["FAST"], HINT="none" if g.params["HINT"] != "none" else "evict_first")
    assert model.predict(far)[SHORT][1] == pytest.approx(0.2)  # two params apart
    model.add(g.id, g.params, {SHORT: 5.0})  # the same genome twice: kept once
    assert len(model) == 1


def test_surrogate_reads_records_and_skips_bad_times() -> None:
    model = ParamSurrogate(SPACE)
    g1, g2, g3 = random_genomes(3, 4)
    assert model.add_record(Record(genome=g1, evaluation=evaluation(g1.params)))
    assert not model.add_record(Record(genome=g2, evaluation=Evaluation.failure(Status.COMPILE_ERROR, "x")))
    assert not model.add_record(Record(genome=g2, evaluation=Evaluation(Status.OK, fitness=1.0, metrics={})))
    model.add(g3.id, g3.params, {SHORT: float("nan"), LONG: 0.0, "other": -1.0})
    assert len(model) == 2 and model.predict(g3.params).keys() == {SHORT, LONG}
    with pytest.raises(ValueError, match="k must be"):
        ParamSurrogate(SPACE, k=0)


# --------------------------------------------------------------------------- the wrapper


def test_screened_sends_the_pool_child_with_the_best_predicted_gain(tmp_path: Path) -> None:
    arch = measured_archive(tmp_path / "a.lmdb", random_genomes(40, 5))
    try:
        parent = next(arch.records())
        op = Screened(ParamMutation(n_changes=2), pool=12, explore=0.0)
        ctx = make_context(problem(), 7, archive=arch)
        (child,) = op.propose([parent], ctx)
        assert isinstance(child, Proposal) and "screened: best of 12" in child.note
        assert child.meta["screen"]["how"] == "screened" and child.genome.id not in arch
        # the same pool, drawn again with the same seed: the sent child has the top score
        pool = op._draw_pool([parent], make_context(problem(), 7, archive=arch))
        best = {}
        for m in op._models.values():
            best.update(m.best())
        scores = [op.score(p.genome, best) for p in pool]
        assert child.genome.id == pool[max(range(len(pool)), key=lambda i: scores[i])].genome.id
    finally:
        arch.close()


def test_screened_explores_and_passes_through_without_data(tmp_path: Path) -> None:
    arch = measured_archive(tmp_path / "a.lmdb", random_genomes(3, 6))
    try:
        parent = next(arch.records())
        (child,) = Screened(pool=4, min_records=8).propose([parent], make_context(problem(), 1, archive=arch))
        assert "unscreened: fewer than 8 measured records" in child.note
        (child,) = Screened(pool=4, min_records=2, explore=1.0).propose([parent], make_context(problem(), 1,
                                                                                             archive=arch))
        assert "explored: random 1 of 4" in child.note and child.meta["screen"]["how"] == "explored"
        two = Screened(pool=4, n_children=2, min_records=2).propose([parent], make_context(problem(), 2,
                                                                                          archive=arch))
        assert len({c.genome.id for c in two}) == 2

        class Membership:  # an archive view that can only say what it holds
            def __contains__(self, gid: object) -> bool:
                return gid in arch

        (child,) = Screened(pool=4, min_records=1).propose([parent], make_context(problem(), 3, archive=Membership()))
        assert "unscreened" in child.note
    finally:
        arch.close()


def test_screened_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="cannot exceed pool"):
        Screened(pool=2, n_children=3)
    with pytest.raises(ValueError, match="explore must be"):
        Screened(explore=1.5)
    with pytest.raises(ValueError, match="repairs failed parents"):
        Screened("llm_repair")
    assert operators.resolve("screened_param_mutation").name == "screened_param_mutation"
    assert Screened("param_crossover").n_parents == 2


def test_screened_reports_the_inner_operators_failure() -> None:
    space = ParamSpace({"ONLY": Choice([1])})
    prob = Problem(name="one_point", params=space, check_shapes=({"N": 1},))
    parent = Record(genome=Genome(CONTRACT_SOURCE, {"ONLY": 1}), evaluation=Evaluation(Status.OK, fitness=1.0))
    with pytest.raises(OperatorError, match="screened_param_mutation: param_mutation: no param"):
        Screened().propose([parent], make_context(prob, 0))


class TestScreenedContract(OperatorContract):
    """The operator contract, with an archive of measured records (so the screen is active)."""

    _dir = tempfile.TemporaryDirectory()

    def make_operator(self) -> Screened:
        return Screened(ParamMutation(), pool=6, min_records=4)

    def make_context(self, problem: Problem, seed: int) -> Any:
        path = Path(self._dir.name) / "contract.lmdb"
        if not path.exists():
            a = Archive(problem, str(path))
            rng = np.random.default_rng(0)
            for i in range(12):
                g = Genome(self.make_source(), problem.params.sample(rng))
                a.add(Record(genome=g, evaluation=Evaluation(Status.OK, fitness=1.0 + i, metrics={
                    "cases": {"N=1000:float32": {"time_ms": 1.0 / (1 + i + g.params["VEC"])}}})))
            a.close()
        arch = Archive.open_readonly(str(path))
        return make_context(problem, seed, archive=arch)


def test_contract_problem_is_what_the_contract_uses() -> None:
    assert set(contract_problem().params.params) == {"THREADS", "VEC", "UNROLL", "FAST"}


# --------------------------------------------------------------------------- in a search


def _search(tmp_path: Path, op: Any, seed: int, evaluations: int = 40) -> float:
    """Best log time per case summed, after ``evaluations`` (8 random seeds first)."""
    prob = problem(seeds=tuple(random_genomes(8, 100 + seed)))
    cfg = EngineConfig(islands=1, case_champions=0.5)
    best: dict[str, float] = {}
    with Engine(prob, str(tmp_path / f"{seed}-{getattr(op, 'name', op)}.lmdb"), operators=[op], config=cfg,
                seed=seed) as eng:
        while eng.evaluations < evaluations:
            for c in eng.ask(1):
                lt = log_times(c.genome.params)
                for k, v in lt.items():
                    best[k] = min(best.get(k, v), v)
                eng.tell(c.id, evaluation(c.genome.params))
    return sum(best.values())


def test_screening_finds_faster_genomes_in_the_same_evaluations(tmp_path: Path) -> None:
    seeds = range(6)
    plain = [_search(tmp_path, ParamMutation(n_changes=2), s) for s in seeds]
    screened = [_search(tmp_path, Screened(ParamMutation(n_changes=2), pool=8), s) for s in seeds]
    # lower is faster; the optimum of the landscape is -3.0 (both cases at their best)
    assert float(np.mean(screened)) < float(np.mean(plain)) - 0.05, (plain, screened)
    assert sum(s <= p for s, p in zip(screened, plain, strict=True)) >= 4, (plain, screened)
