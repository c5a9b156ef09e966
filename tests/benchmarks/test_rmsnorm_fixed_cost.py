"""The fixed-cost benchmark's source variants and line fit (no GPU needed; nvcc where installed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import rmsnorm_fixed_cost as fc  # noqa: E402

from evo.types import Genome  # noqa: E402
from examples.rmsnorm_problem import KERNEL_DIR, make_backward_problem, make_forward_problem  # noqa: E402
from tests.examples.conftest import nvcc_compile  # noqa: E402

FWD = (KERNEL_DIR / "rmsnorm_fwd.cu").read_text()
BWD = (KERNEL_DIR / "rmsnorm_bwd.cu").read_text()


@pytest.mark.parametrize("dtype,code", [("float32", 0), ("float16", 1), ("bfloat16", 2)])
@pytest.mark.parametrize("source", [FWD, BWD], ids=["forward", "backward"])
def test_dtype_only_is_the_build_of_one_dtype(source: str, dtype: str, code: int) -> None:
    out = fc.variant_source(source, "dtype-only", dtype, backward=source is BWD)
    assert out == f"#define DTYPE_CODE {code}\n" + source


def test_backward_edits_apply_once_and_forward_refuses_them() -> None:
    no_reduce = fc.variant_source(BWD, "no-reduce", "bfloat16", backward=True)
    assert "if (t < T - K) return;" not in no_reduce and no_reduce.count("\n    return;\n") == \
        BWD.count("\n    return;\n") + 1
    no_sum = fc.variant_source(BWD, "no-sum", "bfloat16", backward=True)
    assert "for (int j0 = jhi; j0 < jhi; j0 += L)" in no_sum and "j0 = jlo" not in no_sum
    assert "while (ld_acquire(ticket) < T)" in no_sum  # the reducers still wait for every partial row
    no_dw = fc.variant_source(BWD, "no-dw", "bfloat16", backward=True)
    assert no_dw.index("    return;\n    if (use_smem) {") < no_dw.index("mine[j] = sdw[j]")
    assert fc.variant_source(BWD, "full", "float32", backward=True) is BWD
    with pytest.raises(ValueError, match="backward"):
        fc.variant_source(FWD, "no-reduce", "bfloat16", backward=False)
    with pytest.raises(ValueError, match="unknown variant"):
        fc.variant_source(FWD, "fast", "bfloat16", backward=False)
    with pytest.raises(ValueError, match="no '#ifdef DTYPE_CODE'"):
        fc.variant_source("int x;", "dtype-only", "bfloat16", backward=False)
    with pytest.raises(ValueError, match="no-reduce"):
        fc.variant_source("int x;", "no-reduce", "bfloat16", backward=True)
    with pytest.raises(ValueError, match="no-sum"):
        fc.variant_source("int x;", "no-sum", "bfloat16", backward=True)


def test_forward_part_edits_remove_the_weight_loads_and_the_stores() -> None:
    no_w = fc.variant_source(FWD, "no-w", "bfloat16", backward=False)
    assert "load_w<E, A16>(w, g);" not in no_w and "load_w<E, decltype(a16)::value>" not in no_w
    assert no_w.count("load_ones<E>(g);") == 2 and "load_ones<E>(wr[k]);" in no_w and "void load_ones(float* f)" in no_w
    assert no_w.count("load_w<E") == FWD.count("load_w<E") - 3  # norm_store's, norm_rows' and the row tile's
    no_store = fc.variant_source(FWD, "no-store", "bfloat16", backward=False)
    assert no_store.count("if (v.w[0] == 0x7fc00001u") == 1 and no_store.count(".v4.u32 [%0]") == 1
    with pytest.raises(ValueError, match="forward"):
        fc.variant_source(BWD, "no-w", "bfloat16", backward=True)
    with pytest.raises(ValueError, match="no-store: st_vec's 16-byte store is not in the source"):
        fc.variant_source("int x;", "no-store", "bfloat16", backward=False)
    with pytest.raises(ValueError, match="no-w"):  # every edit of a variant must find its code
        fc.variant_source(FWD.replace("load_w<E, A16>(w, g);", ""), "no-w", "bfloat16", backward=False)


def test_fraction_of_copy() -> None:
    # 2 GB in 500 us is 4 TB/s: all of a 4 TB/s copy, half of an 8 TB/s one
    assert fc.fraction_of_copy(2 * 10**9, 500.0, 4.0) == pytest.approx(1.0)
    assert fc.fraction_of_copy(2 * 10**9, 500.0, 8.0) == pytest.approx(0.5)


def _cubin_bytes(source: str, defines: list[str], tmp: Path, name: str) -> int:
    d = tmp / name
    d.mkdir()
    nvcc_compile("kernel.cu", defines, d, source=source)
    return (d / "kernel.cu.cubin").stat().st_size


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_variants_compile_and_dtype_only_is_smaller(backward: bool, tmp_path: Path) -> None:
    problem = make_backward_problem() if backward else make_forward_problem()
    source = BWD if backward else FWD
    seed = problem.seeds[-1]  # a persistent (ALGO 1) seed for the backward, the last forward seed
    defines = Genome(seed.source, seed.params, entry=seed.entry).defines()
    full = _cubin_bytes(source, defines, tmp_path, "full")
    only = _cubin_bytes(fc.variant_source(source, "dtype-only", "bfloat16", backward), defines, tmp_path, "only")
    assert only < full
    if backward:
        for v in ("no-reduce", "no-sum", "no-dw"):
            _cubin_bytes(fc.variant_source(source, v, "bfloat16", True), defines, tmp_path, v)
    else:
        # a cluster seed with four rows per tile (its weights go through norm_rows), a row-tile seed and
        # the last seed
        tiles = next(s for s in problem.seeds if s.params["CLUSTER"] > 1 and s.params["TILE_ROWS"] == 4)
        rowtile = next(s for s in problem.seeds if s.params["STAGE"] == 4)
        for name, d in (("tiles", Genome(tiles.source, tiles.params).defines()),
                        ("rowtile", Genome(rowtile.source, rowtile.params).defines()), ("last", defines)):
            for v in ("no-w", "no-store"):
                _cubin_bytes(fc.variant_source(source, v, "bfloat16", False), d, tmp_path, f"{name}-{v}")


def test_fit_line_recovers_fixed_and_per_row_cost() -> None:
    ms = [16384, 32768, 65536, 131072]
    a, b, worst = fc.fit_line(ms, [5.0 + 3.0 * m / 32768 for m in ms])
    assert a == pytest.approx(5.0) and b == pytest.approx(3.0) and worst == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="two different"):
        fc.fit_line([32768, 32768], [1.0, 2.0])


def test_input_sets_cover_three_l2_within_bounds() -> None:
    l2 = 60 << 20
    assert fc.input_sets(l2, 32 << 20) == 6  # 6 x 32 MiB >= 3 x 60 MiB
    assert fc.input_sets(l2, 1 << 30) == 2  # at least two sets
    assert fc.input_sets(l2, 1 << 20) == 16  # at most sixteen


def test_bad_arguments_are_refused_before_any_gpu_work(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        fc.main(["--module", "x.py", "--n", "256", "--variants", "full,no-dw"])
    assert e.value.code == 2 and "need --backward" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fc.main(["--module", "x.py", "--n", "256", "--rows", ","])
    assert "at least one row count" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        fc.main(["--module", "x.py", "--backward", "--n", "256", "--variants", "full,no-w"])
    assert e.value.code == 2 and "leave out --backward" in capsys.readouterr().err


def test_params_give_a_genome_of_the_family() -> None:
    """--params: the first seed's source with the given knobs, in a dispatch module's form."""
    prob = make_forward_problem()
    seed = dict(prob.seeds[7].params)
    g = fc.genome_from_params(prob, __import__("json").dumps({"STAGE": seed["STAGE"], "TPR": seed["TPR"],
                                                               "THREADS": seed["THREADS"], "MAX_VECS": 2,
                                                               "TILE_ROWS": 2, "OCCUPANCY": 4}))
    assert g["source"] == prob.seeds[0].source and g["entry"] == prob.seeds[0].entry
    assert g["params"]["STAGE"] == 4 and g["params"]["MAX_VECS"] == 2
    assert f"-DSTAGE={seed['STAGE']}" in g["defines"]
    assert g["id"] == prob.seeds[0].with_params(**g["params"]).id


@pytest.mark.parametrize("text,match", [("{not json", "not JSON"), ("[1, 2]", "JSON object"),
                                        ('{"THREADZ": 128}', "unknown knobs"),
                                        ('{"TPR": 64, "THREADS": 32}', "rules")])
def test_bad_params_are_clear_errors(text: str, match: str) -> None:
    with pytest.raises(SystemExit, match=match):
        fc.genome_from_params(make_forward_problem(), text)


def test_module_and_params_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        fc.main(["--n", "256", "--module", "m.py", "--params", "{}"])
    assert "not allowed with" in capsys.readouterr().err


def test_vs_edits_the_genome_and_labels_the_changes() -> None:
    """--vs: the genome with the given knobs changed (the source kept), labelled by what changed."""
    prob = make_backward_problem()
    base = fc.genome_from_params(prob, '{"ALGO": 1, "THREADS": 256, "MAX_CHUNKS": 2, "ROW_WARP": 2}')
    label, g = fc.edited_genome(prob, base, '{"TREE": 8, "THREADS": 256}')
    assert label == "TREE=8"  # THREADS is unchanged, so it is not in the label
    assert g["params"] == {**base["params"], "TREE": 8} and g["source"] == base["source"]
    assert "-DTREE=8" in g["defines"] and g["id"] != base["id"]
    assert g["id"] == prob.seeds[0].with_params(**g["params"]).id


@pytest.mark.parametrize("text,match", [('{"TREE": 0}', "changes no knob"), ('{"TREEZ": 8}', "unknown knobs"),
                                        ('{"THREADS": 1024, "MAX_CHUNKS": 8}', "rules"), ("[8]", "JSON object")])
def test_bad_vs_are_clear_errors(text: str, match: str) -> None:
    prob = make_backward_problem()
    base = fc.genome_from_params(prob, '{"ALGO": 1, "THREADS": 256, "MAX_CHUNKS": 2, "ROW_WARP": 2}')
    with pytest.raises(SystemExit, match=match):
        fc.edited_genome(prob, base, text)


def test_vs_genomes_are_canonical() -> None:
    """A change that switches another knob off stores it at its default, as the engine does: STAGES on a
    PREFETCH genome times it with PREFETCH 0 (the kernel refuses both)."""
    prob = make_backward_problem()
    base = fc.genome_from_params(prob, '{"ALGO": 1, "THREADS": 256, "MAX_CHUNKS": 2, "PREFETCH": 1}')
    label, g = fc.edited_genome(prob, base, '{"STAGES": 2}')
    assert label == "STAGES=2" and g["params"]["PREFETCH"] == 0 and "-DPREFETCH=0" in g["defines"]
    assert g["id"] == prob.seeds[0].with_params(**prob.params.canonical(g["params"])).id
