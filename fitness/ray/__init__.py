"""Scale-out: evaluation on a Ray cluster, and the executor factory the engine calls.

API index:
    RayExecutor        host stages as Ray CPU tasks, device stages on one Ray actor per GPU
    RayExecutorError   Ray missing, no GPU in the cluster, Problem not loadable on workers
    make_executor      ``make_executor("local" | "ray", problem, **kw)``: the engine's backend switch
    EXECUTOR_KINDS     the kinds make_executor accepts
    run_host_stages    the body of the Ray host task (usable on its own)
    run_preflight      the local Evaluator's start-up checks, run as a Ray task
    LOOPBACK           "127.0.0.1"
    loopback_ray       context manager: Ray started/connected inside keeps to 127.0.0.1
    init_local_ray     start a private single-node Ray on 127.0.0.1 (what RayExecutor(address=None) does)
    is_loopback        whether an address is 127.0.0.0/8, ::1 or IPv4-mapped loopback
    node_addresses     NodeManagerAddress of each live node of the connected cluster

Importing this package does not import Ray; Ray is imported when a RayExecutor is made.
"""

from fitness.ray._executor import RayExecutor, RayExecutorError, run_host_stages, run_preflight
from fitness.ray._factory import EXECUTOR_KINDS, make_executor
from fitness.ray._loopback import LOOPBACK, init_local_ray, is_loopback, loopback_ray, node_addresses

__all__ = ["EXECUTOR_KINDS", "LOOPBACK", "RayExecutor", "RayExecutorError", "init_local_ray", "is_loopback",
           "loopback_ray", "make_executor", "node_addresses", "run_host_stages", "run_preflight"]
