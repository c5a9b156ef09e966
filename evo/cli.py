"""Command-line interface: ``evo`` / ``python -m evo``.

Subcommands (each takes ``--json`` for machine-readable output):

* ``show ARCHIVE``: counts by status, coverage, QD score, best fitness, id and params;
* ``lineage ARCHIVE ID``: the path from a seed to a record (an id prefix is enough);
* ``export ARCHIVE [-o DIR]``: the best genome as ``<entry>.cu`` plus ``params.json``;
* ``report ARCHIVE [-o DIR]``: an HTML/Markdown report (:mod:`evo.report`).

Archives are opened read-only. Errors print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]

WIDTH = 80


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.6g}" if math.isfinite(x) else str(x)
    return str(x)


def _wrap(label: str, text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=f"{label:<10}", subsequent_indent=" " * 10,
                         break_long_words=True, break_on_hyphens=False) or [label]


def _open(path: str) -> Any:
    from archive import Archive

    return Archive.open_readonly(path)


def _cmd_show(args: argparse.Namespace) -> int:
    with _open(args.archive) as ar:
        h = ar.header
        counts = ar.counts()
        best = ar.best()
        info = {
            "archive": str(ar.path), "problem": h["problem"].get("name"), "fingerprint": h["problem_fingerprint"],
            "schema_version": h["schema_version"], "device": h.get("device"), "created": h.get("created"),
            "records": len(ar), "counts": counts, "cells": ar.n_cells, "elites": ar.n_elites,
            "coverage": ar.coverage, "qd_score": ar.qd_score, "lessons": len(ar.lessons),
            "best": None if best is None else {"id": best.id, "fitness": best.fitness, "seq": best.seq,
                                               "operator": best.operator, "cell": best.cell,
                                               "params": dict(best.genome.params)},
        }
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    dev = info["device"]
    lines = _wrap("archive", f"{info['archive']}")
    lines += _wrap("problem", f"{info['problem']} (fingerprint {info['fingerprint']}, schema {info['schema_version']})")
    lines += _wrap("device", "unknown" if not dev else f"{dev.get('name')} (cc {dev.get('compute_capability')})")
    nonzero = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    lines += _wrap("records", f"{info['records']}" + (f": {nonzero}" if nonzero else ""))
    lines += _wrap("grid", f"{info['elites']}/{info['cells']} cells ({info['coverage']:.1%}), "
                           f"qd score {_fmt(info['qd_score'])}")
    lines += _wrap("lessons", str(info["lessons"]))
    if best is None:
        lines += _wrap("best", "none yet (no OK record)")
    else:
        b = info["best"]
        lines += _wrap("best", f"fitness {_fmt(b['fitness'])}, id {b['id']}")
        lines += _wrap("", f"seq {b['seq']}, operator {b['operator']}, cell {b['cell']}")
        lines += _wrap("params", " ".join(f"{k}={v}" for k, v in sorted(b["params"].items())) or "(none)")
    print("\n".join(lines))
    return 0


def _cmd_lineage(args: argparse.Namespace) -> int:
    with _open(args.archive) as ar:
        gid = ar.resolve_id(args.id)
        lin = ar.lineage()
        path = lin.path_to(gid)
        ops = lin.operators(path)
        steps = []
        for i, (node, op) in enumerate(zip(path, ops, strict=True)):
            rec = ar.get(node)
            steps.append({"step": i, "id": node, "operator": op if rec is None else rec.operator,
                          "fitness": None if rec is None else rec.fitness,
                          "status": None if rec is None else rec.status.value, "in_archive": rec is not None})
    if args.json:
        print(json.dumps({"id": gid, "path": steps}, indent=2))
        return 0
    print(f"{'step':>4}  {'id':<16}  {'operator':<20}  {'fitness':>12}  status")
    for s in steps:
        op = (s["operator"] or "-")[:20]
        status = s["status"] or "(not in archive)"
        print(f"{s['step']:>4}  {s['id'][:16]:<16}  {op:<20}  {_fmt(s['fitness']):>12}  {status}"[:WIDTH])
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    with _open(args.archive) as ar:
        best = ar.best()
        if best is None:
            print("evo: error: the archive has no OK record to export", file=sys.stderr)
            return 2
        problem = ar.header["problem"].get("name")
        dtype_defines = (ar.header["problem"].get("contract") or {}).get("dtype_defines")
    out = Path(args.output) if args.output else Path(f"best-{best.id[:12]}")
    out.mkdir(parents=True, exist_ok=True)
    g = best.genome
    src = out / f"{g.entry}.{'ptx' if g.language == 'ptx' else 'cu'}"
    src.write_text(g.source, encoding="utf-8", errors="surrogatepass")
    meta = {
        "id": best.id, "problem": problem, "entry": g.entry, "language": g.language, "fitness": best.fitness,
        "params": dict(g.params), "defines": g.defines(), "cases": dict(best.evaluation.metrics.get("cases", {})),
        "metrics": {k: v for k, v in best.evaluation.metrics.items() if k != "cases"},
        "resources": dict(best.evaluation.resources), "device": dict(best.evaluation.device),
        "operator": best.operator, "parents": list(best.parents), "seq": best.seq,
    }
    if dtype_defines:  # the gate built it once per dtype with these definitions added
        meta["dtype_defines"] = f"per-dtype definitions added to `defines` by {dtype_defines}(params, dtype)"
    from evo.types import thaw

    params_file = out / "params.json"
    params_file.write_text(json.dumps(thaw(meta), indent=2, default=str) + "\n")
    if args.json:
        print(json.dumps({"id": best.id, "fitness": best.fitness, "source": str(src), "params": str(params_file)}))
    else:
        print(f"exported {best.id[:16]} (fitness {_fmt(best.fitness)})")
        print(f"  {src}"[:WIDTH] if len(str(src)) < WIDTH - 2 else f"  {src}")
        print(f"  {params_file}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    try:
        from evo.report import write_report
    except ImportError as e:
        print(f"evo: error: reports are not available ({e}); install ptx-kernel-factory[report]", file=sys.stderr)
        return 2
    _open(args.archive).close()  # clear errors for bad paths before the report starts
    out = Path(args.output) if args.output else Path(f"{Path(args.archive).name}-report")
    path = write_report(args.archive, out)
    if args.json:
        print(json.dumps({"report": str(path)}))
    else:
        print(f"report written to {path}")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="evo", description="Inspect kernel-factory archives.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = sub.add_parser("show", help="summary of an archive")
    s.add_argument("archive", help="archive directory")
    s.set_defaults(fn=_cmd_show)
    s = sub.add_parser("lineage", help="path from a seed to a record")
    s.add_argument("archive", help="archive directory")
    s.add_argument("id", help="genome id (a unique prefix is enough)")
    s.set_defaults(fn=_cmd_lineage)
    s = sub.add_parser("export", help="write the best genome as source + params.json")
    s.add_argument("archive", help="archive directory")
    s.add_argument("-o", "--output", help="output directory (default: ./best-<id>)")
    s.set_defaults(fn=_cmd_export)
    s = sub.add_parser("report", help="write a report of a run")
    s.add_argument("archive", help="archive directory")
    s.add_argument("-o", "--output", help="output directory (default: ./<archive>-report)")
    s.set_defaults(fn=_cmd_report)
    for name in ("show", "lineage", "export", "report"):
        sub.choices[name].add_argument("--json", action="store_true", help="machine-readable output")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status (0 ok, 2 error)."""
    from archive import ArchiveError

    args = _parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except ArchiveError as e:
        print(f"evo: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"evo: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
