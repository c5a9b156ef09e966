"""Run report: Markdown with tables, and PNG figures when matplotlib is installed.

``write_report(archive_path, out_dir)`` reads an archive (read-only, no Problem needed)
and writes ``report.md`` with:

* counts by status, coverage and QD score;
* best fitness against evaluations (archive insertion order) - ``progress.png``;
* the archive heatmap over the first two descriptor axes (one axis: a bar chart) -
  ``heatmap.png``; without matplotlib, a text heatmap in the Markdown;
* the best genome's per-case table (time, GB/s, fraction of the ceiling) from
  ``metrics["cases"]``;
* the lineage of the best genome (seed -> ... -> best, operator and fitness per step).

``evo report ARCHIVE [-o DIR]`` calls it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["best_curve", "heatmap_grid", "write_report"]


def best_curve(records: Sequence[Any]) -> list[tuple[int, float | None]]:
    """``(evaluation number, best OK fitness so far)`` for records in insertion order."""
    out = []
    best: float | None = None
    for i, r in enumerate(records, 1):
        f = r.fitness if r.evaluation.ok else None
        if f is not None and math.isfinite(f) and (best is None or f > best):
            best = f
        out.append((i, best))
    return out


def _axes(archive: Any, elites: Sequence[Any]) -> list[dict[str, Any]]:
    """Descriptor axes: from the header's problem description, else inferred from the elites."""
    header = getattr(archive, "header", None) or {}
    desc = None
    for key in ("problem", "problem_description", "description"):
        v = header.get(key) if isinstance(header, Mapping) else None
        if isinstance(v, Mapping) and "descriptors" in v:
            desc = v["descriptors"]
            break
    if desc is None and isinstance(header, Mapping) and isinstance(header.get("descriptors"), list):
        desc = header["descriptors"]
    axes: list[dict[str, Any]] = []
    if desc:
        for a in desc:
            if a.get("kind") == "categorical":
                labels = [str(v) for v in a.get("values", [])]
            else:
                lo, hi, bins = float(a["low"]), float(a["high"]), int(a["bins"])
                w = (hi - lo) / bins
                labels = [f"{lo + i * w:g}" for i in range(bins)]
            axes.append({"name": a.get("name", f"axis{len(axes)}"), "labels": labels})
        return axes
    cells = [r.cell for r in elites if r.cell is not None]
    if not cells:
        return []
    names = list(elites[0].descriptors) if elites and elites[0].descriptors else []
    for d in range(len(cells[0])):
        size = max(c[d] for c in cells) + 1
        axes.append({"name": names[d] if d < len(names) else f"axis{d}", "labels": [str(i) for i in range(size)]})
    return axes


def heatmap_grid(elites: Sequence[Any], axes: Sequence[Mapping[str, Any]]) -> list[list[float | None]]:
    """Best fitness per cell over the first two axes (rows: axis 0; one axis: one row)."""
    if not axes:
        return [[max((r.fitness for r in elites if r.fitness is not None), default=None)]]
    n0 = len(axes[0]["labels"])
    n1 = len(axes[1]["labels"]) if len(axes) > 1 else 1
    grid: list[list[float | None]] = [[None] * n1 for _ in range(n0)]
    for r in elites:
        if r.cell is None or r.fitness is None:
            continue
        i = min(int(r.cell[0]), n0 - 1)
        j = min(int(r.cell[1]), n1 - 1) if len(axes) > 1 and len(r.cell) > 1 else 0
        cur = grid[i][j]
        if cur is None or r.fitness > cur:
            grid[i][j] = r.fitness
    return grid


def _g(v: Any, spec: str = ".4g") -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, float)):
        return format(v, spec)
    return str(v)


def _text_heatmap(grid: list[list[float | None]], axes: Sequence[Mapping[str, Any]]) -> list[str]:
    shades = " .:-=+*#%@"
    vals = [v for row in grid for v in row if v is not None]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    span = hi - lo or 1.0
    lines = ["```"]
    if len(axes) > 1:
        lines.append(f"rows: {axes[0]['name']}, columns: {axes[1]['name']} ('.' low ... '@' high, blank empty)")
        lines.append(" " * 12 + " ".join(f"{lab[:6]:>6}" for lab in axes[1]["labels"]))
    elif axes:
        lines.append(f"rows: {axes[0]['name']}")
    for i, row in enumerate(grid):
        lab = axes[0]["labels"][i] if axes else "all"
        cells = []
        for v in row:
            if v is None:
                cells.append(f"{'':>6}")
            else:
                k = 1 + int((v - lo) / span * (len(shades) - 2))
                cells.append(f"{shades[k] * 2:>6}")
        lines.append(f"{lab[:11]:>11} " + " ".join(cells))
    lines.append(f"fitness range {lo:.4g} .. {hi:.4g}")
    lines.append("```")
    return lines


