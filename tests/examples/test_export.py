"""evo.export: best genome per case and the generated dispatch module (CPU parts)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from evo.export import ExportError, best_per_case, export_module, top_per_case
from evo.types import Evaluation, Record, Status
from examples.rmsnorm_problem import make_forward_problem


def _rec(prob, params: dict, times: dict[str, float]) -> Record:
    g = prob.seeds[0].with_params(**params)
    cases = {k: {"time_ms": t, "fraction": 0.5} for k, t in times.items()}
    return Record(g, Evaluation(Status.OK, fitness=1.0, metrics={"cases": cases}))


def test_export_dispatches_on_n(tmp_path: Path) -> None:
    prob = make_forward_problem(timed=[{"M": 64, "N": 256}, {"M": 64, "N": 65536}], dtypes=["bfloat16"])
    k1, k2 = "M=64,N=256:bfloat16", "M=64,N=65536:bfloat16"
    small = _rec(prob, {"MAX_VECS": 1}, {k1: 0.01, k2: 0.9})
    large = _rec(prob, {"MAX_VECS": 2}, {k1: 0.02, k2: 0.5})
    failed = Record(prob.seeds[1], Evaluation.failure(Status.INCORRECT, "wrong"))
    best = best_per_case([small, large, failed], prob)
    assert best[k1].id == small.id and best[k2].id == large.id

    path = export_module([small, large, failed], prob, tmp_path / "pkg" / "rms_dispatch.py",
                         extra_code="EXTRA = 42")
    spec = importlib.util.spec_from_file_location("rms_dispatch", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rms_dispatch"] = mod
    try:
        spec.loader.exec_module(mod)
        assert mod.EXTRA == 42 and len(mod.GENOMES) == 2
        assert len(mod._DATA["sources"]) == 1  # the two genomes share their source: kept once
        assert all(g["source"] == prob.seeds[0].source for g in mod.GENOMES)
        assert mod.select({"M": 10, "N": 300}, "bfloat16")["id"] == small.id
        assert mod.select({"M": 10, "N": 40000}, "bfloat16")["id"] == large.id
        L = mod.launch_config({"M": 10, "N": 300}, "bfloat16")
        assert L.block == (128, 1, 1) and L.grid == (3, 1, 1)
        with pytest.raises(KeyError, match="no exported genome"):
            mod.select({"M": 1, "N": 1}, "float32")
    finally:
        sys.modules.pop("rms_dispatch", None)


def test_top_per_case_ranks_distinct_genomes_within_a_margin() -> None:
    prob = make_forward_problem(timed=[{"M": 64, "N": 256}, {"M": 64, "N": 2048}], dtypes=["bfloat16"])
    k1, k2 = "M=64,N=256:bfloat16", "M=64,N=2048:bfloat16"
    a = _rec(prob, {"MAX_VECS": 1}, {k1: 0.010, k2: 0.100})
    b = _rec(prob, {"MAX_VECS": 2}, {k1: 0.011, k2: 0.098})
    c = _rec(prob, {"MAX_VECS": 4}, {k1: 0.020, k2: 0.099})
    again = _rec(prob, {"MAX_VECS": 1}, {k1: 0.0105})  # the same genome re-scored: counted once
    failed = Record(prob.seeds[1], Evaluation.failure(Status.INCORRECT, "wrong"))
    top = top_per_case([a, b, c, again, failed], prob, k=3)
    assert list(top) == [k2, k1]  # case-key order
    assert [r.id for r in top[k1]] == [a.id, b.id, c.id]
    assert [r.id for r in top[k2]] == [b.id, c.id, a.id]
    assert [r.id for r in top_per_case([a, b, c], prob, k=3, within=0.15)[k1]] == [a.id, b.id]
    assert [r.id for r in top_per_case([a, b, c], prob, k=2)[k2]] == [b.id, c.id]
    assert {k: r.id for k, r in best_per_case([a, b, c], prob).items()} == {k1: a.id, k2: b.id}
    with pytest.raises(ValueError, match="k must be 1 or more"):
        top_per_case([a], prob, k=0)
    with pytest.raises(ValueError, match="within must be"):
        top_per_case([a], prob, within=-0.1)


def test_export_dispatches_the_chosen_record(tmp_path: Path) -> None:
    """``choices`` overrides the fastest record of a case (a side-by-side re-timing's winner)."""
    prob = make_forward_problem(timed=[{"M": 64, "N": 256}, {"M": 64, "N": 2048}], dtypes=["bfloat16"])
    k1, k2 = "M=64,N=256:bfloat16", "M=64,N=2048:bfloat16"
    a = _rec(prob, {"MAX_VECS": 1}, {k1: 0.010, k2: 0.100})
    b = _rec(prob, {"MAX_VECS": 2}, {k1: 0.011, k2: 0.098})
    path = export_module([a, b], prob, tmp_path / "chosen.py", binaries=False, choices={k2: a})
    mod = _load(path, "chosen_dispatch")
    assert {g["case"]: g["id"] for g in mod.GENOMES} == {k1: a.id, k2: a.id}
    with pytest.raises(ExportError, match="not a timed case"):
        export_module([a, b], prob, tmp_path / "x.py", binaries=False, choices={"M=1,N=8:bfloat16": a})
    untimed = _rec(prob, {"MAX_VECS": 4}, {k1: 0.02})
    with pytest.raises(ExportError, match="not an OK record timed on that case"):
        export_module([a, b, untimed], prob, tmp_path / "x.py", binaries=False, choices={k2: untimed})
    assert not (tmp_path / "x.py").exists()


def test_export_nothing_raises(tmp_path: Path) -> None:
    prob = make_forward_problem(timed=[{"M": 64, "N": 256}], dtypes=["float32"])
    with pytest.raises(ExportError, match="no OK record"):
        export_module([], prob, tmp_path / "x.py")


def test_export_names_the_signature_only_when_a_workspace_needs_it(tmp_path: Path) -> None:
    """The backward's workspace is supplied by the dispatch module, which then needs the signature."""
    import json

    from examples.rmsnorm_problem import make_backward_problem

    fwd = make_forward_problem(timed=[{"M": 64, "N": 256}], dtypes=["float32"])
    bwd = make_backward_problem(timed=[{"M": 64, "N": 256}], dtypes=["float32"])
    key = "M=64,N=256:float32"
    for prob, want in ((fwd, False), (bwd, True)):
        path = export_module([_rec(prob, {}, {key: 0.1})], prob, tmp_path / f"{prob.name}.py")
        text = path.read_text()
        data = json.loads(eval(text.split("_DATA = json.loads(", 1)[1].split(")\n", 1)[0]))  # noqa: S307
        assert ("signature" in data["funcs"]) is want
        if want:
            assert data["funcs"]["signature"] == ["examples.rmsnorm_problem", "bwd_signature"]
        assert "def _with_workspaces" in text


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _code(elf: bytes) -> dict[str, bytes]:
    """The code sections (``.text.*``) of a 64-bit little-endian ELF cubin, by name."""
    import struct

    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx]
    out = {}
    for name, _type, _flags, _addr, off, size, *_ in heads:
        label = elf[strtab[4] + name:elf.index(b"\0", strtab[4] + name)].decode()
        if label.startswith(".text."):
            out[label] = elf[off:off + size]
    return out


