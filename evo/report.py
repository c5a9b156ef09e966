"""Run report: Markdown with tables, and PNG figures when matplotlib is installed.

``write_report(archive_path, out_dir)`` reads an archive (read-only, no Problem needed)
and writes ``report.md`` with:

* counts by status, coverage and QD score;
* best fitness against evaluations (archive insertion order) - ``progress.png``;
* the archive heatmap over the first two descriptor axes (one axis: a bar chart) -
  ``heatmap.png``; without matplotlib, a text heatmap in the Markdown;
* the best genome's per-case table (time, GB/s, fraction of the ceiling) from
  ``metrics["cases"]``;
* the per-case champions (the fastest OK record of each case, what an export dispatches):
  whether a seed or the search found each, at which evaluation, how many operator steps
  from its seed, and how much faster it is than the fastest seed on that case;
* what each operator's evaluations gave: OK share, children faster than their parent, and
  new best times (records that were, when evaluated, the fastest so far on some case);
* the lineage of the best genome (seed -> ... -> best, operator and fitness per step);
* where the evaluation time went: wall seconds per scoring stage (compile, correctness,
  timing, ...) over all records, total, median and 90th percentile per evaluation, and
  by outcome, from each Evaluation's ``stage_times``; how many timed cases the
  Timing stage's racing stopped early; inside the Timing stage, seconds per phase (inputs,
  warm-up, timed batches, references, verification, the determinism relaunch) and the
  cases that cost the most.

``evo report ARCHIVE [-o DIR]`` calls it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["best_curve", "case_champions", "heatmap_grid", "operator_summary", "stage_time_summary", "write_report"]


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


def case_champions(records: Sequence[Any]) -> list[dict[str, Any]]:
    """The fastest OK record of every timed case (as :func:`evo.export.best_per_case` picks
    it, so what an export dispatches), and where it came from.

    Args:
        records: The archive's records (any order).

    Returns:
        One dict per case key, in key order: ``case``, ``time_ms``, ``fraction`` (of the
        ceiling, when the record has it), ``id``, ``operator``, ``evaluation`` (1-based
        insertion order), ``seed`` (whether a seed operator made it), ``params`` (the
        genome's params), ``steps`` (None here;
        :func:`write_report` fills in the operator steps from its seed), ``seed_ms`` (the
        fastest seed's time on that case, or None) and ``speedup``
        (``seed_ms / time_ms``, or None), ``found_by`` (the operator that first made the
        genome: its own, or for a warm-started record the one its earlier run recorded,
        None where that archive did not say), ``rebased`` (a warm-started genome that took the
        family's current kernel text, EngineConfig.warm_start_rebase). Seeds are the records of
        the operators ``"seed"`` and ``"warm_start"``.
    """
    from evo.engine import SEED_OPERATORS, _found_by
    from evo.export import best_per_case

    def time_of(rec: Any, key: str) -> tuple[float, float | None]:
        m = rec.evaluation.metrics["cases"][key]
        return float(m["time_ms"]), m.get("fraction")

    seeds = best_per_case([r for r in records if r.operator in SEED_OPERATORS])
    out: list[dict[str, Any]] = []
    for key, rec in best_per_case(records).items():
        t, frac = time_of(rec, key)
        seed_ms = time_of(seeds[key], key)[0] if key in seeds else None
        out.append({"case": key, "time_ms": t, "fraction": frac, "id": rec.id, "operator": rec.operator,
                    "evaluation": rec.seq + 1 if rec.seq >= 0 else None, "seed": rec.operator in SEED_OPERATORS,
                    "params": dict(rec.genome.params), "steps": None, "seed_ms": seed_ms,
                    "speedup": seed_ms / t if seed_ms is not None else None, "found_by": _found_by(rec),
                    "rebased": "rebased" in ((rec.meta or {}).get("warm_start") or {})})
    return out


def operator_summary(records: Sequence[Any]) -> list[dict[str, Any]]:
    """What each operator's evaluations gave, replayed in insertion order.

    Args:
        records: The archive's records (any order; replayed by ``seq``).

    Returns:
        One dict per operator, most evaluations first: ``operator``, ``evaluations``,
        ``ok``, ``children`` (OK records with an OK first parent that share a timed case
        with it), ``faster`` (of those, the ones whose geometric-mean time over the shared
        cases beat the parent's), ``new_best`` (records that set a new best time on at least
        one case when they were evaluated; the first record of a case does not count) and
        ``cases_taken`` (those new bests summed over cases).
    """
    ordered = sorted(records, key=lambda r: r.seq)
    by_id = {r.genome.id: r for r in ordered}
    best: dict[str, float] = {}
    stats: dict[str, dict[str, Any]] = {}
    for r in ordered:
        st = stats.setdefault(r.operator, {"operator": r.operator, "evaluations": 0, "ok": 0, "children": 0,
                                           "faster": 0, "new_best": 0, "cases_taken": 0})
        st["evaluations"] += 1
        if not r.evaluation.ok:
            continue
        st["ok"] += 1
        times = r.evaluation.case_times()
        parent = by_id.get(r.parents[0]) if r.parents else None
        if parent is not None and parent.seq < r.seq:
            pt = parent.evaluation.case_times()
            shared = [k for k in times if k in pt]
            if shared:
                st["children"] += 1
                st["faster"] += sum(math.log(times[k] / pt[k]) for k in shared) < 0
        taken = sum(1 for k, t in times.items() if k in best and t < best[k])
        st["new_best"] += taken > 0
        st["cases_taken"] += taken
        for k, t in times.items():
            best[k] = min(best.get(k, t), t)
    return sorted(stats.values(), key=lambda d: (-d["evaluations"], d["operator"]))


def _seconds(times: Mapping[Any, Any]) -> dict[str, float]:
    """The finite, non-negative numbers of a name -> seconds mapping (others are ignored)."""
    return {str(k): float(v) for k, v in times.items() if isinstance(v, (int, float)) and math.isfinite(v) and v >= 0}


def stage_time_summary(records: Sequence[Any]) -> dict[str, Any]:
    """Where the scoring time of ``records`` went, from each Evaluation's ``stage_times``.

    Args:
        records: The archive's records (any order; records without stage times, e.g.
            imported ones, are counted in ``untimed`` and left out of the figures).

    Returns:
        ``{"evaluations": n timed, "untimed": n, "total_s": sum over all stages,
        "per_evaluation": {"median_s", "p90_s"} of each record's sum over stages,
        "stages": [...], "by_status": {status: {"evaluations", "total_s"}}}``; each stage
        entry (in order of first appearance) holds ``stage``, ``evaluations`` (records that
        ran it), ``total_s``, ``median_s``, ``p90_s`` (per record that ran it) and
        ``share`` (of ``total_s``). Non-finite or negative times are ignored.
        ``"racing"``: ``{"cases", "raced", "evaluations"}``: the timed cases reported with a
        racing decision (``metrics["cases"][key]["raced"]``, see ``fitness.Timing``), how
        many of them stopped early, and in how many evaluations; ``None`` when no record
        reports one. ``"phases"``: inside the Timing stage, wall seconds per phase (inputs,
        warmup, timed, reference, verify, determinism: ``metrics["cases"][key]["phases_s"]``),
        each ``{"phase", "evaluations", "total_s", "per_evaluation_s", "share"}`` (share of
        all phases), in order of first appearance; ``"phase_parts"``: the same for the parts
        a phase records beside itself under ``"<phase>/<part>"`` (``inputs/draw``, ...), with
        ``share`` of their phase's total; parts count in neither the phases' total nor the
        cases'; ``"costliest_cases"``: the cases whose phases took longest in all,
        ``{"case", "evaluations", "total_s", "per_evaluation_s"}``, longest first (at most
        :data:`COSTLIEST_CASES`). All empty when no record has phases.
    """
    per_stage: dict[str, list[float]] = {}
    per_record: list[float] = []
    by_status: dict[str, dict[str, float]] = {}
    untimed = 0
    racing = {"cases": 0, "raced": 0, "evaluations": 0}
    phase_s: dict[str, float] = {}
    phase_n: dict[str, int] = {}
    case_s: dict[str, float] = {}
    case_n: dict[str, int] = {}
    for r in records:
        cases = (r.evaluation.metrics or {}).get("cases")
        flags = [c["raced"] for c in cases.values() if isinstance(c, Mapping) and "raced" in c] \
            if isinstance(cases, Mapping) else []
        seen: set[str] = set()
        for key, c in (cases.items() if isinstance(cases, Mapping) else ()):
            ph = c.get("phases_s") if isinstance(c, Mapping) else None
            if not isinstance(ph, Mapping):
                continue
            good = _seconds(ph)
            for k, v in good.items():
                phase_s[k] = phase_s.get(k, 0.0) + v
                seen.add(k)
            case_s[str(key)] = case_s.get(str(key), 0.0) + sum(v for k, v in good.items() if "/" not in k)
            case_n[str(key)] = case_n.get(str(key), 0) + 1
        for k in seen:
            phase_n[k] = phase_n.get(k, 0) + 1
        racing["cases"] += len(flags)
        racing["raced"] += sum(1 for f in flags if f)
        racing["evaluations"] += 1 if any(flags) else 0
        times = getattr(r.evaluation, "stage_times", None) or {}
        clean = _seconds(times)
        if not clean:
            untimed += 1
            continue
        for k, v in clean.items():
            per_stage.setdefault(k, []).append(v)
        total = sum(clean.values())
        per_record.append(total)
        st = by_status.setdefault(r.evaluation.status.value, {"evaluations": 0, "total_s": 0.0})
        st["evaluations"] += 1
        st["total_s"] += total
    import numpy as np

    grand = sum(per_record)
    stages = []
    for k, vals in per_stage.items():
        total = sum(vals)
        med, p90 = (float(q) for q in np.percentile(vals, [50, 90]))
        stages.append({"stage": k, "evaluations": len(vals), "total_s": total, "median_s": med, "p90_s": p90,
                       "share": total / grand if grand > 0 else None})
    med, p90 = (float(q) for q in np.percentile(per_record, [50, 90])) if per_record else (None, None)

    def entry(k: str, v: float, of: float) -> dict[str, Any]:
        return {"phase": k, "evaluations": phase_n[k], "total_s": v, "per_evaluation_s": v / phase_n[k],
                "share": v / of if of > 0 else None}

    whole = {k: v for k, v in phase_s.items() if "/" not in k}
    all_phases = sum(whole.values())
    phases = [entry(k, v, all_phases) for k, v in whole.items()]
    parts = [entry(k, v, whole.get(k.split("/", 1)[0], 0.0)) for k, v in phase_s.items() if "/" in k]
    costliest = [{"case": k, "evaluations": case_n[k], "total_s": v, "per_evaluation_s": v / case_n[k]}
                 for k, v in sorted(case_s.items(), key=lambda kv: -kv[1])[:COSTLIEST_CASES]]
    return {"evaluations": len(per_record), "untimed": untimed, "total_s": grand,
            "per_evaluation": {"median_s": med, "p90_s": p90}, "stages": stages, "by_status": by_status,
            "racing": racing if racing["cases"] else None, "phases": phases, "phase_parts": parts,
            "costliest_cases": costliest}


COSTLIEST_CASES = 5
"""How many of the costliest cases (by the Timing stage's phase seconds) a report lists."""


def _phase_line(ph: Mapping[str, Any]) -> str:
    """One row of the report's table of phases (or of parts): an entry of stage_time_summary's."""
    return (f"| {ph['phase']} | {ph['evaluations']} | {ph['total_s']:.2f} | {ph['per_evaluation_s']:.3f} | "
            f"{_g(ph['share'], '.1%')} |")


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
        champions = case_champions(records)
        timing = stage_time_summary(records)
        hops: dict[str, int] = {}  # champion id -> operator steps from its seed
        if champions:
            try:
                graph = a.lineage()
                for c in champions:
                    if c["id"] not in hops:
                        hops[c["id"]] = len(graph.path_to(c["id"])) - 1
            except Exception:  # a broken lineage must not cost the whole report
                hops = {}
            for c in champions:
                c["steps"] = hops.get(c["id"])
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

    md += ["## Per-case champions", ""]
    if champions:
        found = [c for c in champions if not c["seed"]]
        warm = [c for c in champions if c["operator"] == "warm_start"]
        md += [f"The fastest OK record of each case (what an export dispatches): {len(found)} of "
               f"{len(champions)} found by the search" + _op_counts(found, "operator") + ", "
               + (_warm_origins(warm) if warm else "")
               + f"{len(champions) - len(found) - len(warm)} by seeds. `seed / champion`: the fastest seed's "
               "time on that case over the champion's.", "",
               "| case | time (ms) | fraction | genome | operator | evaluation | steps from seed | "
               "seed / champion |", "| --- | ---: | ---: | --- | --- | ---: | ---: | ---: |"]
        for c in champions:
            op = c["operator"]
            if op == "warm_start" and (c.get("found_by") or c.get("rebased")):
                op = "warm_start (" + ", ".join([*([c["found_by"]] if c.get("found_by") else []),
                                                 *(["on the current kernel text"] if c.get("rebased") else [])]) + ")"
            md.append(f"| {c['case']} | {_g(c['time_ms'])} | {_g(c['fraction'], '.1%')} | `{c['id'][:12]}` | "
                      f"{op} | {_g(c['evaluation'])} | {_g(c['steps'])} | "
                      f"{_g(c['speedup'], '.3f')}{'x' if c['speedup'] is not None else ''} |")
        md += ["", *_champion_genomes(champions), ""]
    else:
        md += ["No per-case metrics (the run was not timed on a GPU).", ""]

    md += ["## Operators", ""]
    ops = operator_summary(records)
    if ops:
        md += ["Replayed in evaluation order. `faster than parent`: OK children whose geometric-mean time over "
               "the cases they share with their first parent beat it. `new best`: evaluations that were the "
               "fastest so far on at least one case (`cases`: how many such cases in all).", "",
               "| operator | evaluations | OK | faster than parent | new best | cases |",
               "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for o in ops:
            faster = f"{o['faster']} of {o['children']}" if o["children"] else "-"
            md.append(f"| {o['operator']} | {o['evaluations']} | {o['ok']} | {faster} | {o['new_best']} | "
                      f"{o['cases_taken']} |")
        md.append("")
    else:
        md += ["No records.", ""]

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

    md += ["## Where the evaluation time went", ""]
    if timing["stages"]:
        pe = timing["per_evaluation"]
        md += [f"{timing['evaluations']} evaluations with stage times, {timing['total_s']:.1f} s in all; "
               f"per evaluation median {pe['median_s']:.2f} s, 90th percentile {pe['p90_s']:.2f} s"
               + (f" ({timing['untimed']} records without stage times left out)" if timing["untimed"] else "")
               + ". Wall seconds per stage, as the evaluator measured them (stages of different "
               "evaluations may overlap, e.g. compiling one while timing another).", "",
               "| stage | evaluations | total (s) | share | median (s) | p90 (s) |",
               "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for st in timing["stages"]:
            md.append(f"| {st['stage']} | {st['evaluations']} | {st['total_s']:.2f} | {_g(st['share'], '.1%')} | "
                      f"{st['median_s']:.3f} | {st['p90_s']:.3f} |")
        md += ["", "| outcome | evaluations | total (s) |", "| --- | ---: | ---: |"]
        for k in sorted(timing["by_status"]):
            v = timing["by_status"][k]
            md.append(f"| {k} | {v['evaluations']} | {v['total_s']:.2f} |")
        md.append("")
        race = timing["racing"]
        if race:
            md += [f"Racing: {race['raced']} of {race['cases']} timed cases (in {race['evaluations']} evaluations) "
                   "stopped after their first timed batches, slower than the case's best time by more than the "
                   "Timing stage's margin; the rest were timed in full.", ""]
        if timing["phases"]:
            md += ["Inside the timing stage, per case and summed (wall seconds of its phases: drawing the "
                   "inputs, warm-up, the timed batches, the reference of each timed set, verifying the outputs, "
                   "the relaunch that checks determinism):", "",
                   "| phase | evaluations | total (s) | per evaluation (s) | share |", "| --- | ---: | ---: | ---: | ---: |"]
            md += [_phase_line(ph) for ph in timing["phases"]]
            if timing.get("phase_parts"):
                md += ["", "Parts of a phase, timed inside it (share: of that phase; for the inputs: allocating the "
                       "buffers, drawing the values, storing them in the buffers' types (a deferred draw is drawn "
                       "there), their checksums, poisoning the outputs):", "",
                       "| part | evaluations | total (s) | per evaluation (s) | share of its phase |",
                       "| --- | ---: | ---: | ---: | ---: |"]
                md += [_phase_line(ph) for ph in timing["phase_parts"]]
            md += ["", "Costliest cases (all phases): " + "; ".join(
                f"{c['case']} {c['per_evaluation_s']:.3f} s per evaluation ({c['evaluations']})"
                for c in timing["costliest_cases"]) + ".", ""]
    else:
        md += ["No stage times recorded.", ""]

    path = out / "report.md"
    path.write_text("\n".join(md) + "\n", encoding="utf-8")
    return path


def _op_counts(champions: Sequence[Mapping[str, Any]], key: str) -> str:
    """`` (crossover 2, mutation 1)`` from the champions' ``key``; empty when there are none."""
    by_op: dict[str, int] = {}
    for c in champions:
        by_op[str(c[key])] = by_op.get(str(c[key]), 0) + 1
    return " (" + ", ".join(f"{k} {v}" for k, v in sorted(by_op.items())) + ")" if by_op else ""


def _warm_origins(warm: Sequence[Mapping[str, Any]]) -> str:
    """Where warm-started champions came from: an earlier run's search, its seeds, or unknown."""
    searched = [c for c in warm if c.get("found_by") not in (None, "seed")]
    seeded = sum(1 for c in warm if c.get("found_by") == "seed")
    unknown = len(warm) - len(searched) - seeded
    parts = [f"{len(searched)} first found by an earlier run's search" + _op_counts(searched, "found_by")]
    if seeded:
        parts.append(f"{seeded} seeds there")
    if unknown:
        parts.append(f"{unknown} of unrecorded origin (an older archive)")
    return f"{len(warm)} re-evaluated from a warm start ({'; '.join(parts)}), "


def _champion_genomes(champions: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown rows: each distinct champion genome, the cases it wins and its params (so a
    genome found once can be written down, e.g. as a seed, even after its archive is gone)."""
    wins: dict[str, list[str]] = {}
    params: dict[str, Mapping[str, Any]] = {}
    for c in champions:
        wins.setdefault(c["id"], []).append(c["case"])
        params[c["id"]] = c.get("params") or {}
    rows = ["| genome | cases won | params |", "| --- | ---: | --- |"]
    for gid, cases in sorted(wins.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        text = ", ".join(f"{k}={v}" for k, v in params[gid].items()).replace("|", "/")
        rows.append(f"| `{gid[:12]}` | {len(cases)} | {text} |")
    return rows


def _problem_name(header: Mapping[str, Any]) -> str:
    for key in ("problem", "problem_description", "description"):
        v = header.get(key)
        if isinstance(v, Mapping) and v.get("name"):
            return str(v["name"])
    v = header.get("problem_name")
    return str(v) if v else ""
