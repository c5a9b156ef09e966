"""LMDBStore: the persistent store (py-lmdb), safe across processes, growing its own map.

Rules it follows (see the LMDB notes in the project's shared notes):

* one :class:`lmdb.Environment` per path per process: a module-level registry keyed by
  the real path hands the same environment (reference counted) to every store object;
* ``reader_check()`` on open clears reader slots left by killed processes;
* the map starts at 1 GiB of *virtual* address space (sparse file) and grows by doubling
  before a write transaction once it is half full, and when a write still hits
  ``MapFullError`` the transaction is aborted, the map doubled and the writes replayed
  (after checking that nothing it had read changed); ``MapResizedError`` (another process
  grew the map) is answered with ``set_mapsize(0)`` and a retry. No ``MapFullError``
  reaches the caller;
* every transaction is a ``with`` block; scans read in short chunks so no read
  transaction outlives a call;
* a truncated ``data.mdb`` is detected *before* any page is touched (touching a page
  past the end of the file would kill the process with SIGBUS);
* durability (see :data:`DURABILITY`): ``"full"`` (the default) flushes every commit to
  the disk before the commit returns; ``"process"`` leaves the flush to a background
  thread (every ``sync_interval`` seconds), :meth:`LMDBStore.sync` and the last close.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import lmdb

from archive._errors import ArchiveError, CorruptArchiveError, NotAnArchiveError, TransactionConflict
from archive._store import MAX_KEY_BYTES, Store, Txn, check_items, check_key, prefix_end

__all__ = ["DEFAULT_MAP_SIZE", "DEFAULT_SYNC_INTERVAL", "DURABILITY", "Durability", "LMDBStore"]

log = logging.getLogger(__name__)

DEFAULT_MAP_SIZE = 1 << 30
DEFAULT_SYNC_INTERVAL = 1.0
Durability = Literal["full", "process"]
DURABILITY: dict[str, str] = {
    "full": "every commit is on the disk when it returns (LMDB flushes the data, then the commit record): a "
            "killed process, an operating-system crash or a power cut loses nothing that was committed",
    "process": "commits reach the operating system at once and the disk within about sync_interval seconds (a "
               "background thread flushes them; sync() and the last close flush at once): a killed process loses "
               "nothing, but an operating-system crash or a power cut can lose the commits since the last flush "
               "and can leave the archive damaged (LMDB's MDB_NOSYNC); for runs that can be repeated",
}
_SCAN_CHUNK = 512
_CORRUPT = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError, lmdb.PanicError, lmdb.BadTxnError,
            lmdb.BadValsizeError, lmdb.IncompatibleError)


class _Shared:
    """One open environment shared by every LMDBStore of a path in this process."""

    def __init__(self, path: str, env: lmdb.Environment, dbs: dict[str, Any], readonly: bool,
                 durability: Durability = "full") -> None:
        self.path = path
        self.env = env
        self.dbs = dbs  # name -> handle, or None for a missing db in a read-only archive
        self.readonly = readonly
        self.durability = durability
        self.dirty = False  # commits not yet flushed ("process" durability)
        self.flusher: _Flusher | None = None
        self.refs = 0
        self.lock = threading.RLock()
        self.pid = os.getpid()
        self.writer = threading.local()

    def flush(self) -> None:
        """Flush every commit made so far to the disk (no lock needed: LMDB's sync is an fdatasync)."""
        self.dirty = False
        self.env.sync(True)


class _Flusher(threading.Thread):
    """Flushes a ``"process"``-durability environment every ``interval`` seconds while it has new commits.

    The flush (an fdatasync, run without the GIL) overlaps the writer's own work instead of
    stalling it, which is what makes ``"process"`` faster than a flush per commit.
    """

    def __init__(self, shared: _Shared, interval: float) -> None:
        super().__init__(name=f"archive-flush {shared.path}", daemon=True)
        self._shared = shared
        self._interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            if self._shared.dirty:
                try:
                    self._shared.flush()
                except Exception as e:  # keep flushing later; close() flushes and reports
                    self._shared.dirty = True
                    log.warning("flushing %s failed: %s: %s", self._shared.path, type(e).__name__, e)

    def stop(self) -> None:
        self._stop_event.set()
        if self is not threading.current_thread():
            self.join()


_REGISTRY: dict[str, _Shared] = {}
_REGISTRY_LOCK = threading.Lock()


def _corrupt(path: str, e: BaseException) -> CorruptArchiveError:
    return CorruptArchiveError(
        f"archive {path} is damaged ({type(e).__name__}: {e}); it was not modified. Restore it from a "
        "backup, or copy what is readable with `python -m lmdb copy --compact`, or start a new archive")


def _open_shared(path: str, *, map_size: int, readonly: bool, create: bool, dbs: tuple[str, ...],
                 durability: Durability = "full") -> _Shared:
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise NotAnArchiveError(
            f"{p} is a file, not an archive (an archive is a directory holding data.mdb); "
            "pass a new or empty directory path")
    data = p / "data.mdb"
    if p.is_dir() and not data.exists():
        junk = sorted(n for n in os.listdir(p) if n != "lock.mdb")
        if junk:
            shown = ", ".join(junk[:5]) + (", ..." if len(junk) > 5 else "")
            raise NotAnArchiveError(
                f"{p} is a directory without an archive (no data.mdb) and holds other files ({shown}); "
                "pass a new or empty directory path")
        if readonly or not create:
            raise NotAnArchiveError(f"{p} holds no archive (no data.mdb)")
    if not p.exists():
        if readonly or not create:
            raise NotAnArchiveError(f"{p} does not exist")
        p.mkdir(parents=True)
    lock_existed = (p / "lock.mdb").exists()
    existed = data.exists()
    try:
        env = lmdb.open(str(p), subdir=True, map_size=map_size, max_dbs=len(dbs) + 4, readonly=readonly,
                        readahead=False, max_spare_txns=0, sync=durability == "full")
    except lmdb.Error as e:
        if not lock_existed and existed:
            try:
                (p / "lock.mdb").unlink()
            except OSError:
                pass
        if isinstance(e, _CORRUPT):
            raise _corrupt(str(p), e) from None
        raise ArchiveError(f"cannot open archive {p}: {type(e).__name__}: {e}") from None
    try:
        # A read past the end of the file raises SIGBUS: check the size before touching a page.
        info = env.info()
        psize = env.stat()["psize"]
        need = (info["last_pgno"] + 1) * psize
        have = os.path.getsize(data)
        if have < need:
            raise CorruptArchiveError(
                f"archive {p} is damaged: data.mdb has {have} bytes but its pages reach {need} (truncated "
                "copy?); it was not modified. Restore it from a backup or start a new archive")
        if not readonly:
            n = env.reader_check()
            if n:
                log.info("cleared %d stale reader slot(s) in %s", n, p)
        handles = _open_dbs(env, str(p), dbs, readonly)
    except BaseException:
        env.close()
        raise
    return _Shared(str(p), env, handles, readonly, durability)


def _begin(env: lmdb.Environment, write: bool = False) -> lmdb.Transaction:
    """Begin a transaction, adopting a map grown by another process."""
    while True:
        try:
            return env.begin(write=write)
        except lmdb.MapResizedError:
            env.set_mapsize(0)


def _open_dbs(env: lmdb.Environment, path: str, dbs: tuple[str, ...], readonly: bool) -> dict[str, Any]:
    handles: dict[str, Any] = {}
    try:
        with _begin(env) as txn:
            names = [bytes(k) for k, _ in txn.cursor()]
        for name in dbs:
            if name.encode() in names:  # (handles opened inside a read txn are not usable afterwards)
                while True:
                    try:
                        handles[name] = env.open_db(name.encode(), create=False)
                        break
                    except lmdb.MapResizedError:
                        env.set_mapsize(0)
        ours = {n.encode() for n in dbs}
        if names and not ours.intersection(names):
            raise NotAnArchiveError(
                f"{path} is an LMDB environment but not a kernel-factory archive (none of the sub-databases "
                f"{', '.join(dbs)}); it was not modified. Pass another path")
        missing = [n for n in dbs if n not in handles]
        if missing and not readonly:
            with _begin(env, write=True) as txn:
                for name in missing:
                    handles[name] = env.open_db(name.encode(), txn=txn, create=True)
        for name in missing:
            handles.setdefault(name, None)
    except _CORRUPT as e:
        raise _corrupt(path, e) from None
    return handles


class _LMDBTxn(Txn):
    """A write transaction that survives map growth by replaying its writes."""

    def __init__(self, store: LMDBStore) -> None:
        self._store = store
        self._sh = store._sh
        self._reads: list[tuple[str, tuple[Any, ...], Any]] = []
        self._ops: list[tuple[str, str, bytes, Any]] = []
        self._txn: lmdb.Transaction = self._store._begin_write()

    def _h(self, db: str) -> Any:
        return self._sh.dbs[db]

    def _grow_and_replay(self) -> None:
        self._txn.abort()
        while True:
            self._store._grow()
            self._txn = self._store._begin_write(grow=False)
            try:
                for kind, args, seen in self._reads:
                    if getattr(self, "_raw_" + kind)(*args) != seen:
                        raise TransactionConflict(
                            "another process changed the archive while this transaction was restarted to grow "
                            "the map; everything was rolled back, run the transaction again")
                for op, db, key, value in self._ops:
                    if op == "put":
                        self._txn.put(key, value, db=self._h(db))
                    elif op == "put_many":
                        with self._txn.cursor(db=self._h(db)) as cur:
                            cur.putmulti(value)
                    else:
                        self._txn.delete(key, db=self._h(db))
                return
            except lmdb.MapFullError:
                self._txn.abort()
            except BaseException:
                self._txn.abort()
                raise

    def _raw_get(self, db: str, key: bytes) -> bytes | None:
        return self._txn.get(key, db=self._h(db))

    def _raw_get_many(self, db: str, keys: tuple[bytes, ...]) -> list[bytes | None]:
        get, h = self._txn.get, self._h(db)
        return [get(k, db=h) for k in keys]

    def _raw_scan(self, db: str, prefix: bytes, reverse: bool) -> list[tuple[bytes, bytes]]:
        with self._txn.cursor(db=self._h(db)) as cur:
            return list(_cursor_range(cur, prefix, reverse, None, None))

    def _raw_count(self, db: str) -> int:
        return int(self._txn.stat(self._h(db))["entries"])

    def get(self, db: str, key: bytes) -> bytes | None:
        check_key(db, key, self._store.DBS)
        key = bytes(key)
        v = self._raw_get(db, key)
        self._reads.append(("get", (db, key), v))
        return v

    def get_many(self, db: str, keys: Sequence[bytes]) -> list[bytes | None]:
        self._store._check_db(db)
        keys = tuple(keys)
        for k in keys:
            if type(k) is not bytes or not 0 < len(k) <= MAX_KEY_BYTES:
                check_key(db, k, self._store.DBS)
                keys = tuple(bytes(k) for k in keys)
                break
        vals = self._raw_get_many(db, keys)
        self._reads.append(("get_many", (db, keys), vals))
        return vals

    def put_many(self, db: str, items: Sequence[tuple[bytes, bytes]]) -> None:
        pairs = check_items(db, items, self._store.DBS)
        if not pairs:
            return
        while True:
            try:
                with self._txn.cursor(db=self._h(db)) as cur:
                    cur.putmulti(pairs)
                break
            except lmdb.MapFullError:
                self._grow_and_replay()  # replays the writes before this call; then redo all of these
        self._ops.append(("put_many", db, b"", pairs))

    def scan(self, db: str, prefix: bytes = b"", reverse: bool = False) -> list[tuple[bytes, bytes]]:
        self._store._check_db(db)
        out = self._raw_scan(db, bytes(prefix), reverse)
        self._reads.append(("scan", (db, bytes(prefix), reverse), out))
        return out

    def count(self, db: str) -> int:
        self._store._check_db(db)
        n = self._raw_count(db)
        self._reads.append(("count", (db,), n))
        return n

    def put(self, db: str, key: bytes, value: bytes) -> None:
        check_key(db, key, self._store.DBS)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"values are bytes, got {type(value).__name__}")
        key, value = bytes(key), bytes(value)
        while True:
            try:
                self._txn.put(key, value, db=self._h(db))
                break
            except lmdb.MapFullError:
                self._grow_and_replay()
        self._ops.append(("put", db, key, value))

    def delete(self, db: str, key: bytes) -> bool:
        check_key(db, key, self._store.DBS)
        key = bytes(key)
        while True:
            try:
                found = bool(self._txn.delete(key, db=self._h(db)))
                break
            except lmdb.MapFullError:
                self._grow_and_replay()
        self._ops.append(("delete", db, key, None))
        return found

    def _commit(self) -> None:
        while True:
            try:
                self._txn.commit()
                return
            except lmdb.MapFullError:
                self._grow_and_replay()

    def _abort(self) -> None:
        self._txn.abort()


