"""The reference benchmark's argument checks and its answer on a machine with no device (no GPU needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import rmsnorm_reference_bench as rb  # noqa: E402


def test_shapes_are_parsed_and_bad_ones_say_what_to_write() -> None:
    assert rb.parse_shapes("32768x256, 8192x262144") == [(32768, 256), (8192, 262144)]
    for bad in ("32768", "32768x", "0x256", "ax256", "32768*256"):
        with pytest.raises(SystemExit, match="is not MxN"):
            rb.parse_shapes(bad)


def test_repeats_below_one_are_refused() -> None:
    with pytest.raises(SystemExit):
        rb.main(["--repeats", "0"])


def test_no_device_is_a_clear_exit(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
        pytest.skip("a CUDA device is present: the benchmark would run")
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - cupy without a device: what this test wants
        pass
    assert rb.main(["--shapes", "4x8"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_time_calls_warms_once_then_times_each_call_to_a_synced_end() -> None:
    log: list[str] = []

    def call(i: int) -> int:
        log.append(f"call {i}")
        return 10 * i

    ts, last = rb.time_calls(call, 3, lambda: log.append("sync"))
    assert log == ["call 0", "sync", "call 1", "sync", "call 2", "sync", "call 3", "sync"]
    assert len(ts) == 3 and all(t >= 0 for t in ts) and last == 30