def test_export_embeds_the_cubin_the_gate_builds(tmp_path: Path) -> None:
    """Each distinct (source, defines) is compiled once with nvcc for the Problem's target, as
    the gate compiles it; the module carries the same bytes and says how they were built."""
    import base64
    import zlib

    from fitness import compile_genome

    prob = make_forward_problem(timed=[{"M": 64, "N": 256}, {"M": 64, "N": 65536}], dtypes=["bfloat16", "float32"])
    recs = [_rec(prob, {"MAX_VECS": 1}, {"M=64,N=256:bfloat16": 0.01, "M=64,N=65536:bfloat16": 0.9,
                                          "M=64,N=256:float32": 0.01}),
            _rec(prob, {"MAX_VECS": 2}, {"M=64,N=65536:bfloat16": 0.5})]
    mod = _load(export_module(recs, prob, tmp_path / "d.py", use_cache=False), "d_bin")
    assert len(mod.GENOMES) == 3
    keys = {g["case"]: g["binary"] for g in mod.GENOMES}
    # the dtype is a run-time argument of this family: one binary serves a genome's dtypes
    assert keys["M=64,N=256:bfloat16"] == keys["M=64,N=256:float32"] != keys["M=64,N=65536:bfloat16"]
    assert set(mod._BINARIES) == set(keys.values())
    assert mod.BUILD.startswith("nvcc 13.") and mod.BUILD.endswith(", sm_90a"), mod.BUILD
    g = mod.select({"M": 64, "N": 256}, "float32")
    cubin = zlib.decompress(base64.b64decode(mod._BINARIES[g["binary"]]))
    assert cubin[:4] == b"\x7fELF"
    genome = next(r.genome for r in recs if r.genome.id == g["id"])
    gate = compile_genome(genome, prob).cubin  # its line info names another temporary folder
    assert _code(cubin) == _code(gate) and _code(cubin)[".text." + g["entry"]]
    assert mod.origin({"M": 64, "N": 256}, "float32") is None  # nothing loaded yet
    assert "cubin built at export time" in mod.__doc__ and mod.BUILD in mod.__doc__


