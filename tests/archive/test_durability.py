"""Durability settings of the LMDB store: "full" (the default) and "process"."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from archive import DURABILITY, Archive, ArchiveError, LMDBStore, MemoryStore, Store
from archive._lmdb import _Shared
from archive.testing import StoreContract
from evo.types import Problem
from tests.archive.helpers import check_record, make_record


class TestLMDBStoreProcessDurability(StoreContract):
    """The whole Store contract holds with flushes left to the background thread."""

    def make_store(self, tmp_path: Path) -> Store:
        return LMDBStore(tmp_path / "db", durability="process", sync_interval=0.01)

    def reopen_store(self, tmp_path: Path) -> Store | None:
        return LMDBStore(tmp_path / "db", durability="process", sync_interval=0.01)


def _flushers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("archive-flush")]


def test_default_is_full(tmp_path: Path, problem: Problem) -> None:
    with Archive(problem, tmp_path / "a") as ar:
        assert ar.store.durability == "full"  # type: ignore[attr-defined]
    assert set(DURABILITY) == {"full", "process"} and all(DURABILITY.values())


def test_bad_options_are_refused(tmp_path: Path, problem: Problem) -> None:
    with pytest.raises(ValueError, match="durability must be one of 'full', 'process'"):
        LMDBStore(tmp_path / "db", durability="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sync_interval"):
        LMDBStore(tmp_path / "db", durability="process", sync_interval=-1)
    with pytest.raises(ValueError, match="durability must be one of"):
        Archive(problem, tmp_path / "a", durability="none")  # type: ignore[arg-type]
    for store in (None, MemoryStore()):
        with pytest.raises(ValueError, match="from a path"):
            Archive(problem, store, durability="process")
    assert not (tmp_path / "db").exists() and not (tmp_path / "a").exists()


def test_one_durability_per_path_per_process(tmp_path: Path) -> None:
    a = LMDBStore(tmp_path / "db")
    with pytest.raises(ArchiveError, match="durability='full'"):
        LMDBStore(tmp_path / "db", durability="process")
    a.close()
    b = LMDBStore(tmp_path / "db", durability="process")
    assert b.durability == "process"
    b.close()


def test_background_flush(tmp_path: Path) -> None:
    s = LMDBStore(tmp_path / "db", durability="process", sync_interval=0.02)
    sh = s._sh
    assert sh is not None and sh.flusher is not None and sh.flusher.is_alive()
    s.put("records", b"k", b"v")
    assert sh.dirty  # committed, not yet flushed
    deadline = time.monotonic() + 10
    while sh.dirty and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not sh.dirty
    flusher = sh.flusher
    s.close()
    assert not flusher.is_alive()


def test_zero_interval_flushes_every_commit(tmp_path: Path) -> None:
    before = len(_flushers())
    s = LMDBStore(tmp_path / "db", durability="process", sync_interval=0)
    assert s._sh is not None and s._sh.flusher is None and len(_flushers()) == before
    s.put("records", b"k", b"v")
    assert not s._sh.dirty
    s.close()


def test_sync_and_close_flush(tmp_path: Path, problem: Problem, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = _Shared.flush

    def counting(self: _Shared) -> None:
        calls.append(self.path)
        real(self)

    monkeypatch.setattr(_Shared, "flush", counting)
    store = LMDBStore(tmp_path / "a", durability="process", sync_interval=3600)
    ar = Archive(problem, store)
    ar.add_many([make_record(i, registers=i, fitness=float(i)) for i in range(20)])
    assert calls == []
    ar.sync()
    assert len(calls) == 1
    ar.add(make_record(99))
    ar.close()  # the archive does not own this store
    assert len(calls) == 1
    store.close()
    assert len(calls) == 2  # the last close flushes what is left
    with Archive(problem, tmp_path / "a") as again:  # readable with the default durability
        assert len(again) == 21
        for rec in again.records():
            check_record(rec)


def test_archive_opens_process_durability(tmp_path: Path, problem: Problem) -> None:
    with Archive(problem, tmp_path / "a", durability="process") as ar:
        assert ar.store.durability == "process"  # type: ignore[attr-defined]
        ar.add_many([make_record(i, registers=i, fitness=float(i)) for i in range(10)])
        best = ar.best()
    with Archive(problem, tmp_path / "a") as again:
        assert len(again) == 10 and again.best() == best


def test_close_without_new_commits_does_not_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = LMDBStore(tmp_path / "db", durability="process", sync_interval=3600)
    s.put("records", b"k", b"v")
    s.sync()
    calls: list[str] = []
    monkeypatch.setattr(_Shared, "flush", lambda self: calls.append(self.path))
    s.close()
    assert calls == []


def test_sync_is_harmless_everywhere(tmp_path: Path, problem: Problem) -> None:
    Archive(problem).sync()  # in memory: nothing to flush
    with Archive(problem, tmp_path / "a") as ar:
        ar.add(make_record(1))
        ar.sync()  # "full": already on the disk
    ro = Archive.open_readonly(tmp_path / "a")
    ro.sync()
    assert len(ro) == 1
    ro.close()
