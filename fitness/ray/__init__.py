"""Scale-out: evaluation on a Ray cluster, and the executor factory the engine calls.

API index:
    RayExecutor        host stages as Ray CPU tasks, device stages on one Ray actor per GPU
    RayExecutorError   Ray missing, no GPU in the cluster, Problem not loadable on workers
    make_executor      ``make_executor("local" | "ray", problem, **kw)``: the engine's backend switch
    EXECUTOR_KINDS     the kinds make_executor accepts
    run_host_stages    the body of the Ray host task (usable on its own)
    run_preflight      the local Evaluator's start-up checks, run as a Ray task

Importing this package does not import Ray; Ray is imported when a RayExecutor is made.
"""

from fitness.ray._executor import RayExecutor, RayExecutorError, run_host_stages, run_preflight
from fitness.ray._factory import EXECUTOR_KINDS, make_executor

__all__ = ["EXECUTOR_KINDS", "RayExecutor", "RayExecutorError", "make_executor", "run_host_stages", "run_preflight"]
