"""Engine ask/tell, state checks, budgets, islands, lessons and resume (fast: no compiler).

These tests drive the real Engine over a real LMDB archive with
``cpu_problem.ParamsExecutor``, an executor that scores params on threads; the
compiler-backed runs are in ``test_engine_e2e.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from archive import AddStatus, Archive
from evo.engine import Budget, Candidate, Engine, EngineConfig, EngineError, EngineStateError
from evo.types import Evaluation, Genome, Record, Status
from operators import OperatorContext, OperatorError, ParamMutation, Proposal
from tests.evo.cpu_problem import ParamsExecutor, make_problem, seed_genome


@pytest.fixture
def problem():  # type: ignore[no-untyped-def]
    return make_problem()


def _engine(problem, path: Path, **kw) -> Engine:  # type: ignore[no-untyped-def]
    kw.setdefault("config", EngineConfig(islands=1, in_flight=3))
    return Engine(problem, str(path), **kw)


# --------------------------------------------------------------------------- ask / tell


def test_ask_tell_out_of_order(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ex = ParamsExecutor()
    with _engine(problem, tmp_path / "a") as eng:
        (seed,) = eng.ask(1)
        assert seed.operator == "seed" and seed.parents == ()
        eng.tell(seed.id, ex.evaluate_now(seed.genome))
        cands = eng.ask(4)
        assert len(cands) == 4
        assert len({c.id for c in cands}) == 4 and len({c.genome.id for c in cands}) == 4
        assert all(c.parents == (seed.genome.id,) or len(c.parents) == 2 for c in cands)
        results = {}
        for c in reversed(cands):  # out of order
            results[c.id] = eng.tell(c.id, ex.evaluate_now(c.genome))
        assert all(r.status in (AddStatus.NEW, AddStatus.IMPROVED, AddStatus.NOT_ADDED) for r in results.values())
        assert len(eng.archive) == 5
        for c in cands:
            rec = eng.archive.get(c.genome.id)
            assert rec is not None
            assert rec.operator == c.operator and rec.parents == c.parents and rec.generation == c.generation
        assert eng.evaluations == 5
        assert eng.pending == []


def test_misuse_errors(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ex = ParamsExecutor()
    eng = _engine(problem, tmp_path / "a", evaluator=ex)
    (c,) = eng.ask(1)
    with pytest.raises(EngineStateError, match="unknown candidate id 999"):
        eng.tell(999, ex.evaluate_now(c.genome))
    with pytest.raises(TypeError, match="Evaluation"):
        eng.tell(c.id, {"status": "ok"})  # type: ignore[arg-type]
    with pytest.raises(EngineStateError, match="outstanding"):
        eng.run(Budget(evaluations=3), progress=False)
    eng.tell(c.id, ex.evaluate_now(c.genome))
    with pytest.raises(EngineStateError, match="already told"):
        eng.tell(c.id, ex.evaluate_now(c.genome))
    with pytest.raises(ValueError, match="n >= 1"):
        eng.ask(0)
    eng.close()
    with pytest.raises(EngineStateError, match="closed"):
        eng.ask(1)
    with pytest.raises(EngineStateError, match="closed"):
        eng.run(Budget(evaluations=1))
    with pytest.raises(ValueError, match="selection"):
        EngineConfig(selection="greedy")
    with pytest.raises(ValueError, match="islands"):
        EngineConfig(islands=0)
    with pytest.raises(ValueError, match="Budget.seconds"):
        Budget(seconds=-1)


def test_no_parent_is_a_clear_error(tmp_path: Path) -> None:
    problem = make_problem(seeds=())
    with _engine(problem, tmp_path / "a") as eng, pytest.raises(EngineError, match="Problem.seeds"):
        eng.ask(1)


def test_failed_seed_gives_lesson_and_clear_error(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ex = ParamsExecutor(fail=lambda p: True)
    with _engine(problem, tmp_path / "a", evaluator=ex) as eng:
        with pytest.raises(EngineError, match="no OK record"):
            eng.run(Budget(evaluations=5), progress=False)
        assert eng.archive.counts().get("compile_error") == 1
        (lesson,) = eng.archive.lessons.all()
        assert lesson.outcome == "compile_error" and "synthetic compile error" in lesson.message


# --------------------------------------------------------------------------- operators, lessons


class RecordingMutation(ParamMutation):
    """ParamMutation that remembers the lessons it was shown."""

    name = "recording_mutation"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[str]] = []
        self._lock = threading.Lock()

    def propose(self, parents: Sequence[Record], ctx: OperatorContext) -> list[Proposal]:
        with self._lock:
            self.seen.append([lesson.change for lesson in ctx.lessons])
        assert ctx.archive is not None and len(ctx.archive) >= 1
        with pytest.raises(AttributeError, match="read-only"):
            ctx.archive.add  # noqa: B018
        return super().propose(parents, ctx)


def test_lessons_written_with_param_diffs_and_shown_later(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    op = RecordingMutation()
    with _engine(problem, tmp_path / "a", operators=[op], evaluator=ParamsExecutor()) as eng:
        eng.run(Budget(evaluations=12), progress=False)
        lessons = eng.archive.lessons.all()
        assert lessons, "each told child must leave a lesson"
        assert all(lesson.operator == "recording_mutation" for lesson in lessons)
        assert all("->" in lesson.change for lesson in lessons)  # "UNROLL 1->2" style diffs
        assert {lesson.outcome for lesson in lessons} <= {"improved", "no_gain"}
        assert any(lesson.delta is not None for lesson in lessons)
        assert op.seen[0] == []  # first call: nothing learned yet
        later = [changes for changes in op.seen if changes]
        assert later and any("->" in ch for ch in later[-1])


def test_operator_error_becomes_lesson_and_run_goes_on(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    calls = {"n": 0}

    def flaky(parents, ctx):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] % 2:
            raise OperatorError("no usable code block in the response")
        return ParamMutation().propose(parents, ctx)

    with _engine(problem, tmp_path / "a", operators=[flaky], evaluator=ParamsExecutor()) as eng:
        eng.run(Budget(evaluations=6), progress=False)
        errs = eng.archive.lessons.by_outcome("operator_error")
        assert errs and errs[0].message == "no usable code block in the response"
        assert eng.stats()["operator_errors"] == len(errs)
        assert eng.evaluations == 6


def test_duplicates_skipped_before_evaluation(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def echo(parents, ctx):  # type: ignore[no-untyped-def]
        child = ParamMutation().propose(parents, ctx)
        return [parents[0].genome, *child, *child]  # the parent again and the child twice

    ex = ParamsExecutor()
    with _engine(problem, tmp_path / "a", operators=[echo], evaluator=ex) as eng:
        eng.run(Budget(evaluations=8), progress=False)
        st = eng.stats()
        assert st["duplicates"] >= 14
        assert len(ex.submitted) == len(set(ex.submitted)) == len(eng.archive) == 8


# --------------------------------------------------------------------------- budgets


def test_budget_seconds(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import time

    ex = ParamsExecutor(delay=0.05)
    with _engine(problem, tmp_path / "a", evaluator=ex) as eng:
        t0 = time.monotonic()
        eng.run(Budget(seconds=0.8), progress=False)
        took = time.monotonic() - t0
        assert 0.8 <= took < 3.0
        assert eng.evaluations >= 5
        assert eng.pending == [] or all(c.id not in eng._outstanding for c in eng.pending)


def test_budget_target_fraction(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with _engine(problem, tmp_path / "a", evaluator=ParamsExecutor(), seed=3) as eng:
        best = eng.run(Budget(target_fraction=0.2, evaluations=300), progress=False)
        assert best is not None and best.evaluation.metrics["fraction"] >= 0.2
        assert eng.evaluations < 300
        # stopping is prompt: at most the in-flight candidates after the one that hit it
        hits = [r.seq for r in eng.archive.records() if r.evaluation.ok and r.evaluation.metrics["fraction"] >= 0.2]
        assert eng.evaluations <= min(hits) + 1 + eng.config.in_flight


def test_budget_cost_and_llm_budget_exceeded(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def paid(parents, ctx):  # type: ignore[no-untyped-def]
        return [Proposal(g.genome if isinstance(g, Proposal) else g, "paid change", {"cost": 0.25, "model": "m"})
                for g in ParamMutation().propose(parents, ctx)]

    with _engine(problem, tmp_path / "a", operators=[paid], evaluator=ParamsExecutor()) as eng:
        eng.run(Budget(cost=1.0, evaluations=100), progress=False)
        assert 1.0 <= eng.cost < 1.0 + 0.25 * (eng.config.in_flight + 1)
        assert eng.evaluations < 100

    from operators import BudgetExceeded

    calls = {"n": 0}

    def capped(parents, ctx):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] > 4:
            raise BudgetExceeded("cost cap 1.00 reached")
        return ParamMutation().propose(parents, ctx)

    with _engine(problem, tmp_path / "b", operators=[capped], evaluator=ParamsExecutor(delay=0.02)) as eng:
        eng.run(Budget(evaluations=100), progress=False)
        told = eng.evaluations
        assert 2 <= told <= 5
        assert not eng.archive.lessons.by_outcome("operator_error")
        assert eng.archive.load_state()["evaluations"] == told


# --------------------------------------------------------------------------- islands


def test_islands_migrate(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = EngineConfig(islands=3, migration_interval=4, in_flight=2)
    with _engine(problem, tmp_path / "a", config=cfg, evaluator=ParamsExecutor()) as eng:
        eng.run(Budget(evaluations=24), progress=False)
        assert eng.islands.migrations == 6
        assert {r.island for r in eng.archive.records()} == {0, 1, 2}
        migrants = 0
        for i in range(3):
            for e in eng.islands.entries(i):
                if eng.archive.get(e.id).island != i:
                    migrants += 1
        assert migrants >= 1
        st = eng.archive.load_state()["islands"]
        assert st["migrations"] == 6 and len(st["pools"]) == 3


@pytest.mark.parametrize("strategy", ["uniform", "fitness", "curiosity"])
def test_selection_strategies_run(problem, tmp_path: Path, strategy: str) -> None:  # type: ignore[no-untyped-def]
    cfg = EngineConfig(islands=1, selection=strategy)
    with _engine(problem, tmp_path / "a", config=cfg, evaluator=ParamsExecutor()) as eng:
        best = eng.run(Budget(evaluations=15), progress=False)
        assert best is not None and best.fitness > eng.archive.get(seed_genome().id).fitness
        if strategy == "curiosity":
            assert eng.curiosity.scores


# --------------------------------------------------------------------------- state and resume


def test_resume_continues_the_same_rng_stream(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ex = ParamsExecutor()

    def steps(eng: Engine, k: int) -> list[str]:
        ids = []
        for _ in range(k):
            (c,) = eng.ask(1)
            eng.tell(c.id, ex.evaluate_now(c.genome))
            ids.append(c.genome.id)
        return ids

    with _engine(problem, tmp_path / "straight", seed=7) as eng:
        straight = steps(eng, 8)
    with _engine(problem, tmp_path / "split", seed=7) as eng:
        first = steps(eng, 4)
        gen = eng.generation
    with _engine(problem, tmp_path / "split", seed=12345) as eng:  # the saved RNG state wins
        assert eng.resumed and eng.generation == gen and eng.evaluations == 4
        second = steps(eng, 4)
    assert first + second == straight


def test_seeds_added_to_the_problem_are_evaluated_on_resume(tmp_path: Path) -> None:
    ex = ParamsExecutor()
    first = make_problem()
    with _engine(first, tmp_path / "a", seed=3) as eng:
        (c,) = eng.ask(1)
        assert c.operator == "seed"
        eng.tell(c.id, ex.evaluate_now(c.genome))
    extra = seed_genome(THREADS=448, UNROLL=2)
    grown = make_problem(seeds=(seed_genome(), extra))
    with _engine(grown, tmp_path / "a", seed=3) as eng:
        assert eng.resumed
        (c,) = eng.ask(1)
        assert c.operator == "seed" and c.genome.id == extra.id  # the new seed, not the old one again
        eng.tell(c.id, ex.evaluate_now(c.genome))
    with _engine(grown, tmp_path / "a", seed=3) as eng:  # nothing queued twice
        assert all(c.operator != "seed" for c in eng.ask(2))


def test_pending_candidates_resubmitted_after_restart(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ex = ParamsExecutor()
    eng = _engine(problem, tmp_path / "a")
    (s,) = eng.ask(1)
    eng.tell(s.id, ex.evaluate_now(s.genome))
    cands = eng.ask(3)
    eng.tell(cands[1].id, ex.evaluate_now(cands[1].genome))
    # simulate a crash: nothing closed; a second process opens the archive... here we
    # drop the engine without close() and reopen from the saved state
    state = eng.archive.load_state()
    assert [p["id"] for p in state["pending"]] == [cands[0].id, cands[2].id]
    eng.archive.close()
    eng2 = _engine(problem, tmp_path / "a")
    assert [c.id for c in eng2.pending] == [cands[0].id, cands[2].id]
    again = eng2.ask(2)
    assert [c.genome.id for c in again] == [cands[0].genome.id, cands[2].genome.id]
    for c in again:
        eng2.tell(c.id, ex.evaluate_now(c.genome))
    assert len(eng2.archive) == 4 and eng2.evaluations == 4
    eng2.close()


def test_candidate_state_round_trip() -> None:
    c = Candidate(3, seed_genome(UNROLL=2), ("p",), "param_mutation", 5, 1, "UNROLL 1->2", {"cost": 0.1})
    d = Candidate.from_state(c.to_state())
    assert d == c


def test_warm_start_from_another_archive(tmp_path: Path) -> None:
    ex = ParamsExecutor()
    src_problem = make_problem("cpu_axpy_small", check_shapes=({"N": 100},))
    with _engine(src_problem, tmp_path / "src", evaluator=ex, seed=1) as eng:
        eng.run(Budget(evaluations=15), progress=False)
        src_elites = {r.id for r in eng.archive.elites()}
        n_lessons = len(eng.archive.lessons.all())
    assert n_lessons > 0
    dst_problem = make_problem("cpu_axpy_big", check_shapes=({"N": 100000},), seeds=())
    cfg = EngineConfig(islands=1, warm_start_elites=5)
    with Engine(dst_problem, str(tmp_path / "dst"), evaluator=ParamsExecutor(), config=cfg,
                warm_start=str(tmp_path / "src")) as eng:
        assert len(eng.archive.lessons.all()) == n_lessons
        eng.run(Budget(evaluations=8), progress=False)
        warm = [r for r in eng.archive.records() if r.operator == "warm_start"]
        assert len(warm) == min(5, len(src_elites))
        assert {r.id for r in warm} <= src_elites
        assert all(r.meta["warm_start"]["source_problem"] == "cpu_axpy_small" for r in warm)
        assert [r.seq for r in eng.archive.records()][: len(warm)] == sorted(r.seq for r in warm)
        after_run = len(eng.archive.lessons.all())
    # reopening with the same warm_start neither copies the lessons again nor re-queues elites
    with Engine(dst_problem, str(tmp_path / "dst"), evaluator=ParamsExecutor(), config=cfg,
                warm_start=str(tmp_path / "src")) as eng:
        assert len(eng.archive.lessons.all()) == after_run
        assert eng.archive.load_state()["warm_started"] is True
        assert eng.archive.load_state()["seed_queue"] == []


def test_warm_start_genomes_go_before_the_problems_seeds(tmp_path: Path) -> None:
    """An earlier run's elites are asked for ahead of the problem's seeds (so they set the
    racing incumbents first), in their own order, and a reopened engine keeps that order."""
    from archive import Archive

    src_problem = make_problem("cpu_axpy_small")
    src = Archive(src_problem, str(tmp_path / "src"))
    olds = [seed_genome(UNROLL=u, VEC=v) for u, v in ((2, 1), (1, 2), (2, 4))]
    for i, g in enumerate(olds):
        ev = Evaluation(Status.OK, fitness=1.0 - 0.1 * i, resources={"registers": 8 + 8 * i})
        src.add(Record(g, ev, operator="param_mutation"))
    src.close()
    seeds = (seed_genome(), seed_genome(THREADS=256))
    assert seeds[0].id != seeds[1].id
    dst_problem = make_problem("cpu_axpy_big", seeds=seeds)
    cfg = EngineConfig(islands=1, warm_start_elites=3, warm_start_champions=False)
    with Engine(dst_problem, str(tmp_path / "dst"), evaluator=ParamsExecutor(), config=cfg,
                warm_start=str(tmp_path / "src")) as eng:
        first = eng.ask(2)
        queued = [item["genome"]["id"] for item in eng.archive.load_state()["seed_queue"]]
    assert [c.operator for c in first] == ["warm_start", "warm_start"]
    assert [c.genome.id for c in first] == [olds[0].id, olds[1].id]  # best first
    assert queued == [olds[2].id, seeds[0].id, seeds[1].id]
    with Engine(dst_problem, str(tmp_path / "dst"), evaluator=ParamsExecutor(), config=cfg,
                warm_start=str(tmp_path / "src")) as eng:  # reopened: the two asked are pending
        rest = eng.ask(5)
    assert [c.genome.id for c in rest][:2] == [olds[0].id, olds[1].id]
    assert [c.genome.id for c in rest][2:5] == [olds[2].id, seeds[0].id, seeds[1].id]


def test_warm_start_records_which_operator_first_found_each_genome(tmp_path: Path) -> None:
    """``meta["warm_start"]["found_by"]``: the source record's operator, or, for a genome the
    source run had itself warm-started, the operator recorded there (None if it recorded none)."""
    from archive import Archive

    src = Archive(make_problem("cpu_axpy_small"), str(tmp_path / "src"))
    made = {(2, 1): ("param_crossover", {}), (1, 2): ("seed", {}),
            (2, 2): ("warm_start", {"warm_start": {"source_id": "a", "found_by": "param_mutation"}}),
            (4, 1): ("warm_start", {"warm_start": {"source_id": "b"}})}
    ids = {}
    for i, ((u, v), (op, meta)) in enumerate(made.items()):
        g = seed_genome(UNROLL=u, VEC=v)
        ids[g.id] = op, meta
        ev = Evaluation(Status.OK, fitness=1.0 - 0.1 * i, resources={"registers": 8 + 8 * i})
        src.add(Record(g, ev, operator=op, meta=meta))
    src.close()
    cfg = EngineConfig(islands=1, warm_start_elites=4, warm_start_champions=False)
    with Engine(make_problem("cpu_axpy_big", seeds=()), str(tmp_path / "dst"), evaluator=ParamsExecutor(),
                config=cfg, warm_start=str(tmp_path / "src")) as eng:
        found = {c.genome.id: c.meta["warm_start"]["found_by"] for c in eng.ask(4)}
    assert len(found) == 4
    expect = {"param_crossover": "param_crossover", "seed": "seed"}
    for gid, (op, meta) in ids.items():
        want = expect.get(op) or meta["warm_start"].get("found_by")
        assert found[gid] == want, (op, meta)


def _vec_wide(p: Any) -> bool:
    return int(p["VEC"]) > 1


def _family_v2(space_extra: dict, conditions: tuple = (), seeds: tuple = ()) -> Any:
    """make_problem's family grown by knobs (``space_extra``) and a new kernel text."""
    import dataclasses

    from evo.space import ParamSpace

    base = make_problem("cpu_axpy_v2")
    space = ParamSpace({**base.params.params, **space_extra}, base.params.constraints, conditions)
    return dataclasses.replace(base, params=space, seeds=seeds)