def test_export_embeds_each_dtype_build(tmp_path: Path) -> None:
    """DTYPE_BUILD 1: the gate builds the genome once per dtype (-DDTYPE_CODE); the module carries
    each dtype's build and its definitions, for the cubin and for an NVRTC fallback alike."""
    import base64
    import zlib

    from fitness import compile_genome

    prob = make_forward_problem(timed=[{"M": 64, "N": 256}], dtypes=["bfloat16", "float32"])
    rec = _rec(prob, {"MAX_VECS": 1, "DTYPE_BUILD": 1}, {"M=64,N=256:bfloat16": 0.01, "M=64,N=256:float32": 0.01})
    mod = _load(export_module([rec], prob, tmp_path / "b.py", use_cache=False), "b_bin")
    by = {g["dtype"]: g for g in mod.GENOMES}
    assert by["bfloat16"]["binary"] != by["float32"]["binary"]
    for dtype, code in (("bfloat16", 2), ("float32", 0)):
        g = by[dtype]
        assert g["defines"] == rec.genome.defines() + [f"-DDTYPE_CODE={code}"]
        cubin = zlib.decompress(base64.b64decode(mod._BINARIES[g["binary"]]))
        assert _code(cubin) == _code(compile_genome(rec.genome, prob, dtype=dtype).cubin)
    assert _code(compile_genome(rec.genome, prob, dtype="bfloat16").cubin) != _code(compile_genome(rec.genome, prob).cubin)


def test_export_without_binaries_compiles_where_it_runs(tmp_path: Path) -> None:
    prob = make_forward_problem(timed=[{"M": 64, "N": 256}], dtypes=["float32"])
    mod = _load(export_module([_rec(prob, {}, {"M=64,N=256:float32": 0.1})], prob, tmp_path / "d.py",
                              binaries=False), "d_src")
    assert mod._BINARIES == {} and "binary" not in mod.GENOMES[0]
    assert "NVRTC where the module runs" in mod.__doc__


def test_export_names_the_genome_that_does_not_compile(tmp_path: Path) -> None:
    """A record whose source no longer compiles here stops the export before any file is written."""
    from evo.types import Genome

    prob = make_forward_problem(timed=[{"M": 64, "N": 256}], dtypes=["float32"])
    bad = Genome("extern \"C\" __global__ void rmsnorm_fwd( { this is not C++ }", dict(prob.seeds[0].params),
                 entry=prob.seeds[0].entry)
    rec = Record(bad, Evaluation(Status.OK, fitness=1.0, metrics={"cases": {"M=64,N=256:float32": {"time_ms": 0.1}}}))
    out = tmp_path / "d.py"
    with pytest.raises(ExportError, match=r"does not compile with nvcc for sm_90a: .*binaries=False"):
        export_module([rec], prob, out, use_cache=False)
    assert not out.exists()


def test_export_without_a_compiler_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prob = make_forward_problem(timed=[{"M": 64, "N": 256}], dtypes=["float32"])
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvcc here
    with pytest.raises(ExportError, match="install the CUDA toolkit, or export with binaries=False"):
        export_module([_rec(prob, {}, {"M=64,N=256:float32": 0.1})], prob, tmp_path / "d.py", use_cache=False)


def test_export_assembles_a_raw_ptx_genome(tmp_path: Path) -> None:
    """A PTX genome's cubin comes from ptxas (as the gate assembles it), not from a C++ compiler."""
    import base64
    import zlib

    from evo.types import Genome
    from fitness import compile_source

    prob = make_forward_problem(timed=[{"M": 64, "N": 256}], dtypes=["float32"])
    cu = 'extern "C" __global__ void rmsnorm_fwd(float* y) { y[threadIdx.x] = 1.0f; }'
    ptx = compile_source(cu, entry="rmsnorm_fwd", keep_ptx=True).ptx
    assert ptx and ".entry rmsnorm_fwd" in ptx
    g = Genome(ptx, dict(prob.seeds[0].params), entry="rmsnorm_fwd", language="ptx")
    rec = Record(g, Evaluation(Status.OK, fitness=1.0, metrics={"cases": {"M=64,N=256:float32": {"time_ms": 0.1}}}))
    mod = _load(export_module([rec], prob, tmp_path / "d.py", use_cache=False), "d_ptx")
    entry = mod.GENOMES[0]
    assert entry["language"] == "ptx" and entry["source"] == ptx
    cubin = zlib.decompress(base64.b64decode(mod._BINARIES[entry["binary"]]))
    assert cubin[:4] == b"\x7fELF" and ".text.rmsnorm_fwd" in _code(cubin)
