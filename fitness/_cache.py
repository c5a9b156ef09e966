"""An on-disk compile cache shared safely by threads and processes.

One file per key (``<root>/<key[:2]>/<key>.msgpack``), written to a temporary file in
the same directory and moved into place with :func:`os.replace`, so a reader sees either
nothing or a whole entry, and several processes may fill the same cache at once (the
last writer of equal content wins). Entries are msgpack maps (no pickle: a shared cache
directory must not be a code-execution channel). A file that cannot be read is treated
as a miss and removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack

from evo.types import canonical_json

__all__ = ["CompileCache", "cache_key", "default_cache_dir"]

log = logging.getLogger(__name__)

_FORMAT = 1


def default_cache_dir() -> Path:
    """``$EVO_CACHE_DIR`` if set, else ``~/.cache/ptx-kernel-factory/compile``."""
    env = os.environ.get("EVO_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "ptx-kernel-factory" / "compile"


def cache_key(*, source: str, defines: Sequence[str], options: Sequence[str], target: str, backend: str,
              toolkit: str, language: str = "cuda", entry: str = "") -> str:
    """SHA-256 (hex) of everything that decides a compile's output.

    The source is hashed exactly (not normalised): a comment can change line info.
    """
    payload = canonical_json({"format": _FORMAT, "source": source, "defines": list(defines),
                              "options": list(options), "target": target, "backend": backend,
                              "toolkit": toolkit, "language": language, "entry": entry})
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


class CompileCache:
    """A directory of compile results keyed by :func:`cache_key`.

    Args:
        root: The cache directory (created on first write).
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()

    def _path(self, key: str) -> Path:
        if len(key) < 8 or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"cache key must be a hex digest, got {key!r}")
        return self.root / key[:2] / f"{key}.msgpack"

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry stored under ``key``, or ``None``."""
        path = self._path(key)
        try:
            raw = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            log.warning("compile cache: cannot read %s: %s", path, e)
            return None
        try:
            entry = msgpack.unpackb(raw, raw=False)
            if not isinstance(entry, dict) or entry.get("_format") != _FORMAT:
                raise ValueError("not a compile cache entry")
        except Exception as e:  # corrupt or foreign file: drop it
            log.warning("compile cache: dropping unreadable entry %s (%s)", path, e)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        entry.pop("_format", None)
        return entry

    def put(self, key: str, entry: Mapping[str, Any]) -> None:
        """Store ``entry`` (bytes, str, numbers, lists and dicts) under ``key`` atomically."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = msgpack.packb({**entry, "_format": _FORMAT}, use_bin_type=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def __contains__(self, key: str) -> bool:
        return self._path(key).exists()

    def clear(self) -> int:
        """Remove every entry; return how many were removed."""
        n = 0
        if not self.root.exists():
            return 0
        for p in self.root.glob("*/*.msgpack"):
            with contextlib.suppress(OSError):
                p.unlink()
                n += 1
        return n

    def __repr__(self) -> str:
        return f"CompileCache({str(self.root)!r})"
