"""The peer benchmark's output holding: each input set's latest output stays alive (no GPU needed)."""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import rmsnorm_peers  # noqa: E402


class _Out:
    """Stands for a provider's freshly allocated output tensor."""

    def __init__(self, tag: str) -> None:
        self.tag = tag


def test_holding_keeps_each_sets_latest_output_until_its_next_call() -> None:
    made: list[weakref.ref[_Out]] = []

    def make_call(x: str, w: str) -> object:
        def call() -> _Out:
            out = _Out(f"{x}{len(made)}")
            made.append(weakref.ref(out))
            return out
        return call

    calls = [rmsnorm_peers.holding(make_call)(x, "w") for x in ("a", "b")]
    first_a = calls[0]()
    assert first_a.tag == "a0"  # the provider's result passes through
    del first_a
    calls[1]()
    gc.collect()
    assert made[0]() is not None and made[1]() is not None  # both sets' outputs are alive
    calls[0]()
    gc.collect()
    assert made[0]() is None  # set a's previous output is released by set a's next call ...
    assert made[1]() is not None and made[2]() is not None  # ... and only that one


def test_holding_passes_make_call_errors_through() -> None:
    def missing(*_args: object) -> object:
        raise ModuleNotFoundError("quack")

    with pytest.raises(ModuleNotFoundError, match="quack"):  # shown as FAILED, never dropped
        rmsnorm_peers.holding(missing)(1, 2)


def test_skip_leaves_providers_out_and_names_them() -> None:
    provs = {"evo (ours)": 1, "torch": 2, "quack": 3, "quack tuned": 4}
    kept, skipped = rmsnorm_peers.skip_providers(provs, " quack tuned,torch ")
    assert list(kept) == ["evo (ours)", "quack"] and skipped == ["quack tuned", "torch"]
    assert rmsnorm_peers.skip_providers(provs, "") == (provs, [])


def test_skip_with_an_unknown_name_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="no provider named 'quack-tuned'.*'quack tuned'"):
        rmsnorm_peers.skip_providers({"quack tuned": 1}, "quack-tuned")


def _failed_to_load(exc: BaseException):
    def make(*_a):
        raise exc
    make.load_error = exc
    return make


def test_require_stops_before_timing_when_a_required_peer_did_not_load() -> None:
    provs = {"evo (ours)": lambda *a: None, "torch": lambda *a: None,
             "quack": _failed_to_load(ModuleNotFoundError("No module named 'quack'")),
             "liger": _failed_to_load(ImportError("liger broke"))}
    with pytest.raises(SystemExit, match=r"'quack' did not load \(ModuleNotFoundError: No module named 'quack'\)"):
        rmsnorm_peers.check_required(provs, "quack")
    with pytest.raises(SystemExit, match="'quack' did not load.*'liger' did not load.*nothing was timed"):
        rmsnorm_peers.check_required(provs, "all")
    rmsnorm_peers.check_required(provs, "torch, evo (ours)")  # loaded: no error
    rmsnorm_peers.check_required(provs, "")  # nothing required (the default)
    with pytest.raises(SystemExit, match="--require: no provider named 'QuACK'"):
        rmsnorm_peers.check_required(provs, "QuACK")


def test_a_peer_that_fails_to_import_carries_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """providers() marks a peer whose import failed with ``load_error`` (what --require reads)."""
    pytest.importorskip("torch")
    import importlib

    real = importlib.import_module

    def fake(name: str, *a):
        if name.startswith(("quack", "liger_kernel")):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *a)

    monkeypatch.setattr(importlib, "import_module", fake)
    provs = rmsnorm_peers.providers(None)
    assert isinstance(provs["quack"].load_error, ModuleNotFoundError)
    assert isinstance(provs["liger"].load_error, ModuleNotFoundError)
    assert getattr(provs["torch"], "load_error", None) is None
    with pytest.raises(SystemExit, match="'quack' did not load"):
        rmsnorm_peers.check_required(provs, "quack,torch")


def test_import_dispatch_loads_the_module_at_a_path(tmp_path: Path) -> None:
    mod_path = tmp_path / "some.dispatch.py"
    mod_path.write_text("GENOMES = [{'case': 'M=1,N=8:float32'}]\n\ndef select(shape, dtype):\n    return GENOMES[0]\n")
    mod = rmsnorm_peers.import_dispatch(mod_path)
    assert mod.select({"M": 1, "N": 8}, "float32") == {"case": "M=1,N=8:float32"}


