"""Archive behaviour over both stores: grid, adds, reads, lineage, lessons, state."""

from __future__ import annotations

import gc
import math
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from archive import AddStatus, Archive, InvalidRecordError, MemoryStore
from evo.types import Evaluation, Genome, Lesson, Record, Status
from tests.archive.helpers import check_record, make_problem, make_record


def test_add_statuses_and_grid(archive: Archive) -> None:
    r1 = archive.add(make_record(1, registers=10, fitness=1.0))
    assert r1.status is AddStatus.NEW and r1.previous is None and not r1.duplicate
    assert r1.record.cell == (0, 0) and r1.record.seq == 0
    assert r1.record.descriptors == {"registers": 10, "variant": "a"}
    r2 = archive.add(make_record(2, registers=20, fitness=2.0))  # same cell (bin width 32), better
    assert r2.status is AddStatus.IMPROVED and r2.previous is not None and r2.previous.id == r1.record.id
    r3 = archive.add(make_record(3, registers=5, fitness=1.5))  # same cell, worse
    assert r3.status is AddStatus.NOT_ADDED and not r3.duplicate and r3.record.seq == 2
    r4 = archive.add(make_record(4, registers=250, variant="b", fitness=0.5))
    assert r4.status is AddStatus.NEW and r4.record.cell == (7, 1)
    fail = archive.add(make_record(5, status=Status.COMPILE_ERROR))
    assert fail.status is AddStatus.NOT_ADDED and fail.record.cell is None
    assert AddStatus.NOT_ADDED < AddStatus.IMPROVED < AddStatus.NEW
    assert len(archive) == 5
    assert [r.seq for r in archive.records()] == [0, 1, 2, 3, 4]
    assert [r.id for r in archive.records(Status.COMPILE_ERROR)] == [fail.record.id]
    assert archive.counts()["ok"] == 4 and archive.counts()["compile_error"] == 1
    assert sum(archive.counts().values()) == 5
    assert archive.n_cells == 16 and archive.n_elites == 2
    assert archive.coverage == pytest.approx(2 / 16)
    assert archive.best().id == r2.record.id  # type: ignore[union-attr]
    # qd score: offset is the lowest OK fitness seen (0.5): (2 - .5 + 1) + (.5 - .5 + 1)
    assert archive.qd_score == pytest.approx(3.5)
    assert {e.id for e in archive.elites()} == {r2.record.id, r4.record.id}
    assert archive.elite((7, 1)).id == r4.record.id  # type: ignore[union-attr]
    assert archive.elite((3, 0)) is None
    assert fail.record.id in archive and "nope" not in archive
    assert archive.get(fail.record.id).status is Status.COMPILE_ERROR  # type: ignore[union-attr]


def test_duplicate_changes_nothing(archive: Archive) -> None:
    rec = make_record(1)
    first = archive.add(rec)
    again = archive.add(rec.replace(operator="other", created=0.0))
    assert again.status is AddStatus.NOT_ADDED and again.duplicate
    assert again.record.seq == first.record.seq and again.record.operator == "seed"
    assert len(archive) == 1 and archive.counts()["ok"] == 1
    # same genome up to whitespace/comments is the same id
    g2 = Genome(rec.genome.source.replace(" ", "  ") + "\n// note\n", dict(rec.genome.params))
    assert archive.add(Record(g2, rec.evaluation)).duplicate


def test_no_descriptors_is_one_cell(tmp_path: Path) -> None:
    ar = Archive(make_problem(descriptors=False), tmp_path / "a")
    assert ar.n_cells == 1
    assert ar.add(make_record(1, fitness=1.0)).status is AddStatus.NEW
    assert ar.add(make_record(2, fitness=3.0)).status is AddStatus.IMPROVED
    assert ar.add(make_record(3, fitness=2.0)).status is AddStatus.NOT_ADDED
    assert ar.best().fitness == 3.0 and ar.coverage == 1.0  # type: ignore[union-attr]
    assert ar.elite(()).fitness == 3.0  # type: ignore[union-attr]
    ar.close()


def test_add_many_one_transaction(archive: Archive) -> None:
    recs = [make_record(i, registers=8 * i, fitness=float(i)) for i in range(10)]
    recs.append(recs[3])  # duplicate inside the batch
    recs.append(make_record(100, registers=1, fitness=50.0))  # beats recs[3], the elite of cell (0, 0)
    res = archive.add_many(recs)
    assert [r.record.seq for r in res[:10]] == list(range(10))
    assert res[10].duplicate and res[10].record.seq == 3
    assert res[11].status is AddStatus.IMPROVED and res[11].previous.id == recs[3].id  # type: ignore[union-attr]
    assert len(archive) == 11
    assert archive.add_many([]) == []


