"""benchmarks/normal_bench.py: shapes and errors on the CPU; on a GPU, the current generator
draws exactly the first form's values (the oracle) on shapes that exercise its row stepping."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import normal_bench  # noqa: E402

from tests.marks import needs_gpu, without_gpu  # noqa: E402


def test_parse_shapes() -> None:
    assert normal_bench.parse_shapes("32768x1024, 7,3X5x2") == [(32768, 1024), (7,), (3, 5, 2)]
    with pytest.raises(SystemExit, match="give shapes like"):
        normal_bench.parse_shapes("big")
    with pytest.raises(SystemExit, match="1 or more"):
        normal_bench.parse_shapes("4x0")


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(SystemExit, match="--repeats must be 1 or more"):
        normal_bench.main(["--repeats", "0"])
    with pytest.raises(SystemExit, match=r"unknown dtype\(s\) \['int8'\]"):
        normal_bench.main(["--store", "bfloat16,int8"])


@without_gpu
def test_no_gpu_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="needs a usable CUDA device"):
        normal_bench.main(["--shapes", "1000"])


def test_first_form_compiles_with_nvcc(tmp_path: Path) -> None:
    src = tmp_path / "first.cu"
    src.write_text(normal_bench.FIRST_FORM)
    subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-o", str(tmp_path / "first.cubin"), str(src)],
                   check=True, capture_output=True, timeout=300)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("shape", [(1000, 1001), (7,), (5, 1), (3, 2), (1, 9), (3000, 3001), (513, 16384)])
@pytest.mark.parametrize("per_row", [True, False])
def test_current_generator_draws_the_first_forms_bits(shape: tuple[int, ...], per_row: bool) -> None:
    import cupy as cp

    # (3000, 3001) and (513, 16384): more pairs than the grid has threads, odd and even rows,
    # so every thread steps its row and column several times across row ends.
    for seed in (0, 5, 2**63 + 11):
        assert normal_bench.same_values(cp, seed, shape, per_row=per_row), (shape, seed)


@pytest.mark.gpu
@needs_gpu
def test_small_run_prints_same_bits(capsys: pytest.CaptureFixture[str]) -> None:
    assert normal_bench.main(["--shapes", "1000x1001,77", "--repeats", "2", "--store", "bfloat16,float16"]) == 0
    out = capsys.readouterr().out
    assert out.count("same bits: True") == 6 and "same bits: False" not in out
