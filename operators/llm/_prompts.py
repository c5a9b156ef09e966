"""Prompt sections and templates for the LLM operators.

A template is :class:`string.Template` text with ``$name`` placeholders (write ``$$`` for
a literal dollar). The sections an operator fills are:

``problem``, ``hardware``, ``parent``, ``parent_b`` (crossover), ``failure`` (repair),
``inspirations``, ``lessons``, ``entry``, ``generation``.

The default templates live in ``operators/llm/templates/``; :func:`load_template`
accepts a path or the template text itself. :func:`render` fills a template and keeps
the prompt under a size bound by truncating the longest sections first, each cut marked
``[... truncated N chars ...]``.
"""

from __future__ import annotations

import json
import math
import os
import string
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from evo.types import Lesson, Problem, Record

__all__ = [
    "load_template",
    "render",
    "render_failure",
    "render_hardware",
    "render_inspirations",
    "render_lessons",
    "render_problem",
    "render_record",
    "select_inspirations",
    "select_lessons",
    "truncate_middle",
]

_MIN_KEEP = 200


def load_template(template: str | os.PathLike[str]) -> str:
    """Template text from a path, a packaged template name (``"diff.txt"``) or the text itself.

    A value counts as a path when it is a :class:`os.PathLike`, or a one-line string that
    names an existing file; a one-line string naming a packaged template loads that.
    Anything else is the template text.

    Raises:
        FileNotFoundError: a :class:`os.PathLike` that does not exist.
    """
    if isinstance(template, os.PathLike):
        return Path(template).read_text(encoding="utf-8")
    if "\n" not in template and len(template) < 4096:
        p = Path(template).expanduser()
        if p.is_file():
            return p.read_text(encoding="utf-8")
        pkg = resources.files("operators.llm").joinpath("templates", template)
        if pkg.is_file():
            return pkg.read_text(encoding="utf-8")
    return template


def truncate_middle(text: str, keep: int) -> str:
    """``text`` cut to about ``keep`` chars: head (2/3) and tail (1/3) around a marker."""
    if len(text) <= keep:
        return text
    cut = len(text) - keep
    head = keep * 2 // 3
    tail = keep - head
    return f"{text[:head]}\n[... truncated {cut} chars ...]\n{text[len(text) - tail:] if tail else ''}"


def render(template: str, sections: Mapping[str, str], max_chars: int | None = 24000,
           protected: Iterable[str] = ("parent", "parent_b")) -> str:
    """Fill ``template`` with ``sections``, truncating longest sections first to fit ``max_chars``.

    Sections named in ``protected`` are cut only when cutting all others is not enough.
    Unknown placeholders are left as they are; sections a template does not use cost
    nothing.

    Raises:
        ValueError: the template has an invalid placeholder (a lone ``$``).
    """
    tmpl = string.Template(template)
    used = set()
    for m in tmpl.pattern.finditer(template):
        if m.group("invalid") is not None:
            line = template[:m.start()].count("\n") + 1
            raise ValueError(f"template line {line}: invalid placeholder; write $$ for a literal dollar sign")
        name = m.group("named") or m.group("braced")
        if name:
            used.add(name)
    secs = {k: str(v) for k, v in sections.items()}
    text = tmpl.safe_substitute(secs)
    if max_chars is None or len(text) <= max_chars:
        return text
    prot = set(protected)
    for allow_protected in (False, True):
        while len(text) > max_chars:
            cands = [k for k in used if k in secs and len(secs[k]) > _MIN_KEEP and (allow_protected or k not in prot)]
            if not cands:
                break
            k = max(cands, key=lambda name: (len(secs[name]), name))
            excess = len(text) - max_chars
            keep = max(_MIN_KEEP, len(secs[k]) - excess - 48)
            if keep >= len(secs[k]):
                break
            secs[k] = truncate_middle(secs[k], keep)
            text = tmpl.safe_substitute(secs)
    return text


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}" if math.isfinite(v) else str(v)
    return str(v)


def render_problem(problem: Problem, entry: str = "kernel") -> str:
    """The task: description, entry point, harness contract, shapes and the params space."""
    lines = [f"Problem: {problem.name} (compile target {problem.target}, entry point `{entry}`)"]
    if problem.description:
        lines += ["", problem.description.strip()]
    lines += ["", "Checked shapes: " + "; ".join(",".join(f"{k}={v}" for k, v in s.items())
                                              for s in problem.check_shapes),
              "Timed shapes: " + ("; ".join(",".join(f"{k}={v}" for k, v in s.items())
                                            for s in problem.timed_shapes) or "(none)"),
              "Dtypes: " + ", ".join(problem.dtypes)]
    space = problem.params.describe()
    if space["params"]:
        lines += ["", "Tunable params (each reaches the source as a -D NAME=VALUE macro and the launch through the "
                  "harness; change them only within these ranges and constraints):",
                  json.dumps(space, sort_keys=True)]
    lines += ["", "Rules: the harness allocates every buffer and launches the kernel; keep the entry point's name "
              "and argument list; device code only (no host code, no streams); allowed includes: "
              + ", ".join(problem.allowed_includes) + "."]
    return "\n".join(lines)


