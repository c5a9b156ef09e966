"""A test suite that any :class:`~operators.Operator` can be run through.

In the spirit of ``optuna.testing``: subclass :class:`OperatorContract` in a pytest
module under a name starting with ``Test``, return your operator from
:meth:`~OperatorContract.make_operator`, and pytest collects the contract's tests::

    from operators.testing import OperatorContract

    class TestToggleHint(OperatorContract):
        def make_operator(self):
            return ToggleHint()

        def make_source(self):          # optional: a source your operator can change
            return KERNEL_WITH_LD_GLOBAL_NC

The defaults give a small problem with choices, int ranges, a bool and two
constraints, and parents drawn validly from it (:meth:`make_problem`,
:meth:`make_parents`); override them to fit your operator. Class attributes switch
checks off for operators that legitimately differ (``params_must_be_valid`` for an
operator that does not keep params in the space, ``may_copy_parent`` for one that may
return a parent unchanged).

The suite checks: ``name`` and ``n_parents`` are declared; children are
:class:`Genome` or :class:`Proposal` with a text note and msgpack-encodable meta;
children's params are valid; no child is a copy of a parent; the same seed gives the
same children whatever the global random state; exactly ``n_parents`` parents suffice
and are not read past; an operator either proposes or raises
:class:`~operators.OperatorError`, and succeeds on most seeds; ``ctx.archive=None``
is tolerated.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from evo.space import Bool, Choice, Constraint, IntRange, ParamSpace
from evo.types import Evaluation, Genome, Problem, Record, Status
from operators._base import Operator, OperatorContext, OperatorError, Proposal

__all__ = ["CONTRACT_SOURCE", "OperatorContract", "contract_problem", "make_context", "make_record"]

CONTRACT_SOURCE = r"""
extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = (blockIdx.x * THREADS + threadIdx.x) * VEC;
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        if (i + v < n) {
            float a;
            asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(a) : "l"(x + i + v));
            y[i + v] = FAST ? a * 2.0f : a + a;
        }
    }
}
"""


def _threads_vec_fit(p: Any) -> bool:
    return p["THREADS"] * p["VEC"] <= 2048


def _unroll_le_vec(p: Any) -> bool:
    return p["UNROLL"] <= p["VEC"] * 2


def contract_problem() -> Problem:
    """The default problem of the suite: four kinds of params and two constraints."""
    space = ParamSpace(
        {
            "THREADS": Choice([64, 128, 256, 512, 1024]),
            "VEC": Choice([1, 2, 4, 8]),
            "UNROLL": IntRange(1, 8),
            "FAST": Bool(),
        },
        [
            Constraint("THREADS * VEC <= 2048", _threads_vec_fit),
            Constraint("UNROLL <= 2 * VEC", _unroll_le_vec),
        ],
    )
    return Problem(name="operator_contract", params=space, check_shapes=({"N": 1000},),
                   description="y = 2 * x, elementwise (operator contract tests)")


def make_record(genome: Genome, fitness: float | None = 1.0, **kw: Any) -> Record:
    """A Record for ``genome``: OK with ``fitness``, or a compile error when ``fitness`` is None."""
    if fitness is None:
        ev = Evaluation.failure(Status.COMPILE_ERROR, "error: identifier \"VEC2\" is undefined")
    else:
        ev = Evaluation(Status.OK, fitness=fitness, metrics={"fraction": fitness})
    return Record(genome=genome, evaluation=ev, **kw)


def make_context(problem: Problem, seed: int, **kw: Any) -> OperatorContext:
    """A context with a fresh ``np.random.default_rng(seed)`` and no archive or LLM."""
    return OperatorContext(rng=np.random.default_rng(seed), problem=problem, **kw)


class _StrictParents(Sequence[Record]):
    """Exactly the given parents; reading past them fails the test."""

    def __init__(self, parents: Sequence[Record]) -> None:
        self._p = tuple(parents)

    def __len__(self) -> int:
        return len(self._p)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, int) and not -len(self._p) <= i < len(self._p):
            raise AssertionError(f"operator read parent [{i}] but declares n_parents={len(self._p)}")
        return self._p[i]

    def __iter__(self) -> Iterator[Record]:
        return iter(self._p)


class OperatorContract:
    """Contract tests for an operator; subclass it as ``Test...`` and define :meth:`make_operator`."""

    seeds: ClassVar[tuple[int, ...]] = (0, 1, 2, 3, 4, 5, 6, 7)
    """Seeds each test runs with."""
    min_success: ClassVar[float] = 0.5
    """Fraction of seeds on which the operator must propose at least one child."""
    params_must_be_valid: ClassVar[bool] = True
    may_copy_parent: ClassVar[bool] = False

    # ---- hooks --------------------------------------------------------------------

    def make_operator(self) -> Operator:
        """The operator under test (a fresh one per call)."""
        raise NotImplementedError("subclass OperatorContract and return your operator from make_operator()")

    def make_problem(self) -> Problem:
        """The problem the parents belong to (default :func:`contract_problem`)."""
        return contract_problem()

    def make_source(self) -> str:
        """The parents' source (default: a small kernel with an ``ld.global.nc`` load)."""
        return CONTRACT_SOURCE

    def make_parents(self, problem: Problem, n: int, seed: int) -> list[Record]:
        """``n`` distinct valid parents, OK records with different params (deterministic in ``seed``)."""
        rng = np.random.default_rng(10_000 + seed)
        out: list[Record] = []
        seen: set[str] = set()
        for _ in range(1000):
            if len(out) == n:
                break
            g = Genome(self.make_source(), problem.params.sample(rng))
            if g.id not in seen:
                seen.add(g.id)
                out.append(make_record(g, fitness=float(0.5 + 0.1 * len(out)), generation=0))
        assert len(out) == n, "could not draw distinct parents; override make_parents()"
        return out

    def make_context(self, problem: Problem, seed: int) -> OperatorContext:
        """The context passed to ``propose`` (default: seeded rng, no archive, no LLM)."""
        return make_context(problem, seed)

    # ---- helpers --------------------------------------------------------------------

    def _run(self, seed: int) -> tuple[list[Proposal | Genome] | None, list[Record], Problem, Operator]:
        op = self.make_operator()
        problem = self.make_problem()
        parents = self.make_parents(problem, op.n_parents, seed)
        ctx = self.make_context(problem, seed)
        try:
            children = op.propose(_StrictParents(parents), ctx)
        except OperatorError:
            return None, parents, problem, op
        return children, parents, problem, op

    @staticmethod
    def _genome(child: Proposal | Genome) -> Genome:
        return child.genome if isinstance(child, Proposal) else child

    # ---- the contract -----------------------------------------------------------------

    def test_declares_name_and_n_parents(self) -> None:
        op = self.make_operator()
        assert isinstance(op, Operator), f"make_operator() returned {type(op).__name__}, not an Operator"
        assert isinstance(op.name, str) and op.name, "an operator needs a non-empty name"
        assert isinstance(op.n_parents, int) and op.n_parents >= 0, f"n_parents={op.n_parents!r}"
        assert isinstance(op.uses_failed_parents, bool)

    def test_proposes_on_most_seeds(self) -> None:
        ok = sum(1 for s in self.seeds if self._run(s)[0])
        need = int(np.ceil(self.min_success * len(self.seeds)))
        assert ok >= need, f"proposed children on {ok} of {len(self.seeds)} seeds; at least {need} expected"

    def test_children_are_genomes_or_proposals(self) -> None:
        from evo.codec import pack_raw

        for s in self.seeds:
            children, _, _, op = self._run(s)
            if children is None:
                continue
            assert isinstance(children, list), f"{op.name}.propose returned {type(children).__name__}, not a list"
            for c in children:
                assert isinstance(c, (Genome, Proposal)), f"child of type {type(c).__name__}"
                if isinstance(c, Proposal):
                    assert isinstance(c.genome, Genome), "Proposal.genome must be a Genome"
                    assert isinstance(c.note, str), "Proposal.note must be text"
                    assert "\n" not in c.note.strip(), "Proposal.note is one line"
                    pack_raw(dict(c.meta))  # meta must be storable in the archive

    def test_children_params_valid(self) -> None:
        if not self.params_must_be_valid:
            return
        for s in self.seeds:
            children, _, problem, _ = self._run(s)
            for c in children or ():
                bad = problem.params.violations(self._genome(c).params)
                assert not bad, f"seed {s}: child params invalid: {bad}"

    def test_no_child_copies_a_parent(self) -> None:
        if self.may_copy_parent:
            return
        for s in self.seeds:
            children, parents, _, _ = self._run(s)
            parent_ids = {p.id for p in parents}
            for c in children or ():
                assert self._genome(c).id not in parent_ids, f"seed {s}: a child equals a parent (a no-op proposal)"

    def test_deterministic_for_a_seed(self) -> None:
        for s in self.seeds[:4]:
            random.seed(1)
            np.random.seed(1)
            first, *_ = self._run(s)
            random.seed(2)
            np.random.seed(2)
            second, *_ = self._run(s)
            ids1 = None if first is None else [self._genome(c).id for c in first]
            ids2 = None if second is None else [self._genome(c).id for c in second]
            assert ids1 == ids2, f"seed {s}: the same ctx.rng seed gave different children ({ids1} vs {ids2}); " \
                                 "take every random choice from ctx.rng"

    def test_seeds_give_variety(self) -> None:
        ids = set()
        for s in self.seeds:
            children, *_ = self._run(s)
            ids.update(self._genome(c).id for c in children or ())
        assert len(ids) >= min(2, len(self.seeds)) or not ids, "every seed gave the same child; is ctx.rng used?"

    def test_exactly_n_parents_suffice(self) -> None:
        # _run passes a sequence of exactly n_parents that fails on reads past its end.
        op = self.make_operator()
        problem = self.make_problem()
        parents = self.make_parents(problem, op.n_parents, 0)
        assert len(parents) == op.n_parents
        try:
            op.propose(_StrictParents(parents), self.make_context(problem, 0))
        except OperatorError:
            pass

    def test_failure_is_operator_error(self) -> None:
        # Anything raised by propose on valid input must be an OperatorError.
        for s in self.seeds:
            op = self.make_operator()
            problem = self.make_problem()
            parents = self.make_parents(problem, op.n_parents, s)
            try:
                op.propose(list(parents), self.make_context(problem, s))
            except OperatorError as e:
                assert str(e), "an OperatorError needs a message saying what failed"
