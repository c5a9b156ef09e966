"""The MAP-Elites archive over a :class:`~archive._store.Store`.

Layout (sub-database: key -> value)::

    header   b"meta"             -> pack_raw(header dict)
             b"next_seq"         -> big-endian u64, the next record seq (== number of records)
             b"next_lesson_seq"  -> big-endian u64
             b"count/<status>"   -> big-endian u64, records per Status
             b"min_fitness"      -> big-endian f64, lowest finite fitness of any OK record
    records  genome id (ascii)   -> schema 3: u64 seq + one byte (1: the body has a tail), a pointer
                                    into bodies; schemas 1-2: the record's bytes themselves
    bodies   u64 seq             -> the record's bytes (schema 3): codec.dumps(Record), the source
                                    inline; or, from schema 2 on, pack_raw(the same payload with the
                                    genome's "source" replaced by "source_of": the id of an earlier
                                    record that holds that source); a long value only up to its last
                                    whole overflow page, the rest in tails
    tails    u64 seq             -> the rest of a body cut at a page boundary (schema 3)
    index    b"s" + u64 seq      -> genome id + b"\\0" + status   (records in seq order)
    cells    b"c" + u32 per axis -> pack_raw([elite id, fitness, seq])
    lineage  parent id + b"/" + child id -> operator name (utf-8)
    lessons  u64 seq             -> codec.dumps(Lesson)
    state    b"engine"           -> pack_raw(engine state)

Every add is one transaction: the record, its index entry, its lineage edges, the
counters and (if it wins) its cell are written together or not at all, so a process
killed at any instant leaves either the whole record or nothing.

Shared sources (schema 2): a record whose genome shares its source with a record this
archive object wrote or read (a parameter variant: ``Genome(parent.source, params)``
passes the parent's very ``str``) stores a reference to that record instead of a copy of
the source. The record referred to always holds the source itself and is committed
before, or in the same transaction as, the record that refers to it; records are never
deleted, so a reference never dangles. :meth:`Archive.get` and every other read return
the full genome. Archives of schema 1 (written before) open, read and take new records
as before, with every source inline, so older libraries can still read them; a library
older than schema 2 refuses a schema-2 archive with :class:`SchemaVersionError`.

Record bodies keyed by seq (schema 3): a batch of new records is appended at the end of the
bodies tree instead of landing at random places of a tree keyed by genome id, and only the
small id -> seq pointers go into that random-order tree; a body longer than a page is cut
after its last whole overflow page when the rest is short (an 8 KB source and its record,
~8.6 KB, take two pages and ~400 bytes in a shared leaf instead of three pages). Measured
with bare LMDB on synced commits: 1.32x the insert rate of the schema-2 layout and 29% fewer
bytes on disk (benchmarks/RESULTS.md, 2026-12-04). Archives of schema 2 (and 1) open, read
and take new records in their own layout; a library older than schema 3 refuses a schema-3
archive with :class:`SchemaVersionError`.

QD score: ``sum(fitness - min_fitness + 1)`` over the elites, where ``min_fitness`` is the
lowest finite fitness of any OK record ever added, so every elite contributes at least 1
and the score is positive and grows with coverage and with fitness (the offset plays the
role of pyribs' ``qd_score_offset``, chosen from the data).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import math
import os
import struct
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from archive._errors import (
    ArchiveError,
    CorruptArchiveError,
    HeaderMismatchError,
    InvalidRecordError,
    NotAnArchiveError,
    ReadOnlyArchiveError,
    SchemaVersionError,
    TransactionConflict,
)
from archive._lessons import Lessons
from archive._lineage import Lineage
from archive._lmdb import DEFAULT_MAP_SIZE, DURABILITY, Durability, LMDBStore
from archive._store import MemoryStore, Store, Txn
from evo.codec import SCHEMA_VERSION, CodecError, dumps, loads, pack_raw, unpack_raw
from evo.space import CategoricalAxis, NumericAxis, SpaceError
from evo.types import DeviceInfo, Problem, Record, Status

__all__ = ["ARCHIVE_SCHEMA_VERSION", "FORMAT", "AddResult", "AddStatus", "Archive", "fork_archive"]

log = logging.getLogger(__name__)

FORMAT = "ptx-kernel-factory-archive"
#: Layout version written in new archives' headers (``header["schema_version"]``): 1, every
#: record holds its source; 2, records may refer to another record's source; 3, record bodies
#: keyed by seq, long ones cut at a page boundary (module docstring). Stored values stay codec
#: envelopes of :data:`evo.codec.SCHEMA_VERSION`.
ARCHIVE_SCHEMA_VERSION = 3
_PAGE_HEADER = 16  # bytes of an LMDB overflow run's first page taken by its header
_SHARE_MIN = 512  # sources shorter than this (characters) are always stored inline
_SOURCES_MAX = 4096  # sources remembered for sharing (a bounded map, cleared when full)
_META = b"meta"
_NEXT_SEQ = b"next_seq"
_MIN_FIT = b"min_fitness"
_STATE = b"engine"
_CACHE_MAX = 4096
_RETRIES = 8


class AddStatus(IntEnum):
    """What an add did to the grid (ordered: NOT_ADDED < IMPROVED < NEW)."""

    NOT_ADDED = 0
    IMPROVED = 1
    NEW = 2


@dataclass(frozen=True)
class AddResult:
    """The outcome of :meth:`Archive.add`.

    Attributes:
        status: NEW (filled an empty cell), IMPROVED (beat the cell's elite) or NOT_ADDED
            (a failure, an OK record that did not beat the elite, or a duplicate).
        record: The record as stored (seq, cell and descriptors set). For a duplicate, the
            record stored earlier under the same id.
        previous: The cell's elite before this add, when the cell was occupied.
        duplicate: True when a record with the same genome id was already stored; nothing
            was changed.
    """

    status: AddStatus
    record: Record
    previous: Record | None = None
    duplicate: bool = False


_U64 = struct.Struct(">Q")


def _u64(n: int) -> bytes:
    return _U64.pack(n)


def _read_u64(raw: bytes | None) -> int:
    return struct.unpack(">Q", raw)[0] if raw else 0


def _result(status: AddStatus, record: Record, previous: Record | None, duplicate: bool) -> AddResult:
    """An :class:`AddResult` without the frozen dataclass's per-field ``__setattr__`` calls."""
    res = object.__new__(AddResult)
    res.__dict__.update(status=status, record=record, previous=previous, duplicate=duplicate)
    return res


_STATUS_TAIL = {s: b"\0" + s.value.encode() for s in Status}  # index value: genome id + this


def _cell_key(cell: tuple[int, ...]) -> bytes:
    return b"c" + struct.pack(f">{len(cell)}I", *cell)


def _cell_of_key(key: bytes) -> tuple[int, ...]:
    n = (len(key) - 1) // 4
    return tuple(struct.unpack(f">{n}I", key[1:]))


_SOURCES = ("params", "resources", "metrics")


def _placer(problem: Problem) -> Any:
    """A fast equivalent of ``problem.descriptor_values`` followed by each axis's ``index``.

    Returns a function ``(genome, evaluation) -> (cell, values)`` that returns None whenever
    it is not sure (a missing value, an unusual type, NaN, a category it did not index); the
    caller then takes the general path, which also raises the right error. Returns None when
    the problem or an axis overrides the stock methods.
    """
    names = [axis.name for axis in problem.descriptors]
    if type(problem).descriptor_values is not Problem.descriptor_values or len(set(names)) != len(names):
        return None
    plan: list[tuple[str, tuple[str, ...], int, Any]] = []
    for axis in problem.descriptors:
        sources = (axis.source,) if axis.source else _SOURCES
        if any(src not in _SOURCES for src in sources):
            return None
        if type(axis) is NumericAxis:
            plan.append((axis.name, sources, 0, (axis.low, axis.high, axis.bins)))  # the same arithmetic
        elif type(axis) is CategoricalAxis:
            index: dict[tuple[type, Any], int] = {}
            for i, v in enumerate(axis.values):
                if v != v:  # NaN never matches (the general path says so)
                    continue
                try:
                    index.setdefault((type(v), v), i)
                except TypeError:  # unhashable category: leave such values to the general path
                    pass
            plan.append((axis.name, sources, 1, index))
        else:
            return None

    def place(genome: Any, evaluation: Any) -> tuple[tuple[int, ...], dict[str, Any]] | None:
        values: dict[str, Any] = {}
        cell: list[int] = []
        for name, sources, kind, data in plan:
            for src in sources:
                table = genome.params if src == "params" else (
                    evaluation.resources if src == "resources" else evaluation.metrics)
                if name in table:
                    value = table[name]
                    break
            else:
                return None
            values[name] = value
            t = type(value)
            if kind == 0:
                if t is not int and t is not float:
                    return None
                v = float(value)
                if v != v:
                    return None
                low, high, bins = data
                try:
                    i = int((v - low) / (high - low) * bins)
                except OverflowError:  # infinite or huge: the general path decides
                    return None
                cell.append(min(max(i, 0), bins - 1))
            else:
                try:
                    j = data.get((t, value))
                except TypeError:
                    return None
                if j is None:
                    return None
                cell.append(j)
        return tuple(cell), values

    return place


def cut_body(data: bytes, page: int) -> tuple[bytes, bytes]:
    """A schema-3 record body as (body, tail): cut after its last whole overflow page of
    ``page`` bytes when the rest is at most a quarter page (so the tail fits a shared leaf
    page); else ``(data, b"")`` (also when ``page`` is 0: a store without pages)."""
    if page and len(data) + _PAGE_HEADER > page:
        head = (len(data) + _PAGE_HEADER) // page * page - _PAGE_HEADER
        if len(data) - head <= page // 4:
            return data[:head], data[head:]
    return data, b""


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a block; its previous state is restored after.

    Reference counting still frees every acyclic object at once; cycles made inside the
    block wait for the next collection after it.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Sources:
    """Which record holds each recently seen source inline: the map behind shared sources.

    Keyed by the identity of the source ``str``: a parameter variant made with
    ``Genome(parent.source, params)`` passes its parent's very string, so a lookup costs no
    hashing of 8 KB of text; an equal source in another ``str`` object is merely stored
    again. Only records known to hold the source inline and to be committed (read from the
    store, or written by a committed transaction) are entered. Bounded: when full, the older
    half of the entries is dropped (a later variant of a dropped source stores it again).
    """

    __slots__ = ("by_obj", "by_carrier")

    def __init__(self) -> None:
        self.by_obj: dict[int, tuple[str, str]] = {}  # id(source) -> (source, id of the record holding it)
        self.by_carrier: dict[str, str] = {}  # id of a record holding its source inline -> that source

    def add(self, source: str, carrier: str) -> None:
        for table in (self.by_obj, self.by_carrier):
            if len(table) >= _SOURCES_MAX:
                for key in list(itertools.islice(table, len(table) // 2)):  # the oldest entries
                    table.pop(key, None)
        self.by_obj[id(source)] = (source, carrier)  # the reference to source keeps its id unique
        self.by_carrier[carrier] = source


def _library_version() -> str:
    try:
        from importlib.metadata import version

        return version("ptx-kernel-factory")
    except Exception:
        return "unknown"


def _axes_from_description(descs: list[Mapping[str, Any]]) -> tuple[NumericAxis | CategoricalAxis, ...]:
    axes: list[NumericAxis | CategoricalAxis] = []
    for d in descs:
        if d.get("kind") == "categorical":
            axes.append(CategoricalAxis(d["name"], d["values"], d.get("source")))
        else:
            axes.append(NumericAxis(d["name"], d["low"], d["high"], d["bins"], d.get("source")))
    return tuple(axes)


def _device_dict(device: DeviceInfo | Mapping[str, Any]) -> dict[str, Any]:
    d = device.to_dict() if isinstance(device, DeviceInfo) else dict(device)
    if not d.get("name"):
        raise ArchiveError(f"device info needs a 'name', got {d!r}")
    cc = d.get("compute_capability")
    return {"name": str(d["name"]), "compute_capability": None if cc is None else str(cc)}


_BIG = "__bigint__"


def _wrap_big(value: Any) -> Any:
    """Ints outside msgpack's 64-bit range (e.g. numpy PCG64 state) become ``{"__bigint__": "0x.."}``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and not (-(1 << 63) <= value < (1 << 64)):
        return {_BIG: hex(value)}
    if isinstance(value, Mapping):
        return {k: _wrap_big(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_wrap_big(v) for v in value]
    return value


def _unwrap_big(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and _BIG in value and isinstance(value[_BIG], str):
            return int(value[_BIG], 16)
        return {k: _unwrap_big(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap_big(v) for v in value]
    return value


def decode_header(raw: bytes, where: str) -> dict[str, Any]:
    """Decode and check a stored header; raise the matching ArchiveError."""
    try:
        env = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as e:
        raise CorruptArchiveError(f"{where}: the archive header cannot be decoded ({e}); the archive is damaged") \
            from None
    if isinstance(env, list) and env and isinstance(env[0], int) and env[0] > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where} was written with schema version {env[0]}, newer than this library's {SCHEMA_VERSION}: "
            "upgrade ptx-kernel-factory to open it")  # (an envelope from a newer codec)
    try:
        header = unpack_raw(raw)
    except CodecError as e:
        raise CorruptArchiveError(f"{where}: the archive header is damaged ({e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise NotAnArchiveError(f"{where} holds a store but not a kernel-factory archive header")
    version = header.get("schema_version")
    if not isinstance(version, int):
        raise CorruptArchiveError(f"{where}: the archive header has no schema version")
    if version > ARCHIVE_SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where} was written with schema version {version}, newer than this library's "
            f"{ARCHIVE_SCHEMA_VERSION}: upgrade ptx-kernel-factory to open it")
    return header


class Archive:
    """A MAP-Elites grid over ``problem.descriptors``, holding every record (failures too).

    A problem with no descriptors has one cell (plain elitism). Only OK records occupy
    cells; a cell keeps the record of highest fitness (ties keep the incumbent).

    Args:
        problem: The problem every record belongs to; its fingerprint is kept in the header.
        store: A :class:`Store`, a path (an LMDB archive directory, created if missing) or
            None (in memory).
        device: The GPU the run uses, if known (see :meth:`set_device`).
        force: Reuse an archive created for a different problem or device; the header is
            updated to this problem and the old fingerprint is kept in ``header["history"]``.
        map_size: Initial LMDB map size when ``store`` is a path.
        durability: When ``store`` is a path: ``"full"`` (default), every add is on the
            disk when it returns; ``"process"``, adds are flushed to the disk about once a
            second, by :meth:`sync` and by :meth:`close`: a killed process loses nothing,
            an operating-system crash or power cut can lose or damage the last second of
            adds (see :data:`archive.DURABILITY`).

    Raises:
        NotAnArchiveError: The path holds something else (it is left untouched).
        CorruptArchiveError: The archive's files are damaged (nothing is modified).
        SchemaVersionError: A newer library wrote the archive.
        HeaderMismatchError: The archive belongs to another problem or device.

    Thread safety: the store serialises writes; one Archive may be shared by the threads
    of one process. Several processes may open the same path, each with its own Archive.
    """

    def __init__(self, problem: Problem, store: Store | str | os.PathLike[str] | None = None, *,
                 device: DeviceInfo | Mapping[str, Any] | None = None, force: bool = False,
                 map_size: int = DEFAULT_MAP_SIZE, durability: Durability = "full") -> None:
        if not isinstance(problem, Problem):
            raise TypeError(f"Archive needs a Problem, got {type(problem).__name__}")
        if durability not in DURABILITY:
            raise ValueError(f"durability must be one of {', '.join(map(repr, DURABILITY))}, got {durability!r}")
        if durability != "full" and (store is None or isinstance(store, Store)):
            raise ValueError(f"durability={durability!r} applies when the archive opens its own LMDB store from a "
                             "path; pass the path, or set it on the store (LMDBStore(path, durability=...))")
        owns = not isinstance(store, Store)
        if store is None:
            store = MemoryStore()
        elif not isinstance(store, Store):
            store = LMDBStore(store, map_size=map_size, durability=durability)
        try:
            self._setup(store, owns, problem, readonly=False)
            self._open_header(force)
            if device is not None:
                self.set_device(device, force=force)
        except BaseException:
            if owns:
                store.close()
            raise

    @classmethod
    def open_readonly(cls, path: str | os.PathLike[str]) -> Archive:
        """Open an LMDB archive for reading without its Problem (inspection, the CLI).

        Descriptor axes come from the problem description saved in the header; ``add``
        and the other writes raise :class:`ReadOnlyArchiveError`.
        """
        store = LMDBStore(path, readonly=True, create=False)
        self = cls.__new__(cls)
        try:
            self._setup(store, True, None, readonly=True)
            raw = store.get("header", _META)
            if raw is None:
                raise NotAnArchiveError(f"{self._where} holds no archive header")
            self._header = decode_header(raw, self._where)
            self._layout = int(self._header["schema_version"])
            self._axes = _axes_from_description(self._header["problem"].get("descriptors", []))
        except BaseException:
            store.close()
            raise
        return self

    # -- setup --------------------------------------------------------------------

    def _setup(self, store: Store, owns: bool, problem: Problem | None, readonly: bool) -> None:
        self._store = store
        self._owns = owns
        self.problem = problem
        self._readonly = readonly
        self.path: Path | None = getattr(store, "path", None)
        self._where = str(self.path) if self.path is not None else "in-memory archive"
        self._axes = tuple(problem.descriptors) if problem is not None else ()
        self._place = _placer(problem) if problem is not None else None
        self._header: dict[str, Any] = {}
        self._elites: dict[tuple[int, ...], tuple[str, float, int]] = {}
        self._elite_list: list[tuple[str, float, int]] | None = None
        self._token: int | None = None
        self._cache: dict[str, Record] = {}
        self._sources = _Sources()
        # the archive's schema version (set from the header): from 2 on, variants' records refer to
        # their source's record; from 3 on, bodies are kept by seq
        self._layout = 0
        self._page = int(getattr(store, "page_size", 0) or 0)  # cut bodies at this page size (0: never)
        self.lessons = Lessons(store, readonly=readonly, where=self._where)

    def _open_header(self, force: bool) -> None:
        assert self.problem is not None
        problem = self.problem
        with self._store.transaction() as txn:
            raw = txn.get("header", _META)
            if raw is None:
                if any(txn.count(db) for db in self._store.DBS):
                    raise NotAnArchiveError(f"{self._where} holds data but no archive header; pass another path")
                header = {
                    "format": FORMAT,
                    "schema_version": ARCHIVE_SCHEMA_VERSION,
                    "problem_fingerprint": problem.fingerprint(),
                    "problem": problem.describe(),
                    "device": None,
                    "created": time.time(),
                    "library_version": _library_version(),
                    "history": [],
                }
                txn.put("header", _META, pack_raw(header))
                txn.put("header", _NEXT_SEQ, _u64(0))
                self._header = header
                self._layout = ARCHIVE_SCHEMA_VERSION
                return
            header = decode_header(raw, self._where)
            if header.get("problem_fingerprint") != problem.fingerprint():
                diffs = problem.diff(header.get("problem") or {})
                if not force or "descriptors" in diffs:
                    extra = ("" if not force else
                             " (force=True cannot change the descriptor axes: the grid would not match)")
                    raise HeaderMismatchError(
                        f"{self._where} was created for a different problem "
                        f"({header.get('problem', {}).get('name')!r}, fingerprint {header.get('problem_fingerprint')}"
                        f" vs {problem.fingerprint()}); fields that differ: {', '.join(diffs) or '(none listed)'}"
                        f"{extra}. To reuse it anyway pass force=True; to start a new archive from its records "
                        f"and lessons use archive.fork_archive(src, dst, problem)")
                log.warning("reusing %s with a different problem (differs in %s): force=True", self._where, diffs)
                header["history"] = list(header.get("history") or []) + [{
                    "problem_fingerprint": header.get("problem_fingerprint"), "differs": diffs,
                    "replaced": time.time()}]
                header["problem_fingerprint"] = problem.fingerprint()
                header["problem"] = problem.describe()
                txn.put("header", _META, pack_raw(header))
            self._header = header
            # a schema-1 archive keeps every source inline, so that older libraries can still read it
            self._layout = int(header["schema_version"])

    # -- header, device ---------------------------------------------------------------

    @property
    def header(self) -> dict[str, Any]:
        """A copy of the header: format, schema_version, problem_fingerprint, problem, device, created, ..."""
        return dict(self._header)

    @property
    def readonly(self) -> bool:
        """True for archives opened with :meth:`open_readonly`."""
        return self._readonly

    def _writable(self) -> None:
        if self._readonly:
            raise ReadOnlyArchiveError(f"{self._where} was opened read-only; open it with Archive(problem, path)")

    def set_device(self, device: DeviceInfo | Mapping[str, Any], *, force: bool = False) -> None:
        """Record the device (name and compute capability) once; a later different one is refused.

        Raises:
            HeaderMismatchError: The archive was filled on another device (pass ``force=True``
                to overwrite the recorded device).
        """
        self._writable()
        dev = _device_dict(device)
        with self._store.transaction() as txn:
            header = decode_header(txn.get("header", _META) or b"", self._where)
            old = header.get("device")
            if old == dev:
                self._header = header
                return
            if old is not None and old.get("compute_capability") is None and old.get("name") == dev["name"]:
                pass  # filling in a compute capability that was unknown
            elif old is not None and not force:
                raise HeaderMismatchError(
                    f"{self._where} was filled on {old.get('name')} (cc {old.get('compute_capability')}), "
                    f"not {dev['name']} (cc {dev['compute_capability']}): timings are not comparable. Use a new "
                    "archive (or fork_archive), or pass force=True to reuse it anyway")
            header["device"] = dev
            txn.put("header", _META, pack_raw(header))
        self._header = header

    # -- record bytes ----------------------------------------------------------------

    def _follow(self, get: Any, pointer: bytes, gid: bytes) -> bytes:
        """The bytes of the record whose ``records`` value is ``pointer`` (schema 3), read with ``get``."""
        if len(pointer) != 9:
            raise CorruptArchiveError(f"{self._where}: the pointer of record {gid.decode(errors='replace')} is "
                                      f"damaged ({len(pointer)} bytes, expected 9)")
        key = pointer[:8]
        body = get("bodies", key)
        if body is None:
            raise CorruptArchiveError(f"{self._where}: the body of record {gid.decode(errors='replace')} (seq "
                                      f"{_U64.unpack(key)[0]}) is missing")
        if pointer[8]:
            tail = get("tails", key)
            if tail is None:
                raise CorruptArchiveError(f"{self._where}: the tail of record {gid.decode(errors='replace')} (seq "
                                          f"{_U64.unpack(key)[0]}) is missing")
            body += tail
        return body

    def _raw(self, get: Any, gid: bytes) -> bytes | None:
        """The stored bytes of record ``gid`` (None if absent), through ``get`` (a store's or txn's)."""
        raw = get("records", gid)
        if raw is None or self._layout < 3:
            return raw
        return self._follow(get, raw, gid)

    # -- writes --------------------------------------------------------------------

    def _prepare(self, record: Record) -> Record:
        """A private copy of ``record`` with its cell and descriptors set (seq is set on insert)."""
        if type(record) is not Record and not isinstance(record, Record):
            raise InvalidRecordError(f"add() takes a Record, got {type(record).__name__}")
        rec = object.__new__(type(record))  # always a private copy: _insert_all sets its seq
        fields = rec.__dict__
        fields.update(record.__dict__)
        evaluation = record.evaluation
        if evaluation.status is not Status.OK:
            fields["cell"] = None
            return rec
        placed = self._place(record.genome, evaluation) if self._place is not None else None
        if placed is not None:
            fields["cell"], fields["descriptors"] = placed
            return rec
        problem = self.problem
        assert problem is not None
        try:
            values = problem.descriptor_values(record.genome, evaluation)
            cell = tuple([int(axis.index(values[axis.name])) for axis in self._axes])
        except SpaceError as e:
            raise InvalidRecordError(
                f"record {record.id[:12]} cannot be placed in the grid: {e}. Its params, resources or metrics "
                f"must give every descriptor ({', '.join(a.name for a in self._axes)}) a valid value; "
                "nothing was written") from None
        fields["cell"] = cell
        fields["descriptors"] = values
        return rec

    def _insert_all(self, txn: Txn, prepared: list[Record], seq0: int) -> tuple[
            list[AddResult], list[tuple[Any, ...]], int, dict[str, int], float | None, list[tuple[str, str]]]:
        """Write a batch inside ``txn``: what the grid does with each record, in input order.

        Reads first (one duplicate lookup for the whole batch, one lookup per cell touched),
        then decides every record in order in memory, then writes each sub-database in one
        call; the stored result is the same as adding the records one by one. Returns the
        results, the cell changes ``(cell, id, fitness, seq, record)``, the next seq, the
        count per status, the lowest finite OK fitness and the sources this batch stored
        inline (to remember once the transaction has committed).
        """
        keys = [rec.genome._id.encode() for rec in prepared]  # type: ignore[attr-defined]
        stored = txn.get_many("records", keys)
        batch: dict[bytes, Record] = {}
        cells: dict[tuple[int, ...], tuple[str, float] | None] = {}
        winners: dict[tuple[int, ...], tuple[str, float, int]] = {}
        rec_items: list[tuple[bytes, bytes]] = []
        body_items: list[tuple[bytes, bytes]] = []
        tail_items: list[tuple[bytes, bytes]] = []
        layout3 = self._layout >= 3
        page = self._page
        index_items: list[tuple[bytes, bytes]] = []
        lineage_items: list[tuple[bytes, bytes]] = []
        counts: dict[str, int] = {}
        low: float | None = None
        seq = seq0
        results: list[AddResult] = []
        changes: list[tuple[Any, ...]] = []
        share = self._layout >= 2
        known = self._sources.by_obj
        fresh: dict[int, tuple[str, str]] = {}  # sources stored inline by this batch: id(source) -> (source, id)
        pack_seq = _U64.pack
        encode = dumps
        isfinite = math.isfinite
        new_result = _result
        tails = _STATUS_TAIL
        not_added, improved, new = AddStatus.NOT_ADDED, AddStatus.IMPROVED, AddStatus.NEW
        for rec, key, existing in zip(prepared, keys, stored, strict=True):
            if key in batch:
                results.append(new_result(not_added, batch[key], None, True))
                continue
            if existing is not None:
                if layout3:
                    existing = self._follow(txn.get, existing, key)
                results.append(new_result(not_added, self._decode(existing, txn), None, True))
                continue
            fields = rec.__dict__
            fields["seq"] = seq  # rec is the private copy made by _prepare
            try:
                if share:
                    genome = fields["genome"]
                    source = genome.source
                    if len(source) >= _SHARE_MIN:
                        hit = fresh.get(id(source)) or known.get(id(source))
                        if hit is not None and hit[0] is source:
                            data = pack_raw(rec._payload({  # type: ignore[attr-defined]
                                "source_of": hit[1], "params": genome._plain_params(), "entry": genome.entry,
                                "language": genome.language, "id": genome._id}))
                        else:
                            fresh[id(source)] = (source, genome._id)
                            data = encode(rec)
                    else:
                        data = encode(rec)
                else:
                    data = encode(rec)
            except CodecError as e:
                raise InvalidRecordError(f"record {rec.id[:12]} cannot be encoded: {e}; nothing was written") \
                    from None
            batch[key] = rec
            seq_key = pack_seq(seq)
            if layout3:
                body, tail = cut_body(data, page)
                body_items.append((seq_key, body))
                if tail:
                    tail_items.append((seq_key, tail))
                rec_items.append((key, seq_key + (b"\1" if tail else b"\0")))
            else:
                rec_items.append((key, data))
            status = fields["evaluation"].status
            index_items.append((b"s" + seq_key, key + tails[status]))
            parents = fields["parents"]
            if parents:
                op = fields["operator"].encode()
                for parent in parents:
                    lineage_items.append((str(parent).encode() + b"/" + key, op))
            status = status._value_
            counts[status] = counts.get(status, 0) + 1
            this_seq = seq
            seq += 1
            cell = fields["cell"]
            if cell is None:
                results.append(new_result(not_added, rec, None, False))
                continue
            fit = float(fields["evaluation"].fitness)
            if isfinite(fit) and (low is None or fit < low):
                low = fit
            if cell in cells:
                cur = cells[cell]
            else:
                raw = txn.get("cells", _cell_key(cell))
                if raw is None:
                    cur = None
                else:
                    cid, cfit, _ = unpack_raw(raw)
                    cur = (cid, cfit)
                cells[cell] = cur
            previous = None
            if cur is not None:
                cid, cfit = cur
                ckey = cid.encode()
                prev = batch.get(ckey) or self._cache.get(cid)
                if prev is None:
                    prev_raw = self._raw(txn.get, ckey)
                    prev = self._decode(prev_raw, txn) if prev_raw is not None else None
                previous = prev
                if not fit > cfit:
                    results.append(new_result(not_added, rec, previous, False))
                    continue
            gid = key.decode()
            cells[cell] = (gid, fit)
            winners[cell] = (gid, fit, this_seq)
            results.append(new_result(improved if cur is not None else new, rec, previous, False))
            changes.append((cell, gid, fit, this_seq, rec))
        if rec_items:
            rec_items.sort()
            txn.put_many("records", rec_items)
            if body_items:
                txn.put_many("bodies", body_items)  # seq order: appended at the end of the tree
                if tail_items:
                    txn.put_many("tails", tail_items)
            txn.put_many("index", index_items)
            if lineage_items:
                lineage_items.sort()
                txn.put_many("lineage", lineage_items)
            if winners:
                txn.put_many("cells", sorted((_cell_key(c), pack_raw(list(w))) for c, w in winners.items()))
        return results, changes, seq, counts, low, list(fresh.values())

    def _write_batch(self, prepared: list[Record]) -> list[AddResult]:
        for attempt in range(_RETRIES):
            try:
                with self._store.transaction() as txn:
                    seq0 = _read_u64(txn.get("header", _NEXT_SEQ))
                    results, changes, seq, counts, low, fresh = self._insert_all(txn, prepared, seq0)
                    if seq != seq0:
                        txn.put("header", _NEXT_SEQ, _u64(seq))
                        for status, n in counts.items():
                            k = b"count/" + status.encode()
                            txn.put("header", k, _u64(_read_u64(txn.get("header", k)) + n))
                        if low is not None:
                            raw = txn.get("header", _MIN_FIT)
                            if raw is None or low < struct.unpack(">d", raw)[0]:
                                txn.put("header", _MIN_FIT, struct.pack(">d", low))
                break
            except TransactionConflict:
                if attempt == _RETRIES - 1:
                    raise
        # committed: later records may refer to the sources this batch stored
        add_source = self._sources.add
        for source, carrier in fresh:
            add_source(source, carrier)
        # keep the in-memory elite index in step when nobody else wrote in between
        if self._token == seq0:
            if changes:
                elites = self._elites
                for cell, gid, fit, seq_, _ in changes:
                    elites[cell] = (gid, fit, seq_)
                self._elite_list = None
            self._token = seq
        else:
            self._token = None
        for change in changes:
            self._remember(change[4])
        return results

    def add(self, record: Record) -> AddResult:
        """Store a record (failures too) and place it in the grid if it is OK and wins its cell.

        The archive sets ``seq``, ``cell`` and ``descriptors``. A record whose genome id is
        already stored changes nothing and returns NOT_ADDED with ``duplicate=True``.

        Raises:
            InvalidRecordError: A descriptor is missing, NaN or not on its axis (nothing written).
        """
        self._writable()
        return self._write_batch([self._prepare(record)])[0]

    def add_many(self, records: Iterable[Record]) -> list[AddResult]:
        """Add several records in one transaction (all or nothing); results in input order.

        Python's cyclic garbage collector is paused while the batch is prepared and written
        (and restored to its previous state after): a batch allocates thousands of small,
        acyclic objects, which would otherwise trigger collections that traverse every live
        object of the process (benchmarks/RESULTS.md, 2026-12-03: 40.8 against 44.7 us per
        record on tmpfs).
        """
        self._writable()
        with _gc_paused():
            prepared = [self._prepare(r) for r in records]
            if not prepared:
                return []
            return self._write_batch(prepared)

    def save_state(self, state: Mapping[str, Any]) -> None:
        """Store the engine's state (plain data: dicts, lists, str, bytes, numbers of any size) for resuming."""
        self._writable()
        try:
            data = pack_raw(_wrap_big(dict(state)))
        except CodecError as e:
            raise ArchiveError(f"engine state cannot be stored: {e}") from None
        self._store.put("state", _STATE, data)

    def load_state(self) -> dict[str, Any] | None:
        """The engine state last saved, or None."""
        raw = self._store.get("state", _STATE)
        if raw is None:
            return None
        try:
            state = unpack_raw(raw)
        except CodecError as e:
            raise self._decode_error(e, "the saved engine state is damaged") from None
        return dict(_unwrap_big(state))

    # -- reads ---------------------------------------------------------------------

    def _decode_error(self, e: CodecError, what: str) -> ArchiveError:
        """The archive error for undecodable stored bytes: newer schema, or damage."""
        if "newer" in str(e):
            return SchemaVersionError(f"{self._where}: {e}")
        return CorruptArchiveError(f"{self._where}: {what} ({e})")

    def _decode(self, raw: bytes, txn: Txn | None = None) -> Record:
        """A stored record, its source fetched when it refers to another record's (``txn``: read through it)."""
        try:
            rec = loads(raw)
        except CodecError as e:
            raise self._decode_error(e, "a stored record cannot be decoded") from None
        if type(rec) is Record:
            source = rec.genome.source
            if len(source) >= _SHARE_MIN:
                self._sources.add(source, rec.genome._id)  # type: ignore[attr-defined]
            return rec
        genome = rec.get("genome") if isinstance(rec, dict) else None
        carrier = genome.get("source_of") if isinstance(genome, dict) else None
        if not isinstance(carrier, str):
            raise CorruptArchiveError(f"{self._where}: the records table holds a {type(rec).__name__}")
        source = self._sources.by_carrier.get(carrier)
        if source is None:
            key = carrier.encode()
            held = self._raw(txn.get if txn is not None else self._store.get, key)
            try:
                held_rec = loads(held) if held is not None else None
            except CodecError as e:
                raise self._decode_error(e, f"record {carrier} (holding a shared source) cannot be decoded") \
                    from None
            if type(held_rec) is not Record:
                raise CorruptArchiveError(
                    f"{self._where}: record {genome.get('id')} takes its source from record {carrier}, which is "
                    + ("missing" if held is None else "not a record holding its source"))
            source = held_rec.genome.source
            self._sources.add(source, carrier)
        genome = dict(genome)
        del genome["source_of"]
        genome["source"] = source
        try:
            return Record.from_dict({**rec, "genome": genome})
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptArchiveError(f"{self._where}: a stored record cannot be decoded ({e})") from None

    def _remember(self, rec: Record) -> None:
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[rec.id] = rec

    def get(self, genome_id: str) -> Record | None:
        """The record stored under a genome id, or None."""
        gid = getattr(genome_id, "id", genome_id)
        rec = self._cache.get(gid)
        if rec is not None:
            return rec
        raw = self._raw(self._store.get, str(gid).encode())
        if raw is None:
            return None
        rec = self._decode(raw)
        self._remember(rec)
        return rec

    def resolve_id(self, prefix: str) -> str:
        """The full genome id that starts with ``prefix``.

        Raises:
            ArchiveError: No id, or several ids, start with ``prefix``.
        """
        prefix = prefix.strip().lower()
        if not prefix:
            raise ArchiveError("empty genome id")
        found: list[str] = []
        for k, _ in self._store.scan("records", prefix.encode()):
            found.append(k.decode())
            if len(found) > 5:
                break
        if not found:
            raise ArchiveError(f"no record id starts with {prefix!r} in {self._where}")
        if len(found) > 1:
            raise ArchiveError(f"id prefix {prefix!r} is ambiguous: {', '.join(f[:16] for f in found)}...; "
                               "give more digits")
        return found[0]

    def __contains__(self, genome_id: object) -> bool:
        gid = getattr(genome_id, "id", genome_id)
        if not isinstance(gid, str) or not gid:
            return False
        return gid in self._cache or self._store.get("records", gid.encode()) is not None

    def __len__(self) -> int:
        return self._store.count("records")

    def __iter__(self) -> Iterator[Record]:
        return self.records()

    def records(self, status: Status | str | None = None, start: int = 0) -> Iterator[Record]:
        """Every record (or those with ``status``) with ``seq >= start``, in seq (insertion) order."""
        want = None if status is None else Status(status).value.encode()
        first = b"s" + _u64(max(start, 0))
        for k, v in self._store.scan("index", b"s"):
            if k < first:
                continue
            gid, _, st = v.partition(b"\0")
            if want is not None and st != want:
                continue
            raw = self._raw(self._store.get, gid)
            if raw is None:
                raise CorruptArchiveError(f"{self._where}: index names record {gid.decode()} which is missing")
            yield self._decode(raw)

    def _refresh(self) -> None:
        token = _read_u64(self._store.get("header", _NEXT_SEQ))
        if token == self._token:
            return
        elites: dict[tuple[int, ...], tuple[str, float, int]] = {}
        for k, v in self._store.scan("cells"):
            try:
                gid, fit, seq = unpack_raw(v)
            except (CodecError, ValueError) as e:
                raise CorruptArchiveError(f"{self._where}: a grid cell is damaged ({e})") from None
            elites[_cell_of_key(k)] = (gid, float(fit), int(seq))
        self._elites = elites
        self._elite_list = None
        self._token = token

    def _elite_entries(self) -> list[tuple[str, float, int]]:
        self._refresh()
        if self._elite_list is None:
            self._elite_list = [self._elites[c] for c in sorted(self._elites)]
        return self._elite_list

    def _must_get(self, gid: str) -> Record:
        rec = self.get(gid)
        if rec is None:
            raise CorruptArchiveError(f"{self._where}: a grid cell names record {gid} which is missing")
        return rec

    def elites(self) -> Iterator[Record]:
        """The elite of every occupied cell, in cell order."""
        for gid, _, _ in list(self._elite_entries()):
            yield self._must_get(gid)

    def elite(self, cell: Iterable[int]) -> Record | None:
        """The elite of one cell, or None."""
        self._refresh()
        entry = self._elites.get(tuple(int(i) for i in cell))
        return self._must_get(entry[0]) if entry else None

    def sample_elites(self, n: int, rng: np.random.Generator) -> list[Record]:
        """``n`` elites drawn uniformly with replacement (empty list when the grid is empty)."""
        entries = self._elite_entries()
        if not entries or n <= 0:
            return []
        idx = rng.integers(len(entries), size=n)
        return [self._must_get(entries[int(i)][0]) for i in idx]

    def best(self) -> Record | None:
        """The OK record of highest fitness (earliest on ties), or None."""
        entries = self._elite_entries()
        if not entries:
            return None
        gid = max(entries, key=lambda e: (e[1], -e[2]))[0]
        return self._must_get(gid)

    @property
    def axes(self) -> tuple[NumericAxis | CategoricalAxis, ...]:
        """The descriptor axes of the grid."""
        return self._axes

    @property
    def n_cells(self) -> int:
        """Number of cells in the grid (1 with no descriptors)."""
        return int(np.prod([a.size for a in self._axes])) if self._axes else 1

    @property
    def n_elites(self) -> int:
        """Number of occupied cells."""
        return len(self._elite_entries())

    @property
    def coverage(self) -> float:
        """Fraction of cells occupied."""
        return self.n_elites / self.n_cells

    @property
    def qd_score(self) -> float:
        """``sum(fitness - min_fitness + 1)`` over elites (see the module docstring)."""
        entries = self._elite_entries()
        if not entries:
            return 0.0
        raw = self._store.get("header", _MIN_FIT)
        low = struct.unpack(">d", raw)[0] if raw else min(e[1] for e in entries)
        return float(sum(e[1] - low + 1.0 for e in entries))

    def counts(self) -> dict[str, int]:
        """Number of records by :class:`Status` value (every status present, zeros included)."""
        return {s.value: _read_u64(self._store.get("header", b"count/" + s.value.encode())) for s in Status}

    def lineage(self) -> Lineage:
        """The parent -> child graph of every record."""
        edges = []
        for k, v in self._store.scan("lineage"):
            parent, _, child = k.partition(b"/")
            edges.append((parent.decode(), child.decode(), v.decode()))
        return Lineage(edges, self.__contains__)

    # -- lifetime --------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The underlying store."""
        return self._store

    def sync(self) -> None:
        """Flush every add to the disk now (needed only with ``durability="process"``)."""
        flush = getattr(self._store, "sync", None)
        if flush is not None and not self._readonly:
            flush()

    def close(self) -> None:
        """Close the store if this archive opened it (flushing it to the disk)."""
        if self._owns:
            self._store.close()

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Archive({self._where}, {len(self)} records, {self.n_elites}/{self.n_cells} cells)"


def fork_archive(src: Archive | str | os.PathLike[str], dst: Store | str | os.PathLike[str] | None,
                 problem: Problem, device: DeviceInfo | Mapping[str, Any] | None = None,
                 batch: int = 1000) -> Archive:
    """Copy the records and lessons of ``src`` into a new archive for ``problem``.

    Records are re-added in their original order, so cells are recomputed under the new
    problem's descriptors; an OK record whose descriptors do not fit the new axes is kept
    without a cell (and logged). Engine state is not copied.

    Raises:
        ArchiveError: ``dst`` already holds records.
    """
    source = src if isinstance(src, Archive) else Archive.open_readonly(src)
    out = Archive(problem, dst, device=device)
    try:
        if len(out):
            raise ArchiveError(f"fork_archive: the destination {out._where} already holds {len(out)} records; "
                               "give a new path")
        pending: list[Record] = []
        skipped = 0
        for rec in source.records():
            try:
                pending.append(out._prepare(rec))
            except InvalidRecordError as e:
                skipped += 1
                log.warning("fork_archive: %s", e)
                pending.append(rec.replace(cell=None))
            if len(pending) >= batch:
                out._write_batch(pending)
                pending = []
        if pending:
            out._write_batch(pending)
        for lesson in source.lessons:
            out.lessons.append(lesson)
        if skipped:
            log.warning("fork_archive: %d OK record(s) kept without a cell (descriptors outside the new axes)", skipped)
    except BaseException:
        out.close()
        raise
    finally:
        if source is not src:
            source.close()
    return out
