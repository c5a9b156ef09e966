"""evo.report.write_report on a real archive made by the engine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from evo.engine import Budget, Engine, EngineConfig
from evo.report import best_curve, case_champions, operator_summary, stage_time_summary, write_report
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


def test_report_per_case_champions_say_where_each_came_from(tmp_path: Path) -> None:
    from archive import Archive

    a = Archive(make_problem(), str(tmp_path / "a"))
    seed = Genome("extern \"C\" __global__ void axpy() {}", {"UNROLL": 1, "VEC": 2, "THREADS": 128}, entry="axpy")
    child = seed.with_params(UNROLL=2)
    grandchild = child.with_params(VEC=4)

    def rec(g: Genome, times: dict[str, float], op: str, parents: tuple[str, ...] = ()) -> Record:
        cases = {k: {"time_ms": t, "fraction": 0.01 / t} for k, t in times.items()}
        ev = Evaluation(Status.OK, fitness=0.5, metrics={"cases": cases}, resources={"registers": 32})
        return Record(g, ev, parents=parents, operator=op)

    a.add(rec(seed, {"N=1000:float32": 0.02, "N=4096:float32": 0.01}, "seed"))
    a.add(rec(child, {"N=1000:float32": 0.03, "N=4096:float32": 0.03}, "param_mutation", (seed.id,)))
    a.add(Record(Genome(seed.source + " ", {"UNROLL": 4, "VEC": 1, "THREADS": 64}, entry="axpy"),
                 Evaluation.failure(Status.COMPILE_ERROR, "error"), operator="param_mutation"))
    a.add(rec(grandchild, {"N=1000:float32": 0.005, "N=4096:float32": 0.02}, "param_crossover", (child.id,)))
    a.close()
    text = write_report(tmp_path / "a", tmp_path / "rep").read_text()
    assert "## Per-case champions" in text
    assert "1 of 2 found by the search (param_crossover 1), 1 by seeds" in text
    # N=1000: the grandchild, 4th evaluation, two steps from the seed, 4x the seed's time
    assert f"| N=1000:float32 | 0.005 | 200.0% | `{grandchild.id[:12]}` | param_crossover | 4 | 2 | 4.000x |" in text
    assert f"| N=4096:float32 | 0.01 | 100.0% | `{seed.id[:12]}` | seed | 1 | 0 | 1.000x |" in text
    # every champion genome once, with its params
    assert f"| `{grandchild.id[:12]}` | 1 | UNROLL=2, VEC=4, THREADS=128 |" in text
    assert f"| `{seed.id[:12]}` | 1 | UNROLL=1, VEC=2, THREADS=128 |" in text
    # what each operator gave: the child was slower than its seed, the grandchild faster than
    # the child (geomean over both cases) and the fastest so far on N=1000; the failure is counted
    assert "| param_mutation | 2 | 1 | 0 of 1 | 0 | 0 |" in text
    assert "| param_crossover | 1 | 1 | 1 of 1 | 1 | 1 |" in text
    assert "| seed | 1 | 1 | - | 0 | 0 |" in text


def test_report_says_where_warm_started_champions_were_first_found(tmp_path: Path) -> None:
    """Champions re-evaluated from a warm start are credited to the operator that first made
    them in the earlier run (carried by the engine as ``found_by``), or said to be of unrecorded
    origin when an older archive did not record it."""
    from archive import Archive

    a = Archive(make_problem(), str(tmp_path / "a"))
    base = Genome("extern \"C\" __global__ void axpy() {}", {"UNROLL": 1, "VEC": 1, "THREADS": 128}, entry="axpy")
    keys = [f"N={n}:float32" for n in (1000, 2000, 3000, 4000, 5000)]

    def rec(g: Genome, win: str, op: str, origin: dict | None = None) -> Record:
        cases = {k: {"time_ms": 0.01 if k == win else 1.0} for k in keys}
        ev = Evaluation(Status.OK, fitness=0.5, metrics={"cases": cases}, resources={"registers": 32})
        return Record(g, ev, operator=op, meta={"warm_start": origin} if origin is not None else {})

    crossed = base.with_params(UNROLL=2)
    a.add(rec(crossed, keys[0], "warm_start", {"source_id": "x", "found_by": "param_crossover"}))
    mutated = base.with_params(UNROLL=4)
    a.add(rec(mutated, keys[1], "warm_start", {"source_id": "y", "found_by": "param_mutation"}))
    a.add(rec(base.with_params(VEC=2), keys[2], "warm_start", {"source_id": "z", "found_by": "seed"}))
    a.add(rec(base.with_params(VEC=4), keys[3], "warm_start", {"source_id": "w"}))  # older archive
    a.add(rec(base, keys[4], "seed"))
    a.close()
    text = write_report(tmp_path / "a", tmp_path / "rep").read_text()
    assert ("0 of 5 found by the search, 4 re-evaluated from a warm start (2 first found by an earlier run's "
            "search (param_crossover 1, param_mutation 1); 1 seeds there; 1 of unrecorded origin (an older "
            "archive)), 1 by seeds.") in text
    assert f"| {keys[0]} | 0.01 | - | `{crossed.id[:12]}` | warm_start (param_crossover) |" in text
    (c,) = [c for c in case_champions([rec(mutated, keys[1], "warm_start", {"found_by": "param_mutation"})])
            if c["case"] == keys[1]]
    assert c["found_by"] == "param_mutation" and c["seed"] and not c["rebased"]


def test_report_says_which_warm_started_champions_took_the_current_kernel_text(tmp_path: Path) -> None:
    """A champion the engine rebased on the family's current text (meta.warm_start.rebased) says so."""
    from archive import Archive

    a = Archive(make_problem(), str(tmp_path / "a"))
    g = Genome("extern \"C\" __global__ void axpy() {}", {"UNROLL": 1, "VEC": 1, "THREADS": 128}, entry="axpy")
    cases = {"N=1000:float32": {"time_ms": 0.5}}
    ev = Evaluation(Status.OK, fitness=0.5, metrics={"cases": cases}, resources={"registers": 32})
    a.add(Record(g, ev, operator="warm_start",
                 meta={"warm_start": {"source_id": "x", "found_by": "param_mutation", "rebased": {"filled": {}}}}))
    a.close()
    text = write_report(tmp_path / "a", tmp_path / "rep").read_text()
    assert "| warm_start (param_mutation, on the current kernel text) |" in text
    (c,) = case_champions([Record(g, ev, operator="warm_start", meta={"warm_start": {"rebased": {"filled": {}}}})])
    assert c["rebased"] and c["found_by"] is None


