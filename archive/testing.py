"""Reusable test suites for third-party stores (like ``optuna.testing``).

Subclass :class:`StoreContract` in a pytest module and implement ``make_store``; every
``test_*`` method then checks one rule of the :class:`~archive.Store` contract::

    from archive.testing import StoreContract

    class TestMyStore(StoreContract):
        def make_store(self, tmp_path):
            return MyStore(tmp_path / "db")

``reopen_store`` (optional) reopens the same data to check persistence; leave it
returning None for stores that live in memory.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from archive._store import Store

__all__ = ["StoreContract"]


class StoreContract:
    """Tests every :class:`Store` must pass. Subclasses implement :meth:`make_store`."""

    def make_store(self, tmp_path: Path) -> Store:
        """Return a new, empty store (data may live under ``tmp_path``)."""
        raise NotImplementedError

    def reopen_store(self, tmp_path: Path) -> Store | None:
        """Return a store over the same data as the last ``make_store`` (None: not persistent)."""
        return None

    @pytest.fixture
    def store(self, tmp_path: Path) -> Any:
        s = self.make_store(tmp_path)
        yield s
        s.close()

    # -- single writes ---------------------------------------------------------------

    def test_empty(self, store: Store) -> None:
        assert store.is_empty()
        for db in Store.DBS:
            assert store.count(db) == 0
            assert list(store.scan(db)) == []
        assert store.get("records", b"x") is None

    def test_put_get_overwrite(self, store: Store) -> None:
        store.put("records", b"k", b"v1")
        assert store.get("records", b"k") == b"v1"
        store.put("records", b"k", b"v2")
        assert store.get("records", b"k") == b"v2"
        assert store.count("records") == 1
        assert store.get("cells", b"k") is None  # sub-databases are separate

    def test_empty_and_large_values(self, store: Store) -> None:
        big = bytes(range(256)) * 4096  # 1 MiB
        store.put("records", b"big", big)
        store.put("records", b"nil", b"")
        assert store.get("records", b"big") == big
        assert store.get("records", b"nil") == b""

    def test_bad_names_and_keys(self, store: Store) -> None:
        with pytest.raises(KeyError, match="unknown sub-database"):
            store.put("nope", b"k", b"v")
        with pytest.raises(KeyError):
            store.get("nope", b"k")
        with pytest.raises(ValueError):
            store.put("records", b"", b"v")
        with pytest.raises(ValueError):
            store.put("records", b"k" * 600, b"v")
        with pytest.raises(TypeError):
            store.put("records", "k", b"v")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.put("records", b"k", "v")  # type: ignore[arg-type]
        assert store.count("records") == 0

    # -- scans -----------------------------------------------------------------------

    def test_scan_order_and_prefix(self, store: Store) -> None:
        keys = [b"a", b"a\x00", b"a\xff", b"a\xff\xff", b"ab", b"b", b"\xff", b"\xff\x01", b"\x00z"]
        with store.transaction() as txn:
            for k in keys:
                txn.put("lessons", k, k + b"!")
        assert [k for k, _ in store.scan("lessons")] == sorted(keys)
        assert [k for k, _ in store.scan("lessons", reverse=True)] == sorted(keys, reverse=True)
        for prefix in (b"a", b"a\xff", b"\xff", b"b", b"c", b"\x00"):
            want = sorted(k for k in keys if k.startswith(prefix))
            assert [k for k, _ in store.scan("lessons", prefix)] == want, prefix
            assert [k for k, _ in store.scan("lessons", prefix, reverse=True)] == want[::-1], prefix
        assert all(v == k + b"!" for k, v in store.scan("lessons"))

    def test_long_scan_both_ways(self, store: Store) -> None:
        n = 1500  # more than one internal chunk in chunked implementations
        with store.transaction() as txn:
            for i in range(n):
                txn.put("index", b"s" + i.to_bytes(8, "big"), str(i).encode())
            txn.put("index", b"t", b"other")
        fwd = [int(v) for _, v in store.scan("index", b"s")]
        assert fwd == list(range(n))
        rev = [int(v) for _, v in store.scan("index", b"s", reverse=True)]
        assert rev == list(range(n))[::-1]

    # -- transactions ----------------------------------------------------------------

    def test_transaction_commits_and_reads_own_writes(self, store: Store) -> None:
        with store.transaction() as txn:
            txn.put("records", b"a", b"1")
            txn.put("records", b"b", b"2")
            assert txn.get("records", b"a") == b"1"
            assert txn.count("records") == 2
            assert [k for k, _ in txn.scan("records")] == [b"a", b"b"]
            assert store.get("records", b"a") is None  # not visible before commit
        assert store.get("records", b"a") == b"1"
        assert store.count("records") == 2

    def test_transaction_rolls_back_on_error(self, store: Store) -> None:
        store.put("records", b"keep", b"old")

        class Boom(Exception):
            pass

        with pytest.raises(Boom):
            with store.transaction() as txn:
                txn.put("records", b"keep", b"new")
                txn.put("records", b"extra", b"x")
                txn.delete("records", b"keep")
                raise Boom()
        assert store.get("records", b"keep") == b"old"
        assert store.get("records", b"extra") is None
        assert store.count("records") == 1

    def test_put_many_and_get_many(self, store: Store) -> None:
        store.put("records", b"old", b"o")
        # ~600 KB in one transaction: a store with a small initial map must grow inside it
        items = [(b"k%04d" % i, bytes([i % 256]) * 3000) for i in range(200)]
        with store.transaction() as txn:
            txn.put("index", b"first", b"1")
            txn.put_many("records", items[:100])
            txn.put_many("records", items[100:] + [(b"old", b"new")])
            got = txn.get_many("records", [b"k0000", b"missing", b"k0199", b"old"])
            assert got == [items[0][1], None, items[199][1], b"new"]
            assert store.get("records", b"k0000") is None  # not visible before commit
        assert store.count("records") == 201
        assert store.get("records", b"k0150") == items[150][1]
        assert store.get("records", b"old") == b"new"
        assert store.get("index", b"first") == b"1"
        with store.transaction() as txn:
            with pytest.raises(ValueError):
                txn.put_many("records", [(b"ok", b"v"), (b"", b"v")])
            with pytest.raises(TypeError):
                txn.put_many("records", [(b"ok", "not bytes")])  # type: ignore[list-item]
            with pytest.raises(KeyError):
                txn.get_many("nope", [b"k"])
            txn.put_many("records", [])

    def test_put_many_rolls_back_on_error(self, store: Store) -> None:
        class Boom(Exception):
            pass

        with pytest.raises(Boom):
            with store.transaction() as txn:
                txn.put_many("records", [(b"a", b"1"), (b"b", b"2")])
                raise Boom()
        assert store.get("records", b"a") is None
        assert store.count("records") == 0

    def test_delete(self, store: Store) -> None:
        store.put("records", b"a", b"1")
        with store.transaction() as txn:
            assert txn.delete("records", b"a") is True
            assert txn.delete("records", b"zz") is False
            assert txn.get("records", b"a") is None
            assert txn.count("records") == 0
            assert txn.scan("records") == []
        assert store.get("records", b"a") is None

    def test_threads_serialise_writes(self, store: Store) -> None:
        store.put("state", b"n", (0).to_bytes(8, "big"))

        def work() -> None:
            for _ in range(50):
                with store.transaction() as txn:
                    n = int.from_bytes(txn.get("state", b"n") or b"", "big")
                    txn.put("state", b"n", (n + 1).to_bytes(8, "big"))

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert int.from_bytes(store.get("state", b"n") or b"", "big") == 200

    def test_persistence(self, tmp_path: Path) -> None:
        s = self.make_store(tmp_path)
        s.put("header", b"k", b"v")
        with s.transaction() as txn:
            txn.put("records", b"r", b"x")
        s.close()
        again = self.reopen_store(tmp_path)
        if again is None:
            pytest.skip("store is not persistent")
        try:
            assert again.get("header", b"k") == b"v"
            assert again.get("records", b"r") == b"x"
        finally:
            again.close()

    def test_closed_store_refuses(self, tmp_path: Path) -> None:
        s = self.make_store(tmp_path)
        s.close()
        with pytest.raises(Exception):  # noqa: B017 - the contract only demands that it raises
            s.get("records", b"k")