def _plots(out: Path, curve: list[tuple[int, float | None]], grid: list[list[float | None]],
           axes: Sequence[Mapping[str, Any]]) -> list[str]:
    """Write the PNGs; returns their file names (empty when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    names = []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [i for i, b in curve if b is not None]
    ys = [b for _, b in curve if b is not None]
    ax.step(xs, ys, where="post")
    ax.set_xlabel("evaluations")
    ax.set_ylabel("best fitness")
    ax.set_title("Best fitness vs evaluations")
    fig.tight_layout()
    fig.savefig(out / "progress.png", dpi=100)
    plt.close(fig)
    names.append("progress.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    if len(axes) > 1:
        data = [[math.nan if v is None else v for v in row] for row in grid]
        im = ax.imshow(data, origin="lower", aspect="auto", cmap="viridis")
        ax.set_yticks(range(len(axes[0]["labels"])), axes[0]["labels"])
        ax.set_xticks(range(len(axes[1]["labels"])), axes[1]["labels"], rotation=45)
        ax.set_ylabel(axes[0]["name"])
        ax.set_xlabel(axes[1]["name"])
        fig.colorbar(im, ax=ax, label="fitness")
    else:
        labels = axes[0]["labels"] if axes else ["all"]
        ax.bar(range(len(grid)), [row[0] if row[0] is not None else 0.0 for row in grid])
        ax.set_xticks(range(len(labels)), labels, rotation=45)
        ax.set_xlabel(axes[0]["name"] if axes else "")
        ax.set_ylabel("fitness")
    ax.set_title("Archive: best fitness per cell")
    fig.tight_layout()
    fig.savefig(out / "heatmap.png", dpi=100)
    plt.close(fig)
    names.append("heatmap.png")
    return names


def write_report(archive_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> Path:
    """Write ``report.md`` (and PNGs when matplotlib is installed) for an archive.

    Args:
        archive_path: The run's archive directory.
        out_dir: Where to write (created if missing).

    Returns:
        The path of ``report.md``.

    Raises:
        archive.ArchiveError: The path is not a readable archive.
    """
    from archive import Archive

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    a = Archive.open_readonly(archive_path)
    try:
        records = list(a.records())
        elites = list(a.elites())
        best = a.best()
        counts = a.counts()
        axes = _axes(a, elites)
        curve = best_curve(records)
        grid = heatmap_grid(elites, axes)
        path_ids: list[str] = []
        if best is not None:
            try:
                path_ids = list(a.lineage().path_to(best.id))
            except Exception:  # a broken lineage must not cost the whole report
                path_ids = [best.id]
        lineage = [a.get(i) for i in path_ids]
        header = a.header if isinstance(getattr(a, "header", None), Mapping) else {}
        coverage = getattr(a, "coverage", None)
        qd = getattr(a, "qd_score", None)
    finally:
        a.close()

    images = _plots(out, curve, grid, axes)
    title = _problem_name(header) or Path(archive_path).name
    md: list[str] = [f"# Run report: {title}", ""]
    dev = header.get("device")
    if isinstance(dev, Mapping) and dev.get("name"):
        md += [f"Device: {dev.get('name')} (cc {dev.get('compute_capability', '?')})", ""]
    md += ["## Summary", "", "| status | records |", "| --- | ---: |"]
    for k in sorted(counts):
        if counts[k]:
            md.append(f"| {k} | {counts[k]} |")
    md.append(f"| **total** | {len(records)} |")
    md += ["", f"Coverage: {_g(coverage, '.1%')}, QD score: {_g(qd)}, elites: {len(elites)}", ""]

    md += ["## Best fitness vs evaluations", ""]
    if "progress.png" in images:
        md += ["![best fitness vs evaluations](progress.png)", ""]
    steps = [(i, b) for k, (i, b) in enumerate(curve) if b is not None and (k == 0 or curve[k - 1][1] != b)]
    md += ["| evaluation | best fitness |", "| ---: | ---: |"]
    md += [f"| {i} | {_g(b)} |" for i, b in steps] or ["| - | - |"]
    md.append("")

    md += ["## Archive", ""]
    if "heatmap.png" in images:
        md += ["![archive heatmap](heatmap.png)", ""]
    md += _text_heatmap(grid, axes) + [""]

    md += ["## Best genome", ""]
    if best is None:
        md += ["No OK record yet.", ""]
    else:
        md += [f"- id: `{best.id}`", f"- fitness: {_g(best.fitness)}", f"- operator: {best.operator}",
               f"- params: `{dict(best.genome.params)}`"]
        res = best.evaluation.resources
        if res:
            md.append("- resources: " + ", ".join(f"{k}={res[k]}" for k in sorted(res)))
        md.append("")
        cases = best.evaluation.metrics.get("cases") if isinstance(best.evaluation.metrics, Mapping) else None
        if isinstance(cases, Mapping) and cases:
            md += ["| case | time (ms) | GB/s | fraction of ceiling |", "| --- | ---: | ---: | ---: |"]
            for key in cases:
                c = cases[key] if isinstance(cases[key], Mapping) else {}
                md.append(f"| {key} | {_g(c.get('time_ms'))} | {_g(c.get('gbps'), '.1f')} | "
                          f"{_g(c.get('fraction'), '.1%')} |")
            md.append("")
        else:
            md += ["No per-case metrics (the run was not timed on a GPU).", ""]

    md += ["## Lineage of the best", ""]
    if lineage:
        md += ["| step | genome | operator | fitness | change |", "| ---: | --- | --- | ---: | --- |"]
        for k, r in enumerate(lineage):
            if r is None:
                continue
            note = str((r.meta or {}).get("note", ""))[:60].replace("|", "/")
            md.append(f"| {k} | `{r.id[:12]}` | {r.operator} | {_g(r.fitness)} | {note} |")
        md.append("")
    else:
        md += ["-", ""]

    path = out / "report.md"
    path.write_text("\n".join(md) + "\n", encoding="utf-8")
    return path


def _problem_name(header: Mapping[str, Any]) -> str:
    for key in ("problem", "problem_description", "description"):
        v = header.get(key)
        if isinstance(v, Mapping) and v.get("name"):
            return str(v["name"])
    v = header.get("problem_name")
    return str(v) if v else ""
