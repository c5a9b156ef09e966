"""Schema 3: record bodies keyed by seq, long ones cut at a page boundary; schema-2 archives keep their layout.

Checked with real LMDB files: where each part of a record lies (pointer, body, tail) and that
the parts make the record's bytes; the cut at every boundary around whole pages; the
in-memory store (no pages, no cut); a schema-2 archive opened by this library keeps reading
and writing records in its own layout, next to its old records; reopening finds everything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from archive import ARCHIVE_SCHEMA_VERSION, Archive, MemoryStore
from archive._archive import cut_body
from evo.codec import dumps, unpack_raw
from tests.archive.helpers import check_record, empty_archive_of_schema, make_problem, make_record, make_variant


def test_new_archive_keeps_a_pointer_a_page_aligned_body_and_a_tail(tmp_path: Path) -> None:
    problem = make_problem()
    recs = [make_record(i, size=8192, registers=8 * i) for i in range(5)]
    with Archive(problem, tmp_path / "a") as ar:
        assert ar.header["schema_version"] == ARCHIVE_SCHEMA_VERSION == 3
        res = ar.add_many(recs)
        page = ar.store.page_size  # type: ignore[attr-defined]
        for r, out in zip(recs, res, strict=True):
            pointer = ar.store.get("records", r.id.encode())
            assert pointer is not None and len(pointer) == 9 and pointer[8] == 1
            assert int.from_bytes(pointer[:8], "big") == out.record.seq
            body, tail = ar.store.get("bodies", pointer[:8]), ar.store.get("tails", pointer[:8])
            assert body is not None and tail is not None
            assert (len(body) + 16) % page == 0 and 0 < len(tail) <= page // 4
            assert body + tail == dumps(out.record)
    with Archive(problem, tmp_path / "a") as ar:  # reopened: every record reads back whole
        assert [r.id for r in ar.records()] == [r.id for r in recs]
        for r in recs:
            back = ar.get(r.id)
            assert back is not None and back.genome.source == r.genome.source
            check_record(back)
        assert ar.add(recs[2]).duplicate  # a duplicate found through the pointer
        assert ar.best() is not None and ar.best().id == recs[4].id  # type: ignore[union-attr]


@pytest.mark.parametrize(("size", "cut"), [(100, None), (3000, None), (4080, None), (4081, 4080), (4096, 4080), (8176, None), (8177, 8176),
                                           (8582, 8176), (9200, 8176), (9201, None), (12272, None),
                                           (12300, 12272)])
def test_cut_after_the_last_whole_page_when_the_rest_is_short(size: int, cut: int | None) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    body, tail = cut_body(data, 4096)
    assert body + tail == data
    assert (len(body), len(tail)) == ((size, 0) if cut is None else (cut, size - cut))


def test_memory_store_keeps_whole_bodies() -> None:
    store = MemoryStore()
    ar = Archive(make_problem(), store)
    rec = make_record(1, size=8192)
    out = ar.add(rec).record
    pointer = store.get("records", rec.id.encode())
    assert pointer is not None and pointer[8] == 0  # no pages, no cut
    assert store.get("bodies", pointer[:8]) == dumps(out) and store.count("tails") == 0


def test_schema_2_archive_keeps_its_layout(tmp_path: Path) -> None:
    """An archive written by a schema-2 library: old records read back, new ones are written as
    schema 2 writes them (whole bytes under the genome id, sources shared), so it stays
    readable by that library."""
    problem = make_problem()
    empty_archive_of_schema(tmp_path / "a", problem, 2)
    base = make_record(3, size=8192, registers=16)
    first = [base, make_variant(base, 64, registers=24)]
    with Archive(problem, tmp_path / "a") as ar:
        res = ar.add_many(first)
        assert ar.header["schema_version"] == 2
        assert ar.store.get("records", base.id.encode()) == dumps(res[0].record)  # whole, by id
        assert unpack_raw(ar.store.get("records", first[1].id.encode()))["genome"]["source_of"] == base.id  # type: ignore[arg-type]
        assert ar.store.count("bodies") == 0 and ar.store.count("tails") == 0
    more = [make_record(4, size=8192, registers=40), make_variant(base, 128, registers=48)]
    with Archive(problem, tmp_path / "a") as ar:
        res2 = ar.add_many(more)
        assert [o.record.seq for o in res2] == [2, 3]
        assert ar.store.get("records", more[0].id.encode()) == dumps(res2[0].record)
        assert ar.store.count("bodies") == 0
        assert [r.id for r in ar.records()] == [r.id for r in first + more]
        for r in first + more:
            back = ar.get(r.id)
            assert back is not None and back.genome.source == r.genome.source
        assert ar.add(base).duplicate and len(ar) == 4
    with Archive.open_readonly(tmp_path / "a") as ro:
        assert [r.genome.source for r in ro.records()] == [r.genome.source for r in first + more]


def test_a_missing_tail_is_a_clear_error_naming_the_record(tmp_path: Path) -> None:
    """A pointer whose tail flag is set but whose tail is gone (a damaged file): reading that record
    raises CorruptArchiveError naming it; the other records still read whole; nothing is written."""
    from archive import CorruptArchiveError, LMDBStore

    problem = make_problem()
    recs = [make_record(i, size=8192, registers=8 * i) for i in range(4)]
    with Archive(problem, tmp_path / "a") as ar:
        ar.add_many(recs)
    s = LMDBStore(tmp_path / "a")
    pointer = s.get("records", recs[1].id.encode())
    assert pointer is not None and pointer[8] == 1
    with s.transaction() as txn:
        txn.delete("tails", pointer[:8])
    s.close()
    before = (tmp_path / "a" / "data.mdb").read_bytes()
    with Archive(problem, tmp_path / "a") as ar:
        with pytest.raises(CorruptArchiveError, match=f"tail of record {recs[1].id} .*is missing"):
            ar.get(recs[1].id)
        with pytest.raises(CorruptArchiveError, match="tail of record"):
            list(ar.records())
        for r in (recs[0], recs[2], recs[3]):
            back = ar.get(r.id)
            assert back is not None and back.genome.source == r.genome.source
    assert (tmp_path / "a" / "data.mdb").read_bytes() == before
