"""Per-case champions: a genome fastest on one timed case stays a parent even with a low fitness."""

from __future__ import annotations

from pathlib import Path

import pytest

from evo.engine import Budget, Engine, EngineConfig
from evo.types import Evaluation, Status
from tests.evo.cpu_problem import ParamsExecutor, make_problem, seed_genome


def _evaluation(fitness: float, small_ms: float, large_ms: float) -> Evaluation:
    return Evaluation(Status.OK, fitness=fitness, resources={"registers": 32},
                      metrics={"cases": {"N=256:float32": {"time_ms": small_ms},
                                         "N=65536:float32": {"time_ms": large_ms}}})


GENERALIST = seed_genome(THREADS=128)
SPECIALIST = seed_genome(THREADS=448)  # slow overall, fastest on the long case
RUNNER_UP = seed_genome(THREADS=256)  # the best fitness, but the fastest on no case
OUTCOMES = {GENERALIST.id: _evaluation(0.9, 1.0, 10.0), SPECIALIST.id: _evaluation(0.2, 5.0, 8.0),
            RUNNER_UP.id: _evaluation(1.0, 2.0, 9.0)}


def _parents(tmp_path: Path, name: str, share: float) -> set[str]:
    prob = make_problem(seeds=(GENERALIST, SPECIALIST, RUNNER_UP))
    with Engine(prob, str(tmp_path / name), config=EngineConfig(islands=1, case_champions=share), seed=1) as eng:
        for c in eng.ask(3):
            eng.tell(c.id, OUTCOMES[c.genome.id])
        seen: set[str] = set()
        for _ in range(60):
            seen.update(p.id for p in eng._plan().parents)
    return seen


def test_with_champions_only_the_fastest_per_case_are_parents(tmp_path: Path) -> None:
    assert _parents(tmp_path, "only", 1.0) == {GENERALIST.id, SPECIALIST.id}
    assert RUNNER_UP.id in _parents(tmp_path, "off", 0.0)  # plain elites: everyone


def test_champions_are_tracked_and_drawn_as_parents(tmp_path: Path) -> None:
    prob = make_problem(seeds=(GENERALIST, SPECIALIST))
    cfg = EngineConfig(islands=1, case_champions=1.0, selection="fitness")
    with Engine(prob, str(tmp_path / "a"), config=cfg, seed=1) as eng:
        first, second = eng.ask(2)
        by_id = {GENERALIST.id: _evaluation(0.9, 1.0, 10.0), SPECIALIST.id: _evaluation(0.2, 5.0, 8.0)}
        for c in (first, second):
            eng.tell(c.id, by_id[c.genome.id])
        assert eng._champions["N=65536:float32"][1] == SPECIALIST.id
        assert eng._champions["N=256:float32"][1] == GENERALIST.id
        parents = set()
        for _ in range(40):
            plan = eng._plan()
            parents.update(p.id for p in plan.parents)
        assert SPECIALIST.id in parents  # drawn although its fitness is a quarter of the generalist's
    with Engine(prob, str(tmp_path / "a"), config=cfg, seed=1) as eng:  # rebuilt from the archive on resume
        assert eng.resumed
        assert eng._champions["N=65536:float32"] == (8.0, SPECIALIST.id)


def test_champions_off_and_invalid_setting(tmp_path: Path) -> None:
    prob = make_problem(seeds=(GENERALIST, SPECIALIST))
    cfg = EngineConfig(islands=1, case_champions=0.0)
    with Engine(prob, str(tmp_path / "b"), config=cfg, seed=1) as eng:
        for c in eng.ask(2):
            eng.tell(c.id, _evaluation(0.5, 1.0, 1.0))
        assert eng._champion_pool()  # tracked (cheap) but never drawn
    with pytest.raises(ValueError, match="case_champions=1.5 must be in"):
        EngineConfig(case_champions=1.5)


