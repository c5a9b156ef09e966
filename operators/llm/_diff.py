"""Parsing LLM answers: SEARCH/REPLACE blocks, fenced code blocks and params JSON.

Every function raises :class:`operators.OperatorError` with the reason (which block,
why) when the answer cannot be used, so the failure is recorded as a lesson.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from operators._base import OperatorError

__all__ = ["EditBlock", "apply_blocks", "extract_code", "extract_params", "parse_blocks"]

_SEARCH = re.compile(r"^\s*<{5,9}\s*SEARCH\s*$")
_DIVIDER = re.compile(r"^\s*={5,9}\s*$")
_REPLACE = re.compile(r"^\s*>{5,9}\s*REPLACE\s*$")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+#.-]*)\s*$")
CODE_LANGS = ("cuda", "cu", "cpp", "c++", "cxx", "c", "ptx", "")


@dataclass(frozen=True)
class EditBlock:
    """One SEARCH/REPLACE edit."""

    search: str
    replace: str


def parse_blocks(text: str) -> list[EditBlock]:
    """All ``<<<<<<< SEARCH / ======= / >>>>>>> REPLACE`` blocks of ``text``, in order.

    Raises:
        OperatorError: a block is not closed (a truncated answer) or has no divider.
    """
    lines = text.splitlines()
    blocks: list[EditBlock] = []
    i = 0
    while i < len(lines):
        if not _SEARCH.match(lines[i]):
            i += 1
            continue
        n = len(blocks) + 1
        j = i + 1
        search: list[str] = []
        while j < len(lines) and not _DIVIDER.match(lines[j]):
            if _SEARCH.match(lines[j]) or _REPLACE.match(lines[j]):
                raise OperatorError(f"edit block {n}: no '=======' divider between SEARCH and REPLACE")
            search.append(lines[j])
            j += 1
        if j >= len(lines):
            raise OperatorError(f"edit block {n}: SEARCH is not followed by '=======' (truncated answer?)")
        k = j + 1
        replace: list[str] = []
        while k < len(lines) and not _REPLACE.match(lines[k]):
            if _SEARCH.match(lines[k]):
                raise OperatorError(f"edit block {n}: not closed by '>>>>>>> REPLACE' before the next block")
            replace.append(lines[k])
            k += 1
        if k >= len(lines):
            raise OperatorError(f"edit block {n}: not closed by '>>>>>>> REPLACE' (truncated answer?)")
        blocks.append(EditBlock("\n".join(search), "\n".join(replace)))
        i = k + 1
    return blocks


def _norm_line(line: str) -> str:
    return " ".join(line.split())


def _line_spans(source: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of each line (end excludes the newline)."""
    spans = []
    pos = 0
    for line in source.split("\n"):
        spans.append((pos, pos + len(line)))
        pos += len(line) + 1
    return spans


def _apply_one(source: str, block: EditBlock, n: int) -> str:
    search = block.search
    if not search.strip():
        raise OperatorError(f"edit block {n}: SEARCH is empty; quote the exact lines to replace")
    count = source.count(search)
    if count == 1:
        return source.replace(search, block.replace, 1)
    if count > 1:
        raise OperatorError(f"edit block {n}: SEARCH text is ambiguous: it matches {count} places in the parent; "
                            "include more surrounding lines so it matches exactly once")
    # Fallback: line-based, whitespace-tolerant (runs of whitespace collapsed, ends stripped,
    # blank lines at the edges of SEARCH ignored).
    want = [_norm_line(s) for s in search.split("\n")]
    while want and not want[0]:
        want.pop(0)
    while want and not want[-1]:
        want.pop()
    lines = source.split("\n")
    have = [_norm_line(s) for s in lines]
    hits = [i for i in range(len(have) - len(want) + 1) if have[i:i + len(want)] == want]
    if not hits:
        first = want[0] if want else ""
        raise OperatorError(f"edit block {n}: SEARCH text not found in the parent (first line: {first[:80]!r}); "
                            "SEARCH must quote the current source exactly")
    if len(hits) > 1:
        raise OperatorError(f"edit block {n}: SEARCH text is ambiguous: it matches {len(hits)} places in the "
                            "parent (whitespace-insensitive); include more surrounding lines")
    spans = _line_spans(source)
    start = spans[hits[0]][0]
    end = spans[hits[0] + len(want) - 1][1]
    return source[:start] + block.replace.strip("\n") + source[end:]


def apply_blocks(source: str, blocks: list[EditBlock]) -> str:
    """Apply ``blocks`` in order; each SEARCH must match exactly once.

    An exact substring match is tried first; when there is none, a line-based match that
    ignores differences in whitespace runs and trailing spaces.

    Raises:
        OperatorError: no blocks, or a block whose SEARCH matches zero or several places.
    """
    if not blocks:
        raise OperatorError("no SEARCH/REPLACE edit blocks in the response")
    for n, block in enumerate(blocks, 1):
        source = _apply_one(source, block, n)
    return source


def _fenced(text: str) -> tuple[list[tuple[str, str]], bool]:
    """(language, body) of each closed fenced block, and whether a fence is left open."""
    out: list[tuple[str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(2), m.group(3).lower()
        j = i + 1
        body: list[str] = []
        while j < len(lines):
            m2 = _FENCE.match(lines[j])
            if m2 and m2.group(2)[0] == fence[0] and len(m2.group(2)) >= len(fence) and not m2.group(3):
                break
            body.append(lines[j])
            j += 1
        if j >= len(lines):
            return out, True
        out.append((lang, "\n".join(body)))
        i = j + 1
    return out, False


def extract_code(text: str) -> str:
    """The kernel source in the answer's ```cuda fenced block.

    A ``cuda``/``cu`` block wins over ``cpp``/``c``/unlabelled ones; among several of
    the same kind the longest is taken. ``json`` blocks are never code.

    Raises:
        OperatorError: ``"no code block in the response"``, or a fence left open
            (``"truncated ..."``).
    """
    blocks, open_fence = _fenced(text)
    code = [(lang, body) for lang, body in blocks if lang in CODE_LANGS and body.strip()]
    if not code:
        if open_fence:
            raise OperatorError("truncated response: a code fence is opened but never closed")
        raise OperatorError("no code block in the response")
    best = [b for lang, b in code if lang in ("cuda", "cu")] or [b for _, b in code]
    return max(best, key=len) + "\n"


def extract_params(text: str) -> dict[str, Any] | None:
    """The ``{"params": {...}}`` object of the answer's ```json block, or ``None`` if none.

    Raises:
        OperatorError: the block is not valid JSON or not of that shape.
    """
    blocks, _ = _fenced(text)
    found = [body for lang, body in blocks if lang == "json"]
    if not found:
        return None
    body = found[-1]
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise OperatorError(f"params block is not valid JSON ({e.msg} at line {e.lineno} col {e.colno})") from None
    if not (isinstance(obj, Mapping) and isinstance(obj.get("params"), Mapping)):
        raise OperatorError('params block must be a JSON object {"params": {"name": value, ...}}')
    return dict(obj["params"])