def _old_archive(path: Path) -> dict[str, Genome]:
    """An archive of the family as it was: a seed, two param-only descendants and an LLM rewrite."""
    from archive import Archive

    src = Archive(make_problem("cpu_axpy_v1"), str(path))
    old = seed_genome()
    made = {"seed": old, "param_mutation": old.with_params(UNROLL=2, VEC=2),
            "param_crossover": old.with_params(UNROLL=4), "llm_rewrite": Genome(old.source + "\n// rewritten\n",
                                                                               dict(old.params), entry=old.entry)}
    for i, (op, g) in enumerate(made.items()):
        src.add(Record(g, Evaluation(Status.OK, fitness=1.0 - 0.1 * i, resources={"registers": 8 + 8 * i}),
                       operator=op))
    src.close()
    return made


def test_warm_start_rebases_param_only_genomes_on_the_current_source(tmp_path: Path) -> None:
    """The family gained a knob (with a condition) and a new kernel text: the old archive's seed and
    its param-only descendants come back on the new text with the knob at its condition's default;
    an LLM-rewritten genome keeps its own text, and lacking the knob it is skipped."""
    from evo.space import Choice, Condition

    made = _old_archive(tmp_path / "src")
    new_source = made["seed"].source + "\n// v2: the FAST knob\n"
    seed = Genome(new_source, {**made["seed"].params, "VEC": 2, "FAST": 1}, entry="axpy")
    prob = _family_v2({"FAST": Choice((0, 1))}, (Condition("FAST", _vec_wide, 0, "FAST only with VEC > 1"),),
                      seeds=(seed,))
    cfg = EngineConfig(islands=1, warm_start_elites=4, warm_start_champions=False)
    with Engine(prob, str(tmp_path / "dst"), evaluator=ParamsExecutor(), config=cfg,
                warm_start=str(tmp_path / "src")) as eng:
        asked = eng.ask(4)
        rebased = eng.stats().get("warm_start_rebased")
    warm = [c for c in asked if c.operator == "warm_start"]
    assert len(warm) == 3 and rebased == 3
    assert all(c.genome.source == new_source for c in warm)
    by_old = {c.meta["warm_start"]["source_id"]: c for c in warm}
    assert set(by_old) == {made[k].id for k in ("seed", "param_mutation", "param_crossover")}
    for op in ("seed", "param_mutation", "param_crossover"):
        c = by_old[made[op].id]
        assert dict(c.genome.params) == {**made[op].params, "FAST": 0}
        assert c.meta["warm_start"]["rebased"] == {"filled": {"FAST": 0}}
    assert asked[3].operator == "seed" and asked[3].genome == seed


