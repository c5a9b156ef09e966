"""The archive: MAP-Elites grid over an LMDB (or in-memory) store, lineage, lessons.

API index:
    :class:`Archive`        the grid: add / add_many, get, records, elites, sample_elites,
                            best, coverage, qd_score, counts, lineage, lessons,
                            save_state / load_state, header, set_device, open_readonly,
                            sync (flush, for ``durability="process"``)
    :class:`AddStatus`, :class:`AddResult`
    :func:`fork_archive`    copy records and lessons into a new archive for another problem
    :class:`Lineage`        parent -> child graph (networkx)
    :class:`Lessons`        append-only lessons
    :class:`Store`, :class:`Txn`, :class:`LMDBStore`, :class:`MemoryStore`   storage seam
    :data:`DURABILITY`      what ``durability="full"`` (default) and ``"process"`` guarantee
    :data:`ARCHIVE_SCHEMA_VERSION`   the layout new archives get (2: shared sources stored once)
    Errors: :class:`ArchiveError` > :class:`NotAnArchiveError`, :class:`SchemaVersionError`,
        :class:`CorruptArchiveError`, :class:`HeaderMismatchError`, :class:`InvalidRecordError`,
        :class:`ReadOnlyArchiveError`, :class:`TransactionConflict`
    :mod:`archive.testing`  :class:`StoreContract`, a test suite for any Store
"""

from archive._archive import ARCHIVE_SCHEMA_VERSION, FORMAT, AddResult, AddStatus, Archive, fork_archive
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
from archive._lmdb import DEFAULT_MAP_SIZE, DEFAULT_SYNC_INTERVAL, DURABILITY, Durability, LMDBStore
from archive._store import MemoryStore, Store, Txn

__all__ = [
    "ARCHIVE_SCHEMA_VERSION",
    "DEFAULT_MAP_SIZE",
    "DEFAULT_SYNC_INTERVAL",
    "DURABILITY",
    "Durability",
    "FORMAT",
    "AddResult",
    "AddStatus",
    "Archive",
    "ArchiveError",
    "CorruptArchiveError",
    "HeaderMismatchError",
    "InvalidRecordError",
    "LMDBStore",
    "Lessons",
    "Lineage",
    "MemoryStore",
    "NotAnArchiveError",
    "ReadOnlyArchiveError",
    "SchemaVersionError",
    "Store",
    "TransactionConflict",
    "Txn",
    "fork_archive",
]
