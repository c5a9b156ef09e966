"""Shared sources (schema 2): parameter variants store a reference to a record holding their source.

Checked: every read returns the full record (every field, hypothesis-generated records
included), a record holding its source is stored as exactly ``codec.dumps`` of it, the
sharing is all or nothing with its transaction, older (schema-1) archives keep every source
inline, a newer schema is refused, and a dangling reference is reported as damage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import archive._archive as archive_module
from archive import (
    ARCHIVE_SCHEMA_VERSION,
    Archive,
    CorruptArchiveError,
    InvalidRecordError,
    LMDBStore,
    MemoryStore,
    SchemaVersionError,
    fork_archive,
)
from evo.codec import dumps, loads, unpack_raw
from evo.types import Genome, Record
from tests.archive.helpers import check_record, empty_archive_of_schema, make_problem, make_record, make_variant
from tests.evo.test_codec import _same, evaluations, params, text

BIG = 4000  # source characters: above the size from which sources are shared


def _family(i: int, n: int, size: int = BIG) -> list[Record]:
    base = make_record(i, registers=10, fitness=1.0, size=size)
    return [base] + [make_variant(base, 64 + k, registers=40 * k % 256, variant="ab"[k % 2]) for k in range(1, n)]


def _stored(ar: Archive, rec: Record) -> bytes:
    raw = ar._raw(ar.store.get, rec.id.encode())  # through the schema-3 pointer
    assert raw is not None
    return raw


def test_variants_store_the_source_once(archive: Archive) -> None:
    fam = _family(1, 10)
    res = archive.add_many(fam[:4])
    res += [archive.add(r) for r in fam[4:]]  # later transactions refer to the same record
    base_raw = _stored(archive, fam[0])
    assert base_raw == dumps(res[0].record)  # the record holding the source: exactly the codec's bytes
    for r in fam[1:]:
        raw = _stored(archive, r)
        assert len(raw) < 600 < BIG  # a reference, not a copy
        assert unpack_raw(raw)["genome"]["source_of"] == fam[0].id
    fresh = Archive(make_problem(), archive.store)  # decodes from the store, not from the cache
    for r, out in zip(fam, res, strict=True):
        back = fresh.get(r.id)
        assert back is not None and back.genome.source == r.genome.source and back.id == r.id
        assert _same(back, out.record)
        check_record(back)
    assert [b.id for b in fresh.records()] == [r.id for r in fam]
    assert {e.id for e in fresh.elites()} <= {r.id for r in fam}
    fresh.close()


def test_duplicate_of_a_variant_returns_the_full_record(archive: Archive) -> None:
    fam = _family(2, 3)
    archive.add_many(fam)
    fresh = Archive(make_problem(), archive.store)
    again = fresh.add(fam[2])
    assert again.duplicate and again.record.genome.source == fam[0].genome.source and again.record.seq == 2
    fresh.close()


def test_short_sources_stay_inline(archive: Archive) -> None:
    fam = _family(3, 4, size=100)
    res = archive.add_many(fam)
    for r, out in zip(fam, res, strict=True):
        assert _stored(archive, r) == dumps(out.record)


def test_read_records_are_shared_from(tmp_path: Path) -> None:
    """After reopening, a variant of a record read back (an elite, a parent) refers to it."""
    problem = make_problem()
    with Archive(problem, tmp_path / "a") as ar:
        ar.add_many(_family(4, 2))
    with Archive(problem, tmp_path / "a") as ar:
        parent = ar.best()
        assert parent is not None
        child = make_variant(parent, 999, registers=200)
        ar.add(child)
        assert unpack_raw(_stored(ar, child))["genome"]["source_of"] in {r.id for r in _family(4, 2)}
    with Archive.open_readonly(tmp_path / "a") as ro:  # read-only opening (the CLI, reports) resolves too
        assert [r.genome.source for r in ro.records()] == [parent.genome.source] * 3
        check_record(ro.get(child.id))  # type: ignore[arg-type]


def test_failed_batch_shares_nothing(archive: Archive) -> None:
    """A source first written by a batch that failed is not referred to afterwards."""
    fam = _family(5, 2)
    bad = make_record(6).replace(meta={"x": object()})  # cannot be encoded
    with pytest.raises(InvalidRecordError):
        archive.add_many([fam[0], bad])
    assert len(archive) == 0
    archive.add(fam[1])
    assert _stored(archive, fam[1]) == dumps(archive.get(fam[1].id))  # inline: fam[0] was never stored
    archive.add(fam[0])
    fresh = Archive(make_problem(), archive.store)
    assert fresh.get(fam[0].id).genome.source == fam[0].genome.source  # type: ignore[union-attr]
    fresh.close()


def test_schema_1_archive_keeps_sources_inline(tmp_path: Path) -> None:
    """An archive written before schema 2 stays readable by older libraries: no references are added."""
    problem = make_problem()
    empty_archive_of_schema(tmp_path / "a", problem, 1)
    fam = _family(7, 5)
    with Archive(problem, tmp_path / "a") as ar:
        res = ar.add_many(fam)
        assert ar.header["schema_version"] == 1
        for r, out in zip(fam, res, strict=True):
            raw = _stored(ar, r)
            assert raw == dumps(out.record) and loads(raw).genome.source == r.genome.source


def test_newer_schema_refused_by_an_older_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    problem = make_problem()
    with Archive(problem, tmp_path / "a") as ar:
        ar.add_many(_family(8, 3))
        assert ar.header["schema_version"] == ARCHIVE_SCHEMA_VERSION == 3
    monkeypatch.setattr(archive_module, "ARCHIVE_SCHEMA_VERSION", 2)  # a library of schema 2
    with pytest.raises(SchemaVersionError, match="schema version 3, newer than this library's 2: upgrade"):
        Archive(problem, tmp_path / "a")
    with pytest.raises(SchemaVersionError, match="upgrade"):
        Archive.open_readonly(tmp_path / "a")


def test_missing_source_record_is_damage(tmp_path: Path) -> None:
    problem = make_problem()
    fam = _family(9, 2)
    with Archive(problem, tmp_path / "a") as ar:
        ar.add_many(fam)
    s = LMDBStore(tmp_path / "a")
    with s.transaction() as txn:
        txn.delete("records", fam[0].id.encode())
    s.close()
    with Archive(problem, tmp_path / "a") as ar:
        with pytest.raises(CorruptArchiveError, match=f"source from record {fam[0].id}, which is missing"):
            ar.get(fam[1].id)


def test_fork_keeps_full_records(tmp_path: Path) -> None:
    problem = make_problem()
    fam = _family(10, 6)
    with Archive(problem, tmp_path / "a") as ar:
        ar.add_many(fam)
    with fork_archive(tmp_path / "a", tmp_path / "b", make_problem(name="flat", descriptors=False)) as out:
        assert [r.id for r in out.records()] == [r.id for r in fam]
        for r in out.records():
            check_record(r)
        assert len(_stored(out, fam[5])) < 600  # shared in the copy as well


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(source=st.text(st.characters(blacklist_categories=("Cs",)), min_size=600, max_size=2000), base_params=params, variants=st.lists(
    st.tuples(params, evaluations(), st.lists(text, max_size=2).map(tuple), text, st.integers(0, 10**6),
              st.dictionaries(text, text, max_size=2)), min_size=1, max_size=5))
def test_every_field_round_trips(source: str, base_params: dict[str, Any], variants: list[Any]) -> None:
    """Variants of one source with arbitrary params, evaluations and metadata read back equal."""
    problem = make_problem(descriptors=False)
    base = Record(Genome(source, {**base_params, "_k": 0}), make_record(0).evaluation)
    recs = [base]
    for p, ev, parents, op, gen, meta in variants:
        recs.append(Record(Genome(base.genome.source, {**p, "_k": len(recs)}), ev, parents=parents, operator=op,
                           generation=gen, meta=meta))
    store = MemoryStore()
    ar = Archive(problem, store)
    res = ar.add_many(recs)
    fresh = Archive(problem, store)
    for out in res[1:]:  # stored as references to the first
        assert unpack_raw(ar._raw(store.get, out.record.id.encode()))["genome"]["source_of"] == base.id  # type: ignore[arg-type]
    for out in res:
        assert not out.duplicate
        back = fresh.get(out.record.id)
        assert back is not None and _same(back, out.record) and back.id == out.record.id
        assert loads(dumps(back)).genome.source == source
    assert all(_same(a, b.record) for a, b in zip(fresh.records(), res, strict=True))
