"""The timing plan shared by the Timing stage and :func:`fitness.time_calls`.

Pure arithmetic, no device: how many launches make one batch, how many batches to time,
and which end of a batch counts. Both timers call these, so a genome and a framework
callable timed side by side are measured by the same rules.

A batch is timed between a start event and an end event recorded on the timing stream
right after the batch's last launch (device timestamps: no host latency in the figure).
The host then synchronises the whole device and records a second end event. If that one is
later than the first by more than :func:`escape_slack_ms`, work outlived the stream (it
escaped to another stream, where the first end event cannot see it) and the synchronised
end counts instead, so such work is never left out of the time. Otherwise the gap is the
host's wake-up after the synchronise (a few to tens of microseconds, varying from batch to
batch), which the first end event keeps out of the figure.

Racing: when the submitter knows a case's best time so far (the incumbent), the first few
timed batches decide whether the rest are worth running. A candidate whose median over
them is slower than ``margin`` times the incumbent cannot take the case, so its time is
the median of those batches (the same method, fewer samples) and the device moves on.
"""

from __future__ import annotations

import math
import statistics

__all__ = ["MAX_BATCHES", "MIN_BATCHES", "batch_count", "batch_size", "batch_time", "escape_slack_ms", "raced_out",
           "rotation_sets"]

MIN_BATCHES = 10
"""Fewest timed batches."""
MAX_BATCHES = 100
"""Most timed batches."""


def rotation_sets(l2_bytes: int, set_bytes: int, *, most: int, least: int = 1, fit: int | None = None) -> int:
    """Input sets to rotate so that one round over them exceeds 3x L2 (every launch reads from HBM).

    Args:
        l2_bytes: The device's L2 size.
        set_bytes: Bytes one launch reads and writes (one set's buffers).
        most: Upper bound (the caller's).
        least: Lower bound (the caller's; wins over ``fit``).
        fit: Most sets the free device memory holds, if the caller limits by it.
    """
    want = math.ceil(3 * max(int(l2_bytes), 1) / max(int(set_bytes), 1))
    k = min(want, int(most), int(fit) if fit is not None else want)
    return max(int(least), k)


def batch_size(sets: int, per_launch_ms: float, min_batch_ms: float, max_batch: int) -> int:
    """Launches per batch: a whole number of rounds over ``sets``, lasting >= ``min_batch_ms``.

    Args:
        sets: Input sets the batch rotates over (>= 1).
        per_launch_ms: Estimated milliseconds per launch.
        min_batch_ms: Shortest batch.
        max_batch: Most launches in one batch (wins over ``min_batch_ms``; at least ``sets``).
    """
    k = max(1, int(sets))
    b = max(k, math.ceil(min_batch_ms / max(per_launch_ms, 1e-9)))
    return min(max(k, b + (-b) % k), max(k, int(max_batch)))


def batch_count(target_ms: float, batch_ms: float, lo: int = MIN_BATCHES, hi: int = MAX_BATCHES) -> int:
    """Batches to time so their total is about ``target_ms`` (between ``lo`` and ``hi``)."""
    return int(min(hi, max(lo, math.ceil(target_ms / max(batch_ms, 1e-9)))))


def escape_slack_ms(stream_ms: float) -> float:
    """How much later the synchronised end may be before work counts as escaped.

    0.5 ms or 10% of the batch, whichever is larger: far above the host's wake-up after a
    synchronise, far below any real work moved off the stream over a batch of launches.
    """
    return max(0.5, 0.1 * stream_ms)


def batch_time(stream_ms: float, synced_ms: float) -> tuple[float, bool]:
    """(milliseconds that count, whether work escaped) for one batch.

    Args:
        stream_ms: Start event to the end event recorded on the stream after the batch.
        synced_ms: Start event to the end event recorded after a device-wide synchronise.
    """
    if synced_ms - stream_ms > escape_slack_ms(stream_ms):
        return synced_ms, True
    return stream_ms, False


def raced_out(first_ms: list[float], incumbent_ms: float | None, margin: float | None) -> bool:
    """Whether a case may stop after its first timed batches (racing).

    Args:
        first_ms: Milliseconds per launch of the first timed batches (at least one).
        incumbent_ms: The case's best known time per launch; ``None``, non-finite or not
            positive: no race.
        margin: How much slower than the incumbent the median of ``first_ms`` must be
            (e.g. 1.15: 15%); ``None`` or <= 1: no race.
    """
    if not first_ms or incumbent_ms is None or margin is None:
        return False
    if not (math.isfinite(incumbent_ms) and incumbent_ms > 0 and math.isfinite(margin) and margin > 1.0):
        return False
    return statistics.median(first_ms) > margin * incumbent_ms
