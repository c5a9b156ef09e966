"""The sweep's built-in variant sets are valid genomes of the forward Problem (no GPU needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import rmsnorm_sweep  # noqa: E402

from examples.rmsnorm_problem import make_forward_problem  # noqa: E402
from tests.marks import needs_gpu  # noqa: E402


@pytest.mark.parametrize("make", list(rmsnorm_sweep.SETS.values()), ids=list(rmsnorm_sweep.SETS))
@pytest.mark.parametrize("count", [40, 120])
def test_sets_are_valid_and_distinct(make, count: int) -> None:
    space = make_forward_problem(dtypes=["bfloat16"]).params
    variants = make(count)
    assert count // 2 <= len(variants) <= count
    assert all(space.is_valid(p) for p in variants), [space.violations(p) for p in variants if not space.is_valid(p)]
    assert len({tuple(sorted(p.items())) for p in variants}) == len(variants)  # no variant (seed) timed twice


def test_bad_shapes_argument_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="no standard shape"):
        rmsnorm_sweep.main(["--shapes", "7", "--set", "seeds"])


def test_cluster_set_holds_a_row_slice_on_chip() -> None:
    """Every variant of the cluster set keeps a whole row slice of some long shape on chip."""
    variants = rmsnorm_sweep.cluster_set(90)
    assert all(p["STAGE"] in (0, 1) and p["CLUSTER"] > 1 and p["TPR"] == p["THREADS"] for p in variants)
    for p in variants:  # registers: the tile covers the shortest long row (32K bf16) at least
        if p["STAGE"] == 0:
            assert p["THREADS"] * p["MAX_VECS"] * 16 * p["CLUSTER"] >= 32768 * 2, p
    assert {p["STAGE"] for p in variants} == {0, 1}


def test_regtile_set_holds_the_full_register_tile() -> None:
    """The regtile set is the 32 KB register tile at 512 and 1024 threads, the 1024-thread ones
    admitted only by the relaxed rule (half of it before)."""
    variants = rmsnorm_sweep.regtile_set(120)
    assert len(variants) == 60
    assert all(p["THREADS"] * p["MAX_VECS"] * p["VEC_BYTES"] == 32768 for p in variants)
    assert {p["THREADS"] for p in variants} == {512, 1024} and {p["CLUSTER"] for p in variants} == {1, 2, 4, 8, 16}
    assert [p["LOAD_HINT"] for p in rmsnorm_sweep.regtile_set(40)] == [3] * 20 + [0] * 20


def test_missing_source_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no such kernel file"):
        rmsnorm_sweep.main(["--set", "seeds", "--source", str(tmp_path / "nope.cu"), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()  # nothing written


@pytest.mark.gpu
@needs_gpu
def test_source_option_reads_the_given_kernel(tmp_path: Path) -> None:
    """--source sweeps another kernel file: a broken one fails to compile, and says so in the table."""
    bad = tmp_path / "broken.cu"
    bad.write_text('extern "C" __global__ void rmsnorm_fwd(float* y) { this does not compile }\n')
    out = tmp_path / "sweep"
    assert rmsnorm_sweep.main(["--set", "seeds", "--shapes", "1024", "--source", str(bad), "--out", str(out),
                               "--limit", "60"]) == 0
    assert "FAILED" in (out / "sweep.md").read_text()


def _row(params: dict, times: dict[str, float] | None, registers: int = 64) -> dict:
    cases = {k: {"time_ms": t, "fraction": 0.5} for k, t in (times or {}).items()}
    return {"params": params, "status": "ok" if times else "incorrect", "registers": registers, "cases": cases}


def test_comparison_reports_time_ratios_of_shared_variants() -> None:
    k1, k2 = "M=32768,N=8192:bfloat16", "M=8192,N=262144:bfloat16"
    a, b, c = {"STAGE": 3, "THREADS": 128}, {"STAGE": 0, "THREADS": 256}, {"STAGE": 2, "THREADS": 512}
    new = [_row(a, {k1: 1.0, k2: 2.0}), _row(b, {k1: 2.0, k2: 2.0}), _row(c, None)]
    old = [_row(b, {k1: 1.0, k2: 2.0}, registers=80), _row(a, {k1: 1.1, k2: 2.2}), _row(c, {k1: 1.0, k2: 1.0})]
    text = rmsnorm_sweep.render_comparison(new, old)
    lines = [ln for ln in text.splitlines() if ln.startswith("| ST")]
    assert lines[0].startswith("| ST3 TH128") and "| 1.100 | 1.100 | 1.100 |" in lines[0]  # faster first
    assert "| 64 / 80 | 0.500 | 1.000 |" in lines[1]
    assert "FAILED ST2 TH512" in text and "new incorrect, old ok" in text
    assert "2 variants in both sweeps" in text


def test_compare_needs_two_files(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="is not a file"):
        rmsnorm_sweep.main(["--compare", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")])


def test_policy_set_compares_the_hints_on_equal_terms() -> None:
    """The policy set times each STAGE 2 variant at LOAD_HINT 0, 3, 4 and 5, nothing else changed."""
    variants = rmsnorm_sweep.policy_set(36)
    assert len(variants) == 36 and all(p["STAGE"] == 2 for p in variants)
    for i in range(0, len(variants), 4):
        four = variants[i:i + 4]
        assert [p["LOAD_HINT"] for p in four] == [0, 3, 4, 5]
        assert len({tuple(sorted((k, v) for k, v in p.items() if k != "LOAD_HINT")) for p in four}) == 1


def test_variant_names_tell_every_knob_apart() -> None:
    """Two variants that differ in any one forward knob get different names (PREFETCH and
    RSQRT_APPROX included; STAGE / STORE_HINT and PERSISTENT / PREFETCH do not share a label)."""
    from examples.rmsnorm_problem import forward_param_space

    space = forward_param_space()
    base = dict(make_forward_problem().seeds[0].params)
    assert set(rmsnorm_sweep._KNOBS) == set(space.params)
    assert len(set(rmsnorm_sweep._KNOBS.values())) == len(rmsnorm_sweep._KNOBS)
    for knob in space.params:
        other = dict(base, **{knob: int(base[knob]) + 1})
        assert rmsnorm_sweep._variant_name(other) != rmsnorm_sweep._variant_name(base), knob


def test_sweep_table_names_machine_and_marks_spills() -> None:
    """The written table says when, on which GPU (copy ceiling), dtypes, kernel and how many
    variants came back; a variant that spilled shows its spill bytes."""
    import datetime

    from evo.types import DeviceInfo

    dev = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", sm_count=132, copy_gbps=3025.0)
    when = datetime.datetime(2026, 12, 7, 16, 35, tzinfo=datetime.timezone.utc)
    head = rmsnorm_sweep.sweep_header(dev, ["bfloat16", "float16"], "examples/kernels/rmsnorm_fwd.cu", 66, 64, when)
    assert "2026-12-07 16:35 UTC" in head and "NVIDIA H100 80GB HBM3, 132 SMs, copy 3.025 TB/s" in head
    assert "bfloat16, float16" in head and "64 of 66 variants collected" in head
    assert "device unknown" in rmsnorm_sweep.sweep_header(None, ["float32"], "old.cu", 3, 0, when)
    base = dict(make_forward_problem().seeds[0].params)
    case = {"M=32768,N=2048:bfloat16": {"fraction": 0.98, "time_ms": 0.09}}
    rows = [{"params": base, "status": "ok", "registers": 32, "spill": 16, "cases": case},
            {"params": dict(base, PREFETCH=1), "status": "ok", "registers": 32, "spill": 0, "cases": case}]
    table = rmsnorm_sweep.render_markdown(rows)
    assert table.count("32 (16 B spill)") == 1 and "| 32 |" in table
