"""evo.report.write_report on a real archive made by the engine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from evo.engine import Budget, Engine, EngineConfig
from evo.report import best_curve, write_report
from evo.types import Evaluation, Genome, Record, Status
from tests.evo.cpu_problem import ParamsExecutor, make_problem


@pytest.fixture(scope="module")
def run_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "run"
    ex = ParamsExecutor(fail=lambda p: p["THREADS"] == 64)
    with Engine(make_problem(), str(path), evaluator=ex, config=EngineConfig(islands=2), seed=2) as eng:
        eng.run(Budget(evaluations=25), progress=False)
    return path


def test_report_markdown(run_archive: Path, tmp_path: Path) -> None:
    from archive import Archive

    out = write_report(run_archive, tmp_path / "rep")
    assert out == tmp_path / "rep" / "report.md"
    text = out.read_text()
    a = Archive.open_readonly(str(run_archive))
    try:
        best = a.best()
        counts = a.counts()
        path = a.lineage().path_to(best.id)
    finally:
        a.close()
    assert "# Run report: cpu_axpy" in text
    assert f"| ok | {counts['ok']} |" in text
    assert "| **total** | 25 |" in text
    assert best.id in text and "Lineage of the best" in text
    for gid in path:  # every step of the lineage is listed
        assert f"`{gid[:12]}`" in text
    assert "rows: registers, columns: VEC" in text  # text heatmap over the first two axes
    assert "No per-case metrics" in text
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "rep" / "progress.png").stat().st_size > 1000
        assert (tmp_path / "rep" / "heatmap.png").stat().st_size > 1000
        assert "![archive heatmap](heatmap.png)" in text
    else:
        assert not (tmp_path / "rep" / "heatmap.png").exists()


def test_report_per_case_table(tmp_path: Path) -> None:
    from archive import Archive

    problem = make_problem()
    a = Archive(problem, str(tmp_path / "a"))
    g = Genome("extern \"C\" __global__ void axpy() {}", {"UNROLL": 1, "VEC": 2, "THREADS": 128}, entry="axpy")
    cases = {"N=1000:float32": {"time_ms": 0.0123, "gbps": 2900.5, "fraction": 0.87}}
    a.add(Record(g, Evaluation(Status.OK, fitness=0.87, metrics={"cases": cases, "fraction": 0.87},
                               resources={"registers": 20})))
    a.close()
    text = write_report(tmp_path / "a", tmp_path / "rep").read_text()
    assert "| N=1000:float32 | 0.0123 | 2900.5 | 87.0% |" in text


def test_best_curve_is_monotone() -> None:
    class R:
        def __init__(self, f: float | None) -> None:
            self.fitness = f
            self.evaluation = Evaluation(Status.OK, fitness=f) if f is not None else Evaluation(Status.TIMEOUT)

    curve = best_curve([R(None), R(1.0), R(0.5), R(2.0)])
    assert curve == [(1, None), (2, 1.0), (3, 1.0), (4, 2.0)]


def test_report_on_a_non_archive_is_a_clear_error(tmp_path: Path) -> None:
    from archive import ArchiveError

    (tmp_path / "junk").write_text("not an archive")
    with pytest.raises(ArchiveError):
        write_report(tmp_path / "junk", tmp_path / "rep")