def test_case_champions_without_seeds_or_lineage() -> None:
    g = Genome("k", {"A": 1})
    ev = Evaluation(Status.OK, fitness=1.0, metrics={"cases": {"c": {"time_ms": 2.0}}})
    r = Record(g, ev, operator="llm_rewrite")
    (c,) = case_champions([r])
    assert c["case"] == "c" and c["time_ms"] == 2.0 and c["id"] == g.id and not c["seed"]
    assert c["seed_ms"] is None and c["speedup"] is None and c["steps"] is None and c["fraction"] is None
    assert c["evaluation"] is None  # never stored, so no insertion order
    assert c["params"] == {"A": 1}
    assert case_champions([]) == []


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


def _timed(status: Status, **times: float) -> Record:
    g = Genome("k", {"A": len(times), "T": sum(times.values())})
    ev = (Evaluation(Status.OK, fitness=1.0, stage_times=times) if status is Status.OK
          else Evaluation(status, stage_times=times))
    return Record(g, ev, operator="param_mutation")


def test_stage_time_summary_sums_and_quantiles() -> None:
    recs = [_timed(Status.OK, compile=1.0, correctness=0.5, timing=2.0),
            _timed(Status.OK, compile=3.0, correctness=0.5, timing=4.0),
            _timed(Status.COMPILE_ERROR, compile=2.0),
            Record(Genome("k", {"A": 9}), Evaluation(Status.OK, fitness=1.0), operator="import"),  # no times
            _timed(Status.INCORRECT, compile=1.0, correctness=float("nan"), timing=-1.0)]  # bad values ignored
    s = stage_time_summary(recs)
    assert s["evaluations"] == 4 and s["untimed"] == 1
    assert s["total_s"] == 3.5 + 7.5 + 2.0 + 1.0
    assert [st["stage"] for st in s["stages"]] == ["compile", "correctness", "timing"]
    comp, corr, timing = s["stages"]
    assert comp["evaluations"] == 4 and comp["total_s"] == 7.0 and comp["median_s"] == 1.5
    assert comp["p90_s"] == 2.0 + 0.7 * 1.0  # sorted 1, 1, 2, 3: rank 2.7
    assert corr["evaluations"] == 2 and timing["total_s"] == 6.0
    assert abs(sum(st["share"] for st in s["stages"]) - 1.0) < 1e-12
    assert s["per_evaluation"]["median_s"] == (2.0 + 3.5) / 2  # per-record sums 1, 2, 3.5, 7.5
    assert s["by_status"] == {"ok": {"evaluations": 2, "total_s": 11.0},
                              "compile_error": {"evaluations": 1, "total_s": 2.0},
                              "incorrect": {"evaluations": 1, "total_s": 1.0}}
    empty = stage_time_summary([])
    assert empty["stages"] == [] and empty["per_evaluation"]["median_s"] is None
    assert s["racing"] is None and empty["racing"] is None  # no record reports a racing decision


