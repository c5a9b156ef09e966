"""A CPU-scorable Problem for engine tests: real CUDA compiled with nvcc, no GPU needed.

The kernel (``kernels/cpu_axpy.cu``) computes ``out = a * x + y``; its params change
the code the compiler emits:

* ``UNROLL`` (1, 2, 4, 8): loop unroll factor;
* ``VEC`` (1, 2, 4): elements per thread per step;
* ``THREADS`` (64..512 step 64): the ``__launch_bounds__`` block size;
* constraint ``UNROLL * VEC <= 16``.

Fitness comes from the compiler's resource report (``ptxas -v``), through
``fitness.HostScore(score_fn)``: more work per thread per register is better, with a
small term for the block size. The descriptor axes are the register count and ``VEC``.

Other test suites (LLM operators, Ray executor) may import this module:
``make_problem()``, ``make_evaluator(cache_dir)``, ``score_fn``, ``SEED_PARAMS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evo.space import CategoricalAxis, Choice, Constraint, IntRange, NumericAxis, ParamSpace
from evo.types import Genome, Problem

__all__ = ["KERNEL_PATH", "SEED_PARAMS", "ParamsExecutor", "fraction_fn", "make_evaluator", "make_problem",
           "model_registers", "score_fn",
           "seed_genome", "unroll_vec_ok"]

KERNEL_PATH = Path(__file__).with_name("kernels") / "cpu_axpy.cu"
SEED_PARAMS: dict[str, Any] = {"UNROLL": 1, "VEC": 1, "THREADS": 128}
#: Fitness at which :func:`fraction_fn` reports 1.0 (a reachable but not trivial value).
FITNESS_CEILING = 10.0


def unroll_vec_ok(params: Mapping[str, Any]) -> bool:
    """Constraint: at most 16 elements per thread."""
    return int(params["UNROLL"]) * int(params["VEC"]) <= 16


def score_fn(job: Any, resources: Mapping[str, Any]) -> float:
    """Fitness from the compiler's resource report: work per thread per register.

    Args:
        job: The fitness Job (its genome's params are read).
        resources: ``registers`` (and spills) parsed from ``ptxas -v``.

    Returns:
        ``10 * UNROLL * VEC / registers + THREADS / 1024 - spill_bytes / 64``.
    """
    p = job.genome.params
    regs = max(int(resources.get("registers", 0) or 0), 1)
    spills = float(resources.get("spill_bytes", 0) or 0)
    return 10.0 * int(p["UNROLL"]) * int(p["VEC"]) / regs + int(p["THREADS"]) / 1024.0 - spills / 64.0


def fraction_fn(fitness: float) -> float:
    """The fitness expressed as a fraction of :data:`FITNESS_CEILING` (for target budgets)."""
    return float(fitness) / FITNESS_CEILING


def seed_genome(**params: Any) -> Genome:
    """The kernel as a Genome with :data:`SEED_PARAMS` updated by ``params``."""
    p = dict(SEED_PARAMS)
    p.update(params)
    return Genome(KERNEL_PATH.read_text(), p, entry="axpy")


def make_problem(name: str = "cpu_axpy", *, seeds: tuple[Genome, ...] | None = None,
                 check_shapes: tuple[Mapping[str, int], ...] = ({"N": 1000},)) -> Problem:
    """The CPU-scorable Problem.

    Args:
        name: Problem name (part of the fingerprint).
        seeds: Starting genomes (default: one seed with :data:`SEED_PARAMS`).
        check_shapes: Shapes (only part of the fingerprint here: nothing runs on a GPU).
    """
    space = ParamSpace(
        {"UNROLL": Choice((1, 2, 4, 8)), "VEC": Choice((1, 2, 4)), "THREADS": IntRange(64, 512, step=64)},
        (Constraint("UNROLL * VEC <= 16", unroll_vec_ok),),
    )
    return Problem(
        name=name,
        params=space,
        check_shapes=tuple(check_shapes),
        description="out[i] = a * x[i] + y[i] for i < n; CPU-scored from the compiler's resource report.",
        objective="geomean_speed",
        target="sm_90a",
        descriptors=(NumericAxis("registers", 0, 64, 8, source="resources"),
                     CategoricalAxis("VEC", (1, 2, 4), source="params")),
        seeds=(seed_genome(),) if seeds is None else tuple(seeds),
    )


def make_evaluator(problem: Problem, cache_dir: str | Path | None = None, **kw: Any) -> Any:
    """A real ``fitness.Evaluator`` with host stages only: static check, nvcc, resources, score."""
    from fitness import Compile, Evaluator, HostScore, Resources, StaticCheck

    stages = [StaticCheck(), Compile(), Resources(), HostScore(score_fn)]
    return Evaluator(problem, stages=stages, cache_dir=str(cache_dir) if cache_dir is not None else None, **kw)


def model_registers(params: Mapping[str, Any]) -> int:
    """A register-count model of the kernel (used by :class:`ParamsExecutor`, no compiler)."""
    return 8 + 2 * int(params["UNROLL"]) * int(params["VEC"])


class ParamsExecutor:
    """The executor contract (``submit``/``stats``/``close``) scoring params on threads, no nvcc.

    For fast engine tests: fitness is :func:`score_fn` applied to
    :func:`model_registers`, ``metrics["fraction"]`` is :func:`fraction_fn` of it.
    Genomes whose params satisfy ``fail(params)`` come back as COMPILE_ERROR.

    Args:
        delay: Seconds each evaluation takes (in a worker thread).
        fail: Predicate on params marking failures.
        workers: Threads.
    """

    def __init__(self, delay: float = 0.0, fail: Any = None, workers: int = 4) -> None:
        import concurrent.futures as cf
        import threading

        self.delay = delay
        self.fail = fail
        self._pool = cf.ThreadPoolExecutor(workers)
        self._lock = threading.Lock()
        self.submitted: list[str] = []

    def evaluate_now(self, genome: Genome) -> Any:
        """The evaluation, computed in the calling thread."""
        import time
        from types import SimpleNamespace

        from evo.types import Evaluation, Status

        if self.delay:
            time.sleep(self.delay)
        p = genome.params
        if self.fail is not None and self.fail(p):
            return Evaluation.failure(Status.COMPILE_ERROR, f"synthetic compile error for {dict(p)}",
                                      artifacts={"compile_log": "error: synthetic"})
        res = {"registers": model_registers(p), "spill_bytes": 0}
        f = score_fn(SimpleNamespace(genome=genome), res)
        return Evaluation(Status.OK, fitness=f, metrics={"fraction": fraction_fn(f)}, resources=res)

    def submit(self, genome: Genome) -> Any:
        with self._lock:
            self.submitted.append(genome.id)
        return self._pool.submit(self.evaluate_now, genome)

    def stats(self) -> dict[str, Any]:
        return {"evaluations": len(self.submitted)}

    def close(self) -> None:
        self._pool.shutdown(wait=True)