def render_hardware(hardware: Mapping[str, Any], problem: Problem | None = None) -> str:
    """Device facts and measured ceilings (name, sm_count, copy_gbps, ...)."""
    lines = []
    if hardware:
        name = hardware.get("name", "unknown GPU")
        cc = hardware.get("compute_capability")
        lines.append(f"GPU: {name}" + (f" (compute capability {cc})" if cc else ""))
        labels = {"sm_count": "SMs", "copy_gbps": "measured copy bandwidth ceiling (GB/s)",
                  "l2_bytes": "L2 bytes", "shared_per_block_optin": "max shared memory per block (bytes)"}
        for k, v in hardware.items():
            if k in ("name", "compute_capability", "index"):
                continue
            lines.append(f"{labels.get(k, k)}: {_fmt(v)}")
    else:
        lines.append("GPU: not measured yet")
    if problem is not None:
        notes = problem.extra.get("hardware") if isinstance(problem.extra, Mapping) else None
        if notes:
            lines.append(f"Notes: {notes}")
    return "\n".join(lines)


def _metrics_lines(record: Record) -> list[str]:
    ev = record.evaluation
    lines = [f"status: {ev.status.value}" + (f", fitness {_fmt(ev.fitness)}" if ev.fitness is not None else "")]
    frac = ev.metrics.get("fraction")
    if frac is not None:
        lines.append(f"fraction of the measured ceiling (objective): {_fmt(frac)}")
    cases = ev.metrics.get("cases")
    if isinstance(cases, Mapping) and cases:
        lines.append("per case:")
        for key, m in cases.items():
            if isinstance(m, Mapping):
                parts = [f"{k} {_fmt(m[k])}" for k in ("time_ms", "gbps", "fraction", "spread") if k in m]
                lines.append(f"  {key}: " + ", ".join(parts))
    if ev.resources:
        lines.append("resources: " + ", ".join(f"{k} {_fmt(v)}" for k, v in ev.resources.items()
                                               if isinstance(v, (int, float, str))))
    return lines


def render_record(record: Record, label: str = "Parent") -> str:
    """A genome with its params, metrics and resources, the source in a fenced block."""
    g = record.genome
    lines = [f"{label} {g.id[:12]} (operator {record.operator}, generation {record.generation})",
             "params: " + json.dumps(dict(g.params), sort_keys=True)]
    lines += _metrics_lines(record)
    lang = "cuda" if g.language == "cuda" else "ptx"
    lines += [f"```{lang}", g.source.rstrip("\n"), "```"]
    return "\n".join(lines)


def render_failure(record: Record) -> str:
    """Why a record failed: status and its compile log / mismatch report / reason / traceback."""
    ev = record.evaluation
    lines = [f"The candidate failed with status {ev.status.value}."]
    for key in ("compile_log", "mismatch", "reason", "traceback"):
        v = ev.artifacts.get(key)
        if v:
            text = v if isinstance(v, str) else repr(v)
            lines += [f"{key}:", text.rstrip()]
    if len(lines) == 1:
        lines.append("(no log was recorded)")
    return "\n".join(lines)


def select_inspirations(archive: Any, rng: Any, exclude: Iterable[str], n: int) -> list[Record]:
    """The archive's best record plus ``n - 1`` sampled elites (diverse), minus ``exclude``."""
    if archive is None or n <= 0:
        return []
    skip = set(exclude)
    out: list[Record] = []
    pool: list[Any] = []
    best = getattr(archive, "best", None)
    if callable(best):
        pool.append(best())
    sample = getattr(archive, "sample_elites", None)
    if callable(sample):
        try:
            pool.extend(sample(n + len(skip), rng))
        except (ValueError, IndexError):  # an empty archive
            pass
    for r in pool:
        if r is None or not hasattr(r, "genome") or r.id in skip:
            continue
        skip.add(r.id)
        out.append(r)
        if len(out) >= n:
            break
    return out


def render_inspirations(records: Sequence[Record]) -> str:
    """Inspirations, best first."""
    if not records:
        return "(none yet)"
    return "\n\n".join(render_record(r, label=f"Inspiration {i}") for i, r in enumerate(records, 1))


_FAILED = {"compile_error", "incorrect", "runtime_error", "timeout", "rejected", "proposal_error", "error"}


def select_lessons(lessons: Sequence[Lesson], parent_ids: Iterable[str], n: int) -> dict[str, list[Lesson]]:
    """Relevant lessons in three groups: on these parents, recent failures, changes that helped.

    Each lesson appears once (first group that takes it); at most ``n`` in all.
    """
    pids = set(parent_ids)
    groups: dict[str, list[Lesson]] = {"parent": [], "failures": [], "speedups": []}
    taken: set[int] = set()
    newest = list(reversed(list(lessons)))

    def take(group: str, items: Iterable[Lesson]) -> None:
        for les in items:
            if sum(len(g) for g in groups.values()) >= n:
                return
            if id(les) in taken:
                continue
            taken.add(id(les))
            groups[group].append(les)

    per = max(1, n // 3)
    take("parent", [x for x in newest if x.parent_id in pids][:per])
    take("speedups", sorted((x for x in newest if x.delta is not None and math.isfinite(x.delta) and x.delta > 0),
                            key=lambda x: -x.delta)[:per])  # type: ignore[operator]
    take("failures", [x for x in newest if x.outcome in _FAILED or (x.message and x.outcome != "improved")])
    take("speedups", [x for x in newest if x.delta is not None and math.isfinite(x.delta) and x.delta > 0])
    return groups


def render_lessons(groups: Mapping[str, Sequence[Lesson]]) -> str:
    """Lessons as bullet lists under their headings."""
    heads = {"parent": "On this parent:", "failures": "Recent failures (avoid repeating them):",
             "speedups": "Changes that gave speedups:"}
    out = []
    for key, head in heads.items():
        items = groups.get(key) or []
        if items:
            out.append(head)
            out += [f"- {les.summary()[:400]}" for les in items]
    return "\n".join(out) if out else "(none yet)"