def test_stage_time_summary_counts_raced_cases() -> None:
    def rec(*flags: bool) -> Record:
        cases = {f"N={i}:float32": {"time_ms": 1.0, "raced": f} for i, f in enumerate(flags)}
        return Record(Genome("k", {"A": len(flags), "B": sum(flags)}),
                      Evaluation(Status.OK, fitness=1.0, metrics={"cases": cases}, stage_times={"timing": 1.0}))

    s = stage_time_summary([rec(True, False, True), rec(False, False), rec(True), _timed(Status.OK, timing=1.0)])
    assert s["racing"] == {"cases": 6, "raced": 3, "evaluations": 2}


def test_stage_time_summary_sums_the_timing_phases_and_ranks_the_cases() -> None:
    def rec(**cases: dict[str, float]) -> Record:
        metrics = {"cases": {k: {"time_ms": 1.0, "phases_s": v} for k, v in cases.items()}}
        return Record(Genome("k", {"A": len(cases), "B": sum(sum(v.values()) for v in cases.values())}),
                      Evaluation(Status.OK, fitness=1.0, metrics=metrics, stage_times={"timing": 1.0}))

    recs = [rec(big={"inputs": 2.0, "timed": 1.0, "reference": 1.0}, small={"inputs": 0.5, "timed": 0.5}),
            rec(big={"inputs": 4.0, "timed": 1.0, "reference": float("nan")}),  # a bad value is ignored
            rec(small={"inputs": 0.5, "warmup": -1.0}),
            _timed(Status.OK, timing=1.0)]  # no cases: counts for no phase
    s = stage_time_summary(recs)
    by = {p["phase"]: p for p in s["phases"]}
    assert [p["phase"] for p in s["phases"]] == ["inputs", "timed", "reference"]  # first appearance
    assert by["inputs"] == {"phase": "inputs", "evaluations": 3, "total_s": 7.0, "per_evaluation_s": 7.0 / 3,
                            "share": 7.0 / 10.5}
    assert by["timed"]["evaluations"] == 2 and by["timed"]["total_s"] == 2.5
    assert by["reference"]["evaluations"] == 1 and by["reference"]["per_evaluation_s"] == 1.0
    assert abs(sum(p["share"] for p in s["phases"]) - 1.0) < 1e-12
    assert s["costliest_cases"] == [{"case": "big", "evaluations": 2, "total_s": 9.0, "per_evaluation_s": 4.5},
                                    {"case": "small", "evaluations": 2, "total_s": 1.5, "per_evaluation_s": 0.75}]
    many = stage_time_summary([rec(**{f"c{i}": {"timed": float(i)} for i in range(9)})])["costliest_cases"]
    assert [c["case"] for c in many] == ["c8", "c7", "c6", "c5", "c4"]  # longest first, five at most
    assert stage_time_summary([_timed(Status.OK, timing=1.0)])["phases"] == []


def test_stage_time_summary_keeps_the_parts_of_a_phase_apart() -> None:
    def rec(ph: dict[str, float]) -> Record:
        return Record(Genome("k", {"A": len(ph), "B": int(sum(ph.values()))}),
                      Evaluation(Status.OK, fitness=1.0, metrics={"cases": {"c": {"time_ms": 1.0, "phases_s": ph}}},
                                 stage_times={"timing": 1.0}))

    s = stage_time_summary([rec({"inputs": 2.0, "inputs/draw": 1.5, "inputs/store": 0.25, "timed": 2.0}),
                            rec({"inputs": 2.0, "inputs/draw": 0.5, "timed": 4.0, "warmup/odd": 1.0})])
    assert [p["phase"] for p in s["phases"]] == ["inputs", "timed"]  # the parts are not phases of their own
    assert sum(p["total_s"] for p in s["phases"]) == 10.0 and s["phases"][0]["share"] == 0.4
    parts = {p["phase"]: p for p in s["phase_parts"]}
    assert parts["inputs/draw"] == {"phase": "inputs/draw", "evaluations": 2, "total_s": 2.0,
                                    "per_evaluation_s": 1.0, "share": 0.5}  # of the inputs phase's 4 s
    assert parts["inputs/store"]["evaluations"] == 1 and parts["inputs/store"]["share"] == 0.25 / 4.0
    assert parts["warmup/odd"]["share"] is None  # a part whose phase was not recorded
    assert s["costliest_cases"] == [{"case": "c", "evaluations": 2, "total_s": 10.0, "per_evaluation_s": 5.0}]
    assert stage_time_summary([_timed(Status.OK, timing=1.0)])["phase_parts"] == []


