"""benchmarks/inputs_bench.py: arguments and errors on the CPU; on a GPU, a small run whose two
ways of filling the inputs store the same bits."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import inputs_bench  # noqa: E402

from evo.types import Case  # noqa: E402
from fitness import NormalDraw  # noqa: E402
from tests.marks import needs_gpu, without_gpu  # noqa: E402


def test_parse_shapes_and_errors() -> None:
    assert inputs_bench.parse_shapes("32768x1024, 7x3") == [{"M": 32768, "N": 1024}, {"M": 7, "N": 3}]
    with pytest.raises(SystemExit, match="give MxN shapes"):
        inputs_bench.parse_shapes("1024")
    with pytest.raises(SystemExit, match="1 or more"):
        inputs_bench.parse_shapes("0x5")
    with pytest.raises(SystemExit, match="use bfloat16, float16"):
        inputs_bench.main(["--dtypes", "int8"])
    with pytest.raises(SystemExit, match="--repeats must be 1 or more"):
        inputs_bench.main(["--repeats", "0"])


def test_eager_draws_what_the_deferred_draw_would() -> None:
    from examples.rmsnorm_problem import fwd_make_inputs

    case = Case({"M": 5, "N": 12}, "bfloat16")
    lazy = fwd_make_inputs(case, np.random.default_rng(2), np)
    arrays = inputs_bench.eager(fwd_make_inputs)(case, np.random.default_rng(2), np)
    assert isinstance(lazy["x"], NormalDraw) and isinstance(arrays["x"], np.ndarray)
    assert np.array_equal(arrays["x"], lazy["x"].values(np)) and np.array_equal(arrays["w"], lazy["w"])


@without_gpu
def test_no_gpu_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="needs a usable CUDA device"):
        inputs_bench.main(["--shapes", "8x8"])


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("backward", [False, True])
def test_small_run_stores_the_same_bits(backward: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--shapes", "300x1000,7x4099", "--repeats", "2", "--out", str(tmp_path / "r.json")]
    assert inputs_bench.main(argv + (["--backward"] if backward else [])) == 0
    out = capsys.readouterr().out
    assert out.count("same bits: True") == 6 and "same bits in every case: True" in out
