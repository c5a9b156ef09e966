"""Lessons: short structured findings kept in the archive (append-only, in seq order)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING

from archive._errors import CorruptArchiveError, InvalidRecordError, ReadOnlyArchiveError
from evo.codec import CodecError, dumps, loads
from evo.types import Lesson

if TYPE_CHECKING:
    from archive._store import Store

__all__ = ["Lessons"]

_NEXT = b"next_lesson_seq"


def _be(n: int) -> bytes:
    return struct.pack(">Q", n)


class Lessons:
    """The lessons of an archive. Keys are big-endian seqs, so iteration is in append order."""

    def __init__(self, store: Store, readonly: bool = False, where: str = "archive") -> None:
        self._store = store
        self._readonly = readonly
        self._where = where

    def append(self, lesson: Lesson) -> Lesson:
        """Store a lesson; return it with its ``seq`` set."""
        if self._readonly:
            raise ReadOnlyArchiveError(f"{self._where} is open read-only; lessons cannot be added")
        if not isinstance(lesson, Lesson):
            raise InvalidRecordError(f"append() takes a Lesson, got {type(lesson).__name__}")
        with self._store.transaction() as txn:
            raw = txn.get("header", _NEXT)
            seq = struct.unpack(">Q", raw)[0] if raw else 0
            out = lesson.replace(seq=seq)
            try:
                data = dumps(out)
            except CodecError as e:
                raise InvalidRecordError(f"lesson cannot be stored: {e}") from None
            txn.put("lessons", _be(seq), data)
            txn.put("header", _NEXT, _be(seq + 1))
        return out

    def _decode(self, raw: bytes) -> Lesson:
        try:
            value = loads(raw)
        except CodecError as e:
            raise CorruptArchiveError(f"{self._where}: a stored lesson cannot be decoded ({e})") from None
        if not isinstance(value, Lesson):
            raise CorruptArchiveError(f"{self._where}: the lessons table holds a {type(value).__name__}")
        return value

    def __iter__(self) -> Iterator[Lesson]:
        for _, raw in self._store.scan("lessons"):
            yield self._decode(raw)

    def __len__(self) -> int:
        return self._store.count("lessons")

    def all(self) -> list[Lesson]:
        """Every lesson, oldest first."""
        return list(self)

    def recent(self, n: int) -> list[Lesson]:
        """The last ``n`` lessons, oldest first."""
        out: list[Lesson] = []
        if n <= 0:
            return out
        for _, raw in self._store.scan("lessons", reverse=True):
            out.append(self._decode(raw))
            if len(out) >= n:
                break
        out.reverse()
        return out

    def by_parent(self, parent_id: str) -> list[Lesson]:
        """Lessons about children of ``parent_id``, oldest first."""
        return [le for le in self if le.parent_id == parent_id]

    def by_operator(self, name: str) -> list[Lesson]:
        """Lessons written for operator ``name``, oldest first."""
        return [le for le in self if le.operator == name]

    def by_outcome(self, outcome: str) -> list[Lesson]:
        """Lessons with the given outcome (``"improved"``, ``"no_gain"``, a Status value...), oldest first."""
        outcome = getattr(outcome, "value", outcome)
        return [le for le in self if le.outcome == outcome]
