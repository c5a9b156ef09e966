"""Errors raised by the archive; every message says what to do next."""

from __future__ import annotations

__all__ = [
    "ArchiveError",
    "CorruptArchiveError",
    "HeaderMismatchError",
    "InvalidRecordError",
    "NotAnArchiveError",
    "ReadOnlyArchiveError",
    "SchemaVersionError",
    "TransactionConflict",
]


class ArchiveError(Exception):
    """Base class of every archive error."""


class NotAnArchiveError(ArchiveError):
    """The path exists but does not hold a kernel-factory archive (it is left untouched)."""


class SchemaVersionError(ArchiveError):
    """The archive was written by a newer library with a newer schema: upgrade to read it."""


class CorruptArchiveError(ArchiveError):
    """The archive's files are damaged (truncated, overwritten or undecodable); nothing was modified."""


class HeaderMismatchError(ArchiveError):
    """The archive was created for a different problem or device."""


class InvalidRecordError(ArchiveError, ValueError):
    """A record that cannot be placed in the archive (bad descriptor, wrong type); nothing was written."""


class ReadOnlyArchiveError(ArchiveError):
    """A write was attempted on an archive opened with :meth:`Archive.open_readonly`."""


class TransactionConflict(ArchiveError):
    """A transaction had to be restarted (map growth) and another process changed what it had read.

    The store rolled everything back; re-run the whole transaction. :class:`Archive` does
    this by itself.
    """
