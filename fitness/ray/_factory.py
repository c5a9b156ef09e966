"""The executor factory: one call that gives the engine a local or a Ray executor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evo.types import Problem
from fitness._stage import Stage

__all__ = ["EXECUTOR_KINDS", "make_executor"]

EXECUTOR_KINDS = ("local", "ray")

# Keywords only the Ray executor understands; dropped (if None) or refused for "local".
_RAY_ONLY = ("address", "ray_address", "num_gpus_per_actor", "num_actors", "max_retries", "runtime_env",
             "init_kwargs", "compile_concurrency")


def make_executor(kind: str, problem: Problem, stages: Sequence[Stage] | None = None, **kw: Any) -> Any:
    """Make the evaluation backend the engine submits candidates to.

    Both kinds return an object with ``submit(genome) -> Future[Evaluation]``,
    ``evaluate``, ``stats()``, ``close()`` and ``device_info``.

    Args:
        kind: ``"local"`` (:class:`fitness.Evaluator`: one worker per visible GPU of this
            host, compiles on a thread pool) or ``"ray"`` (:class:`fitness.ray.RayExecutor`).
        problem: The Problem.
        stages: The stage list (default: each executor's default stages).
        **kw: Executor options. Common: ``cache_dir``, ``timeout``, ``device_timeout``,
            ``seed``, ``keep_ptx``. Local only: ``devices``, ``compile_workers``. Ray only:
            ``address`` (or its alias ``ray_address``), ``num_gpus_per_actor``,
            ``num_actors``, ``compile_concurrency``, ``max_retries``, ``runtime_env``,
            ``init_kwargs``. ``compile_concurrency`` given to ``"local"`` becomes
            ``compile_workers``; other Ray-only options given to ``"local"`` must be None.

    Returns:
        The executor.

    Raises:
        ValueError: Unknown kind, or a Ray-only option set for the local executor.

    Example:
        ``make_executor(cfg.executor, problem, ray_address=cfg.ray_address, cache_dir=...)``
    """
    kind = (kind or "local").lower()
    if kind not in EXECUTOR_KINDS:
        raise ValueError(f"unknown executor {kind!r}: use one of {', '.join(EXECUTOR_KINDS)}")
    if kind == "ray":
        from fitness.ray._executor import RayExecutor

        alias = kw.pop("ray_address", None)
        if alias is not None:
            if kw.get("address") not in (None, alias):
                raise ValueError(f"both address={kw['address']!r} and ray_address={alias!r} given; pass one")
            kw["address"] = alias
        if "compile_workers" in kw:
            cw = kw.pop("compile_workers")
            kw.setdefault("compile_concurrency", cw)
        if kw.pop("devices", None) is not None:
            _refuse("devices", "ray")
        return RayExecutor(problem, stages, **kw)

    from fitness import Evaluator

    if kw.get("compile_concurrency") is not None:
        kw.setdefault("compile_workers", kw["compile_concurrency"])
    for name in _RAY_ONLY:
        value = kw.pop(name, None)
        if value is not None and name != "compile_concurrency":
            _refuse(name, "local")
    return Evaluator(problem, stages, **kw)


def _refuse(name: str, kind: str) -> None:
    other = "ray" if kind == "local" else "local"
    raise ValueError(f"option {name!r} is for the {other!r} executor, not {kind!r}; remove it or set executor={other!r}")
