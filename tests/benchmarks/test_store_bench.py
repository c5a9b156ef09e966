"""benchmarks/store_bench.py: clear errors on the CPU (the timing itself needs a GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import store_bench  # noqa: E402

from tests.marks import needs_gpu, without_gpu  # noqa: E402


def test_bad_sizes_are_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="give element counts"):
        store_bench.main(["--sizes", "lots"])
    with pytest.raises(SystemExit, match="--repeats must be 1 or more"):
        store_bench.main(["--repeats", "0"])


@without_gpu
def test_no_gpu_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="needs a usable CUDA device"):
        store_bench.main(["--sizes", "1000"])


@pytest.mark.gpu
@needs_gpu
def test_small_run_prints_same_bits(capsys: pytest.CaptureFixture[str]) -> None:
    assert store_bench.main(["--sizes", "100003", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("same bits: True") == 3
