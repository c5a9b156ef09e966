"""The timing plan shared by Timing and time_calls (pure arithmetic) and the batch timer's use of it."""

from __future__ import annotations

import math

import pytest

from fitness._gate import Timing
from fitness._plan import MAX_BATCHES, MIN_BATCHES, batch_count, batch_size, batch_time, escape_slack_ms, raced_out


def test_batch_size_whole_rounds_and_bounds() -> None:
    assert batch_size(3, 0.1, 2.0, 8192) == 21  # ceil(2 / 0.1) = 20 -> a multiple of 3
    assert batch_size(4, 5.0, 2.0, 8192) == 4  # one round already lasts longer than 2 ms
    assert batch_size(1, 1e-6, 2.0, 100) == 100  # max_batch wins over the shortest batch
    assert batch_size(7, 1e-6, 2.0, 3) == 7  # but never fewer launches than sets
    assert batch_size(0, 0.0, 2.0, 50) == 50


def test_batch_count_aims_at_target_within_bounds() -> None:
    assert batch_count(50.0, 2.0) == 25
    assert batch_count(50.0, 20.0) == MIN_BATCHES
    assert batch_count(50.0, 0.01) == MAX_BATCHES
    assert batch_count(100.0, 0.0) == MAX_BATCHES


def test_batch_time_keeps_host_latency_out_and_escaped_work_in() -> None:
    # the host's wake-up after the synchronise (tens of us) is not counted
    assert batch_time(2.000, 2.030) == (2.000, False)
    assert batch_time(20.0, 21.5) == (20.0, False)  # within 10% of a long batch
    # work that outlived the stream counts: the synchronised end is the batch's time
    assert batch_time(2.0, 4.0) == (4.0, True)
    assert batch_time(20.0, 23.0) == (23.0, True)
    assert escape_slack_ms(1.0) == 0.5 and escape_slack_ms(10.0) == pytest.approx(1.0)


class _Clock:
    """A fake backend: events are device timestamps; work on the stream ends at `stream_end`,
    escaped work at `device_end`, and the host wakes `wake` ms after the device is idle."""

    def __init__(self, stream_ms: float, escaped_ms: float, wake: float) -> None:
        self.t = 0.0
        self.stream_ms, self.escaped_ms, self.wake = stream_ms, escaped_ms, wake
        self.launched = False

    def event(self) -> float:
        return self.t

    def synchronize(self) -> None:
        self.t = max(self.t, self.escaped_ms) + self.wake

    def elapsed_ms(self, a: float, b: float) -> float:
        return b - a


class _Batch:
    def __init__(self, clock: _Clock) -> None:
        self.clock = clock

    def launch(self) -> None:
        self.clock.t += self.clock.stream_ms


def _run(stream_ms: float, escaped_ms: float, wake: float) -> tuple[float, bool]:
    clock = _Clock(stream_ms, escaped_ms, wake)
    return Timing._run_batch(clock, None, None, [object()], None, _Batch(clock), 1)  # type: ignore[arg-type]


def test_run_batch_uses_stream_end_unless_work_escaped() -> None:
    assert _run(2.0, 0.0, 0.04) == (2.0, False)  # host latency after the sync is not timed
    ms, escaped = _run(2.0, 5.0, 0.04)  # 3 ms of work outlived the stream
    assert escaped and ms == pytest.approx(5.04)


def test_raced_out_compares_the_median_of_the_first_batches_with_the_margin() -> None:
    assert raced_out([1.3, 1.2, 5.0], 1.0, 1.15)  # median 1.3 > 1.15
    assert not raced_out([1.1, 9.0, 1.0], 1.0, 1.15)  # one slow batch does not decide: median 1.1
    assert raced_out([1.2, 1.3], 1.0, 1.15)  # even count: mean of the middle two, 1.25
    assert not raced_out([1.15], 1.0, 1.15)  # exactly at the margin: keep timing
    for inc, margin in [(None, 1.15), (0.0, 1.15), (-1.0, 1.15), (math.nan, 1.15), (1.0, None), (1.0, 1.0),
                        (1.0, 0.5), (1.0, math.inf)]:
        assert not raced_out([100.0], inc, margin)
    assert not raced_out([], 1.0, 1.15)


def test_rotation_sets_exceed_three_l2_within_the_callers_bounds() -> None:
    from fitness import rotation_sets

    l2 = 60 << 20
    assert rotation_sets(l2, 32 << 20, most=64) == 6  # 6 x 32 MiB >= 180 MiB
    assert rotation_sets(l2, 400 << 20, most=64) == 1  # one set alone exceeds 3x L2
    assert rotation_sets(l2, 400 << 20, most=16, least=2) == 2
    assert rotation_sets(l2, 1 << 20, most=16) == 16
    assert rotation_sets(l2, 32 << 20, most=64, fit=3) == 3  # what free memory holds
    assert rotation_sets(l2, 32 << 20, most=64, fit=0) == 1  # never below least
    assert rotation_sets(0, 1 << 20, most=8) == 1  # no L2 reported: one set
