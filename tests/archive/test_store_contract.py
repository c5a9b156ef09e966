"""The Store contract run against both shipped stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from archive import LMDBStore, MemoryStore, Store
from archive.testing import StoreContract


class TestMemoryStore(StoreContract):
    def make_store(self, tmp_path: Path) -> Store:
        return MemoryStore()


class TestLMDBStore(StoreContract):
    def make_store(self, tmp_path: Path) -> Store:
        return LMDBStore(tmp_path / "db")

    def reopen_store(self, tmp_path: Path) -> Store | None:
        return LMDBStore(tmp_path / "db")


class TestLMDBStoreTinyMap(StoreContract):
    """The same contract with a 64 KiB initial map: every test must trigger growth silently."""

    def make_store(self, tmp_path: Path) -> Store:
        return LMDBStore(tmp_path / "db", map_size=64 << 10)

    def reopen_store(self, tmp_path: Path) -> Store | None:
        return LMDBStore(tmp_path / "db", map_size=64 << 10)


def test_one_environment_per_path(tmp_path: Path) -> None:
    a = LMDBStore(tmp_path / "db")
    b = LMDBStore(str(tmp_path / "db") + "/")
    assert a._sh is b._sh
    a.put("records", b"k", b"v")
    a.close()
    assert b.get("records", b"k") == b"v"  # still open through b
    b.close()
    c = LMDBStore(tmp_path / "db")
    assert c.get("records", b"k") == b"v"
    c.close()


def test_map_grows_inside_one_big_transaction(tmp_path: Path) -> None:
    s = LMDBStore(tmp_path / "db", map_size=32 << 10)
    start = s.map_size
    with s.transaction() as txn:
        n = txn.count("records")
        for i in range(2000):
            txn.put("records", i.to_bytes(4, "big"), bytes([i % 251]) * 2000)
        assert txn.get("records", (5).to_bytes(4, "big")) == bytes([5]) * 2000
    assert n == 0
    assert s.map_size > start
    assert s.count("records") == 2000
    assert all(v == bytes([int.from_bytes(k, "big") % 251]) * 2000 for k, v in s.scan("records"))
    s.close()


def test_readonly_store_refuses_writes(tmp_path: Path) -> None:
    LMDBStore(tmp_path / "db").close()
    r = LMDBStore(tmp_path / "db", readonly=True, create=False)
    with pytest.raises(Exception, match="read-only"):
        r.put("records", b"k", b"v")
    r.close()
