"""Device-to-device copy bandwidth by buffer size: is a large copy slower than the ceiling's?

The fitness worker measures its copy ceiling on 1 GiB and ``rmsnorm_peers.py`` on 2 GiB, and a
kernel's "fraction of copy" divides by that. The long RMSNorm rows move far more: at 64K-256K
columns each case reads 4 GiB (16-bit) or 8 GiB (float32) and writes as much. If the memory
system copies such buffers more slowly than 1-2 GiB ones (page-table reach, HBM channel
mapping), every kernel's fraction there is capped below 1 by the size alone, and a peer that
reaches 99% on a smaller buffer is not comparable. This script times, side by side in one
run, one copy of each size and the same bytes copied in pieces of ``--piece`` (a size the
ceiling uses), so a slowdown shows which of the two it follows: the size of one copy or the
size of the buffers.

Every timing is :func:`rmsnorm_peers.copy_timing`, the code that times the peer benchmarks'
ceiling (:func:`fitness.time_calls`, issued call by call). Output: a table on stdout and
``--out`` (JSON).

    python benchmarks/copy_by_size.py --sizes 256M,1G,2G,4G,8G --piece 1G --out runs/copy_by_size.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import rmsnorm_peers  # noqa: E402

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes of a size such as ``512M``, ``1G``, ``1.5G`` or ``4096`` (binary units, K/M/G).

    Raises:
        ValueError: Not a positive size in that form.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*", text, flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"size {text!r}: give a number with an optional K, M or G (binary units), e.g. 512M or 2G")
    n = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if n <= 0:
        raise ValueError(f"size {text!r} is not positive")
    if n % 4:
        raise ValueError(f"size {text!r} is {n} bytes: give a multiple of 4 (the copies are of float32 words)")
    return n


def format_size(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that keeps it whole to two decimals (``1.5 GiB``)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def table_lines(rows: Sequence[dict[str, Any]], reference: int | None) -> list[str]:
    """Markdown lines of the results: size, copy TB/s (spread), in pieces, and each against the
    copy of ``reference`` bytes (the ceiling's size, when it was timed)."""
    ref = next((r for r in rows if r["bytes"] == reference), None)
    head = "| buffer | one copy TB/s (spread) | in pieces TB/s (piece) |"
    head += " one copy / ceiling size | pieces / ceiling size |" if ref else ""
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        cells = [format_size(r["bytes"]), f"{r['copy_tbs']:.3f} ({100 * r['copy_spread']:.1f}%)",
                 f"{r['pieces_tbs']:.3f} ({format_size(r['piece'])})" if r.get("pieces_tbs") else "-"]
        if ref:
            cells.append(f"{r['copy_tbs'] / ref['copy_tbs']:.3f}")
            cells.append(f"{r['pieces_tbs'] / ref['copy_tbs']:.3f}" if r.get("pieces_tbs") else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Copy bandwidth by buffer size (one GPU)")
    ap.add_argument("--sizes", default="256M,512M,1G,2G,4G,8G", help="comma list of buffer sizes (K/M/G)")
    ap.add_argument("--piece", default="1G", help="also copy each buffer in pieces of this size (0: do not)")
    ap.add_argument("--reference", default="2G", help="the ceiling's size, the ratios' denominator "
                    "(rmsnorm_peers.py: 2G; the fitness worker: 1G)")
    ap.add_argument("--out", default=None, help="JSON results (default: print only)")
    args = ap.parse_args(argv)
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
        piece = parse_size(args.piece) if args.piece.strip() not in ("0", "") else 0
        reference = parse_size(args.reference)
    except ValueError as e:
        ap.error(str(e))
    if not sizes:
        ap.error("--sizes needs at least one size")

    try:
        import torch
    except ImportError as e:
        raise SystemExit(f"copy_by_size needs torch and a usable CUDA device ({e})") from e
    if not torch.cuda.is_available():
        raise SystemExit("copy_by_size needs a usable CUDA device (torch sees none)")
    free = torch.cuda.mem_get_info()[0]
    rows = []
    for n in sizes:
        if 2 * n > 0.9 * free:
            print(f"{format_size(n)}: skipped (two buffers need {format_size(2 * n)}, "
                  f"{format_size(free)} free)", flush=True)
            continue
        row = rmsnorm_peers.copy_timing(n, piece)
        torch.cuda.empty_cache()  # the buffers died with copy_timing's frame: give their memory back
        rows.append(row)
        print(f"{format_size(n):>9s}: copy {row['copy_tbs']:.3f} TB/s (spread {100 * row['copy_spread']:.1f}%)"
              + (f", in pieces {row['pieces_tbs']:.3f} TB/s" if row.get("pieces_tbs") else ""), flush=True)
    name = torch.cuda.get_device_name()
    lines = [f"# Copy bandwidth by buffer size ({datetime.date.today().isoformat()}, {name}, {platform.node()})",
             ""] + table_lines(rows, reference)
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps({"device": name, "reference": reference, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
