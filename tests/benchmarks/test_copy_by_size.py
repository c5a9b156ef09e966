"""benchmarks/copy_by_size.py: sizes, the table and clear errors on the CPU; a small run on a GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import copy_by_size as cbs  # noqa: E402

from tests.marks import needs_gpu, without_gpu  # noqa: E402


@pytest.mark.parametrize("text,nbytes", [("4096", 4096), ("512M", 512 << 20), ("1G", 1 << 30),
                                         ("1.5g", 3 << 29), ("8GiB", 8 << 30), (" 2K ", 2048)])
def test_parse_size(text: str, nbytes: int) -> None:
    assert cbs.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["lots", "1T", "-1G", "0", "", "4097"])
def test_bad_sizes_are_clear_errors(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        cbs.parse_size(text)


@pytest.mark.parametrize("nbytes,piece", [(4097, 0), (0, 0), (1 << 20, 6)])
def test_copy_timing_refuses_partial_words_before_any_gpu_work(nbytes: int, piece: int) -> None:
    with pytest.raises(ValueError, match="multiples of 4 bytes"):
        cbs.rmsnorm_peers.copy_timing(nbytes, piece)


def test_format_size() -> None:
    assert [cbs.format_size(n) for n in (512, 2048, 3 << 29, 8 << 30)] == ["512 B", "2 KiB", "1.5 GiB", "8 GiB"]


def test_table_compares_every_size_with_the_ceilings_size() -> None:
    rows = [{"bytes": 1 << 30, "copy_tbs": 4.0, "copy_spread": 0.01, "piece": 1 << 30},
            {"bytes": 2 << 30, "copy_tbs": 4.2, "copy_spread": 0.002, "piece": 1 << 30, "pieces_tbs": 4.1},
            {"bytes": 8 << 30, "copy_tbs": 3.78, "copy_spread": 0.004, "piece": 1 << 30, "pieces_tbs": 4.158}]
    lines = cbs.table_lines(rows, 2 << 30)
    assert "ceiling size" in lines[0] and len(lines) == 2 + len(rows)
    assert lines[2].startswith("| 1 GiB | 4.000 (1.0%) | - | 0.952 | - |")
    assert lines[4] == "| 8 GiB | 3.780 (0.4%) | 4.158 (1 GiB) | 0.900 | 0.990 |"
    assert "ceiling size" not in cbs.table_lines(rows, 4 << 30)[0]  # the reference was not timed: no ratios


def test_bad_arguments_are_refused_before_any_gpu_work(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cbs.main(["--sizes", "1G,lots"])
    assert e.value.code == 2 and "size 'lots'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cbs.main(["--sizes", ","])
    assert "at least one size" in capsys.readouterr().err


@without_gpu
def test_no_gpu_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="needs"):
        cbs.main(["--sizes", "1M"])


@pytest.mark.gpu
@needs_gpu
def test_small_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "c.json"
    assert cbs.main(["--sizes", "64M,128M", "--piece", "32M", "--reference", "64M", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["bytes"] for r in data["rows"]] == [64 << 20, 128 << 20]
    assert all(r["copy_tbs"] > 0.1 and r["pieces_tbs"] > 0.1 for r in data["rows"])
    assert "one copy / ceiling size" in capsys.readouterr().out
