"""Stage base class and the values stages pass along.

An :class:`~fitness.Evaluator` is an ordered list of stages that stops at the first
failed gate. Host stages (``where = "host"``) run in the driver process (a compile stage
runs its compiler in a subprocess); device stages (``where = "device"``) run inside a
spawned GPU worker and must therefore be picklable.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from evo.types import DeviceInfo, Genome, Problem, Status

__all__ = ["CudaFault", "Job", "Stage", "StageContext", "StageResult"]


class CudaFault(RuntimeError):
    """A CUDA error raised while a candidate ran (illegal address, misaligned access, ...).

    Such errors are sticky: they poison the CUDA context, so the worker that saw one
    reports RUNTIME_ERROR and exits; a fresh worker takes the next candidate. Device
    stages raise it (or let cupy's CUDA errors propagate, which the worker treats alike).
    """


@dataclass
class StageResult:
    """What one stage found.

    Attributes:
        ok: ``False`` stops the evaluation; ``status`` then says how it failed.
        status: The failure status (REJECTED, COMPILE_ERROR, INCORRECT, RUNTIME_ERROR,
            TIMEOUT); ignored when ``ok``.
        fitness: Set by the stage that scores (usually the timing stage).
        metrics, resources, artifacts: Merged into the final Evaluation (later stages
            overwrite earlier keys).
        data: Passed to later stages through :attr:`Job.data` (e.g. ``"cubin"``).
    """

    ok: bool
    status: Status | None = None
    fitness: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def fail(cls, status: Status, reason: str, **artifacts: Any) -> StageResult:
        """A failed gate with ``reason`` (and any further artifacts) recorded."""
        arts = {"reason": reason}
        arts.update(artifacts)
        return cls(ok=False, status=status, artifacts=arts)


INCUMBENTS = "incumbents"
"""Key in :attr:`Job.data` of ``{case key: best known time_ms}`` (see ``Evaluator.submit``)."""


def incumbents_data(incumbents: Mapping[str, float] | None) -> dict[str, Any]:
    """The initial :attr:`Job.data` for a submit with ``incumbents`` (checked and copied).

    Raises:
        TypeError: Not a mapping of case keys (str) to positive, finite numbers.
    """
    if incumbents is None:
        return {}
    if not isinstance(incumbents, Mapping):
        raise TypeError(f"incumbents must map case keys to times in ms, got {type(incumbents).__name__}")
    out: dict[str, float] = {}
    for k, v in incumbents.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)) \
                or not math.isfinite(v) or v <= 0:
            raise TypeError(f"incumbents[{k!r}] = {v!r}: give case keys (str) and positive, finite times in ms")
        out[k] = float(v)
    return {INCUMBENTS: out} if out else {}


@dataclass
class Job:
    """One genome on its way through the stages.

    Attributes:
        genome: The candidate.
        problem: The Problem it is scored against.
        data: Products of earlier stages (``"cubin"``: bytes, ``"ptx"``: str,
            ``"compile_log"``: str, ...), and what the submitter handed over:
            ``INCUMBENTS`` (``"incumbents"``), the best time in ms known for each timed
            case key, which lets :class:`~fitness.Timing` stop timing a case early.
    """

    genome: Genome
    problem: Problem
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class StageContext:
    """What a stage may use besides the job.

    Attributes:
        device: The GPU (device stages only), with its measured copy bandwidth.
        seed: Secret per-evaluation seed for input generation (the genome cannot know it).
        scratch: Per-process storage kept across evaluations (module caches, buffers).
        options: Evaluator options (timeouts, repetitions, cache directory, ...).
    """

    device: DeviceInfo | None = None
    seed: int = 0
    scratch: dict[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)


class Stage(abc.ABC):
    """One step of an evaluation. Subclass and implement :meth:`run`.

    Attributes:
        name: Key for per-stage wall times.
        where: ``"host"`` (driver process) or ``"device"`` (inside a GPU worker).
        needs_gpu: ``True`` if the stage uses the GPU: the worker then initialises the
            device (and measures its copy bandwidth) before the first such stage.
    """

    name: ClassVar[str] = "stage"
    where: ClassVar[Literal["host", "device"]] = "host"
    needs_gpu: ClassVar[bool] = False

    @abc.abstractmethod
    def run(self, job: Job, ctx: StageContext) -> StageResult:
        """Run the stage; return a failed :class:`StageResult` for a candidate fault.

        Raising is reserved for faults of the harness itself; a candidate's fault is data.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