def test_warm_start_rebase_off_or_impossible_keeps_the_old_genomes_out(tmp_path: Path) -> None:
    """warm_start_rebase=False keeps each genome's own text, so genomes lacking the new knob are
    skipped; a new knob without a condition has no default to give them, so they are skipped too."""
    from evo.space import Choice, Condition

    made = _old_archive(tmp_path / "src")
    seed = Genome(made["seed"].source + "\n// v2\n", {**made["seed"].params, "FAST": 0}, entry="axpy")
    cond = (Condition("FAST", _vec_wide, 0, "FAST only with VEC > 1"),)
    off = EngineConfig(islands=1, warm_start_elites=4, warm_start_champions=False, warm_start_rebase=False)
    with Engine(_family_v2({"FAST": Choice((0, 1))}, cond, seeds=(seed,)), str(tmp_path / "off"),
                evaluator=ParamsExecutor(), config=off, warm_start=str(tmp_path / "src")) as eng:
        assert [c.operator for c in eng.ask(2)] == ["seed"]
    on = EngineConfig(islands=1, warm_start_elites=4, warm_start_champions=False)
    with Engine(_family_v2({"FAST": Choice((0, 1))}, seeds=(seed,)), str(tmp_path / "nocond"),
                evaluator=ParamsExecutor(), config=on, warm_start=str(tmp_path / "src")) as eng:
        assert [c.operator for c in eng.ask(2)] == ["seed"]
    # the same family (no new knob, same text): nothing to rebase, every genome comes back as it was
    with Engine(make_problem("cpu_axpy_v1"), str(tmp_path / "same"), evaluator=ParamsExecutor(), config=on,
                warm_start=str(tmp_path / "src")) as eng:
        warm = [c for c in eng.ask(5) if c.operator == "warm_start"]
        assert {c.genome.id for c in warm} == {g.id for g in made.values()}
        assert "warm_start_rebased" not in eng.stats()


