"""benchmarks/surrogate_bench.py on a real archive of a known landscape (CPU only)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from archive import Archive
from evo.types import Record
from operators import ParamMutation
from operators.testing import make_context
from tests.operators.test_screen import SPACE, evaluation, problem, random_genomes

ROOT = Path(__file__).resolve().parents[2]


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("surrogate_bench", ROOT / "benchmarks" / "surrogate_bench.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _archive(path: Path) -> None:
    a = Archive(problem(), str(path))
    seeds = random_genomes(30, 11)
    for g in seeds:
        a.add(Record(genome=g, evaluation=evaluation(g.params), operator="seed"))
    mut = ParamMutation()
    for i in range(30):
        parent = a.get(seeds[i].id)
        (child,) = mut.propose([parent], make_context(problem(), i))
        if child.genome.id not in a:
            a.add(Record(genome=child.genome, evaluation=evaluation(child.genome.params), operator="param_mutation",
                         parents=(parent.id,)))
    a.close()


def test_bench_reads_the_space_and_scores_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    _archive(tmp_path / "a.lmdb")
    a = Archive.open_readonly(str(tmp_path / "a.lmdb"))
    try:
        space = bench.space_from_header(a.header["problem"])
    finally:
        a.close()
    assert {n: type(s) for n, s in space.params.items()} == {n: type(s) for n, s in SPACE.params.items()}
    assert bench.main([str(tmp_path / "a.lmdb"), "--k", "5"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    median = float(line.split("Spearman median ")[1].split()[0])
    right, total = (int(x) for x in line.split("sign right ")[1].split(" (")[0].split(" of "))
    assert median > 0.8 and total > 10 and right / total > 0.5, line  # the landscape is learnable


def test_bench_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    assert bench.main([str(tmp_path / "missing.lmdb")]) == 2
    assert "surrogate_bench:" in capsys.readouterr().err
    a = Archive(problem(), str(tmp_path / "small.lmdb"))
    g = random_genomes(1, 1)[0]
    a.add(Record(genome=g, evaluation=evaluation(g.params)))
    a.close()
    assert bench.main([str(tmp_path / "small.lmdb")]) == 2
    assert "need 4 or more" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main([str(tmp_path / "small.lmdb"), "--k", "0"])
    assert bench.spearman([1.0, 2.0], [1.0, 2.0]) != bench.spearman([1.0, 2.0], [1.0, 2.0])  # NaN below 3 points
