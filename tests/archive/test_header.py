"""Header, resume refusal, bad paths, corruption, read-only opening and forking."""

from __future__ import annotations

import hashlib
from pathlib import Path

import lmdb
import msgpack
import pytest

from archive import (
    ARCHIVE_SCHEMA_VERSION,
    Archive,
    ArchiveError,
    CorruptArchiveError,
    HeaderMismatchError,
    LMDBStore,
    NotAnArchiveError,
    ReadOnlyArchiveError,
    SchemaVersionError,
    fork_archive,
)
from evo.codec import SCHEMA_VERSION, pack_raw, unpack_raw
from evo.types import DeviceInfo, Lesson, Problem
from tests.archive.helpers import make_problem, make_record


def _digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir()) if p.is_file()}


def _filled(path: Path, problem: Problem, n: int = 20) -> None:
    with Archive(problem, path) as ar:
        ar.add_many([make_record(i, registers=i * 11, fitness=float(i), size=3000) for i in range(n)])
        ar.lessons.append(Lesson("m", "c", "x", "improved"))


def test_header_contents(tmp_path: Path, problem: Problem) -> None:
    with Archive(problem, tmp_path / "a") as ar:
        h = ar.header
        assert h["schema_version"] == ARCHIVE_SCHEMA_VERSION and h["problem_fingerprint"] == problem.fingerprint()
        assert h["problem"]["name"] == problem.name and h["device"] is None
        assert h["created"] > 0 and h["library_version"]


def test_different_problem_refused_with_guidance(tmp_path: Path, problem: Problem) -> None:
    _filled(tmp_path / "a", problem)
    other = make_problem(target="sm_80", compile_options=("-O2",))
    before = _digest(tmp_path / "a")
    with pytest.raises(HeaderMismatchError) as ei:
        Archive(other, tmp_path / "a")
    msg = str(ei.value)
    assert "compile_options" in msg and "target" in msg and "name" not in msg.split("differ:")[1]
    assert "force=True" in msg and "fork_archive" in msg
    assert _digest(tmp_path / "a")["data.mdb"] == before["data.mdb"]
    # force: reuse, header now names the new problem and keeps the old fingerprint
    with Archive(other, tmp_path / "a", force=True) as ar:
        assert len(ar) == 20 and ar.header["problem_fingerprint"] == other.fingerprint()
        assert ar.header["history"][0]["problem_fingerprint"] == problem.fingerprint()
    with Archive(other, tmp_path / "a") as ar:  # no force needed any more
        assert len(ar) == 20


def test_force_cannot_change_axes(tmp_path: Path, problem: Problem) -> None:
    _filled(tmp_path / "a", problem)
    with pytest.raises(HeaderMismatchError, match="descriptors"):
        Archive(make_problem(descriptors=False), tmp_path / "a", force=True)


def test_fork_archive(tmp_path: Path, problem: Problem) -> None:
    _filled(tmp_path / "a", problem)
    flat = make_problem(name="flat", descriptors=False)
    with fork_archive(tmp_path / "a", tmp_path / "b", flat) as ar:
        assert len(ar) == 20 and ar.n_cells == 1 and ar.best().fitness == 19.0  # type: ignore[union-attr]
        assert len(ar.lessons) == 1 and ar.header["problem"]["name"] == "flat"
        assert [r.seq for r in ar.records()] == list(range(20))
    with pytest.raises(ArchiveError, match="already holds"):
        fork_archive(tmp_path / "a", tmp_path / "b", flat)


def test_device_recorded_once(tmp_path: Path, problem: Problem) -> None:
    h100 = DeviceInfo("NVIDIA H100", "9.0", sm_count=132)
    with Archive(problem, tmp_path / "a", device={"name": "NVIDIA H100", "compute_capability": None}) as ar:
        ar.set_device(h100)  # fills in the unknown compute capability
        assert ar.header["device"] == {"name": "NVIDIA H100", "compute_capability": "9.0"}
    with Archive(problem, tmp_path / "a", device=h100) as ar:
        assert ar.header["device"]["compute_capability"] == "9.0"
    with pytest.raises(HeaderMismatchError, match="A100"):
        Archive(problem, tmp_path / "a", device=DeviceInfo("NVIDIA A100", "8.0"))
    with Archive(problem, tmp_path / "a") as ar:
        with pytest.raises(HeaderMismatchError):
            ar.set_device(DeviceInfo("NVIDIA H200", "9.0"))
        ar.set_device(DeviceInfo("NVIDIA H200", "9.0"), force=True)
        assert ar.header["device"]["name"] == "NVIDIA H200"