def _reward_after_a_case_record(tmp_path: Path, name: str, champion_reward: float) -> tuple[float, str]:
    """Seeds told, then one child that is slower overall than its parent but the fastest on
    the long case: the reward its operator's bandit arm received."""
    prob = make_problem(seeds=(GENERALIST, SPECIALIST))
    cfg = EngineConfig(islands=1, case_champions=1.0, champion_reward=champion_reward, new_cell_bonus=0.0)
    with Engine(prob, str(tmp_path / name), config=cfg, seed=1) as eng:
        for c in eng.ask(2):
            eng.tell(c.id, OUTCOMES[c.genome.id])
        (child,) = eng.ask(1)
        before = {n: a.reward for n, a in eng.bandit.arms.items()}
        eng.tell(child.id, _evaluation(0.1, 6.0, 7.0))  # 7 ms beats the specialist's 8 on the long case
        assert eng._champions["N=65536:float32"] == (7.0, child.genome.id)
        arm = eng.bandit.arms[child.operator]
        cost = eng._ops[child.operator].cost_weight  # the arm sums reward per unit cost
        return (arm.reward - before[child.operator] * cfg.bandit_discount) * cost, child.operator


def test_a_new_case_record_rewards_its_operator(tmp_path: Path) -> None:
    gained, op = _reward_after_a_case_record(tmp_path, "on", 0.5)
    assert gained == pytest.approx(0.5 * 1 / 2)  # one of the two timed cases taken over
    none, _ = _reward_after_a_case_record(tmp_path, "off", 0.0)
    assert none == pytest.approx(0.0)  # its fitness fell: nothing else to reward
    with pytest.raises(ValueError, match="champion_reward=-1"):
        EngineConfig(champion_reward=-1.0)


class _CaseExecutor(ParamsExecutor):
    """ParamsExecutor that reports per-case times and records what each submit was handed."""

    def __init__(self) -> None:
        super().__init__(workers=1)
        self.handed: list[dict[str, float] | None] = []

    def evaluate_now(self, genome):  # type: ignore[no-untyped-def]
        e = super().evaluate_now(genome)
        t = float(genome.params["THREADS"])
        return Evaluation(e.status, fitness=e.fitness, resources=e.resources,
                          metrics={**e.metrics, "cases": {"N=256:float32": {"time_ms": t},
                                                          "N=65536:float32": {"time_ms": 1e4 / t}}})

    def submit(self, genome, *, incumbents=None):  # type: ignore[no-untyped-def]
        self.handed.append(None if incumbents is None else dict(incumbents))
        return super().submit(genome)


def _run_with(tmp_path: Path, name: str, ex: ParamsExecutor, racing: bool) -> Engine:
    prob = make_problem(seeds=(GENERALIST, SPECIALIST))
    cfg = EngineConfig(islands=1, in_flight=1, racing=racing)
    eng = Engine(prob, str(tmp_path / name), config=cfg, evaluator=ex, seed=2)
    eng.run(Budget(evaluations=6), progress=False)
    return eng


def test_racing_hands_the_per_case_incumbents_to_the_evaluator(tmp_path: Path) -> None:
    ex = _CaseExecutor()
    with _run_with(tmp_path, "race", ex, racing=True) as eng:
        threads = [float(eng.archive.get(gid).genome.params["THREADS"]) for gid in ex.submitted]
        assert len(threads) == len(ex.handed) == 6
        assert ex.handed[0] is None  # nothing measured yet: a plain submit
        # one evaluation in flight at a time: each submit saw the best of all earlier results
        for i in range(1, 6):
            assert ex.handed[i] == {"N=256:float32": min(threads[:i]), "N=65536:float32": 1e4 / max(threads[:i])}
        assert eng.incumbents() == {"N=256:float32": min(threads), "N=65536:float32": 1e4 / max(threads)}
    off = _CaseExecutor()
    with _run_with(tmp_path, "off", off, racing=False):
        assert off.handed and all(h is None for h in off.handed)


def test_racing_leaves_an_evaluator_without_incumbents_alone(tmp_path: Path) -> None:
    ex = ParamsExecutor()  # submit(genome) only
    with _run_with(tmp_path, "plain", ex, racing=True) as eng:
        assert eng.evaluations == 6 and len(ex.submitted) == 6


def test_which_evaluators_take_incumbents() -> None:
    from evo.engine import _takes_incumbents

    class Plain:
        def submit(self, genome): ...  # type: ignore[no-untyped-def]

    class Keyword:
        def submit(self, genome, *, incumbents=None): ...  # type: ignore[no-untyped-def]

    class Anything:
        def submit(self, genome, **kw): ...  # type: ignore[no-untyped-def]

    class Opaque:
        submit = max  # a builtin without a signature inspect can read: called the plain way

    assert not _takes_incumbents(Plain()) and _takes_incumbents(Keyword()) and _takes_incumbents(Anything())
    assert _takes_incumbents(Opaque()) is False
