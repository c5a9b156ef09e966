"""Keeping a Ray cluster that lives on this host to the loopback interface (127.0.0.1).

Why this needs more than ``node_ip_address="127.0.0.1"``: on Linux Ray treats
``127.0.0.1`` and ``localhost`` as "this node" and rewrites them to the host's outward
address (``ray._private.services.resolve_ip_for_localhost``, used on the bootstrap
address given to ``ray.init(address=...)`` and on ``ray.init(_node_ip_address=...)``).
Its GCS, raylets and workers, however, listen on the node IP they were started with.
So with nodes started on 127.0.0.1, a driver told ``address="127.0.0.1:PORT",
_node_ip_address="127.0.0.1"`` dials ``<host address>:PORT``, where nothing listens, and
retries forever (the "driver hangs trying to reach the head node" symptom). Ray skips the
rewrite when ``ray_constants.ENABLE_RAY_CLUSTER`` is false (its default on macOS and
Windows, set from the environment variable ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``):
:func:`loopback_ray` turns that off for the processes started inside it, so every
process (driver, GCS, raylets, agents, workers) agrees on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["LOOPBACK", "init_local_ray", "is_loopback", "loopback_ray", "node_addresses"]

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ``::1``, or IPv4-mapped 127.x)."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host == "localhost"
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


@contextlib.contextmanager
def loopback_ray() -> Iterator[None]:
    """Within the block, Ray takes ``127.0.0.1`` at its word instead of rewriting it.

    Sets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` in ``os.environ`` (inherited by the GCS,
    raylets and agents started inside the block, and by the workers those raylets
    start later) and, if Ray is already imported, the constant Ray read from it at
    import. Both are restored on exit; a driver connected inside the block keeps its
    node address. Start nodes and connect the driver inside the block, with
    ``node_ip_address="127.0.0.1"`` / ``_node_ip_address="127.0.0.1"``.

    Not thread-safe (it changes ``os.environ``); use it around start-up code.
    """
    old_env = os.environ.get(_CLUSTER_ENV)
    os.environ[_CLUSTER_ENV] = "0"
    consts = sys.modules.get("ray._private.ray_constants")
    if consts is None:
        with contextlib.suppress(ImportError):
            import ray._private.ray_constants as consts  # type: ignore[no-redef]
    old_const = getattr(consts, "ENABLE_RAY_CLUSTER", None) if consts is not None else None
    if consts is not None and old_const is not None:
        consts.ENABLE_RAY_CLUSTER = False
    elif consts is not None:
        log.warning("this Ray version has no ray_constants.ENABLE_RAY_CLUSTER; Ray may rewrite 127.0.0.1 to the "
                    "host's address")
    try:
        yield
    finally:
        if old_env is None:
            os.environ.pop(_CLUSTER_ENV, None)
        else:
            os.environ[_CLUSTER_ENV] = old_env
        if consts is not None and old_const is not None:
            consts.ENABLE_RAY_CLUSTER = old_const


def init_local_ray(**kwargs: Any) -> dict[str, Any]:
    """Start a private single-node Ray on this host, reachable on 127.0.0.1 only.

    ``ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
    **kwargs)`` inside :func:`loopback_ray`; ``address="local"`` never joins a cluster
    found through ``RAY_ADDRESS`` or ``/tmp/ray/ray_current_cluster``.

    Args:
        **kwargs: Further ``ray.init`` keywords (``num_cpus``, ``runtime_env``, ...);
            ``_node_ip_address`` and ``include_dashboard`` may be overridden.

    Returns:
        The ``ray.init`` context's address info (a dict).
    """
    import ray

    kw: dict[str, Any] = dict(kwargs)
    kw.pop("address", None)
    kw.setdefault("_node_ip_address", LOOPBACK)
    kw.setdefault("include_dashboard", False)
    with loopback_ray():
        ctx = ray.init(address="local", **kw)
    addresses = node_addresses()
    if not all(is_loopback(a) for a in addresses):
        log.warning("Ray nodes are not on the loopback interface: %s", addresses)
    info = getattr(ctx, "address_info", None)
    return dict(info) if isinstance(info, Mapping) else {}


def node_addresses() -> list[str]:
    """``NodeManagerAddress`` of every live node of the connected Ray cluster."""
    import ray

    return [str(n.get("NodeManagerAddress", "")) for n in ray.nodes() if n.get("Alive", True)]