def test_import_dispatch_reads_an_xz_packed_module(tmp_path: Path) -> None:
    import lzma

    text = "GENOMES = [{'case': 'M=2,N=16:bfloat16'}]\n\ndef select(shape, dtype):\n    return GENOMES[0]\n"
    packed = tmp_path / "run.dispatch.py.xz"
    packed.write_bytes(lzma.compress(text.encode()))
    mod = rmsnorm_peers.import_dispatch(packed)
    assert mod.select({"M": 2, "N": 16}, "bfloat16") == {"case": "M=2,N=16:bfloat16"}
    assert mod.__file__ == str(packed)
    with pytest.raises(FileNotFoundError, match="no dispatch module"):
        rmsnorm_peers.import_dispatch(tmp_path / "missing.dispatch.py.xz")


def test_the_kept_run25_module_loads_and_selects_every_case() -> None:
    """The module of the twentieth session's peer table (benchmarks/results) still imports and
    dispatches each of the 33 cases to the genome the table says (no GPU needed to select)."""
    path = Path(rmsnorm_peers.ROOT) / "benchmarks" / "results" / "rmsnorm-run25-h100.dispatch.py.xz"
    mod = rmsnorm_peers.import_dispatch(path)
    assert len(mod.GENOMES) == 33
    for m, n in rmsnorm_peers.SHAPES:
        for dtype in rmsnorm_peers.DTYPES:
            assert mod.select({"M": m, "N": n}, dtype)["case"] == f"M={m},N={n}:{dtype}"


@pytest.mark.gpu
def test_torch_compile_providers_weight_dtypes() -> None:
    """torch.compile gets the weights cast to the input's dtype (as users run it) and, as
    "torch.compile fp32 w", the float32 weights ours reads; both compute the RMSNorm."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    provs = rmsnorm_peers.providers(None)
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.float32)
    xf = x.float()
    ref = xf * torch.rsqrt(xf.pow(2).mean(dim=1, keepdim=True) + rmsnorm_peers.EPS) * w
    for name in ("torch.compile", "torch.compile fp32 w"):
        y = provs[name](x, w)()
        assert y.dtype == torch.bfloat16 and y.shape == x.shape
        err = float((y.float() - ref).norm() / ref.norm())
        assert err < 1e-2, (name, err)
    assert "torch.compile fp32 w" not in rmsnorm_peers.providers_backward(None)


def test_summary_ratios_and_wins() -> None:
    """Each peer's time over ours per N, the fastest peer's, and the count of cases ours wins;
    a failed peer is F (and does not count against ours), a failed case of ours is -."""
    names = ["evo (ours)", "torch", "quack"]
    times = {("bfloat16", 256, "evo (ours)"): 2.0, ("bfloat16", 256, "torch"): 4.0, ("bfloat16", 256, "quack"): 1.0,
             ("bfloat16", 512, "evo (ours)"): 1.0, ("bfloat16", 512, "torch"): 3.0, ("bfloat16", 512, "quack"): None,
             ("float32", 256, "evo (ours)"): None, ("float32", 256, "torch"): 1.0, ("float32", 256, "quack"): 1.0}
    lines = rmsnorm_peers.summary(times, names)
    text = "\n".join(lines)
    assert "| bfloat16 | 256 | 512 |" in text
    assert "| torch | 2.000 | 3.000 |" in text
    assert "| quack | 0.500 | F |" in text
    assert "| **fastest peer** | **0.500** | **3.000** |" in text
    assert "| quack | - |" in text and "| **fastest peer** | **-** |" in text  # float32: ours failed
    assert lines[-1] == "evo (ours) is faster than every peer that ran on 1 of 3 cases."
    assert rmsnorm_peers.summary(times, ["torch", "quack"]) == []  # ours did not run


_TABLE = """# RMSNorm forward peers (2026-12-04)

Machine: NVIDIA H200. Copy ceiling (D2D, same method): 4.230 TB/s.

| case | evo (ours) | torch | quack tuned |
|---|---|---|---|
| 32768x256 bfloat16 | 0.0107 / 3.13 / 74% (±0.2%) | 0.0248 / 1.35 / 32% (±0.2%) | 0.0124 / 2.70 / 64% (±0.2%) |
| 32768x32768 bfloat16 | 1.0719 / 4.01 / 95% (±0.5%) | 1.6734 / 2.57 / 61% (±0.1%) | FAILED CUDADialectError |

