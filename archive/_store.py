"""The narrow storage seam under the archive: named sub-databases of bytes -> bytes.

Contract (every implementation, checked by :class:`archive.testing.StoreContract`):

* ``put`` outside a transaction is one committed write; a value read back is equal bytes.
* ``transaction()`` yields a :class:`Txn`; its writes are visible to its own reads at once,
  to everyone else only after the ``with`` block exits normally; an exception inside the
  block rolls every write of the block back and propagates.
* ``scan`` yields ``(key, value)`` pairs whose key starts with ``prefix`` in bytewise key
  order (reversed with ``reverse=True``); returned bytes never change afterwards. A scan
  reflects a consistent snapshot per chunk, not necessarily of the whole iteration.
* Keys are non-empty bytes of at most 500 bytes (LMDB's default limit is 511).
* ``Txn.get_many`` / ``Txn.put_many`` behave exactly like ``get`` / ``put`` per key, in order
  (stores may do them in one call; the LMDB store does).
* Stores are safe to use from several threads of one process; write transactions are
  serialised. Persistent stores are also safe across processes.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import ClassVar

__all__ = ["MAX_KEY_BYTES", "MemoryStore", "Store", "Txn"]

MAX_KEY_BYTES = 500


def check_key(db: str, key: bytes, dbs: tuple[str, ...]) -> None:
    """Raise a clear error for an unknown sub-database name or a bad key."""
    if db not in dbs:
        raise KeyError(f"unknown sub-database {db!r}; the store has {', '.join(dbs)}")
    if not isinstance(key, (bytes, bytearray)):
        raise TypeError(f"keys are bytes, got {type(key).__name__}")
    if not key or len(key) > MAX_KEY_BYTES:
        raise ValueError(f"key length {len(key)} outside 1..{MAX_KEY_BYTES} bytes")


def check_items(db: str, items: Sequence[tuple[bytes, bytes]], dbs: tuple[str, ...]) -> list[tuple[bytes, bytes]]:
    """Check every pair as ``put`` does; return them as a list of ``(bytes, bytes)``."""
    if db not in dbs:
        raise KeyError(f"unknown sub-database {db!r}; the store has {', '.join(dbs)}")
    items = list(items)
    copy = False
    for k, v in items:
        if type(k) is not bytes or not 0 < len(k) <= MAX_KEY_BYTES:
            check_key(db, k, dbs)
            copy = True
        if type(v) is not bytes:
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise TypeError(f"values are bytes, got {type(v).__name__}")
            copy = True
    if copy:
        return [(bytes(k), bytes(v)) for k, v in items]
    return items


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    b = bytearray(prefix)
    while b and b[-1] == 0xFF:
        b.pop()
    if not b:
        return None
    b[-1] += 1
    return bytes(b)


class Txn(ABC):
    """A write transaction; obtained from :meth:`Store.transaction`, valid inside its ``with`` only."""

    @abstractmethod
    def get(self, db: str, key: bytes) -> bytes | None:
        """The value under ``key`` (including this transaction's own writes), or None."""

    @abstractmethod
    def put(self, db: str, key: bytes, value: bytes) -> None:
        """Write ``value`` under ``key`` (replacing any previous value)."""

    @abstractmethod
    def delete(self, db: str, key: bytes) -> bool:
        """Remove ``key``; True if it was present."""

    @abstractmethod
    def scan(self, db: str, prefix: bytes = b"", reverse: bool = False) -> list[tuple[bytes, bytes]]:
        """Every pair whose key starts with ``prefix``, in key order (materialised)."""

    @abstractmethod
    def count(self, db: str) -> int:
        """Number of keys in ``db`` as this transaction sees it."""

    def get_many(self, db: str, keys: Sequence[bytes]) -> list[bytes | None]:
        """The values under ``keys`` (None where absent), in order; like ``get`` for each key."""
        return [self.get(db, k) for k in keys]

    def put_many(self, db: str, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Write every ``(key, value)`` pair in order; like ``put`` for each pair."""
        for k, v in items:
            self.put(db, k, v)


class Store(ABC):
    """Named sub-databases of bytes -> bytes (see the module docstring for the contract)."""

    DBS: ClassVar[tuple[str, ...]] = ("header", "records", "cells", "lineage", "lessons", "state", "index",
                                      "bodies", "tails")
    persistent: ClassVar[bool] = False

    @abstractmethod
    def get(self, db: str, key: bytes) -> bytes | None:
        """The committed value under ``key``, or None."""

    @abstractmethod
    def put(self, db: str, key: bytes, value: bytes) -> None:
        """One committed write."""

    @abstractmethod
    def scan(self, db: str, prefix: bytes = b"", reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        """Committed pairs whose key starts with ``prefix``, in key order."""

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Txn]:
        """A write transaction: commits when the block exits normally, rolls back on error."""

    @abstractmethod
    def count(self, db: str) -> int:
        """Number of committed keys in ``db``."""

    @abstractmethod
    def close(self) -> None:
        """Release the store; further use raises."""

    @property
    def readonly(self) -> bool:
        """True when writes are refused."""
        return False

    def is_empty(self) -> bool:
        """True when no sub-database holds a key."""
        return all(self.count(db) == 0 for db in self.DBS)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- memory


class _MemoryTxn(Txn):
    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._pending: dict[str, dict[bytes, bytes | None]] = {db: {} for db in store.DBS}

    def get(self, db: str, key: bytes) -> bytes | None:
        check_key(db, key, self._store.DBS)
        pend = self._pending[db]
        if key in pend:
            return pend[key]
        return self._store._data[db].get(bytes(key))

    def put(self, db: str, key: bytes, value: bytes) -> None:
        check_key(db, key, self._store.DBS)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"values are bytes, got {type(value).__name__}")
        self._pending[db][bytes(key)] = bytes(value)

    def delete(self, db: str, key: bytes) -> bool:
        present = self.get(db, key) is not None
        self._pending[db][bytes(key)] = None
        return present

    def scan(self, db: str, prefix: bytes = b"", reverse: bool = False) -> list[tuple[bytes, bytes]]:
        if db not in self._store.DBS:
            raise KeyError(f"unknown sub-database {db!r}")
        merged = {k: v for k, v in self._store._data[db].items() if k.startswith(prefix)}
        for k, v in self._pending[db].items():
            if k.startswith(prefix):
                if v is None:
                    merged.pop(k, None)
                else:
                    merged[k] = v
        return sorted(merged.items(), reverse=reverse)

    def count(self, db: str) -> int:
        if db not in self._store.DBS:
            raise KeyError(f"unknown sub-database {db!r}")
        n = len(self._store._data[db])
        for k, v in self._pending[db].items():
            present = k in self._store._data[db]
            n += (v is not None) - present
        return n

    def _commit(self) -> None:
        for db, pend in self._pending.items():
            data = self._store._data[db]
            for k, v in pend.items():
                if v is None:
                    data.pop(k, None)
                else:
                    data[k] = v


class MemoryStore(Store):
    """A store that lives in this process only (tests, throwaway runs); same semantics as LMDB."""

    def __init__(self) -> None:
        self._data: dict[str, dict[bytes, bytes]] = {db: {} for db in self.DBS}
        self._lock = threading.RLock()
        self._closed = False

    def _check(self) -> None:
        if self._closed:
            raise ValueError("the store is closed")

    def get(self, db: str, key: bytes) -> bytes | None:
        self._check()
        check_key(db, key, self.DBS)
        with self._lock:
            return self._data[db].get(bytes(key))

    def put(self, db: str, key: bytes, value: bytes) -> None:
        with self.transaction() as txn:
            txn.put(db, key, value)

    def scan(self, db: str, prefix: bytes = b"", reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        self._check()
        if db not in self.DBS:
            raise KeyError(f"unknown sub-database {db!r}; the store has {', '.join(self.DBS)}")
        with self._lock:
            items = sorted(((k, v) for k, v in self._data[db].items() if k.startswith(prefix)), reverse=reverse)
        return iter(items)

    @contextmanager  # type: ignore[override]
    def transaction(self) -> Iterator[Txn]:
        self._check()
        with self._lock:
            txn = _MemoryTxn(self)
            yield txn
            txn._commit()

    def count(self, db: str) -> int:
        self._check()
        if db not in self.DBS:
            raise KeyError(f"unknown sub-database {db!r}; the store has {', '.join(self.DBS)}")
        return len(self._data[db])

    def close(self) -> None:
        self._closed = True
