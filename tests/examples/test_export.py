"""evo.export: best genome per case and the generated dispatch module (CPU parts)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from evo.export import ExportError, best_per_case, export_module
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
        assert mod.select({"M": 10, "N": 300}, "bfloat16")["id"] == small.id
        assert mod.select({"M": 10, "N": 40000}, "bfloat16")["id"] == large.id
        L = mod.launch_config({"M": 10, "N": 300}, "bfloat16")
        assert L.block == (128, 1, 1) and L.grid == (3, 1, 1)
        with pytest.raises(KeyError, match="no exported genome"):
            mod.select({"M": 1, "N": 1}, "float32")
    finally:
        sys.modules.pop("rms_dispatch", None)


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