def test_newer_schema_refused(tmp_path: Path, problem: Problem) -> None:
    _filled(tmp_path / "a", problem)
    s = LMDBStore(tmp_path / "a")
    header = unpack_raw(s.get("header", b"meta"))  # type: ignore[arg-type]
    s.put("header", b"meta", msgpack.packb([SCHEMA_VERSION + 1, "raw", header]))
    s.close()
    with pytest.raises(SchemaVersionError, match="upgrade"):
        Archive(problem, tmp_path / "a")
    s = LMDBStore(tmp_path / "a")
    s.put("header", b"meta", pack_raw({**header, "schema_version": ARCHIVE_SCHEMA_VERSION + 1}))
    s.close()
    with pytest.raises(SchemaVersionError, match="upgrade"):
        Archive.open_readonly(tmp_path / "a")


def test_not_an_archive_paths(tmp_path: Path, problem: Problem) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    with pytest.raises(NotAnArchiveError, match="is a file"):
        Archive(problem, text)
    assert text.read_text() == "hello\n"
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "a.csv").write_text("1,2\n")
    with pytest.raises(NotAnArchiveError, match="a.csv"):
        Archive(problem, junk)
    assert sorted(p.name for p in junk.iterdir()) == ["a.csv"]
    foreign = tmp_path / "foreign"
    env = lmdb.open(str(foreign), max_dbs=2)
    with env.begin(write=True) as txn:
        txn.put(b"x", b"y", db=env.open_db(b"other", txn=txn))
    env.close()
    before = _digest(foreign)
    with pytest.raises(NotAnArchiveError, match="not a kernel-factory archive"):
        Archive(problem, foreign)
    assert _digest(foreign)["data.mdb"] == before["data.mdb"]
    with pytest.raises(NotAnArchiveError):
        Archive.open_readonly(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
    # our sub-databases but no header and some data: not an archive either
    s = LMDBStore(tmp_path / "headless")
    s.put("records", b"k", b"v")
    s.close()
    with pytest.raises(NotAnArchiveError, match="no archive header"):
        Archive(problem, tmp_path / "headless")


@pytest.mark.parametrize("damage", ["truncate_half", "truncate_tiny", "garbage", "bad_record", "bad_pointer",
                                    "missing_body"])
def test_corrupt_archive(tmp_path: Path, problem: Problem, damage: str) -> None:
    path = tmp_path / "a"
    _filled(path, problem, n=60)
    data = path / "data.mdb"
    raw = data.read_bytes()
    if damage == "truncate_half":
        data.write_bytes(raw[: len(raw) // 2])
    elif damage == "truncate_tiny":
        data.write_bytes(raw[:100])
    elif damage == "garbage":
        data.write_bytes(b"\x5a" * len(raw))
    else:
        s = LMDBStore(path)
        key, pointer = next(iter(s.scan("records")))
        if damage == "bad_record":
            s.put("bodies", pointer[:8], b"\x93\x01\xa6record\xde")  # truncated msgpack
        elif damage == "bad_pointer":
            s.put("records", key, b"\x00\x01")
        else:
            with s.transaction() as txn:
                txn.delete("bodies", pointer[:8])
        s.close()
    before = data.read_bytes()
    if damage in ("bad_record", "bad_pointer", "missing_body"):
        expect = {"bad_record": "cannot be decoded", "bad_pointer": "pointer of record .* is damaged",
                  "missing_body": "body of record .* is missing"}[damage]
        with Archive(problem, path) as ar:
            with pytest.raises(CorruptArchiveError, match=expect):
                list(ar.records())
            with pytest.raises(CorruptArchiveError, match=expect):
                ar.get(key.decode())
        return
    with pytest.raises(CorruptArchiveError, match="damaged"):
        Archive(problem, path)
    with pytest.raises(CorruptArchiveError):
        Archive.open_readonly(path)
    assert data.read_bytes() == before


def test_open_readonly(tmp_path: Path, problem: Problem) -> None:
    _filled(tmp_path / "a", problem)
    ro = Archive.open_readonly(tmp_path / "a")
    assert ro.problem is None and ro.readonly
    assert len(ro) == 20 and ro.n_cells == 16 and ro.best().fitness == 19.0  # type: ignore[union-attr]
    assert [a.name for a in ro.axes] == ["registers", "variant"]
    assert ro.header["problem"]["name"] == problem.name
    with pytest.raises(ReadOnlyArchiveError):
        ro.add(make_record(99))
    with pytest.raises(ReadOnlyArchiveError):
        ro.lessons.append(Lesson("m", "c", "x", "y"))
    with pytest.raises(ReadOnlyArchiveError):
        ro.save_state({})
    ro.close()