def test_warm_start_rebase_fills_a_knob_from_its_own_default(tmp_path: Path) -> None:
    """A new knob read by every genome (no condition) with a default of its own (``Choice(...,
    default=)``): the old archive's param-only genomes come back with it at that default."""
    from evo.space import Choice

    made = _old_archive(tmp_path / "src")
    new_source = made["seed"].source + "\n// v2: the BUILD knob\n"
    seed = Genome(new_source, {**made["seed"].params, "BUILD": 1}, entry="axpy")
    prob = _family_v2({"BUILD": Choice((0, 1), default=0)}, seeds=(seed,))
    cfg = EngineConfig(islands=1, warm_start_elites=4, warm_start_champions=False)
    with Engine(prob, str(tmp_path / "dst"), evaluator=ParamsExecutor(), config=cfg,
                warm_start=str(tmp_path / "src")) as eng:
        warm = [c for c in eng.ask(4) if c.operator == "warm_start"]
    assert len(warm) == 3
    for c in warm:
        assert c.genome.source == new_source and c.genome.params["BUILD"] == 0
        assert c.meta["warm_start"]["rebased"] == {"filled": {"BUILD": 0}}


def test_archive_object_is_not_closed_by_engine(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    arch = Archive(problem, str(tmp_path / "a"))
    with Engine(problem, arch, evaluator=ParamsExecutor(), config=EngineConfig(islands=1)) as eng:
        eng.run(Budget(evaluations=3), progress=False)
    assert len(arch) == 3  # still open and usable
    ev = Evaluation(Status.OK, fitness=1.0)
    assert ev.ok
    arch.close()


def test_warm_start_brings_per_case_champions_the_elites_miss(tmp_path: Path) -> None:
    """A genome fastest on one case but beaten in its cell (so not an elite) is re-evaluated too,
    with the cases it won; ``warm_start_champions=False`` leaves it out."""
    from archive import Archive

    problem = make_problem()
    src = Archive(problem, str(tmp_path / "src"))
    base = seed_genome()
    best = base.with_params(UNROLL=2)
    niche = base.with_params(UNROLL=4)  # same cell as best (VEC and registers alike), lower fitness

    def rec(g: Genome, fitness: float, times: dict[str, float]) -> Record:
        cases = {k: {"time_ms": t} for k, t in times.items()}
        ev = Evaluation(Status.OK, fitness=fitness, metrics={"cases": cases}, resources={"registers": 32})
        return Record(g, ev, operator="param_mutation")

    src.add(rec(best, 0.9, {"N=1000:float32": 0.01, "N=4096:float32": 0.02}))
    src.add(rec(niche, 0.5, {"N=1000:float32": 0.05, "N=4096:float32": 0.015}))
    assert {r.genome.id for r in src.elites()} == {best.id}
    src.close()

    dst_problem = make_problem("cpu_axpy_big", check_shapes=({"N": 100000},), seeds=())
    cfg = EngineConfig(islands=1, warm_start_elites=1)
    with Engine(dst_problem, str(tmp_path / "dst"), evaluator=ParamsExecutor(), config=cfg,
                warm_start=str(tmp_path / "src")) as eng:
        eng.run(Budget(evaluations=2), progress=False)
        warm = {r.genome.id: r.meta["warm_start"] for r in eng.archive.records() if r.operator == "warm_start"}
    assert set(warm) == {best.id, niche.id}
    assert warm[best.id]["champion_of"] == ["N=1000:float32"]
    assert warm[niche.id]["champion_of"] == ["N=4096:float32"] and warm[niche.id]["source_fitness"] == 0.5

    cfg = EngineConfig(islands=1, warm_start_elites=1, warm_start_champions=False)
    with Engine(dst_problem, str(tmp_path / "dst2"), evaluator=ParamsExecutor(), config=cfg,
                warm_start=str(tmp_path / "src")) as eng:
        eng.run(Budget(evaluations=2), progress=False)
        (only,) = [r for r in eng.archive.records() if r.operator == "warm_start"]
        assert only.genome.id == best.id and "champion_of" not in only.meta["warm_start"]


def test_warm_start_per_case_brings_close_runners_up(tmp_path: Path) -> None:
    """``warm_start_per_case=3`` re-evaluates each case's runners-up too when they are within
    ``warm_start_within`` of the champion (for an archive searched on another GPU); a farther one
    is left out, and the default (1) takes the champions alone."""
    from archive import Archive

    problem = make_problem()
    src = Archive(problem, str(tmp_path / "src"))
    base = seed_genome()
    champ, close, far = base.with_params(UNROLL=2), base.with_params(UNROLL=4), base.with_params(UNROLL=8)

    def rec(g: Genome, fitness: float, t: float) -> Record:
        ev = Evaluation(Status.OK, fitness=fitness, metrics={"cases": {"N=1000:float32": {"time_ms": t}}},
                        resources={"registers": 32})
        return Record(g, ev, operator="param_mutation")

    src.add(rec(champ, 0.9, 0.0100))
    src.add(rec(close, 0.5, 0.0103))  # 3% slower: a runner-up within 5%
    src.add(rec(far, 0.4, 0.0120))  # 20% slower
    src.close()

    def warm(cfg: EngineConfig, name: str) -> dict[str, dict[str, Any]]:
        dst_problem = make_problem("cpu_axpy_big", check_shapes=({"N": 100000},), seeds=())
        with Engine(dst_problem, str(tmp_path / name), evaluator=ParamsExecutor(), config=cfg,
                    warm_start=str(tmp_path / "src")) as eng:
            eng.run(Budget(evaluations=3), progress=False)
            return {r.genome.id: r.meta["warm_start"] for r in eng.archive.records() if r.operator == "warm_start"}

    got = warm(EngineConfig(islands=1, warm_start_elites=1, warm_start_per_case=3), "dst")
    assert set(got) == {champ.id, close.id}
    assert got[champ.id]["champion_of"] == ["N=1000:float32"] and "runner_up_of" not in got[champ.id]
    assert got[close.id]["runner_up_of"] == ["N=1000:float32"] and "champion_of" not in got[close.id]
    wide = warm(EngineConfig(islands=1, warm_start_elites=1, warm_start_per_case=3, warm_start_within=0.5), "wide")
    assert set(wide) == {champ.id, close.id, far.id}
    assert set(warm(EngineConfig(islands=1, warm_start_elites=1), "one")) == {champ.id}


class _OnGpu(ParamsExecutor):
    """ParamsExecutor that reports a GPU, as the real evaluator does after its first evaluation."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.device_info = {"name": name, "compute_capability": "9.0"}


def _seeds_source(tmp_path: Path, gpu: str | None) -> tuple[Genome, Genome, Genome, list[Genome]]:
    """A warm-start archive filled on ``gpu`` holding one of three seeds OK and another failed,
    plus three better genomes (its elites, re-evaluated first)."""
    src = Archive(make_problem(), str(tmp_path / "src"))
    if gpu is not None:
        src.set_device({"name": gpu, "compute_capability": "9.0"})
    ok_seed, failed_seed, new_seed = seed_genome(), seed_genome(THREADS=256), seed_genome(THREADS=64)
    src.add(Record(ok_seed, Evaluation(Status.OK, fitness=0.1, resources={"registers": 8}), operator="seed"))
    src.add(Record(failed_seed, Evaluation(Status.COMPILE_ERROR, artifacts={"compile_log": "x"}), operator="seed"))
    elites = [seed_genome(UNROLL=u, VEC=v) for u, v in ((2, 1), (1, 2), (2, 2))]
    for i, g in enumerate(elites):
        src.add(Record(g, Evaluation(Status.OK, fitness=0.9 - 0.1 * i, resources={"registers": 8 + 8 * i}),
                       operator="param_mutation"))
    src.close()
    return ok_seed, failed_seed, new_seed, elites


@pytest.mark.parametrize("mode,gpu,skipped", [("auto", "GPU A", True), ("auto", "GPU B", False),
                                              ("new", "GPU B", True), ("all", "GPU A", False)])
def test_warm_start_seeds_the_source_evaluated_on_this_gpu_are_not_timed_again(
        tmp_path: Path, mode: str, gpu: str, skipped: bool) -> None:
    """``warm_start_seeds``: "auto" leaves out the problem's seeds that the warm-start archive
    evaluated OK when it was filled on the GPU the evaluator reports; on another GPU, or with
    "all", they are evaluated; "new" leaves them out anywhere. Seeds it failed or never saw
    are always evaluated, and the choice survives a reopened engine."""
    ok_seed, failed_seed, new_seed, elites = _seeds_source(tmp_path, "GPU A")
    problem = make_problem(seeds=(ok_seed, failed_seed, new_seed))
    cfg = EngineConfig(islands=1, in_flight=1, warm_start_elites=3, warm_start_champions=False,
                       warm_start_seeds=mode)
    with Engine(problem, str(tmp_path / "dst"), evaluator=_OnGpu(gpu), config=cfg,
                warm_start=str(tmp_path / "src")) as eng:
        eng.run(Budget(evaluations=4), progress=False)  # three elites, then a seed
        assert eng.archive.header["device"]["name"] == gpu
    with Engine(problem, str(tmp_path / "dst"), evaluator=_OnGpu(gpu), config=cfg,
                warm_start=str(tmp_path / "src")) as eng:
        eng.run(Budget(evaluations=6), progress=False)  # resumed (the budget counts from the start)
        seeds = [r.genome.id for r in eng.archive.records() if r.operator == "seed"]
        stats = eng.stats()
        assert [r.genome.id for r in eng.archive.records()][:3] == [g.id for g in elites]
    want = [failed_seed.id, new_seed.id] if skipped else [ok_seed.id, failed_seed.id, new_seed.id]
    assert seeds[: len(want)] == want
    assert stats["warm_start_seeds_skipped"] == (1 if skipped else 0)


def _chain_run1(tmp_path: Path) -> tuple[tuple[Genome, Genome, Genome], Any, EngineConfig]:
    """Run 1 of a warm-start chain on GPU A (from :func:`_seeds_source`'s archive): it leaves out
    the seed that archive evaluated OK and times the other two. Returns the three seeds (OK in the
    source, failed there, new), the problem and the config."""
    ok_seed, failed_seed, new_seed, _ = _seeds_source(tmp_path, "GPU A")
    problem = make_problem(seeds=(ok_seed, failed_seed, new_seed))
    cfg = EngineConfig(islands=1, in_flight=1, warm_start_elites=3, warm_start_champions=False)
    with Engine(problem, str(tmp_path / "run1"), evaluator=_OnGpu("GPU A"), config=cfg,
                warm_start=str(tmp_path / "src")) as eng:
        eng.run(Budget(evaluations=5), progress=False)
        assert eng.stats()["warm_start_seeds_skipped"] == 1
        assert ok_seed.id not in eng.archive
    return (ok_seed, failed_seed, new_seed), problem, cfg


@pytest.mark.parametrize("gpu,skipped", [("GPU A", True), ("GPU B", False)])
def test_warm_start_chain_keeps_seeds_left_out_earlier(tmp_path: Path, gpu: str, skipped: bool) -> None:
    """A warm start from an archive that itself left a seed out ("auto", same GPU and problem)
    counts that seed as known too: a chain src -> run 1 -> run 2 on GPU A times it in neither run
    (without the inheritance run 2 would time it again: run 1's archive holds no record of it).
    Run 2 on another GPU times every seed."""
    (ok_seed, failed_seed, new_seed), problem, cfg = _chain_run1(tmp_path)
    with Engine(problem, str(tmp_path / "run2"), evaluator=_OnGpu(gpu), config=cfg,
                warm_start=str(tmp_path / "run1")) as eng:
        eng.run(Budget(evaluations=8), progress=False)
        seeds = {r.genome.id for r in eng.archive.records() if r.operator == "seed"}
        assert eng.stats()["warm_start_seeds_skipped"] == (3 if skipped else 0)
    # run 1 timed the other two seeds itself (OK there), so on GPU A run 2 knows all three
    assert seeds == (set() if skipped else {ok_seed.id, failed_seed.id, new_seed.id})


def test_warm_start_from_an_archive_with_an_unreadable_state_times_the_seeds(tmp_path: Path, monkeypatch,
                                                                             caplog) -> None:
    """A source whose saved engine state cannot be read still warm-starts: only the seeds it left
    out earlier lose their shortcut (they are evaluated), with a warning."""
    from archive import ArchiveError

    (ok_seed, _, _), problem, cfg = _chain_run1(tmp_path)
    load = Archive.load_state

    def damaged(self: Archive) -> dict[str, Any] | None:
        if self.path is not None and self.path.name == "run1":  # the source only, not run 2's own state
            raise ArchiveError("the saved engine state is damaged")
        return load(self)

    monkeypatch.setattr(Archive, "load_state", damaged, raising=True)
    with Engine(problem, str(tmp_path / "run2"), evaluator=_OnGpu("GPU A"), config=cfg,
                warm_start=str(tmp_path / "run1")) as eng:
        eng.run(Budget(evaluations=8), progress=False)
        seeds = {r.genome.id for r in eng.archive.records() if r.operator == "seed"}
    assert seeds == {ok_seed.id}
    assert "saved engine state is unreadable" in caplog.text


@pytest.mark.parametrize("what", ["source without a GPU", "another problem"])
def test_warm_start_seeds_auto_times_them_unless_gpu_and_problem_match(tmp_path: Path, what: str) -> None:
    """"auto" evaluates every seed when the warm-start archive recorded no GPU, or was filled
    for another problem (other timed shapes: its times say nothing about these cases)."""
    ok_seed, failed_seed, new_seed, _ = _seeds_source(tmp_path, None if what == "source without a GPU" else "GPU A")
    seeds = (ok_seed, failed_seed, new_seed)
    problem = (make_problem(seeds=seeds) if what == "source without a GPU" else
               make_problem("cpu_axpy_big", check_shapes=({"N": 100000},), seeds=seeds))
    cfg = EngineConfig(islands=1, in_flight=1, warm_start_elites=3, warm_start_champions=False)
    assert cfg.warm_start_seeds == "auto"
    with Engine(problem, str(tmp_path / "dst"), evaluator=_OnGpu("GPU A"), config=cfg,
                warm_start=str(tmp_path / "src")) as eng:
        eng.run(Budget(evaluations=6), progress=False)
        got = {r.genome.id for r in eng.archive.records() if r.operator == "seed"}
        assert eng.stats()["warm_start_seeds_skipped"] == 0
    assert got == {ok_seed.id, failed_seed.id, new_seed.id}


@pytest.mark.parametrize("kw,message", [({"warm_start_per_case": 0}, "warm_start_per_case=0 must be >= 1"),
                                        ({"warm_start_within": -0.1}, "warm_start_within=-0.1 must be a fraction"),
                                        ({"warm_start_seeds": "some"}, "warm_start_seeds='some' must be one of")])
def test_warm_start_per_case_settings_are_checked(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kw)
