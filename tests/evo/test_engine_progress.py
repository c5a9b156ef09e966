"""Progress display and the periodic log line."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from evo._progress import Progress, format_snapshot
from evo.engine import Budget, Engine, EngineConfig
from tests.evo.cpu_problem import ParamsExecutor, make_problem

SNAP = {"evaluations": 12, "best": 3.14159, "coverage": 0.25, "rate": 40.0, "gpu_busy": 0.8, "cost": 0.0123,
        "in_flight": 4, "duplicates": 2}


def test_format_snapshot() -> None:
    line = format_snapshot(SNAP)
    assert line == "evals 12 | best 3.142 | cov 25.0% | 40.0/min | gpu 80% | $0.0123 | in flight 4 | dup 2"
    assert "gpu" not in format_snapshot({**SNAP, "gpu_busy": None})


def test_plain_lines_are_throttled_and_disabled_is_silent() -> None:
    buf = io.StringIO()
    p = Progress(True, interval=60.0, stream=buf, use_rich=False)
    assert not p.uses_rich
    p.update(SNAP, force=True)
    p.update(SNAP)  # within the interval: no new line
    p.close()
    assert buf.getvalue().count("\n") == 1 and "evals 12" in buf.getvalue()
    quiet = io.StringIO()
    q = Progress(False, stream=quiet)
    q.update(SNAP, force=True)
    q.close()
    assert quiet.getvalue() == ""


def test_rich_live_display() -> None:
    pytest.importorskip("rich")
    buf = io.StringIO()
    p = Progress(True, stream=buf, use_rich=True)
    assert p.uses_rich
    p.update(SNAP, force=True)
    p.close()
    assert not p.uses_rich


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_redirected_output_gets_plain_lines_and_a_terminal_gets_rich() -> None:
    # a file or pipe (a job log) would otherwise see nothing of a transient live display
    buf = io.StringIO()
    p = Progress(True, interval=0.0, stream=buf)
    assert not p.uses_rich
    p.update(SNAP, force=True)
    p.close()
    assert "evals 12" in buf.getvalue()
    pytest.importorskip("rich")
    t = Progress(True, stream=_Tty())
    assert t.uses_rich
    t.close()


def test_run_logs_progress(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="evo.engine")
    with Engine(make_problem(), str(tmp_path / "a"), evaluator=ParamsExecutor(),
                config=EngineConfig(islands=1, progress_interval=0.0)) as eng:
        eng.run(Budget(evaluations=4), progress=False)
    msgs = [r.getMessage() for r in caplog.records if r.name == "evo.engine"]
    assert any(m.startswith("evals 4 | best") for m in msgs)
    assert any("run stopped (evaluations budget 4 reached)" in m for m in msgs)
    assert eng.last_run is not None and eng.last_run["evaluations"] == 4
    assert eng.last_run["stop"] == "evaluations budget 4 reached" and eng.last_run["seconds"] > 0
    assert eng.last_run["best"] is not None and eng.last_run["rate_per_min"] > 0