def _cursor_range(cur: Any, prefix: bytes, reverse: bool, after: bytes | None,
                  limit: int | None) -> Iterator[tuple[bytes, bytes]]:
    """Pairs with ``prefix`` from a cursor, strictly after ``after`` in scan direction."""
    n = 0
    if not reverse:
        ok = cur.set_range(after if after is not None else prefix) if (after or prefix) else cur.first()
        while ok:
            k = cur.key()
            if not k.startswith(prefix):
                return
            if after is None or k > after:
                yield k, cur.value()
                n += 1
                if limit is not None and n >= limit:
                    return
            ok = cur.next()
    else:
        if after is not None:
            ok = cur.set_range(after)
            ok = cur.prev() if ok else cur.last()
        else:
            end = prefix_end(prefix) if prefix else None
            if end is None:
                ok = cur.last()
            else:
                ok = cur.set_range(end)
                ok = cur.prev() if ok else cur.last()
        while ok:
            k = cur.key()
            if after is not None and k >= after:
                ok = cur.prev()
                continue
            if not k.startswith(prefix):
                if k < prefix:
                    return
                ok = cur.prev()
                continue
            yield k, cur.value()
            n += 1
            if limit is not None and n >= limit:
                return
            ok = cur.prev()


class LMDBStore(Store):
    """The persistent store: an LMDB environment directory (``data.mdb`` + ``lock.mdb``).

    Args:
        path: The archive directory (created when missing and ``create``).
        map_size: Initial map size in bytes (virtual; the file grows as data is written).
            The map doubles by itself when it fills.
        readonly: Open without write access (for inspection tools).
        create: Create the directory and sub-databases when missing.
        durability: ``"full"`` (default): each commit is flushed to the disk before it
            returns. ``"process"``: commits are flushed later (see :data:`DURABILITY`);
            a killed process still loses nothing, an operating-system crash may. The
            stores of one path in one process share one environment and must agree.
        sync_interval: With ``"process"`` durability, how often (seconds) a background
            thread flushes new commits to the disk; 0 flushes after every commit, in the
            committing thread. The first store of a path in a process sets it.

    Raises:
        NotAnArchiveError: ``path`` is a file, a directory with other files, or an LMDB
            environment that is not an archive. Nothing is modified.
        CorruptArchiveError: ``data.mdb`` is truncated or not an LMDB file. Nothing is modified.
        ValueError: An unknown ``durability`` or a negative ``sync_interval``.
        ArchiveError: The path is already open in this process with another durability.
    """

    persistent = True

    def __init__(self, path: str | os.PathLike[str], *, map_size: int = DEFAULT_MAP_SIZE, readonly: bool = False,
                 create: bool = True, durability: Durability = "full",
                 sync_interval: float = DEFAULT_SYNC_INTERVAL) -> None:
        if durability not in DURABILITY:
            raise ValueError(f"durability must be one of {', '.join(map(repr, DURABILITY))}, got {durability!r}")
        if not sync_interval >= 0:
            raise ValueError(f"sync_interval must be >= 0 seconds, got {sync_interval!r}")
        real = os.path.realpath(os.fspath(path))
        self.path = Path(real)
        with _REGISTRY_LOCK:
            sh = _REGISTRY.get(real)
            if sh is not None and sh.pid != os.getpid():
                _REGISTRY.pop(real)  # inherited across fork: never touch the parent's environment
                sh = None
            if sh is None:
                sh = _open_shared(real, map_size=map_size, readonly=readonly, create=create, dbs=self.DBS,
                                  durability=durability)
                if durability != "full" and not readonly and sync_interval > 0:
                    sh.flusher = _Flusher(sh, float(sync_interval))
                    sh.flusher.start()
                _REGISTRY[real] = sh
            elif sh.readonly and not readonly:
                raise ArchiveError(f"{real} is already open read-only in this process; close that first")
            elif sh.durability != durability and not (readonly or sh.readonly):
                raise ArchiveError(
                    f"{real} is already open in this process with durability={sh.durability!r}; the stores of "
                    f"one path share one environment: open it with durability={sh.durability!r} or close the "
                    "other first")
            sh.refs += 1
        self._sh: _Shared | None = sh
        self._readonly = readonly

    # -- plumbing -------------------------------------------------------------------

    @property
    def readonly(self) -> bool:
        return self._readonly

    @property
    def durability(self) -> Durability:
        """``"full"`` or ``"process"`` (see :data:`DURABILITY`)."""
        return self._live().durability

    @property
    def map_size(self) -> int:
        """The current map size in bytes."""
        return int(self._live().env.info()["map_size"])

    def _live(self) -> _Shared:
        sh = self._sh
        if sh is None:
            raise ArchiveError("the store is closed")
        if sh.pid != os.getpid():
            raise ArchiveError("this store was opened before fork(); open the archive in the child process "
                               "(use the 'spawn' start method)")
        return sh

    def _check_db(self, db: str) -> None:
        if db not in self.DBS:
            raise KeyError(f"unknown sub-database {db!r}; the store has {', '.join(self.DBS)}")

    def _grow(self) -> None:
        env = self._live().env
        new = int(env.info()["map_size"]) * 2
        log.info("growing the LMDB map of %s to %d MiB", self.path, new >> 20)
        env.set_mapsize(new)

    def _begin_write(self, grow: bool = True) -> lmdb.Transaction:
        sh = self._live()
        env = sh.env
        if grow:
            info = env.info()
            used = (info["last_pgno"] + 1) * env.stat()["psize"]
            if used * 2 > info["map_size"]:
                self._grow()
        return _begin(env, write=True)

    def _read(self, fn: Any) -> Any:
        sh = self._live()
        with sh.lock:
            while True:
                try:
                    with sh.env.begin() as txn:
                        return fn(txn)
                except lmdb.MapResizedError:
                    sh.env.set_mapsize(0)
                except _CORRUPT as e:
                    raise _corrupt(str(self.path), e) from None

    # -- Store API ----------------------------------------------------------------------

    def get(self, db: str, key: bytes) -> bytes | None:
        check_key(db, key, self.DBS)
        h = self._live().dbs[db]
        if h is None:
            return None
        return self._read(lambda t: t.get(bytes(key), db=h))  # type: ignore[no-any-return]

    def put(self, db: str, key: bytes, value: bytes) -> None:
        with self.transaction() as txn:
            txn.put(db, key, value)

    def scan(self, db: str, prefix: bytes = b"", reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        self._check_db(db)
        h = self._live().dbs[db]
        if h is None:
            return iter(())
        return self._scan(h, bytes(prefix), reverse)

    def _scan(self, h: Any, prefix: bytes, reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        after: bytes | None = None
        while True:
            def chunk(t: Any, after: bytes | None = after) -> list[tuple[bytes, bytes]]:
                with t.cursor(db=h) as cur:
                    return list(_cursor_range(cur, prefix, reverse, after, _SCAN_CHUNK))
            items = self._read(chunk)
            yield from items
            if len(items) < _SCAN_CHUNK:
                return
            after = items[-1][0]

    def count(self, db: str) -> int:
        self._check_db(db)
        h = self._live().dbs[db]
        if h is None:
            return 0
        return int(self._read(lambda t: t.stat(h)["entries"]))

    @contextmanager  # type: ignore[override]
    def transaction(self) -> Iterator[Txn]:
        if self._readonly:
            raise ArchiveError(f"{self.path} was opened read-only; open it for writing to change it")
        sh = self._live()
        with sh.lock:
            if getattr(sh.writer, "active", False):
                raise ArchiveError("nested write transactions are not supported; use the outer transaction")
            sh.writer.active = True
            try:
                txn = _LMDBTxn(self)
                try:
                    yield txn
                except BaseException:
                    txn._abort()
                    raise
                txn._commit()
                if sh.durability != "full":
                    sh.dirty = True
                    if sh.flusher is None:
                        sh.flush()
            except _CORRUPT as e:
                raise _corrupt(str(self.path), e) from None
            finally:
                sh.writer.active = False

    def sync(self) -> None:
        """Flush every commit to the disk now (with ``"full"`` durability commits already are)."""
        self._live().flush()

    @property
    def page_size(self) -> int:
        """LMDB's page size in bytes (the operating system's, usually 4096): values longer than
        about half a page go to overflow pages of this size."""
        return int(self._live().env.stat()["psize"])

    def disk_bytes(self) -> int:
        """Size of ``data.mdb`` on disk (allocated blocks, not the sparse map size)."""
        st = os.stat(self.path / "data.mdb")
        return int(getattr(st, "st_blocks", 0) * 512 or st.st_size)

    def close(self) -> None:
        sh, self._sh = self._sh, None
        if sh is None:
            return
        with _REGISTRY_LOCK:
            sh.refs -= 1
            if sh.refs <= 0:
                if _REGISTRY.get(sh.path) is sh:
                    del _REGISTRY[sh.path]
                if sh.pid == os.getpid():
                    try:
                        if sh.flusher is not None:
                            sh.flusher.stop()
                        if sh.dirty:
                            sh.flush()
                    finally:
                        sh.env.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