@pytest.mark.parametrize("enabled", [True, False])
def test_add_many_pauses_and_restores_the_garbage_collector(archive: Archive, enabled: bool) -> None:
    """The cyclic GC is off while a batch is written and back as it was after, also after a failure."""
    seen: list[bool] = []

    class Spy(list):
        def __iter__(self):  # add_many iterates its argument inside the pause
            seen.append(gc.isenabled())
            return super().__iter__()

    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        archive.add_many(Spy([make_record(i) for i in range(3)]))
        assert seen == [False] and gc.isenabled() is enabled
        with pytest.raises(InvalidRecordError):
            archive.add_many([make_record(7), "not a record"])  # type: ignore[list-item]
        assert gc.isenabled() is enabled
        assert archive.add_many(Spy()) == [] and gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


@pytest.mark.parametrize("bad", ["category", "missing", "nan", "not_a_record"])
def test_bad_input_leaves_archive_unchanged(archive: Archive, bad: str, tmp_path: Path) -> None:
    archive.add_many([make_record(i, registers=i) for i in range(5)])
    before_len, before_counts = len(archive), archive.counts()
    data = archive.path / "data.mdb" if archive.path else None
    before_bytes = data.read_bytes() if data else None
    good = make_record(50)
    if bad == "category":
        rec = make_record(99, variant="c")  # valid param, but not a category of the axis
    elif bad == "missing":
        rec = Record(Genome("x", {"variant": "a"}), Evaluation(Status.OK, fitness=1.0))
    elif bad == "nan":
        rec = make_record(99, registers=float("nan"))
    else:
        rec = "not a record"  # type: ignore[assignment]
    with pytest.raises(InvalidRecordError) as ei:
        archive.add_many([good, rec])
    msg = str(ei.value)
    assert "nothing was written" in msg or "Record" in msg
    if bad == "category":
        assert "'c'" in msg and "variant" in msg
    with pytest.raises(InvalidRecordError):
        archive.add(rec)
    assert len(archive) == before_len and archive.counts() == before_counts
    assert good.id not in archive
    if data:
        assert data.read_bytes() == before_bytes


def test_sample_elites_fast_and_uniform(archive: Archive) -> None:
    recs = [make_record(i, registers=(i % 8) * 32, variant="ab"[i % 2], fitness=float(i), size=8192)
            for i in range(64)]
    archive.add_many(recs)
    rng = np.random.default_rng(0)
    assert archive.sample_elites(0, rng) == []
    elites = {e.id for e in archive.elites()}
    assert len(elites) == 8
    seen = [r.id for r in archive.sample_elites(4000, rng)]
    assert set(seen) == elites
    assert min(seen.count(e) for e in elites) > 350  # ~500 each
    times = []
    for _ in range(300):
        t = time.perf_counter()
        archive.sample_elites(8, rng)
        times.append(time.perf_counter() - t)
    assert statistics.median(times) < 1e-3


def test_empty_archive_reads(archive: Archive) -> None:
    assert archive.best() is None and archive.coverage == 0.0 and archive.qd_score == 0.0
    assert archive.sample_elites(3, np.random.default_rng()) == []
    assert list(archive.records()) == [] and len(archive) == 0
    assert archive.load_state() is None


def test_infinite_fitness(archive: Archive) -> None:
    archive.add(make_record(1, fitness=1.0))
    archive.add(make_record(2, registers=100, fitness=math.inf))
    assert archive.best().fitness == math.inf  # type: ignore[union-attr]
    assert archive.qd_score == math.inf


def test_other_instance_sees_new_elites(tmp_path: Path, problem) -> None:  # type: ignore[no-untyped-def]
    a = Archive(problem, tmp_path / "x")
    b = Archive(problem, tmp_path / "x")
    a.add(make_record(1, fitness=1.0))
    assert b.best().id == make_record(1).id  # type: ignore[union-attr]
    a.add(make_record(2, fitness=5.0))
    assert b.best().fitness == 5.0  # type: ignore[union-attr]
    b.add(make_record(3, fitness=9.0))
    assert a.best().fitness == 9.0 and len(a) == 3  # type: ignore[union-attr]
    a.close()
    b.close()


