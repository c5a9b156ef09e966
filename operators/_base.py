"""The operator API: how users and the library propose new genomes."""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from evo.types import Genome, Lesson, Problem, Record

__all__ = ["Operator", "OperatorContext", "OperatorError", "Proposal"]


class OperatorError(Exception):
    """A proposal that failed (unusable LLM output, no valid child, ...).

    The engine records the message as a lesson and the run goes on.
    """


@dataclass(frozen=True)
class Proposal:
    """A genome an operator proposes, with a note on what changed and free-form meta.

    Attributes:
        genome: The child.
        note: What changed, in one line (becomes the lesson's ``change``).
        meta: Extra data kept on the record (LLM model, tokens, cost, ...).
    """

    genome: Genome
    note: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class OperatorContext:
    """What an operator may use to propose.

    Attributes:
        rng: Seeded generator; use it for every random choice so runs reproduce.
        problem: The Problem (parameter space, description, target).
        lessons: Recent and relevant lessons (newest last).
        archive: Read-only view of the archive (``best()``, ``sample_elites(n, rng)``,
            ``get(id)``, ``elites()``, ``lessons``); ``None`` in isolated tests.
        llm: An LLM backend (``complete(messages, **params)``) or ``None``.
        generation: The engine's generation counter.
        hardware: Device facts and measured ceilings (name, sm_count, copy_gbps, ...).
    """

    rng: np.random.Generator
    problem: Problem
    lessons: Sequence[Lesson] = ()
    archive: Any = None
    llm: Any = None
    generation: int = 0
    hardware: Mapping[str, Any] = field(default_factory=dict)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Operator(abc.ABC):
    """Base class of every operator.

    Subclasses set ``n_parents`` (how many parent records :meth:`propose` receives) and
    implement :meth:`propose`. An operator never evaluates and never writes the archive.

    Attributes:
        name: Registry name and the ``operator`` field of the records it makes; defaults
            to the class name in snake case.
        n_parents: Number of parents it takes.
        uses_failed_parents: ``True`` for operators that repair failed candidates: the
            engine then passes recent failed records as parents.
        cost_weight: Relative cost of one call, used by the engine's operator bandit
            before real costs are known (LLM operators also report ``meta["cost"]``).
    """

    name: ClassVar[str] = ""
    n_parents: ClassVar[int] = 1
    uses_failed_parents: ClassVar[bool] = False
    cost_weight: ClassVar[float] = 1.0

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if not cls.__dict__.get("name"):
            cls.name = _snake(cls.__name__)

    @abc.abstractmethod
    def propose(self, parents: Sequence[Record], ctx: OperatorContext) -> list[Proposal | Genome]:
        """Return zero or more children of ``parents``; raise :class:`OperatorError` on failure."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
