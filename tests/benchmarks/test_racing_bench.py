"""racing_bench's comparison of a full and a raced pass (pure; no GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import racing_bench  # noqa: E402

from evo.types import Evaluation, Status  # noqa: E402


def _row(gid: str, fitness: float, timing_s: float, **cases: tuple[float, bool]) -> dict:
    return {"genome": gid, "status": "ok", "fitness": fitness, "timing_s": timing_s,
            "cases": {k: {"time_ms": t, "raced": r} for k, (t, r) in cases.items()}}


def test_compare_separates_raced_from_fully_timed_cases() -> None:
    full = [_row("a", 1.0, 4.0, c1=(1.0, False), c2=(10.0, False)),
            _row("b", 0.5, 4.0, c1=(2.0, False), c2=(5.0, False))]
    raced = [_row("a", 1.01, 3.0, c1=(1.01, False), c2=(10.2, True)),
             _row("b", 0.49, 2.0, c1=(1.98, True), c2=(5.05, False))]
    s = racing_bench.compare(full, raced)
    assert s["timing_s"] == {"full": 8.0, "raced": 5.0} and s["timing_ratio"] == pytest.approx(5.0 / 8.0)
    assert s["cases"] == 4 and s["raced_cases"] == 2
    assert s["raced_time_ratio"]["n"] == 2 and s["raced_time_ratio"]["min"] == pytest.approx(0.99)
    assert s["raced_time_ratio"]["max"] == pytest.approx(1.02)
    assert s["full_time_ratio"]["median"] == pytest.approx((1.01 + 1.01) / 2)
    assert s["fitness_ratio"]["min"] == pytest.approx(0.98) and s["fitness_ratio"]["max"] == pytest.approx(1.01)
    assert s["champions_kept"] == 2 and s["champion_cases"] == 2  # a holds c1, b holds c2 in both passes
    assert "raced cases: 2 of 4" in racing_bench.render(s, {"full": 10.0, "raced": 7.0})


def test_per_case_best_and_rows_of_failed_evaluations() -> None:
    rows = [_row("a", 1.0, 1.0, c1=(3.0, False)), _row("b", 1.0, 1.0, c1=(2.0, False), c2=(float("nan"), False))]
    assert racing_bench.per_case_best(rows) == {"c1": 2.0}
    failed = racing_bench.row_of("x", Evaluation(Status.INCORRECT, stage_times={"timing": 0.5}))
    assert failed["status"] == "incorrect" and failed["cases"] == {} and failed["timing_s"] == 0.5
    s = racing_bench.compare([failed], [failed])
    assert s["raced_cases"] == 0 and s["fitness_ratio"]["n"] == 0 and s["timing_ratio"] == 1.0