def test_lineage(archive: Archive) -> None:
    seed = make_record(1, fitness=1.0)
    other_seed = make_record(2, fitness=1.0, variant="b")
    a = make_record(3, parents=(seed.id,), operator="mutate", fitness=2.0)
    b = make_record(4, parents=(a.id,), operator="llm_rewrite", fitness=3.0)
    c = make_record(5, parents=(b.id, other_seed.id), operator="crossover", fitness=4.0)
    archive.add_many([seed, other_seed, a, b, c])
    lin = archive.lineage()
    assert lin.graph.has_edge(seed.id, a.id) and lin.graph.edges[a.id, b.id]["operator"] == "llm_rewrite"
    assert lin.ancestors(c.id) == {seed.id, a.id, b.id, other_seed.id}
    assert lin.descendants(seed.id) == {a.id, b.id, c.id}
    assert lin.path_to(c.id) == [other_seed.id, c.id]  # the nearest seed
    assert lin.path_to(b.id) == [seed.id, a.id, b.id]
    assert lin.operators(lin.path_to(b.id)) == [None, "mutate", "llm_rewrite"]
    lone = make_record(9)
    archive.add(lone)
    assert archive.lineage().path_to(lone.id) == [lone.id]
    assert archive.lineage().ancestors(lone.id) == set()
    with pytest.raises(Exception, match="no record"):
        archive.lineage().path_to("f" * 32)


def test_lessons(archive: Archive) -> None:
    ls = [Lesson(operator=("mutate", "llm")[i % 2], child_id=f"c{i}", change=f"threads {i}",
                 outcome=("improved", "no_gain", "compile_error")[i % 3], parent_id=f"p{i % 4}", delta=0.01 * i)
          for i in range(12)]
    stored = [archive.lessons.append(le) for le in ls]
    assert [s.seq for s in stored] == list(range(12))
    assert len(archive.lessons) == 12
    assert [le.child_id for le in archive.lessons.recent(3)] == ["c9", "c10", "c11"]
    assert archive.lessons.recent(0) == []
    assert [le.child_id for le in archive.lessons.by_parent("p1")] == ["c1", "c5", "c9"]
    assert len(archive.lessons.by_operator("llm")) == 6
    assert [le.child_id for le in archive.lessons.by_outcome(Status.COMPILE_ERROR)] == ["c2", "c5", "c8", "c11"]
    assert [le.seq for le in archive.lessons.all()] == list(range(12))


def test_state_round_trip(archive: Archive) -> None:
    state = {"generation": 7, "rng": {"bit_generator": "PCG64", "state": {"state": 2**100, "inc": 3}},
             "bytes": b"\x00\x01", "nested": [1, [2.5, None]], "ratio": math.inf}
    archive.save_state(state)
    assert archive.load_state() == state
    archive.save_state({"generation": 8})
    assert archive.load_state() == {"generation": 8}


def test_reopen_resumes(tmp_path: Path, problem) -> None:  # type: ignore[no-untyped-def]
    ar = Archive(problem, tmp_path / "a")
    ar.add_many([make_record(i, registers=i * 9, fitness=float(i)) for i in range(30)])
    ar.lessons.append(Lesson("m", "c", "x", "improved"))
    ar.save_state({"g": 3})
    best, cov, qd = ar.best(), ar.coverage, ar.qd_score
    ar.close()
    ar = Archive(problem, tmp_path / "a")
    assert len(ar) == 30 and ar.best() == best and ar.coverage == cov and ar.qd_score == qd
    assert ar.load_state() == {"g": 3} and len(ar.lessons) == 1
    assert ar.add(make_record(100)).record.seq == 30
    assert ar.lessons.append(Lesson("m", "c", "x", "improved")).seq == 1
    for rec in ar.records():
        check_record(rec)
    ar.close()


def test_map_growth_through_archive(tmp_path: Path, problem) -> None:  # type: ignore[no-untyped-def]
    ar = Archive(problem, tmp_path / "a", map_size=64 << 10)
    for i in range(150):
        ar.add(make_record(i, registers=i, size=8192))
    ar.add_many([make_record(1000 + i, size=8192) for i in range(400)])
    assert len(ar) == 550
    assert ar.store.map_size > 64 << 10  # type: ignore[attr-defined]
    for rec in ar.records():
        check_record(rec)
    ar.close()


def test_memory_archive_on_given_store(problem) -> None:  # type: ignore[no-untyped-def]
    store = MemoryStore()
    ar = Archive(problem, store)
    ar.add(make_record(1))
    ar.close()  # does not close a store it did not open
    again = Archive(problem, store)
    assert len(again) == 1