Peer's time / evo (ours)'s time (above 1: ours faster; F: the peer failed; -: ours failed).

| bfloat16 | 256 | 32768 |
|---|---|---|
| torch | 2.318 | 1.561 |
"""


def test_parse_table_reads_rows_times_and_failures_and_drops_the_summary() -> None:
    t = rmsnorm_peers.parse_table(_TABLE)
    assert t.names == ["evo (ours)", "torch", "quack tuned"]
    assert len(t.rows) == 2 and t.rows[1].startswith("| 32768x32768 bfloat16 |")
    assert t.times[("bfloat16", 256, "evo (ours)")] == 0.0107
    assert t.times[("bfloat16", 32768, "quack tuned")] is None  # FAILED stays a failure, not a drop
    assert t.done() == {("bfloat16", 256), ("bfloat16", 32768)}
    assert t.head[0].startswith("# RMSNorm forward peers") and "4.230 TB/s" in t.head[2]
    # the summary of the parsed times is the one a whole run writes
    assert "faster than every peer that ran on 2 of 2 cases" in rmsnorm_peers.summary(t.times, t.names)[-1]


def test_parse_table_rejects_text_without_a_table_and_ragged_rows() -> None:
    with pytest.raises(ValueError, match="no peers table"):
        rmsnorm_peers.parse_table("# notes\n\nnothing here\n")
    ragged = _TABLE.replace("| 0.0124 / 2.70 / 64% (±0.2%) |", "|")
    with pytest.raises(ValueError, match="2 cells for 3 providers"):
        rmsnorm_peers.parse_table(ragged)


def test_resume_keeps_earlier_rows_and_times_only_the_missing_cases(tmp_path: Path) -> None:
    out = tmp_path / "peers.md"
    assert rmsnorm_peers.resume_table(out, ["evo (ours)"]) is None  # nothing to resume: a fresh table
    out.write_text(_TABLE)
    names = ["evo (ours)", "torch", "quack tuned"]
    prior = rmsnorm_peers.resume_table(out, names)
    assert prior is not None
    shapes = [(32768, 256), (32768, 32768), (8192, 262144)]
    todo = rmsnorm_peers.pending_cases(["bfloat16", "float32"], shapes, prior)
    assert todo == [("bfloat16", 8192, 262144), ("float32", 32768, 256), ("float32", 32768, 32768),
                    ("float32", 8192, 262144)]
    assert len(rmsnorm_peers.pending_cases(["bfloat16"], shapes, None)) == 3
    lines = rmsnorm_peers.table_start(["# this run's head"], prior, names, 4.204)
    text = "\n".join(lines)
    assert text.startswith("# RMSNorm forward peers") and "4.230 TB/s" in text  # the first run's ceiling kept
    assert "after the first 2 were timed by a later invocation, copy ceiling 4.204 TB/s" in text
    assert lines[-2:] == prior.rows and "Peer's time" not in text  # the old summary is rewritten at the end
    assert "this run's head" not in text  # the earlier file's head stands for both
    fresh = rmsnorm_peers.table_start(["# this run's head", ""], None, names, 4.204)
    assert fresh == ["# this run's head", "", "| case | evo (ours) | torch | quack tuned |", "|---|---|---|---|"]
    # the rewritten start parses back to the same rows
    assert rmsnorm_peers.parse_table(text + "\n").times == prior.times


def test_resume_refuses_a_table_of_other_providers_or_no_table(tmp_path: Path) -> None:
    out = tmp_path / "peers.md"
    out.write_text(_TABLE)
    with pytest.raises(SystemExit, match="pass the same --skip"):
        rmsnorm_peers.resume_table(out, ["evo (ours)", "torch"])
    out.write_text("not a table\n")
    with pytest.raises(SystemExit, match="leave out --resume"):
        rmsnorm_peers.resume_table(out, ["evo (ours)"])
    assert out.read_text() == "not a table\n"  # nothing overwritten


def test_resume_refuses_rows_of_another_gpu(tmp_path: Path) -> None:
    out = tmp_path / "peers.md"
    out.write_text(_TABLE)
    names = ["evo (ours)", "torch", "quack tuned"]
    assert rmsnorm_peers.table_gpu(rmsnorm_peers.parse_table(_TABLE)) == "NVIDIA H200"
    assert rmsnorm_peers.resume_table(out, names, "NVIDIA H200") is not None
    with pytest.raises(SystemExit, match="timed on NVIDIA H200, this run is on NVIDIA H100 80GB HBM3"):
        rmsnorm_peers.resume_table(out, names, "NVIDIA H100 80GB HBM3")
    real = _TABLE.replace("Machine: NVIDIA H200.", "Machine: NVIDIA H100 80GB HBM3, 132 SMs, L2 50 MiB; host vm.")
    assert rmsnorm_peers.table_gpu(rmsnorm_peers.parse_table(real)) == "NVIDIA H100 80GB HBM3"


def test_a_time_limited_table_names_the_cases_it_did_not_time_and_resumes_past_the_note() -> None:
    left = [("float32", 32768, 65536), ("float32", 16384, 131072)]
    note = rmsnorm_peers.untimed_lines(left, 470.0)
    assert note[-1] == ("Not timed: --time-limit 470 s stopped the run before 2 cases: 32768x65536 float32, "
                        "16384x131072 float32. Run again with --resume to time them.")
    assert rmsnorm_peers.untimed_lines(left[:1], 60.0)[-1].startswith("Not timed: --time-limit 60 s stopped "
                                                                      "the run before 1 case: ")
    assert rmsnorm_peers.untimed_lines([], 470.0) == []
    # a file cut short by the limit: rows, the note, then the summary; --resume reads the rows only
    rows_end = _TABLE.index("\nPeer's time")
    text = _TABLE[:rows_end] + "\n".join(note) + "\n" + _TABLE[rows_end:]
    t = rmsnorm_peers.parse_table(text)
    assert len(t.rows) == 2 and t.done() == {("bfloat16", 256), ("bfloat16", 32768)}


def test_timing_order_rotates_so_each_provider_goes_first_in_some_cases() -> None:
    names = ["evo (ours)", "torch", "quack"]
    firsts = [rmsnorm_peers.timing_order(names, i)[0] for i in range(6)]
    assert firsts == ["evo (ours)", "torch", "quack", "evo (ours)", "torch", "quack"]
    for i in range(6):
        for r in range(3):
            order = rmsnorm_peers.timing_order(names, i, r)
            assert sorted(order) == sorted(names)  # every provider once per round
    # a later round of a case starts with the next provider
    assert rmsnorm_peers.timing_order(names, 4, 1) == ["quack", "evo (ours)", "torch"]
    assert rmsnorm_peers.timing_order([], 3) == []


def test_combine_rounds_takes_the_median_and_widens_the_spread_by_the_range() -> None:
    assert rmsnorm_peers.combine_rounds([(2.0, 0.01)]) == (2.0, 0.01)
    ms, spread = rmsnorm_peers.combine_rounds([(2.9, 0.001), (2.85, 0.002)])
    assert ms == pytest.approx(2.875)
    assert spread == pytest.approx(0.05 / 2.875)
    ms, spread = rmsnorm_peers.combine_rounds([(1.0, 0.05), (1.01, 0.001), (5.0, 0.0)])
    assert ms == 1.01
    assert spread == pytest.approx(4.0 / 1.01)
    ms, spread = rmsnorm_peers.combine_rounds([(1.0, 0.05), (1.001, 0.001)])
    assert spread == 0.05  # a round's own spread when it is the larger
    with pytest.raises(ValueError, match="at least one round"):
        rmsnorm_peers.combine_rounds([])


def test_rounds_below_one_is_refused_before_any_gpu_work(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        rmsnorm_peers.main(["--rounds", "0"])
    assert "--rounds must be 1 or more" in capsys.readouterr().err


def test_copy_floor_by_row_length() -> None:
    assert rmsnorm_peers.copy_floor(256) == 0.65
    assert rmsnorm_peers.copy_floor(2048) == 0.93
    assert rmsnorm_peers.copy_floor(3000) == 0.93  # between two listed lengths: the shorter one's
    assert rmsnorm_peers.copy_floor(8192) == 0.97
    assert rmsnorm_peers.copy_floor(262144) == 0.97
    assert rmsnorm_peers.copy_floor(128) == 0.0


def test_floor_lines_name_each_short_case_and_by_how_much() -> None:
    lines = rmsnorm_peers.floor_lines({("bfloat16", 256): 0.83, ("bfloat16", 8192): 0.955,
                                       ("float32", 2048): None, ("float32", 4096): 0.96})
    text = "\n".join(lines)
    assert "meets its floor on 2 of 4 cases; short:" in text
    assert "- bfloat16 N=8192: 95.5% of copy, floor 97%, short by 1.5 points" in lines
    assert "- float32 N=2048: evo (ours) failed (floor 93%)" in lines
    assert not any("N=256" in line or "N=4096" in line for line in lines[2:])
    assert rmsnorm_peers.floor_lines({("float16", 1024): 0.9})[-1].endswith("meets its floor on 1 of 1 cases.")
    assert rmsnorm_peers.floor_lines({}) == []


def test_parse_table_reads_each_cells_fraction_of_copy() -> None:
    text = "\n".join([
        "# RMSNorm forward peers", "",
        "| case | evo (ours) | quack |", "|---|---|---|",
        "| 32768x256 bfloat16 | 0.0134 / 2.50 / 83% (±0.2%) | FAILED CUDADialectError |",
        "| 32768x8192 float32 | 0.7050 / 3.05 / 101% (±0.1%) | 0.7129 / 3.01 / 100% (±0.1%) |",
    ])
    t = rmsnorm_peers.parse_table(text)
    assert t.copy[("bfloat16", 256, "evo (ours)")] == 0.83
    assert t.copy[("bfloat16", 256, "quack")] is None
    assert t.copy[("float32", 8192, "evo (ours)")] == 1.01
    assert t.copy[("float32", 8192, "quack")] == 1.0


@pytest.mark.parametrize("argv,message", [
    (["--confirm", "3"], "give --archive"),
    (["--confirm", "3", "--archive", "a.lmdb", "--module", "m.py"], "give --archive"),
    (["--confirm", "1", "--archive", "a.lmdb"], "2 or more candidates"),
    (["--confirm", "2", "--archive", "a.lmdb", "--backward"], "forward genomes only"),
    (["--confirm", "2", "--archive", "a.lmdb", "--resume"], "cannot --resume"),
    (["--confirm-rounds", "2", "--archive", "a.lmdb"], "give --confirm K too"),
    (["--confirm", "2", "--confirm-rounds", "0", "--archive", "a.lmdb"], "--confirm-rounds must be 1 or more"),
    (["--confirm-within", "0.1", "--archive", "a.lmdb"], "give --confirm K too"),
    (["--confirm", "2", "--confirm-within", "-0.1", "--archive", "a.lmdb"], "--confirm-within must be a fraction"),
    (["--confirm", "2", "--confirm-within", "nan", "--archive", "a.lmdb"], "--confirm-within must be a fraction"),
])
def test_confirm_arguments_are_checked_before_any_gpu_work(argv: list[str], message: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        rmsnorm_peers.main(argv)
    assert message in capsys.readouterr().err


def test_fastest_candidate_by_median_of_rounds_and_its_table_row() -> None:
    rounds = {"aaaa": [(0.0920, 0.001), (0.0915, 0.001)], "bbbb": [(0.0890, 0.002), (0.0930, 0.001)],
              "cccc": [(0.0905, 0.001)]}
    # medians: aaaa 0.09175, bbbb 0.0910, cccc 0.0905
    assert rmsnorm_peers.fastest(rounds) == "cccc"
    assert rmsnorm_peers.fastest({"x": [(1.0, 0.0)], "y": [(1.0, 0.0)]}) == "x"  # a tie: the first
    with pytest.raises(ValueError, match="no candidate"):
        rmsnorm_peers.fastest({})
    row = rmsnorm_peers.confirm_line("M=32768,N=2048:float16", ["aaaa", "bbbb", "dddd"],
                                     {k: v for k, v in rounds.items() if k != "cccc"},
                                     {"aaaa": 0.0910, "bbbb": 0.0913, "dddd": 0.0912}, "bbbb")
    assert row.startswith("| M=32768,N=2048:float16 | `aaaa` 0.0917 (")
    assert "**`bbbb` 0.0910 (" in row and "search 0.0913)**" in row
    assert "`dddd` FAILED" in row


def test_export_candidates_writes_one_module_per_distinct_genome(tmp_path: Path) -> None:
    from evo.types import Evaluation, Record, Status
    from examples.rmsnorm_problem import make_forward_problem

    prob = make_forward_problem(timed=[{"M": 64, "N": 256}, {"M": 64, "N": 2048}], dtypes=["bfloat16"])
    k1, k2 = "M=64,N=256:bfloat16", "M=64,N=2048:bfloat16"

    def rec(vecs: int, times: dict[str, float]) -> Record:
        cases = {k: {"time_ms": t, "fraction": 0.5} for k, t in times.items()}
        return Record(prob.seeds[0].with_params(MAX_VECS=vecs), Evaluation(Status.OK, fitness=1.0, metrics={"cases": cases}))

    a, b, c = rec(1, {k1: 0.010, k2: 0.100}), rec(2, {k1: 0.0102, k2: 0.099}), rec(4, {k1: 0.02, k2: 0.1})
    top, paths = rmsnorm_peers.export_candidates([a, b, c], prob, 3, tmp_path / "cands", binaries=False)
    assert [r.id for r in top[k1]] == [a.id, b.id]  # c is 2x slower there: not a candidate
    assert [r.id for r in top[k2]] == [b.id, a.id, c.id]
    assert set(paths) == {a.id, b.id, c.id} and all(p.parent == tmp_path / "cands" for p in paths.values())
    mod = rmsnorm_peers.import_dispatch(paths[b.id])
    assert {g["id"] for g in mod.GENOMES} == {b.id}  # each module dispatches its one genome everywhere
    wide, _ = rmsnorm_peers.export_candidates([a, b, c], prob, 3, tmp_path / "wide", binaries=False, within=1.5)
    assert [r.id for r in wide[k1]] == [a.id, b.id, c.id]  # a wider pool (another device's archive) takes c too


def test_device_line_warns_when_the_search_ran_on_another_device() -> None:
    h100 = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
    assert rmsnorm_peers.device_line(h100, "NVIDIA H100 80GB HBM3") == "Search device: NVIDIA H100 80GB HBM3, as here."
    other = rmsnorm_peers.device_line(h100, "NVIDIA H200")
    assert other.startswith("Search device: NVIDIA H100 80GB HBM3; timed here on **NVIDIA H200**, another device")
    assert "not recorded" in rmsnorm_peers.device_line(None, "NVIDIA H200")


def test_confirm_opens_the_archive_read_only_and_checks_its_problem(tmp_path: Path) -> None:
    from archive import Archive
    from evo.types import Evaluation, Record, Status
    from examples.rmsnorm_problem import make_backward_problem, make_forward_problem

    fwd = make_forward_problem()
    arch = Archive(fwd, tmp_path / "fwd.lmdb")
    arch.add(Record(fwd.seeds[0], Evaluation(Status.OK, fitness=1.0, resources={"registers": 40},
                                             metrics={"cases": {"M=32768,N=256:bfloat16": {"time_ms": 0.01}}})))
    arch.close()
    ro = rmsnorm_peers.open_forward_archive(str(tmp_path / "fwd.lmdb"), fwd.name)
    try:
        assert ro.readonly and len(list(ro.records())) == 1
    finally:
        ro.close()
    bwd = make_backward_problem()
    Archive(bwd, tmp_path / "bwd.lmdb").close()
    with pytest.raises(SystemExit, match="not 'rmsnorm_fwd"):
        rmsnorm_peers.open_forward_archive(str(tmp_path / "bwd.lmdb"), fwd.name)


def test_time_rounds_rotates_and_stops_timing_a_name_that_failed(capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[str] = []
    recovered: list[int] = []

    def timer(name: str) -> tuple[float, float]:
        calls.append(name)
        if name == "b":
            raise RuntimeError("launch failed")
        return (1.0 if name == "a" else 2.0, 0.01)

    results, failed = rmsnorm_peers.time_rounds(["a", "b", "c"], timer, 1, 2, "on 4x8 float32",
                                                lambda: recovered.append(1))
    assert calls == rmsnorm_peers.timing_order(["a", "b", "c"], 1, 0) + [
        n for n in rmsnorm_peers.timing_order(["a", "b", "c"], 1, 1) if n != "b"]
    assert failed == {"b": "RuntimeError"} and recovered == [1]
    assert results["a"] == [(1.0, 0.01)] * 2 and results["c"] == [(2.0, 0.01)] * 2 and results["b"] == []
    assert "b on 4x8 float32: RuntimeError: launch failed" in capsys.readouterr().err


def test_also_modules_are_named_checked_and_placed_after_ours(tmp_path: Path) -> None:
    a = tmp_path / "run27.dispatch.py"
    b = tmp_path / "run26-h100.dispatch.py.xz"
    a.write_text("")
    b.write_bytes(b"")
    got = rmsnorm_peers.parse_also([str(a), str(b), f"{a}=again"])
    assert got == [("evo (run27)", a), ("evo (run26-h100)", b), ("evo (again)", a)]
    for bad, message in [([str(tmp_path / "none.py")], "no dispatch module"), ([f"{a}=ours"], "other than 'ours'"),
                         ([f"{a}= "], "other than 'ours'"), ([str(a), f"{b}=run27"], "given twice")]:
        with pytest.raises(SystemExit, match=message):
            rmsnorm_peers.parse_also(bad)
    provs = {"evo (ours)": 1, "torch": 2, "liger": 3}
    assert list(rmsnorm_peers.with_also(provs, [("evo (b)", 4)])) == ["evo (ours)", "evo (b)", "torch", "liger"]
    assert list(rmsnorm_peers.with_also({"torch": 2}, [("evo (b)", 4)])) == ["evo (b)", "torch"]


def test_also_may_name_the_module_confirm_is_about_to_write(tmp_path: Path) -> None:
    later = rmsnorm_peers.confirmed_path(str(tmp_path / "run27.lmdb"))
    assert later == tmp_path / "run27.confirmed.dispatch.py" and not later.exists()
    got = rmsnorm_peers.parse_also([f"{later}=again"], later=later)
    assert got == [("evo (again)", later)]
    with pytest.raises(SystemExit, match="no dispatch module"):  # only that path may be missing
        rmsnorm_peers.parse_also([f"{tmp_path / 'run26.confirmed.dispatch.py'}=again"], later=later)
    with pytest.raises(SystemExit, match="no dispatch module"):  # and only with --confirm
        rmsnorm_peers.parse_also([f"{later}=again"])


def test_also_path_that_is_missing_stops_before_any_gpu_work(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no dispatch module"):
        rmsnorm_peers.main(["--also", str(tmp_path / "none.dispatch.py")])


def test_summary_keeps_our_other_modules_out_of_the_peers() -> None:
    times = {("bfloat16", 256, "evo (ours)"): 0.0100, ("bfloat16", 256, "evo (b)"): 0.0090,
             ("bfloat16", 256, "torch"): 0.0200}
    lines = rmsnorm_peers.summary(times, ["evo (ours)", "evo (b)", "torch"])
    text = "\n".join(lines)
    assert "| **fastest peer** | **2.000** |" in text  # evo (b), faster, is not the fastest peer
    assert "| evo (b) (not a peer) | 0.900 |" in text
    assert lines[-1] == "evo (ours) is faster than every peer that ran on 1 of 1 cases."


def test_import_dispatch_gives_a_module_per_call_and_survives_a_second_op_registration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mod_path = tmp_path / "m.dispatch.py"
    mod_path.write_text("STATE = []\ndef run(*a, **k):\n    STATE.append(1)\n")
    one, two = rmsnorm_peers.import_dispatch(mod_path), rmsnorm_peers.import_dispatch(mod_path)
    one.run()
    assert one is not two and one.STATE == [1] and two.STATE == []  # kernels and workspaces apart
    dup = tmp_path / "dup.dispatch.py"  # what torch raises for the example's op, imported twice
    dup.write_text("def run(*a, **k):\n    pass\nraise RuntimeError('Tried to register an operator "
                   "(evo_rmsnorm::fwd(Tensor x, Tensor w) -> Tensor) with the same name and overload name "
                   "multiple times.')\n")
    assert callable(rmsnorm_peers.import_dispatch(dup).run)
    assert "registered by a module imported before it" in capsys.readouterr().err
    other = tmp_path / "other.dispatch.py"
    other.write_text("def run(*a, **k):\n    pass\nraise RuntimeError('something else')\n")
    with pytest.raises(RuntimeError, match="something else"):
        rmsnorm_peers.import_dispatch(other)
