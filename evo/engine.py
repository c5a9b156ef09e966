"""The engine: MAP-Elites search over kernel genomes with an ask/tell interface.

:class:`Engine` owns the loop's state and nothing else: the archive stores every
record, the evaluator scores, the operators propose. Users may drive it by hand
(``ask`` / ``tell``, results accepted out of order, as in Optuna) or call
:meth:`Engine.run`, a thin loop over the same two calls that keeps several candidates
in flight so that proposing (LLM calls, on a thread pool), compiling (the evaluator's
host pool) and GPU timing overlap.

One step:

1. pick an island (round robin) and an operator (a UCB bandit on improvement per
   unit cost, :mod:`evo._bandit`);
2. pick parents from the island's pool (``uniform``, ``fitness`` or ``curiosity``,
   :mod:`evo._selection`); an operator with ``uses_failed_parents`` gets recent failures;
3. ``operator.propose(parents, OperatorContext(...))``; an ``OperatorError`` becomes a
   lesson (outcome ``"operator_error"``) and another operator is tried;
4. children whose genome id is already recorded or in flight are skipped (counted as
   duplicates) before any compile;
5. ``tell``: the record and a lesson are written, the bandit, curiosity scores and
   islands are updated, and the engine state (counters, RNG state, bandit, islands,
   pending candidates) is saved in the archive, so a run killed at any moment resumes
   where it stopped.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import difflib
import logging
import math
import os
import threading
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evo._bandit import OperatorBandit
from evo._islands import Islands
from evo._progress import Progress
from evo._selection import STRATEGIES, Curiosity, Entry, cell_key, select
from evo.types import Evaluation, Genome, Lesson, Problem, Record, Status, thaw

__all__ = ["Budget", "Candidate", "Engine", "EngineConfig", "EngineError", "EngineStateError"]

log = logging.getLogger("evo.engine")

STATE_VERSION = 1
DEFAULT_OPERATORS = ("param_mutation", "screened_param_mutation", "param_crossover")
LLM_OPERATORS = ("llm_diff", "llm_rewrite", "llm_crossover", "llm_repair")
SEED_OPERATORS = ("seed", "warm_start")
WARM_START_SEEDS = ("auto", "all", "new")


def _found_by(record: Any) -> str | None:
    """The operator that first made ``record``'s genome, across warm starts: its own operator,
    or for a warm-started record the one its warm start recorded (None where an older archive
    did not record it)."""
    if record.operator != "warm_start":
        return str(record.operator)
    origin = (record.meta or {}).get("warm_start")
    found = origin.get("found_by") if isinstance(origin, Mapping) else None
    return str(found) if found else None


class EngineError(RuntimeError):
    """The engine cannot go on (no parents to vary, the executor keeps failing, ...)."""


class EngineStateError(EngineError):
    """The engine was used out of order (tell of an unknown id, ask after close, ...)."""


# --------------------------------------------------------------------------- value types


@dataclass(frozen=True)
class Budget:
    """When :meth:`Engine.run` stops; the first limit reached ends the run.

    Attributes:
        evaluations: Stop once this many evaluations are recorded by the engine in
            total, counting earlier sessions of a resumed run (so re-running the same
            script after a crash finishes the same budget).
        seconds: Wall-clock seconds of this :meth:`Engine.run` call.
        cost: LLM spend in the backend's currency (sum of ``Proposal.meta["cost"]``),
            in total over the run's sessions.
        target_fraction: Stop when the best OK evaluation's ``metrics["fraction"]``
            (fraction of the measured ceiling) reaches this value.

    In-flight evaluations are always finished and recorded before ``run`` returns.
    """

    evaluations: int | None = None
    seconds: float | None = None
    cost: float | None = None
    target_fraction: float | None = None

    def __post_init__(self) -> None:
        for name in ("evaluations", "seconds", "cost", "target_fraction"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0):
                raise ValueError(f"Budget.{name} must be a non-negative number or None, got {v!r}")


@dataclass
class EngineConfig:
    """Engine settings.

    Attributes:
        islands: Number of islands (separate parent pools, :mod:`evo._islands`).
        migration_interval: Evaluations between migrations (each island's best is
            copied to the next island).
        selection: Parent selection: ``"uniform"``, ``"fitness"`` or ``"curiosity"``.
        in_flight: Candidates kept submitted (or being proposed) at once by ``run``.
        proposal_workers: Threads calling operators in ``run`` (LLM calls are slow).
        lessons_in_context: Recent lessons handed to operators (plus lessons on the parents).
        bandit_exploration: UCB exploration constant of the operator bandit.
        bandit_discount: Forgetting factor of the bandit (1.0 = never forget).
        new_cell_bonus: Reward added when a child opens a new archive cell.
        repair_reward: Reward for an OK child of parents that all failed.
        dollars_per_unit: LLM spend that counts as one unit of cost (an operator's
            ``cost_weight`` is in units).
        warm_start_elites: Elites of a warm-start archive re-evaluated as seeds.
        warm_start_champions: Also re-evaluate the warm-start archive's per-case champions
            (the fastest record of each timed case, what its export dispatches): a genome
            that wins one case often has a modest overall fitness and loses its cell, so
            the elites alone miss it.
        warm_start_per_case: With ``warm_start_champions``, how many of each timed case's
            fastest records (distinct genomes) are re-evaluated: 1 is the champion alone.
            Raise it when the warm-start archive was searched on another GPU: genomes within a
            few per cent there can be far apart here (an H100 archive's three
            fastest per case, re-timed on an H200, were up to 24% apart, and the H100's
            fastest was not the H200's on 22 of 33 cases).
        warm_start_within: The runners-up taken by ``warm_start_per_case`` > 1 are at most
            this fraction slower than the case's champion in the warm-start archive.
        warm_start_seeds: Which of the problem's seeds a warm-started run evaluates: ``"all"``;
            ``"new"``, those the warm-start archive holds no successful evaluation of (seeds added
            or changed since); ``"auto"`` (default), ``"new"`` when the warm-start archive was
            filled for the same problem (fingerprint: shapes, dtypes, params, ...) on the GPU this
            run's evaluator reports (same name), else ``"all"`` (also while that GPU is not known). On the same GPU, the seeds that lost there lose here too
            (the winners come back as elites or champions); on another GPU they are re-timed:
            of an H100 archive's genomes re-timed on an H200, 13 of the 16 per-case winners
            were seeds. A seed counts as evaluated also when the warm-start archive's own run
            left it out this way (its saved state; same GPU and problem), so a chain of warm
            starts on one GPU does not re-time it every other run.
        warm_start_rebase: Warm-start genomes whose source is a seed's source in the warm-start
            archive (param-only descendants of the kernel family as it was then) take the
            Problem's current seed source (the seed of the same entry and language, when those
            seeds share one source), so the knobs and fixes added to the family since apply to
            them; a knob they lack is set to its condition's default (the knob switched off, the
            way a family gains knobs), and one without a condition makes the genome skipped. Like
            every warm-start genome they are evaluated again. False: each keeps its own source,
            and a genome lacking a knob of the space is skipped.
        failed_parents: Recent failed records kept as parents for repair operators.
        max_attempts: Operator calls per requested candidate before ``ask`` gives up.
        max_executor_errors: Consecutive executor exceptions (harness faults, not
            candidate faults) after which ``run`` stops with :class:`EngineError`.
        stall_rounds: Consecutive operator calls that yield no new genome (every proposal
            already in the archive or in flight, or the operator failed) after which
            ``run`` stops ("no new genomes"): the operators have exhausted what they reach.
        progress_interval: Seconds between progress lines and log lines.
        executor: Backend used when no evaluator is given: ``"local"`` (one isolated
            worker per visible GPU on this host) or ``"ray"`` (Ray actors across hosts).
        ray_address: Address of the Ray cluster for ``executor="ray"`` (``"auto"``, or
            ``None`` for a local cluster).
        case_champions: Probability that a parent is drawn from the per-case champions
            (for each timed case, the record with the lowest ``time_ms`` in
            ``metrics["cases"]``) instead of the island's elites. The fitness aggregates
            every case, so a genome that is the fastest on long rows but mediocre overall
            would rarely be a parent; drawing champions keeps refining each case's best
            (multi-task selection). 0 turns it off; it has no effect on Problems whose
            evaluations report no per-case times.
        champion_reward: Operator reward for a child that sets a new best time on timed
            cases (a new per-case champion), times the share of cases it took over. The
            export runs each case's champion, so such a child is progress even when its
            aggregate fitness is not; without it the bandit would see no gain. 0 turns it
            off; the first evaluation of a case (no earlier time) earns nothing.
        racing: Hand each submitted candidate the per-case best times so far
            (:meth:`Engine.incumbents`), so the evaluator's Timing stage stops timing a
            case whose first batches are far slower than its best (``Timing
            (race_margin=...)``): such a candidate cannot take the case, and the GPU time
            goes to the next candidate. Evaluators whose ``submit`` takes no
            ``incumbents`` keyword are called as before.
    """

    islands: int = 2
    migration_interval: int = 25
    selection: str = "uniform"
    in_flight: int = 4
    proposal_workers: int = 2
    lessons_in_context: int = 20
    bandit_exploration: float = 0.5
    bandit_discount: float = 0.99
    new_cell_bonus: float = 0.1
    repair_reward: float = 0.5
    dollars_per_unit: float = 0.01
    warm_start_elites: int = 16
    warm_start_champions: bool = True
    warm_start_per_case: int = 1
    warm_start_within: float = 0.05
    warm_start_seeds: str = "auto"
    warm_start_rebase: bool = True
    failed_parents: int = 32
    max_attempts: int = 8
    max_executor_errors: int = 5
    stall_rounds: int = 2000
    progress_interval: float = 5.0
    executor: str = "local"
    ray_address: str | None = None
    case_champions: float = 0.3
    champion_reward: float = 0.5
    racing: bool = True

    def __post_init__(self) -> None:
        errs = []
        if not self.champion_reward >= 0.0:
            errs.append(f"champion_reward={self.champion_reward} must be >= 0")
        if not 0.0 <= self.case_champions <= 1.0:
            errs.append(f"case_champions={self.case_champions} must be in [0, 1]")
        if self.islands < 1:
            errs.append(f"islands={self.islands} must be >= 1")
        if self.migration_interval < 1:
            errs.append(f"migration_interval={self.migration_interval} must be >= 1")
        if self.selection not in STRATEGIES:
            errs.append(f"selection={self.selection!r} must be one of {STRATEGIES}")
        if self.in_flight < 1:
            errs.append(f"in_flight={self.in_flight} must be >= 1")
        if self.proposal_workers < 1:
            errs.append(f"proposal_workers={self.proposal_workers} must be >= 1")
        if not 0 < self.bandit_discount <= 1:
            errs.append(f"bandit_discount={self.bandit_discount} must be in (0, 1]")
        if self.dollars_per_unit <= 0:
            errs.append(f"dollars_per_unit={self.dollars_per_unit} must be > 0")
        if self.max_attempts < 1:
            errs.append(f"max_attempts={self.max_attempts} must be >= 1")
        if self.stall_rounds < 1:
            errs.append(f"stall_rounds={self.stall_rounds} must be >= 1")
        if self.warm_start_per_case < 1:
            errs.append(f"warm_start_per_case={self.warm_start_per_case} must be >= 1 (1: each case's champion)")
        if not self.warm_start_within >= 0.0:
            errs.append(f"warm_start_within={self.warm_start_within} must be a fraction >= 0")
        if self.warm_start_seeds not in WARM_START_SEEDS:
            errs.append(f"warm_start_seeds={self.warm_start_seeds!r} must be one of {WARM_START_SEEDS}")
        if self.executor not in ("local", "ray"):
            errs.append(f"executor={self.executor!r} must be 'local' or 'ray'")
        if errs:
            raise ValueError("EngineConfig: " + "; ".join(errs))


@dataclass
class Candidate:
    """A proposed genome on its way to evaluation.

    Attributes:
        id: Engine-wide candidate number (pass it to :meth:`Engine.tell`).
        genome: The genome to evaluate.
        parents: Parent genome ids.
        operator: Name of the operator that proposed it (``"seed"``, ``"warm_start"``).
        generation: The engine's proposal round when it was made.
        island: Island it belongs to.
        note: What changed (the operator's note).
        meta: Extra data kept on the record (LLM model, tokens, cost, ...).
    """

    id: int
    genome: Genome
    parents: tuple[str, ...] = ()
    operator: str = "seed"
    generation: int = 0
    island: int = 0
    note: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def to_state(self) -> dict[str, Any]:
        return {"id": self.id, "genome": self.genome.to_dict(), "parents": list(self.parents),
                "operator": self.operator, "generation": self.generation, "island": self.island,
                "note": self.note, "meta": thaw(self.meta)}

    @classmethod
    def from_state(cls, d: Mapping[str, Any]) -> Candidate:
        return cls(id=int(d["id"]), genome=Genome.from_dict(d["genome"]), parents=tuple(d.get("parents", ())),
                   operator=str(d.get("operator", "seed")), generation=int(d.get("generation", 0)),
                   island=int(d.get("island", 0)), note=str(d.get("note", "")), meta=dict(d.get("meta") or {}))


@dataclass
class _Plan:
    """One operator call, prepared in the engine thread and run anywhere."""

    operator: Any
    parents: list[Record]
    island: int
    generation: int
    ctx: Any


# --------------------------------------------------------------------------- helpers


def source_diff_summary(old: str, new: str) -> str:
    """``"source +N -M lines, first change at line K: <text>"`` (difflib, line based)."""
    a, b = old.splitlines(), new.splitlines()
    plus = minus = 0
    first: tuple[int, str] | None = None
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        minus += i2 - i1
        plus += j2 - j1
        if first is None:
            text = b[j1].strip() if j2 > j1 else ("-" + a[i1].strip())
            first = (i1 + 1, text[:80])
    if first is None:
        return "source reformatted"
    return f"source +{plus} -{minus} lines, first change at line {first[0]}: {first[1]}"


def describe_change(parent: Genome | None, child: Genome) -> str:
    """A short description of how ``child`` differs from ``parent`` (params and source)."""
    if parent is None:
        return "new genome"
    parts = []
    if thaw(parent.params) != thaw(child.params):
        from operators import param_diff

        parts.append(param_diff(parent.params, child.params))
    if parent.source != child.source:
        parts.append(source_diff_summary(parent.source, child.source))
    return "; ".join(p for p in parts if p) or "no change"


def _takes_incumbents(ev: Any) -> bool:
    """Whether ``ev.submit`` accepts ``incumbents=`` (ours do; a user's evaluator may not)."""
    import inspect

    try:
        params = inspect.signature(ev.submit).parameters.values()
    except (TypeError, ValueError):  # no signature to read: call it the plain way
        return False
    return any(p.name == "incumbents" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _is_budget_exceeded(exc: BaseException | None) -> bool:
    """True if ``exc`` (or its cause chain) is an ``operators.llm.BudgetExceeded``."""
    try:
        from operators.llm import BudgetExceeded
    except Exception:  # operators.llm missing or broken: nothing can raise it
        return False
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, BudgetExceeded):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


class _ReadOnlyArchive:
    """What operators see of the archive: reads only, each under the engine's lock."""

    _READS = ("best", "get", "sample_elites", "elite", "records", "elites", "counts", "lineage")

    def __init__(self, archive: Any, lock: threading.RLock) -> None:
        self._archive = archive
        self._lock = lock

    def __contains__(self, genome_id: object) -> bool:
        with self._lock:
            return genome_id in self._archive

    def __len__(self) -> int:
        with self._lock:
            return len(self._archive)

    def __getattr__(self, name: str) -> Any:
        if name == "lessons":
            return _ReadOnlyLessons(self._archive.lessons, self._lock)
        if name in ("header", "coverage", "qd_score", "n_cells", "problem"):
            with self._lock:
                return getattr(self._archive, name)
        if name not in self._READS:
            raise AttributeError(f"the archive view given to operators is read-only; {name!r} is not available")
        fn = getattr(self._archive, name)

        def call(*a: Any, **kw: Any) -> Any:
            with self._lock:
                out = fn(*a, **kw)
                if hasattr(out, "__next__"):  # materialise iterators while holding the lock
                    out = list(out)
                return out

        return call


class _ReadOnlyLessons:
    def __init__(self, lessons: Any, lock: threading.RLock) -> None:
        self._lessons = lessons
        self._lock = lock

    def __getattr__(self, name: str) -> Any:
        if name not in ("recent", "by_parent", "by_operator", "by_outcome", "all"):
            raise AttributeError(f"lessons are read-only for operators; {name!r} is not available")
        fn = getattr(self._lessons, name)

        def call(*a: Any, **kw: Any) -> Any:
            with self._lock:
                return list(fn(*a, **kw))

        return call


# --------------------------------------------------------------------------- engine


class Engine:
    """MAP-Elites search with ask/tell, islands, an operator bandit and crash-safe state.

    Args:
        problem: What to optimise.
        archive: An ``archive.Archive`` or a path (then opened with ``problem``; the
            engine closes what it opened). Its device header is filled once the
            evaluator reports its ``DeviceInfo``.
        operators: Names, Operator instances or propose functions (``operators.resolve``).
            Default: ``param_mutation`` and ``param_crossover``, plus ``llm_diff``,
            ``llm_rewrite``, ``llm_crossover`` and ``llm_repair`` when ``llm`` is given.
        evaluator: An executor (``submit(genome) -> Future[Evaluation]``, ``stats()``,
            ``close()``); default ``fitness.Evaluator(problem)`` created by :meth:`run`.
        llm: LLM backend handed to operators (``OperatorContext.llm``).
        config: Engine settings.
        seed: Seed of the engine's RNG (selection and the operators' RNG streams).
        warm_start: An archive (or its path) of another run (other shapes or GPU): its
            elites (and per-case champions, see ``EngineConfig.warm_start_champions``) are
            re-evaluated here as seeds, ahead of the problem's own seeds, and its lessons
            are copied (once). Going first, an earlier run's champions set each case's
            best time early, so racing (``EngineConfig.racing``) stops the seeds' slower
            cases after a few batches instead of timing them in full.

    If the archive holds engine state from an earlier session, the engine resumes it:
    counters, RNG stream, bandit, islands; pending candidates are evaluated again unless
    their record made it into the archive.

    Attributes:
        last_run: After :meth:`run`: ``stop`` (why it stopped), ``evaluations``,
            ``seconds``, ``rate_per_min``, ``gpu_busy`` (the evaluator's busy fraction,
            or None), ``best`` (fitness) and ``coverage``; None before the first run.
    """

    def __init__(self, problem: Problem, archive: Any, operators: Sequence[Any] | None = None,
                 evaluator: Any = None, *, llm: Any = None, config: EngineConfig | None = None, seed: int = 0,
                 warm_start: Any = None) -> None:
        import archive as archive_pkg
        import operators as operators_pkg

        self.problem = problem
        self.config = config if config is not None else EngineConfig()
        self.llm = llm
        self.evaluator = evaluator
        self._owns_evaluator = False
        self._lock = threading.RLock()
        if isinstance(archive, (str, os.PathLike)):
            self.archive = archive_pkg.Archive(problem, archive)
            self._owns_archive = True
        else:
            self.archive = archive
            self._owns_archive = False
        specs = list(operators) if operators is not None else list(DEFAULT_OPERATORS) + (
            list(LLM_OPERATORS) if llm is not None else [])
        if not specs:
            raise ValueError("Engine needs at least one operator")
        self.operators = [operators_pkg.resolve(s) for s in specs]
        names = [op.name for op in self.operators]
        if len(set(names)) != len(names):
            raise ValueError(f"operator names repeat: {names}; give each operator a distinct name")
        self._ops = {op.name: op for op in self.operators}
        self._view = _ReadOnlyArchive(self.archive, self._lock)

        self._rng = np.random.default_rng(seed)
        self.bandit = OperatorBandit(names, exploration=self.config.bandit_exploration,
                                     discount=self.config.bandit_discount)
        self.islands = Islands(self.config.islands)
        self.curiosity = Curiosity()
        self._generation = 0
        self._next_id = 0
        self._evaluations = 0
        self._cost = 0.0
        self._stats: collections.Counter[str] = collections.Counter()
        self._pending: dict[int, Candidate] = {}      # proposed, not yet told (persisted)
        self._queue: collections.deque[int] = collections.deque()   # pending, not handed out
        self._outstanding: set[int] = set()           # handed out by ask(), not yet told
        self._told: set[int] = set()
        self._seed_queue: collections.deque[dict[str, Any]] = collections.deque()
        self._failed: collections.deque[str] = collections.deque(maxlen=self.config.failed_parents)
        self._best_fraction: float | None = None
        self._warm_started = False
        self._warm_known: set[str] = set()  # problem seeds the warm-start archive evaluated OK
        self._warm_device: str | None = None  # the GPU that archive was filled on
        self._warm_fingerprint: str | None = None  # and its problem's fingerprint
        self._warm_skipped: set[str] = set()  # those of _warm_known left out (warm_start_seeds)
        self._device_set = False
        self._closed = False
        self.last_run: dict[str, Any] | None = None
        self._executor_errors = 0
        self._resumed = False

        self._champions: dict[str, tuple[float, str]] = {}  # case key -> (time_ms, genome id)
        state = self.archive.load_state()
        if state:
            self._restore(state)
        else:
            self._init_from_archive()
        self._rebuild_champions()
        # Seeds not yet in the archive (all of them on a new run; seeds added to the
        # Problem since, on a resumed one) are evaluated first.
        queued = {item["genome"].get("id") for item in self._seed_queue if isinstance(item.get("genome"), dict)}
        queued |= {c.genome.id for c in self._pending.values()}
        for g in problem.seeds:
            g = self._canonical(g)
            if g.id not in self.archive and g.id not in queued:
                self._seed_queue.append({"genome": g.to_dict(), "operator": "seed", "meta": {}})
        if warm_start is not None and not self._warm_started:
            self._warm_start(warm_start)
        self._save_state()

    # -- public properties --------------------------------------------------------------

    @property
    def generation(self) -> int:
        """The proposal-round counter (continues across resumed sessions)."""
        return self._generation

    @property
    def evaluations(self) -> int:
        """Evaluations recorded by the engine in total (across resumed sessions)."""
        return self._evaluations

    @property
    def cost(self) -> float:
        """LLM spend so far (sum of ``Proposal.meta["cost"]``)."""
        return self._cost

    @property
    def resumed(self) -> bool:
        """True if this engine continued the saved state of an earlier session."""
        return self._resumed

    @property
    def pending(self) -> list[Candidate]:
        """Candidates proposed but not yet told, in id order."""
        return [self._pending[i] for i in sorted(self._pending)]

    def stats(self) -> dict[str, Any]:
        """Counters: evaluations, proposals, duplicates, operator_errors, cost, migrations, per operator,
        ``warm_start_seeds_skipped`` (problem seeds left out, ``EngineConfig.warm_start_seeds``)."""
        out: dict[str, Any] = dict(self._stats)
        out.update(evaluations=self._evaluations, generation=self._generation, cost=self._cost,
                   warm_start_seeds_skipped=len(self._warm_skipped),
                   pending=len(self._pending), migrations=self.islands.migrations,
                   operators=self.bandit.summary())
        for k in ("proposals", "duplicates", "operator_errors"):
            out.setdefault(k, 0)
        return out

    def incumbents(self) -> dict[str, float]:
        """The best time in ms so far for each timed case key (from OK evaluations).

        ``run`` hands it to the evaluator with every candidate (``EngineConfig.racing``);
        a user driving ``ask``/``tell`` with an own evaluator may pass it the same way:
        ``Evaluator.submit(genome, incumbents=engine.incumbents())``.
        """
        return {k: t for k, (t, _) in self._champions.items()}

    # -- ask ------------------------------------------------------------------------------

    def ask(self, n: int = 1) -> list[Candidate]:
        """Propose up to ``n`` new candidates (fewer if the operators keep failing).

        Queued candidates (restored from a killed session) come first, then the
        warm-start genomes, then the problem's seeds, then operator proposals.

        Raises:
            EngineStateError: The engine is closed.
            EngineError: Nothing can be proposed: the archive holds no usable parent,
                no seed is left and no operator takes zero parents.
        """
        self._check_open()
        if n < 1:
            raise ValueError(f"ask(n) needs n >= 1, got {n}")
        out: list[Candidate] = []
        while len(out) < n:
            c = self._next_queued()
            if c is None:
                break
            out.append(c)
        attempts = 0
        while len(out) < n and attempts < self.config.max_attempts * n:
            attempts += 1
            plan = self._plan()
            if plan is None:
                if not out and not self._pending:
                    raise EngineError(self._no_parent_message())
                break
            try:
                proposals = self._propose(plan)
            except Exception as e:
                if isinstance(e, _operator_error_type()) and not _is_budget_exceeded(e):
                    self._operator_failed(plan, e)
                    continue
                raise
            for c in self._accept(plan, proposals):
                self._queue.remove(c.id)
                if len(out) < n:
                    out.append(c)
                else:
                    self._queue.appendleft(c.id)
        for c in out:
            self._outstanding.add(c.id)
        self._save_state()
        return out

    # -- tell -----------------------------------------------------------------------------

    def tell(self, candidate_id: int, evaluation: Evaluation) -> Any:
        """Record the evaluation of a candidate (in any order) and learn from it.

        Args:
            candidate_id: :attr:`Candidate.id` from :meth:`ask`.
            evaluation: Its evaluation.

        Returns:
            The archive's ``AddResult``.

        Raises:
            EngineStateError: Unknown id, already told, or the engine is closed.
        """
        self._check_open()
        if not isinstance(evaluation, Evaluation):
            raise TypeError(f"tell() takes an evo.types.Evaluation, got {type(evaluation).__name__}")
        with self._lock:
            cand = self._pending.get(candidate_id)
            if cand is None:
                if candidate_id in self._told:
                    raise EngineStateError(f"candidate {candidate_id} was already told; each candidate is told once")
                raise EngineStateError(f"unknown candidate id {candidate_id!r}: tell() takes an id returned by ask() "
                                       f"(pending: {sorted(self._pending)[:10]})")
            return self._tell(cand, evaluation)

    def _tell(self, cand: Candidate, evaluation: Evaluation) -> Any:
        from archive import AddStatus

        parents = [r for r in (self.archive.get(p) for p in cand.parents) if r is not None]
        ok_parents = [r for r in parents if r.evaluation.ok and r.fitness is not None]
        best_parent = max(ok_parents, key=lambda r: r.fitness) if ok_parents else None
        meta = dict(cand.meta)
        if cand.note:
            meta.setdefault("note", cand.note)
        record = Record(genome=cand.genome, evaluation=evaluation, parents=cand.parents, operator=cand.operator,
                        generation=cand.generation, island=cand.island, meta=meta)
        result = self.archive.add(record)
        del self._pending[cand.id]
        self._outstanding.discard(cand.id)
        if cand.id in self._queue:
            self._queue.remove(cand.id)
        self._told.add(cand.id)
        self._evaluations += 1
        self._stats[f"status_{evaluation.status.value}"] += 1

        ok = evaluation.ok and evaluation.fitness is not None
        success = result.status in (AddStatus.NEW, AddStatus.IMPROVED)
        won, n_cases = self._note_champion(cand.genome.id, evaluation) if ok else (0, 0)
        delta = None
        if ok and best_parent is not None and best_parent.fitness:
            delta = (evaluation.fitness - best_parent.fitness) / abs(best_parent.fitness)
        if not ok:
            outcome = evaluation.status.value
        elif best_parent is not None:
            outcome = "improved" if evaluation.fitness > best_parent.fitness else "no_gain"
        else:
            outcome = "improved" if success else "no_gain"
        if cand.operator not in SEED_OPERATORS or not ok:
            parent = best_parent or (parents[0] if parents else None)
            change = cand.note or describe_change(parent.genome if parent else None, cand.genome)
            if cand.operator in SEED_OPERATORS:
                change = f"{cand.operator}: {change}"
            message = "" if ok else _excerpt(evaluation.reason)
            self.archive.lessons.append(Lesson(operator=cand.operator, child_id=cand.genome.id, change=change,
                                               outcome=outcome, parent_id=parent.id if parent else None,
                                               delta=delta, message=message, generation=cand.generation))

        # learning: bandit, LLM ensemble, curiosity, islands, failures
        if cand.operator in self._ops:
            improvement = max(delta or 0.0, 0.0) if ok else 0.0
            if ok and result.status == AddStatus.NEW:
                improvement += self.config.new_cell_bonus
            if ok and parents and not ok_parents:
                improvement += self.config.repair_reward
            if won:
                improvement += self.config.champion_reward * won / max(n_cases, 1)
            dollars = _cost_of(cand.meta)
            cost = max(getattr(self._ops[cand.operator], "cost_weight", 1.0), 1e-6) + \
                dollars / self.config.dollars_per_unit
            self.bandit.update(cand.operator, improvement, cost)
            model = cand.meta.get("model")
            if model and self.llm is not None and callable(getattr(self.llm, "report", None)):
                try:
                    self.llm.report(model, improvement, dollars)
                except Exception:  # a reporting hook never ends a run
                    log.exception("llm.report(%r) failed", model)
        for p in parents:
            if p.cell is not None:
                self.curiosity.update(cell_key(p.cell), success)
        if ok:
            rec = result.record if getattr(result.record, "cell", None) is not None else self.archive.get(cand.genome.id)
            cell = rec.cell if rec is not None else None
            self.islands.add(cand.island, Entry(cand.genome.id, float(evaluation.fitness), cell_key(cell)))
            frac = evaluation.metrics.get("fraction") if isinstance(evaluation.metrics, Mapping) else None
            if isinstance(frac, (int, float)) and math.isfinite(frac):
                self._best_fraction = frac if self._best_fraction is None else max(self._best_fraction, frac)
        else:
            self._failed.append(cand.genome.id)
        if self.islands.n > 1 and self._evaluations % self.config.migration_interval == 0:
            moved = self.islands.migrate()
            if moved:
                log.info("migration %d: %s", self.islands.migrations,
                         ", ".join(f"{a}->{b} {gid[:8]}" for a, b, gid in moved))
        self._fill_device_header()
        self._save_state()
        return result

    # -- run ------------------------------------------------------------------------------

    def run(self, budget: Budget | None = None, progress: bool = True) -> Record | None:
        """Search until a budget limit is reached; returns the archive's best record.

        Keeps ``config.in_flight`` candidates proposed or evaluating at once: operator
        calls run on a thread pool, evaluations on the evaluator. Stops on the first of
        the budget's limits, or when the LLM cost cap raises ``BudgetExceeded``; work in
        flight is finished and recorded and the state saved before it returns.

        Args:
            budget: Limits (default: none, run until interrupted).
            progress: Show a live progress display on stderr.

        Raises:
            EngineStateError: Candidates handed out by :meth:`ask` are still outstanding,
                or the engine is closed.
            EngineError: Nothing can be proposed, or the executor keeps raising.
        """
        self._check_open()
        if self._outstanding:
            raise EngineStateError(
                f"{len(self._outstanding)} candidate(s) from ask() are still outstanding "
                f"(ids {sorted(self._outstanding)[:10]}): tell() their evaluations before run()")
        budget = budget if budget is not None else Budget()
        ev = self._ensure_evaluator()
        t0 = time.monotonic()
        told0 = self._evaluations
        evals: dict[cf.Future[Any], int] = {}
        props: dict[cf.Future[Any], _Plan] = {}
        stop: str | None = None
        starved = False
        fruitless = 0  # operator calls in a row that gave no new genome
        prog = Progress(progress, interval=self.config.progress_interval)
        pool = cf.ThreadPoolExecutor(self.config.proposal_workers, thread_name_prefix="evo-propose")
        clean = False
        try:
            while True:
                if stop is None:
                    stop = self._budget_reason(budget, t0)
                if stop is None and fruitless >= self.config.stall_rounds:
                    stop = (f"no new genomes: the last {fruitless} operator calls proposed only genomes already "
                            "evaluated or in flight (or failed); the operators have exhausted what they reach "
                            "from this archive: widen the ParamSpace or add operators")
                    log.warning("%s", stop)
                if stop is None:
                    starved = False
                    while len(evals) + len(props) < self.config.in_flight and self._room(budget, evals, props) > 0:
                        cand = self._next_queued()
                        if cand is not None:
                            evals[self._submit(ev, cand.genome)] = cand.id
                            continue
                        plan = self._plan()
                        if plan is None:
                            starved = True
                            break
                        props[pool.submit(self._propose, plan)] = plan
                    self._save_state()
                if not evals and not props:
                    if stop is None and starved:
                        raise EngineError(self._no_parent_message())
                    break
                done, _ = cf.wait(list(evals) + list(props), timeout=0.25, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    if fut in props:
                        plan = props.pop(fut)
                        exc = fut.exception()
                        if exc is not None:
                            if _is_budget_exceeded(exc):
                                stop = stop or "LLM budget exceeded"
                                log.info("LLM budget exceeded: finishing work in flight")
                                continue
                            if isinstance(exc, _operator_error_type()):
                                self._operator_failed(plan, exc)
                                fruitless += 1
                                continue
                            raise exc
                        accepted = self._accept(plan, fut.result())
                        fruitless = 0 if accepted else fruitless + 1
                        for c in accepted:
                            if stop is None and self._room(budget, evals, props) > 0:
                                self._queue.remove(c.id)
                                evals[self._submit(ev, c.genome)] = c.id
                    else:
                        cid = evals.pop(fut)
                        self.tell(cid, self._result_of(fut, cid))
                prog.update(self._snapshot(ev, t0, told0, len(evals) + len(props)))
            clean = True
        finally:
            pool.shutdown(wait=clean, cancel_futures=True)
            prog.update(self._snapshot(ev, t0, told0, 0), force=True)
            prog.close()
            if not self._closed:
                self._save_state()
        final = self._snapshot(ev, t0, told0, 0)
        self.last_run = {"stop": stop or "no more work", "evaluations": self._evaluations - told0,
                         "seconds": time.monotonic() - t0, "rate_per_min": final["rate"],
                         "gpu_busy": final["gpu_busy"], "best": final["best"], "coverage": final["coverage"]}
        log.info("run stopped (%s) after %d evaluations in %.1f s", self.last_run["stop"],
                 self.last_run["evaluations"], self.last_run["seconds"])
        with self._lock:
            return self.archive.best()  # type: ignore[no-any-return]

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Save the state and close what the engine opened (archive, default evaluator)."""
        if self._closed:
            return
        self._save_state()
        self._closed = True
        if self._owns_evaluator and self.evaluator is not None:
            self.evaluator.close()
        if self._owns_archive:
            self.archive.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals: proposing -------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise EngineStateError("the engine is closed; create a new Engine on the archive to continue the run")

    def _no_parent_message(self) -> str:
        return ("nothing to propose: the archive has no OK record to use as a parent, no seed is left and no "
                "operator takes zero parents; give the Problem a seed genome (Problem.seeds) that compiles and "
                "passes, or pass warm_start=")

    def _new_candidate(self, genome: Genome, parents: Sequence[str], operator: str, generation: int, island: int,
                       note: str = "", meta: Mapping[str, Any] | None = None) -> Candidate:
        c = Candidate(self._next_id, genome, tuple(parents), operator, generation, island, note, dict(meta or {}))
        self._next_id += 1
        self._pending[c.id] = c
        self._queue.append(c.id)
        return c

    def _in_flight_ids(self) -> set[str]:
        return {c.genome.id for c in self._pending.values()}

    def _next_queued(self) -> Candidate | None:
        """The next queued candidate (restored or surplus), else the next seed."""
        with self._lock:
            if self._queue:
                return self._pending[self._queue.popleft()]
            while self._seed_queue:
                item = self._seed_queue.popleft()
                g = Genome.from_dict(item["genome"])
                if g.id in self.archive or g.id in self._in_flight_ids():
                    continue
                if item.get("operator", "seed") == "seed" and g.id in self._warm_known and self._skip_known_seeds():
                    if not self._warm_skipped:
                        log.info("warm start: the problem's seeds that the warm-start archive already evaluated "
                                 "on %s are not evaluated again (EngineConfig.warm_start_seeds=%r)",
                                 self._warm_device or "this GPU", self.config.warm_start_seeds)
                    self._warm_skipped.add(g.id)
                    continue
                island = self._next_id % self.islands.n
                c = self._new_candidate(g, (), item.get("operator", "seed"), self._generation, island,
                                        item.get("note", ""), item.get("meta"))
                self._queue.remove(c.id)
                return c
            return None

    def _skip_known_seeds(self) -> bool:
        """Whether a problem seed the warm-start archive evaluated OK is left out (``warm_start_seeds``)."""
        mode = self.config.warm_start_seeds
        if mode != "auto":
            return mode == "new"
        header = getattr(self.archive, "header", None) or {}
        here = (header.get("device") or {}).get("name")
        return (here is not None and here == self._warm_device
                and self._warm_fingerprint is not None and header.get("problem_fingerprint") == self._warm_fingerprint)

    def _pool(self, island: int, k: int) -> list[Entry]:
        es = self.islands.entries(island)
        if len(es) >= max(k, 1):
            return es
        return [Entry(r.id, float(r.fitness), cell_key(r.cell)) for r in self.archive.elites()
                if r.fitness is not None]

    def _plan(self) -> _Plan | None:
        """Choose island, operator and parents; None if no operator has parents."""
        with self._lock:
            island = self._generation % self.islands.n
            allowed = []
            pools: dict[str, list[Entry] | list[str]] = {}
            for op in self.operators:
                k = int(getattr(op, "n_parents", 1))
                if k == 0:
                    allowed.append(op.name)
                    pools[op.name] = []
                elif getattr(op, "uses_failed_parents", False):
                    failed = [f for f in self._failed]
                    if failed:
                        allowed.append(op.name)
                        pools[op.name] = failed
                else:
                    pool = self._pool(island, k)
                    if self._champions and self._rng.random() < self.config.case_champions:
                        champs = self._champion_pool()
                        if len(champs) >= k:
                            pool = champs
                    if len(pool) >= k:
                        allowed.append(op.name)
                        pools[op.name] = pool
            if not allowed:
                return None
            name = self.bandit.choose(self._rng, allowed)
            op = self._ops[name]
            k = int(getattr(op, "n_parents", 1))
            pool = pools[name]
            if getattr(op, "uses_failed_parents", False) and k > 0:
                idx = self._rng.choice(len(pool), size=k, replace=len(pool) < k)
                ids = [pool[int(i)] for i in idx]
            else:
                ids = [e.id for e in select(pool, k, self._rng, self.config.selection, self.curiosity)]  # type: ignore[arg-type]
            parents = [r for r in (self.archive.get(i) for i in ids) if r is not None]
            gen = self._generation
            self._generation += 1
            op_rng = np.random.default_rng(int(self._rng.integers(2**63)))
            from operators import OperatorContext

            ctx = OperatorContext(rng=op_rng, problem=self.problem, lessons=self._lessons_for(parents),
                                  archive=self._view, llm=self.llm, generation=gen, hardware=self._hardware())
            return _Plan(op, parents, island, gen, ctx)

    def _propose(self, plan: _Plan) -> list[Any]:
        out = plan.operator.propose(plan.parents, plan.ctx)
        return list(out or [])

    def _accept(self, plan: _Plan, proposals: Iterable[Any]) -> list[Candidate]:
        """Turn proposals into queued candidates, skipping duplicates."""
        from operators import Proposal

        out = []
        with self._lock:
            seen = self._in_flight_ids()
            for p in proposals:
                if isinstance(p, Proposal):
                    g, note, meta = p.genome, p.note, dict(p.meta)
                elif isinstance(p, Genome):
                    g, note, meta = p, "", {}
                else:
                    raise TypeError(f"operator {plan.operator.name!r} returned {type(p).__name__}; "
                                    "propose() must return Genome or Proposal objects")
                self._stats["proposals"] += 1
                self._cost += _cost_of(meta)
                g = self._canonical(g)  # a change of an inactive knob is the parent again
                if g.id in seen or g.id in self.archive:
                    self._stats["duplicates"] += 1
                    self.bandit.update(plan.operator.name, 0.0, getattr(plan.operator, "cost_weight", 1.0))
                    continue
                seen.add(g.id)
                out.append(self._new_candidate(g, [r.id for r in plan.parents], plan.operator.name, plan.generation,
                                               plan.island, note, meta))
            self._save_state()
        return out

    @staticmethod
    def _seed_sources(src: Any) -> set[str]:
        """The sources of ``src``'s seed and warm-start records (the kernel family as it was there)."""
        return {r.genome.source for r in src.records() if r.operator in SEED_OPERATORS}

    def _rebase(self, g: Genome) -> tuple[Genome, dict[str, Any] | None]:
        """``g`` on the Problem's current seed source (EngineConfig.warm_start_rebase), and the knobs
        set because ``g`` lacked them (to a condition's default, else to the param's own ``default``);
        ``(g, None)`` where it cannot be (no single current source for its entry and language, the
        same source already, or a lacking knob with neither)."""
        current = {s.source for s in self.problem.seeds if s.entry == g.entry and s.language == g.language}
        if len(current) != 1 or g.source in current:
            return g, None
        space = self.problem.params
        defaults = {k: p.default for k, p in space.params.items() if getattr(p, "default", None) is not None}
        defaults.update({c.param: c.default for c in space.conditions})
        lacking = [k for k in space.params if k not in g.params]
        if any(k not in defaults for k in lacking):
            return g, None
        filled = {k: defaults[k] for k in lacking}
        return Genome(current.pop(), {**g.params, **filled}, g.entry, g.language), filled

    def _canonical(self, g: Genome) -> Genome:
        """``g`` with its inactive conditional params at their defaults (ParamSpace.canonical)."""
        space = self.problem.params
        if not space.conditions:
            return g
        canon = space.canonical(g.params)
        if all(canon[k] == g.params.get(k) for k in canon):
            return g
        return Genome(g.source, canon, g.entry, g.language)

    def _operator_failed(self, plan: _Plan, exc: BaseException) -> None:
        with self._lock:
            self._stats["operator_errors"] += 1
            self._cost += _cost_of(getattr(exc, "meta", None) or {})  # a rejected LLM answer was still paid for
            parent = plan.parents[0].id if plan.parents else None
            self.archive.lessons.append(Lesson(operator=plan.operator.name, child_id="", change="(no child)",
                                               outcome="operator_error", parent_id=parent,
                                               message=_excerpt(str(exc) or type(exc).__name__),
                                               generation=plan.generation))
            self.bandit.update(plan.operator.name, 0.0, getattr(plan.operator, "cost_weight", 1.0))
            log.debug("operator %s failed: %s", plan.operator.name, exc)
            self._save_state()

    def _lessons_for(self, parents: Sequence[Record]) -> list[Lesson]:
        n = self.config.lessons_in_context
        if n <= 0:
            return []
        got: dict[int, Lesson] = {}
        for lesson in self.archive.lessons.recent(n):
            got[lesson.seq] = lesson
        for p in parents:
            for lesson in list(self.archive.lessons.by_parent(p.id))[-5:]:
                got[lesson.seq] = lesson
        return [got[k] for k in sorted(got)]

    def _hardware(self) -> dict[str, Any]:
        info = getattr(self.evaluator, "device_info", None) if self.evaluator is not None else None
        if info is not None:
            return dict(info.to_dict()) if hasattr(info, "to_dict") else dict(info)
        dev = (getattr(self.archive, "header", None) or {}).get("device")
        return dict(dev) if isinstance(dev, Mapping) else {}

    # -- internals: running -----------------------------------------------------------------

    def _ensure_evaluator(self) -> Any:
        if self.evaluator is None:
            from fitness.ray import make_executor

            kw = {"ray_address": self.config.ray_address} if self.config.executor == "ray" else {}
            self.evaluator = make_executor(self.config.executor, self.problem, **kw)
            self._owns_evaluator = True
        return self.evaluator

    def _room(self, budget: Budget, evals: Mapping[Any, Any], props: Mapping[Any, Any]) -> float:
        if budget.evaluations is None:
            return math.inf
        return budget.evaluations - (self._evaluations + len(evals) + len(props))

    def _budget_reason(self, budget: Budget, t0: float) -> str | None:
        if budget.evaluations is not None and self._evaluations >= budget.evaluations:
            return f"evaluations budget {budget.evaluations} reached"
        if budget.seconds is not None and time.monotonic() - t0 >= budget.seconds:
            return f"time budget {budget.seconds:g} s reached"
        if budget.cost is not None and self._cost >= budget.cost:
            return f"cost budget {budget.cost:g} reached"
        if budget.target_fraction is not None and self._best_fraction is not None \
                and self._best_fraction >= budget.target_fraction:
            return f"target fraction {budget.target_fraction:g} reached"
        return None

    def _result_of(self, fut: cf.Future[Any], cid: int) -> Evaluation:
        try:
            ev = fut.result()
            if not isinstance(ev, Evaluation):
                raise TypeError(f"the executor returned {type(ev).__name__}, not an Evaluation")
            self._executor_errors = 0
            return ev
        except Exception as e:
            self._executor_errors += 1
            log.error("executor raised for candidate %d: %s", cid, e)
            if self._executor_errors >= self.config.max_executor_errors:
                raise EngineError(f"the executor raised {self._executor_errors} times in a row (last: "
                                  f"{type(e).__name__}: {e}); this is a harness fault, not a candidate's") from e
            return Evaluation.failure(Status.RUNTIME_ERROR, f"executor raised {type(e).__name__}: {e}",
                                      artifacts={"traceback": "".join(traceback.format_exception(e))[-4000:]})

    def _snapshot(self, ev: Any, t0: float, told0: int, in_flight: int) -> dict[str, Any]:
        with self._lock:
            best = self.archive.best()
            cov = getattr(self.archive, "coverage", None)
        elapsed = max(time.monotonic() - t0, 1e-9)
        gpu = None
        try:
            gpu = (ev.stats() or {}).get("gpu_busy_fraction")
        except Exception:
            gpu = None
        if isinstance(gpu, Mapping):  # {"overall", "per_device"}; no device used yet -> not shown
            gpu = gpu.get("overall") if gpu.get("per_device", True) else None
        return {"evaluations": self._evaluations, "best": best.fitness if best is not None else None,
                "coverage": cov, "rate": (self._evaluations - told0) / elapsed * 60.0,
                "gpu_busy": gpu if isinstance(gpu, (int, float)) else None, "cost": self._cost,
                "in_flight": in_flight, "duplicates": self._stats["duplicates"]}

    def _fill_device_header(self) -> None:
        if self._device_set or self.evaluator is None:
            return
        info = getattr(self.evaluator, "device_info", None)
        if info is None:
            return
        setter = getattr(self.archive, "set_device", None)
        if callable(setter):
            setter(info)
        self._device_set = True

    # -- internals: state ---------------------------------------------------------------------

    def _submit(self, ev: Any, genome: Genome) -> Any:
        """``ev.submit(genome)``, with the per-case incumbents where racing is on and ``ev`` takes them."""
        if self.config.racing and self._champions and _takes_incumbents(ev):
            return ev.submit(genome, incumbents=self.incumbents())
        return ev.submit(genome)

    def _note_champion(self, genome_id: str, evaluation: Evaluation) -> tuple[int, int]:
        """Record ``genome_id`` as the champion of every timed case it is the fastest on.

        Returns:
            (cases it took over from an earlier, slower champion, timed cases it reported).
        """
        cases = evaluation.metrics.get("cases") if isinstance(evaluation.metrics, Mapping) else None
        if not isinstance(cases, Mapping):
            return 0, 0
        won = 0
        for key, t in evaluation.case_times().items():
            held = self._champions.get(key)
            if held is None or t < held[0]:
                if held is not None and held[1] != genome_id:
                    won += 1
                self._champions[key] = (t, genome_id)
        return won, len(cases)

    def _rebuild_champions(self) -> None:
        """Per-case champions from the OK records already in the archive."""
        if self.config.case_champions <= 0 and not self.config.racing:
            return
        try:
            records = self.archive.records(Status.OK)
        except TypeError:  # an archive without a status filter
            records = (r for r in self.archive if r.evaluation.ok)
        for r in records:
            if r.fitness is not None:
                self._note_champion(r.id, r.evaluation)

    def _champion_pool(self) -> list[Entry]:
        """One entry per distinct champion genome (in case order, so draws are reproducible)."""
        out: list[Entry] = []
        seen: set[str] = set()
        for key in sorted(self._champions):
            gid = self._champions[key][1]
            if gid in seen:
                continue
            seen.add(gid)
            r = self.archive.get(gid)
            if r is not None and r.fitness is not None:
                out.append(Entry(gid, float(r.fitness), cell_key(r.cell)))
        return out

    def _init_from_archive(self) -> None:
        """Fill islands and failure list from records already in the archive (no state yet)."""
        for i, r in enumerate(self.archive.elites()):
            if r.fitness is not None:
                self.islands.add(r.island if r.island < self.islands.n else i % self.islands.n,
                                 Entry(r.id, float(r.fitness), cell_key(r.cell)))
        best = self.archive.best()
        if best is not None:
            frac = best.evaluation.metrics.get("fraction")
            if isinstance(frac, (int, float)):
                self._best_fraction = float(frac)

    def _warm_start(self, source: Any) -> None:
        import archive as archive_pkg

        src = archive_pkg.Archive.open_readonly(source) if isinstance(source, (str, os.PathLike)) else source
        try:
            elites = sorted((r for r in src.elites() if r.fitness is not None), key=lambda r: -r.fitness)
            name = _problem_name((getattr(src, "header", {}) or {}).get("problem", {}))
            # genome id -> (record, cases it wins, cases where it is a runner-up)
            picks: dict[str, tuple[Any, list[str], list[str]]] = {}
            for r in elites[: self.config.warm_start_elites]:
                picks.setdefault(r.genome.id, (r, [], []))
            if self.config.warm_start_champions:
                from evo.export import top_per_case

                k = self.config.warm_start_per_case
                top = top_per_case(src, k=k, within=self.config.warm_start_within)  # a champion is always within
                for rank in range(k):  # every case's champion first, then the runners-up
                    for case, recs in top.items():
                        if rank < len(recs):
                            picks.setdefault(recs[rank].genome.id, (recs[rank], [], []))[1 if rank == 0 else 2].append(case)
            items: list[dict[str, Any]] = []
            # the seed texts there (a read of the whole archive) only when some pick is on another text
            current = {g.source for g in self.problem.seeds}
            stale = any(r.genome.source not in current for r, _, _ in picks.values())
            old_seeds = self._seed_sources(src) if self.config.warm_start_rebase and stale else set()
            rebased = 0
            for r, cases, close in picks.values():
                genome, filled = r.genome, None
                if genome.source in old_seeds:
                    genome, filled = self._rebase(genome)
                bad = self.problem.params.violations(genome.params)
                if bad:
                    log.info("warm start: skipping %s (%s)", r.id[:12], "; ".join(bad))
                    continue
                origin: dict[str, Any] = {"source_id": r.id, "source_fitness": r.fitness, "source_problem": name,
                                          "found_by": _found_by(r)}
                if cases:
                    origin["champion_of"] = cases
                if close:
                    origin["runner_up_of"] = close
                if filled is not None:
                    origin["rebased"] = {"filled": filled}
                    rebased += 1
                items.append({"genome": genome.to_dict(), "operator": "warm_start",
                              "meta": {"warm_start": origin}})
            if rebased:
                self._stats["warm_start_rebased"] = rebased
                log.info("warm start: %d genomes took the family's current source", rebased)
            self._seed_queue.extendleft(reversed(items))  # ahead of the problem's seeds, in order
            queued = len(items)
            seed_ids = {self._canonical(g).id for g in self.problem.seeds}
            for sid in seed_ids:
                rec = src.get(sid)
                if rec is not None and rec.evaluation is not None and rec.evaluation.ok:
                    self._warm_known.add(rec.genome.id)
            header = getattr(src, "header", {}) or {}
            self._warm_device = (header.get("device") or {}).get("name")
            self._warm_fingerprint = header.get("problem_fingerprint")
            self._warm_known |= self._inherited_known_seeds(src, seed_ids)
            copied = 0
            for lesson in src.lessons.all():
                self.archive.lessons.append(lesson.replace(seq=-1))
                copied += 1
            log.info("warm start: %d genomes (elites, per-case champions%s) queued for re-evaluation, %d lessons "
                     "copied", queued, " and runners-up" if self.config.warm_start_per_case > 1 else "", copied)
            self._warm_started = True
        finally:
            if src is not source:
                src.close()

    def _inherited_known_seeds(self, src: Any, seed_ids: set[str]) -> set[str]:
        """Those of the problem's seeds (``seed_ids``, canonical) that ``src`` itself left out because
        its own warm-start archive had evaluated them OK on the GPU and for the problem ``src`` was
        filled on (``_warm_device``, ``_warm_fingerprint``; its saved state says so).

        They count as known too: otherwise a chain of warm starts on one GPU (run 29 -> 30 -> 31)
        re-evaluates them every other run, since an archive holds only the seeds it timed.
        """
        load = getattr(src, "load_state", None)
        if load is None or self._warm_device is None or self._warm_fingerprint is None:
            return set()
        try:
            prior = load() or {}
        except Exception as exc:  # a damaged state loses only this shortcut, never the warm start
            log.warning("warm start: the source archive's saved engine state is unreadable (%s); its seeds "
                        "left out earlier are evaluated", exc)
            return set()
        if prior.get("warm_device") != self._warm_device or prior.get("warm_fingerprint") != self._warm_fingerprint:
            return set()
        return {str(i) for i in prior.get("warm_skipped") or []} & seed_ids

    def _state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "generation": self._generation,
            "next_id": self._next_id,
            "evaluations": self._evaluations,
            "cost": self._cost,
            "stats": dict(self._stats),
            "rng": _plain_state(self._rng.bit_generator.state),
            "bandit": self.bandit.state(),
            "islands": self.islands.state(),
            "curiosity": self.curiosity.state(),
            "pending": [self._pending[i].to_state() for i in sorted(self._pending)],
            "seed_queue": list(self._seed_queue),
            "failed": list(self._failed),
            "best_fraction": self._best_fraction,
            "warm_started": self._warm_started,
            "warm_known": sorted(self._warm_known),
            "warm_device": self._warm_device,
            "warm_fingerprint": self._warm_fingerprint,
            "warm_skipped": sorted(self._warm_skipped),
            "saved": time.time(),
        }

    def _save_state(self) -> None:
        if self._closed:
            return
        with self._lock:
            self.archive.save_state(self._state())

    def _restore(self, s: Mapping[str, Any]) -> None:
        if int(s.get("version", 0)) > STATE_VERSION:
            raise EngineError(f"engine state version {s.get('version')} is newer than this library's "
                              f"{STATE_VERSION}: upgrade ptx-kernel-factory to resume this run")
        self._resumed = True
        self._generation = int(s.get("generation", 0))
        self._next_id = int(s.get("next_id", 0))
        self._evaluations = int(s.get("evaluations", 0))
        self._cost = float(s.get("cost", 0.0))
        self._stats.update({str(k): int(v) for k, v in (s.get("stats") or {}).items()})
        if s.get("rng"):
            self._rng.bit_generator.state = _rng_state(s["rng"])
        self.bandit.load(s.get("bandit") or {})
        self.islands.load(s.get("islands") or {})
        self.curiosity.load(s.get("curiosity") or {})
        self._seed_queue.extend(s.get("seed_queue") or [])
        self._failed.extend(s.get("failed") or [])
        self._best_fraction = s.get("best_fraction")
        self._warm_started = bool(s.get("warm_started", False))
        self._warm_known = {str(g) for g in s.get("warm_known") or []}
        self._warm_device = s.get("warm_device")
        self._warm_fingerprint = s.get("warm_fingerprint")
        self._warm_skipped = {str(g) for g in s.get("warm_skipped") or []}
        recovered = 0
        for d in s.get("pending") or []:
            c = Candidate.from_state(d)
            if c.genome.id in self.archive:
                recovered += 1  # told, but killed before the state was saved
                continue
            self._pending[c.id] = c
            self._queue.append(c.id)
        self._evaluations += recovered
        log.info("resumed engine state: generation %d, %d evaluations, %d pending candidate(s) to re-submit",
                 self._generation, self._evaluations, len(self._pending))


def _operator_error_type() -> type[BaseException]:
    from operators import OperatorError

    return OperatorError


def _cost_of(meta: Mapping[str, Any]) -> float:
    c = meta.get("cost") if isinstance(meta, Mapping) else None
    return float(c) if isinstance(c, (int, float)) and math.isfinite(c) and c > 0 else 0.0


def _excerpt(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _problem_name(desc: Any) -> str:
    if isinstance(desc, Mapping):
        return str(desc.get("name", ""))
    return str(desc or "")


def _plain_state(v: Any) -> Any:
    """RNG state as msgpack-safe data: ints beyond 64 bits become ``"int:<digits>"``."""
    if isinstance(v, Mapping):
        return {str(k): _plain_state(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain_state(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**63:
        return f"int:{v}"
    return v


def _rng_state(v: Any) -> Any:
    """Inverse of :func:`_plain_state`."""
    if isinstance(v, Mapping):
        return {k: _rng_state(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_rng_state(x) for x in v]
    if isinstance(v, str) and v.startswith("int:"):
        return int(v[4:])
    return v
