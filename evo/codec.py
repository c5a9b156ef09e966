"""Versioned msgpack codec for the core types.

Every encoded value is a msgpack array ``[SCHEMA_VERSION, kind, payload]`` where kind is
``"genome"``, ``"evaluation"``, ``"record"``, ``"lesson"`` or ``"raw"`` (plain data such
as engine state). Decoding data of a newer schema, of an unknown kind, truncated or
with trailing bytes raises :class:`CodecError` with a message that says what to do.

Pitfalls handled (see the msgpack notes): tuples come back as lists (the types convert
them back), numpy scalars are converted with ``.item()``, ints as map keys are allowed
on decode, NaN and infinities round-trip, bytes stay bytes (``use_bin_type``).
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack

from evo.types import Evaluation, Genome, Lesson, Record

__all__ = ["SCHEMA_VERSION", "CodecError", "dumps", "loads", "pack_raw", "unpack_raw"]

SCHEMA_VERSION = 1

_KINDS: dict[str, Any] = {"genome": Genome, "evaluation": Evaluation, "record": Record, "lesson": Lesson}
_KIND_OF = {v: k for k, v in _KINDS.items()}


class CodecError(ValueError):
    """Bytes that are not a value this codec wrote, or of a newer schema."""


def _default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if isinstance(obj, (tuple,)):
        return list(obj)
    if hasattr(obj, "keys") and hasattr(obj, "__getitem__"):  # MappingProxyType
        return {k: obj[k] for k in obj.keys()}
    if hasattr(obj, "value") and isinstance(obj.value, str):  # enums
        return obj.value
    raise TypeError(f"cannot encode {type(obj).__name__}")


_LOCAL = threading.local()


def _pack(payload: Any) -> bytes:
    # One Packer per thread, reused: ``msgpack.packb`` allocates a fresh 256 KiB buffer per call,
    # which costs more than packing a typical record. ``busy`` guards re-entry (a ``default``
    # hook that encodes) so a nested call packs with a fresh Packer instead of sharing the buffer.
    local = _LOCAL
    packer = getattr(local, "packer", None)
    try:
        if packer is None or local.busy:
            if packer is None:
                local.packer = msgpack.Packer(use_bin_type=True, default=_default, strict_types=False,
                                              autoreset=True)
                local.busy = False
            else:
                return msgpack.packb(payload, use_bin_type=True, default=_default, strict_types=False)
            packer = local.packer
        local.busy = True
        try:
            return packer.pack(payload)  # type: ignore[no-any-return]
        finally:
            local.busy = False
    except (TypeError, OverflowError, ValueError) as e:
        raise CodecError(f"value cannot be encoded: {e}") from e


def dumps(obj: Genome | Evaluation | Record | Lesson) -> bytes:
    """Encode a core value with the schema version and its kind."""
    t = type(obj)
    if t is Record:  # the hot path (archive inserts): no defensive copies of the genome's params
        return _pack([SCHEMA_VERSION, "record", obj._payload(obj.genome._payload())])  # type: ignore[union-attr]
    if t is Genome:
        return _pack([SCHEMA_VERSION, "genome", obj._payload()])  # type: ignore[union-attr]
    kind = _KIND_OF.get(t)
    if kind is None:
        raise CodecError(f"dumps() takes Genome, Evaluation, Record or Lesson, got {type(obj).__name__}; "
                         "use pack_raw() for plain data")
    return _pack([SCHEMA_VERSION, kind, obj.to_dict()])


def pack_raw(data: Any) -> bytes:
    """Encode plain data (dicts, lists, str, bytes, numbers) with the schema envelope."""
    return _pack([SCHEMA_VERSION, "raw", data])


def _unpack(data: bytes) -> tuple[int, str, Any]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    try:
        env = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False, use_list=True)
    except msgpack.ExtraData as e:
        raise CodecError("trailing bytes after the encoded value: the data is corrupted") from e
    except (ValueError, msgpack.UnpackException, TypeError) as e:
        raise CodecError(f"not a valid encoded value ({e}); the data is truncated or corrupted") from e
    if not (isinstance(env, list) and len(env) == 3 and isinstance(env[0], int) and isinstance(env[1], str)):
        raise CodecError("not a value written by this codec (no [version, kind, payload] envelope)")
    version, kind, payload = env
    if version > SCHEMA_VERSION:
        raise CodecError(
            f"data has schema version {version}, newer than this library's {SCHEMA_VERSION}: "
            "upgrade ptx-kernel-factory to read it")
    return version, kind, payload


def loads(data: bytes) -> Any:
    """Decode bytes written by :func:`dumps` or :func:`pack_raw`."""
    _, kind, payload = _unpack(data)
    if kind == "raw":
        return payload
    cls = _KINDS.get(kind)
    if cls is None:
        raise CodecError(f"unknown kind {kind!r} in encoded value")
    try:
        return cls.from_dict(payload)
    except (KeyError, TypeError, ValueError) as e:
        raise CodecError(f"encoded {kind} failed validation: {e}") from e


def unpack_raw(data: bytes) -> Any:
    """Decode plain data written by :func:`pack_raw`."""
    _, kind, payload = _unpack(data)
    if kind != "raw":
        raise CodecError(f"expected raw data, found a {kind}")
    return payload
