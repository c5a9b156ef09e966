"""Bare py-lmdb trial of record layouts: what the disk and LMDB allow for each (not the archive).

The archive (schema 2) keys its records by genome id and keeps a seq index beside them, so a
batch of new records lands at random places in the records B-tree, and a record of 8 KB of
source plus ~400 bytes of fields takes three 4 KB overflow pages. This trial writes the same
bytes with synced commits (``durability="full"``'s flushes) in four layouts, rotating their
order every repeat so they are compared under the same machine conditions:

* ``id``: the archive's layout: records keyed by id, seq index ``s<seq> -> id`` (appended);
* ``seq``: records keyed by seq (appended at the end of the tree), index ``id -> seq``;
* ``seqtail``: as ``seq``, with each value cut into a head of two overflow pages (8,176
  bytes) and the rest in a ``tails`` table keyed by seq (the tails share leaf pages);
* ``idtail``: the head/tail cut with id keys.

    python3 benchmarks/archive_layout_trial.py -n 30000 --repeats 3 --out DIR

Prints records per second and bytes on disk per record, each layout's runs sorted, and
writes ``archive_layout_trial-<date>.json`` into ``--out`` when given.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import lmdb

LAYOUTS = ("id", "seq", "seqtail", "idtail")
HEAD = 8176  # two 4 KB overflow pages less LMDB's 16-byte page header


def make_items(n: int, size: int) -> list[tuple[bytes, bytes]]:
    """``n`` (genome id, value) pairs: 32-hex-digit ids, ``size``-byte incompressible values."""
    rnd = random.Random(0)
    return [(hashlib.md5(str(i).encode()).hexdigest().encode(), rnd.randbytes(size)) for i in range(n)]


def run(layout: str, items: list[tuple[bytes, bytes]], path: Path, batch: int) -> dict[str, float]:
    """Write ``items`` in ``layout`` with synced commits of ``batch``: rate and disk bytes per record."""
    shutil.rmtree(path, ignore_errors=True)
    env = lmdb.open(str(path), map_size=4 * len(items) * (len(items[0][1]) + 4096) + (1 << 30), max_dbs=4,
                    sync=True, readahead=False)
    rec, idx, tail = env.open_db(b"records"), env.open_db(b"index"), env.open_db(b"tails")

    def seq(i: int) -> bytes:
        return i.to_bytes(8, "big")

    t = time.perf_counter()
    for b0 in range(0, len(items), batch):
        chunk = list(enumerate(items[b0:b0 + batch], b0))
        with env.begin(write=True) as txn:
            if layout == "id":
                txn.cursor(db=rec).putmulti(sorted(kv for _, kv in chunk))
                txn.cursor(db=idx).putmulti([(b"s" + seq(i), k) for i, (k, _) in chunk], append=True)
            elif layout == "seq":
                txn.cursor(db=rec).putmulti([(seq(i), v) for i, (_, v) in chunk], append=True)
                txn.cursor(db=idx).putmulti(sorted((k, seq(i)) for i, (k, _) in chunk))
            elif layout == "seqtail":
                txn.cursor(db=rec).putmulti([(seq(i), v[:HEAD]) for i, (_, v) in chunk], append=True)
                txn.cursor(db=tail).putmulti([(seq(i), v[HEAD:]) for i, (_, v) in chunk if len(v) > HEAD],
                                             append=True)
                txn.cursor(db=idx).putmulti(sorted((k, seq(i)) for i, (k, _) in chunk))
            else:  # idtail
                txn.cursor(db=rec).putmulti(sorted((k, v[:HEAD]) for _, (k, v) in chunk))
                txn.cursor(db=tail).putmulti(sorted((k, v[HEAD:]) for _, (k, v) in chunk if len(v) > HEAD))
                txn.cursor(db=idx).putmulti([(b"s" + seq(i), k) for i, (k, _) in chunk], append=True)
    elapsed = time.perf_counter() - t
    env.close()
    disk = os.stat(path / "data.mdb").st_blocks * 512
    shutil.rmtree(path, ignore_errors=True)
    return {"records_per_s": len(items) / elapsed, "disk_bytes_per_record": disk / len(items)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--records", type=int, default=30000)
    ap.add_argument("--size", type=int, default=8582, help="bytes per stored record (8 KB source + fields)")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary directory)")
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON result")
    args = ap.parse_args()
    items = make_items(args.records, args.size)
    runs: dict[str, list[dict[str, float]]] = {lay: [] for lay in LAYOUTS}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for rep in range(args.repeats):
            order = LAYOUTS if rep % 2 == 0 else LAYOUTS[::-1]
            for lay in order:
                r = run(lay, items, Path(tmp) / lay, args.batch)
                runs[lay].append(r)
                print(f"repeat {rep} {lay:8s} {r['records_per_s']:9,.0f} records/s "
                      f"{r['disk_bytes_per_record']:7,.0f} B/record", flush=True)
    base = statistics.median(r["records_per_s"] for r in runs["id"])
    summary = {}
    for lay, rs in runs.items():
        rates = sorted(r["records_per_s"] for r in rs)
        summary[lay] = {"records_per_s_sorted": rates, "median_vs_id": statistics.median(rates) / base,
                        "disk_bytes_per_record": rs[0]["disk_bytes_per_record"]}
        print(f"{lay:8s} median {statistics.median(rates):9,.0f} ({summary[lay]['median_vs_id']:.2f}x id) "
              f"runs {', '.join(f'{x:,.0f}' for x in rates)}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        dest = args.out / f"archive_layout_trial-{dt.date.today().isoformat()}.json"
        dest.write_text(json.dumps({"date": dt.datetime.now().isoformat(timespec="seconds"),
                                    "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
                                    "python": platform.python_version(), "lmdb": lmdb.__version__,
                                    "records": args.records, "size": args.size, "batch": args.batch,
                                    "summary": summary}, indent=1))
        print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