def test_report_says_where_the_time_went(tmp_path: Path) -> None:
    from archive import Archive

    a = Archive(make_problem(), str(tmp_path / "a"))
    g = Genome("extern \"C\" __global__ void axpy() {}", {"UNROLL": 1, "VEC": 2, "THREADS": 128}, entry="axpy")
    a.add(Record(g, Evaluation(Status.OK, fitness=0.5,
                               metrics={"cases": {"N=1000:float32": {"time_ms": 0.01, "raced": True,
                                                                     "phases_s": {"inputs": 0.25, "timed": 0.5,
                                                                                  "inputs/draw": 0.125}}}},
                               resources={"registers": 32}, stage_times={"compile": 1.25, "timing": 0.75}),
                 operator="seed"))
    a.add(Record(g.with_params(UNROLL=2), Evaluation(Status.COMPILE_ERROR, stage_times={"compile": 2.0}),
                 operator="param_mutation"))
    a.close()
    text = write_report(tmp_path / "a", tmp_path / "rep").read_text()
    assert "## Where the evaluation time went" in text
    assert "2 evaluations with stage times, 4.0 s in all" in text
    assert "| compile | 2 | 3.25 | 81.2% | 1.625 | 1.925 |" in text
    assert "| timing | 1 | 0.75 | 18.8% | 0.750 | 0.750 |" in text
    assert "| compile_error | 1 | 2.00 |" in text and "| ok | 1 | 2.00 |" in text
    assert "Racing: 1 of 1 timed cases (in 1 evaluations) stopped" in text
    assert "| inputs | 1 | 0.25 | 0.250 | 33.3% |" in text and "| timed | 1 | 0.50 | 0.500 | 66.7% |" in text
    assert "| inputs/draw | 1 | 0.12 | 0.125 | 50.0% |" in text  # a part: a share of its phase, not of all
    assert "Costliest cases (all phases): N=1000:float32 0.750 s per evaluation (1)." in text


def test_report_without_stage_times(run_archive: Path, tmp_path: Path) -> None:
    """The CPU test executor records no stage times: the section says so instead of a table."""
    text = write_report(run_archive, tmp_path / "rep").read_text()
    assert "## Where the evaluation time went\n\nNo stage times recorded." in text


def test_operator_summary_replays_in_evaluation_order() -> None:
    base = Genome("extern \"C\" __global__ void axpy() {}", {"UNROLL": 1, "VEC": 1, "THREADS": 128}, entry="axpy")

    def rec(g: Genome, t: dict[str, float], op: str, seq: int, parents: tuple[str, ...] = ()) -> Record:
        ev = Evaluation(Status.OK, fitness=1.0, metrics={"cases": {k: {"time_ms": v} for k, v in t.items()}})
        return Record(g, ev, parents=parents, operator=op, seq=seq)

    a, b, c = base, base.with_params(VEC=2), base.with_params(VEC=4)
    recs = [rec(c, {"x": 0.5, "y": 0.5}, "screened_param_mutation", 2, (b.id,)),  # given out of order
            rec(a, {"x": 1.0}, "seed", 0), rec(b, {"x": 2.0, "y": 1.0}, "param_mutation", 1, (a.id,))]
    got = {o["operator"]: o for o in operator_summary(recs)}
    # b: slower than a on x, and y's first time is no new best; c: beats b on both cases, a on x
    assert got["param_mutation"] | {} == {"operator": "param_mutation", "evaluations": 1, "ok": 1, "children": 1,
                                         "faster": 0, "new_best": 0, "cases_taken": 0}
    assert (got["screened_param_mutation"]["faster"], got["screened_param_mutation"]["cases_taken"]) == (1, 2)
    assert operator_summary([]) == []
