"""Timing framework callables (torch) the way :class:`fitness.Timing` times genomes.

Comparisons against torch, torch.compile or other libraries are only fair when both sides
are measured the same way. :func:`time_calls` applies the Timing stage's method to
zero-argument callables that launch GPU work on torch's current stream:

* the caller passes one call per input set, the sets together larger than 3x L2, so
  every call reads from HBM;
* a first pass over the calls, then warm-up until ``warmup_ms`` have passed;
* a batch of B calls rotating over the sets, B chosen so one batch lasts at least
  ``min_batch_ms``, recorded once as a CUDA graph (``torch.cuda.CUDAGraph``) when the
  calls can be captured, else issued call by call;
* at least 10 batches (up to 100, aiming at ``target_ms`` of timed work), each between a
  start event and an end event recorded on the stream, with a device-wide synchronise and
  a second end event that counts instead when work outlived the stream (``fitness._plan``);
* the median time per call over batches, and the spread ``(p75 - p25) / median``.

torch is imported inside the function; nothing here runs without it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fitness._plan import batch_count, batch_size, batch_time

__all__ = ["CallTiming", "time_calls"]


@dataclass(frozen=True)
class CallTiming:
    """The result of :func:`time_calls`.

    Attributes:
        time_ms: Median milliseconds per call.
        spread: ``(p75 - p25) / median`` over batches.
        batches: Batches timed.
        calls_per_batch: B.
        graph: Whether batches were CUDA-graph replays.
    """

    time_ms: float
    spread: float
    batches: int
    calls_per_batch: int
    graph: bool


def _graph(torch: Any, batch: Sequence[Callable[[], Any]]) -> Any:
    """A CUDA graph of ``batch`` (after a side-stream warm-up, as torch requires), or None."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for c in batch[: min(len(batch), 3)]:
                c()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in batch:
                c()
        graph.replay()
        torch.cuda.synchronize()
        return graph
    except Exception:  # noqa: BLE001 - not capturable: plain calls
        torch.cuda.synchronize()
        return None


def time_calls(calls: Sequence[Callable[[], Any]], *, min_batch_ms: float = 2.0, warmup_ms: float = 10.0,
               target_ms: float = 50.0, max_batch: int = 4096, use_graph: bool = True) -> CallTiming:
    """Time zero-argument GPU calls (one per input set) with the Timing stage's method.

    Args:
        calls: One callable per input set; each launches the work once on torch's
            current stream.
        min_batch_ms: Shortest batch.
        warmup_ms: Warm-up after the first pass.
        target_ms: Total timed milliseconds the batch count aims for (10..100 batches).
        max_batch: Most calls in one batch.
        use_graph: Record batches as CUDA graphs when the calls allow it.

    Returns:
        A :class:`CallTiming`.

    Raises:
        ValueError: ``calls`` is empty.
    """
    if not calls:
        raise ValueError("time_calls needs at least one call (one per input set)")
    import torch

    k = len(calls)
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731 - tiny factory

    def run(batch: Sequence[Callable[[], Any]], graph: Any) -> float:
        a, b, c_ = ev(), ev(), ev()
        a.record()
        if graph is not None:
            graph.replay()
        else:
            for c in batch:
                c()
        b.record()
        torch.cuda.synchronize()  # device-wide, as the Timing stage does
        c_.record()
        c_.synchronize()
        return batch_time(float(a.elapsed_time(b)), float(a.elapsed_time(c_)))[0]

    per = max(run(calls, None) / k, 1e-6)
    n = batch_size(k, per, min_batch_ms, max_batch)
    batch = [calls[i % k] for i in range(n)]
    graph = _graph(torch, batch) if use_graph else None
    t0 = time.perf_counter()
    rounds = 0
    while rounds < 2 or (time.perf_counter() - t0) * 1e3 < warmup_ms:
        per = max(run(batch, graph) / n, 1e-6)
        rounds += 1
        if rounds == 1 and graph is not None and n * per < 0.5 * min_batch_ms and n < max_batch:
            n = batch_size(k, per, min_batch_ms, max_batch)
            batch = [calls[i % k] for i in range(n)]
            graph = _graph(torch, batch)
        if rounds >= 1000:
            break
    r = batch_count(target_ms, n * per)
    times = np.array([run(batch, graph) / n for _ in range(r)])
    med = float(np.median(times))
    p25, p75 = np.percentile(times, [25, 75])
    return CallTiming(time_ms=med, spread=float((p75 - p25) / med) if med > 0 else math.inf, batches=r,
                      calls_per_batch=n, graph=graph is not None)
