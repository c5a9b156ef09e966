"""The CLI on a real LMDB archive: show, lineage, export, report; text and --json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from archive import Archive
from evo.cli import main
from evo.types import DeviceInfo
from tests.archive.helpers import make_problem, make_record

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def arch(tmp_path: Path) -> tuple[Path, list[str]]:
    path = tmp_path / "run-archive-with-a-rather-long-directory-name-to-test-wrapping" / "arch"
    seed = make_record(1, fitness=1.0)
    a = make_record(2, parents=(seed.id,), operator="param_mutation", fitness=2.0, registers=100)
    b = make_record(3, parents=(a.id,), operator="llm_rewrite_with_a_long_operator_name", fitness=3.5,
                    registers=200, variant="b")
    with Archive(make_problem(), path, device=DeviceInfo("NVIDIA H100 80GB HBM3", "9.0")) as ar:
        ar.add_many([seed, a, b, make_record(4, status=__import__("evo").Status.TIMEOUT)])
    return path, [seed.id, a.id, b.id]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _narrow(text: str) -> None:
    assert all(len(line) <= 80 for line in text.splitlines()), max(text.splitlines(), key=len)


def test_show(arch: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    path, ids = arch
    rc, out, _ = _run(capsys, "show", str(path))
    assert rc == 0
    _narrow(out)
    assert "ok 3, timeout 1" in out and "3/16 cells" in out and ids[2] in out and "variant=b" in out
    assert "NVIDIA H100" in out
    rc, out, _ = _run(capsys, "show", str(path), "--json")
    data = json.loads(out)
    assert data["counts"]["ok"] == 3 and data["best"]["id"] == ids[2] and data["best"]["fitness"] == 3.5


def test_lineage(arch: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    path, ids = arch
    rc, out, _ = _run(capsys, "lineage", str(path), ids[2][:8])
    assert rc == 0
    _narrow(out)
    lines = out.splitlines()
    assert len(lines) == 4 and ids[0][:16] in lines[1] and "param_mutation" in lines[2] and "3.5" in lines[3]
    rc, out, _ = _run(capsys, "lineage", str(path), ids[2], "--json")
    data = json.loads(out)
    assert [s["id"] for s in data["path"]] == ids and data["path"][1]["operator"] == "param_mutation"
    rc, _, err = _run(capsys, "lineage", str(path), "zzzz")
    assert rc == 2 and "no record id starts with" in err and "Traceback" not in err


def test_export(arch: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path, ids = arch
    rc, out, _ = _run(capsys, "export", str(path), "-o", str(tmp_path / "x"))
    assert rc == 0
    src = (tmp_path / "x" / "kernel.cu").read_text()
    meta = json.loads((tmp_path / "x" / "params.json").read_text())
    assert "3.0f" in src and meta["id"] == ids[2] and meta["fitness"] == 3.5
    assert meta["params"] == {"threads": 256, "variant": "b"} and "N=1:float32" in meta["cases"]
    rc, out, _ = _run(capsys, "export", str(path), "-o", str(tmp_path / "y"), "--json")
    assert json.loads(out)["id"] == ids[2]


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f.txt").write_text("x")
    for argv in (["show", str(tmp_path / "f.txt")], ["show", str(tmp_path / "nope")],
                 ["export", str(tmp_path / "nope")]):
        rc, out, err = _run(capsys, *argv)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and err.startswith("evo: error:")


def test_export_empty_archive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Archive(make_problem(), tmp_path / "a").close()
    rc, _, err = _run(capsys, "export", str(tmp_path / "a"))
    assert rc == 2 and "no OK record" in err


def test_report_dispatch(arch: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path, _ = arch
    try:
        import evo.report  # noqa: F401
    except ImportError:
        rc, _, err = _run(capsys, "report", str(path), "-o", str(tmp_path / "r"))
        assert rc == 2 and "reports are not available" in err
    else:
        rc, out, _ = _run(capsys, "report", str(path), "-o", str(tmp_path / "r"))
        assert rc == 0 and "report written" in out


def test_python_dash_m(arch: tuple[Path, list[str]]) -> None:
    path, ids = arch
    p = subprocess.run([sys.executable, "-m", "evo", "show", str(path), "--json"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["best"]["id"] == ids[2]
