"""Archive benchmark: batched insert rate, sample_elites latency, reopen time, bytes per record.

Run on purpose (not a test)::

    python3 benchmarks/archive_bench.py                         # 100,000 records of 8 KB sources
    python3 benchmarks/archive_bench.py --durability process    # the opt-in faster durability
    python3 benchmarks/archive_bench.py --floor                 # bare py-lmdb, same bytes: the ceiling
    python3 benchmarks/archive_bench.py -n 20000 --batch 500

What is timed: the ``Archive.add_many`` calls (one per batch; building the records is not
timed) plus one ``Archive.sync()`` at the end, so a ``"process"`` archive is timed until
its adds are on the disk, not only handed to the operating system. With the default
``"full"`` durability every add is on the disk when ``add_many`` returns and the final
sync costs nothing.

The records: 70% OK with random fitness and register counts (64 cells), 30% compile
errors, all but the first with a parent, and an 8 KB source each. The sources repeat a few PTX
lines and are far more compressible than real CUDA (about 15x against about 3-5x); the
archive stores sources as they are (no compression), so this does not flatter the figure.

``--floor`` writes the same encoded records (and the seq index) with a bare py-lmdb loop,
in the same batches and with the same durability, without the archive: what the disk and
LMDB alone allow on this machine, the ceiling for the archive's insert rate.

Prints a table and writes ``benchmarks/results/archive_bench-<date>-<config>.json``
(``-2``, ``-3``, ... when that name is taken).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from archive import Archive
from evo.codec import dumps
from evo.space import CategoricalAxis, Choice, IntRange, NumericAxis, ParamSpace
from evo.types import Evaluation, Genome, Problem, Record, Status


def make_problem() -> Problem:
    return Problem(name="bench", params=ParamSpace({"variant": Choice(["a", "b"]), "threads": IntRange(32, 1024)}),
                   check_shapes=({"N": 1},), objective="geomean_speed",
                   descriptors=(NumericAxis("registers", 0, 256, 32, source="resources"),
                                CategoricalAxis("variant", ["a", "b"], source="params")))


def make_batch(start: int, n: int, size: int, rng: np.random.Generator) -> list[Record]:
    words = ["fma.rn.f32", "ld.global.v4.f32", "st.shared.f32", "bar.sync", "add.s32", "shfl.sync.bfly.b32"]
    out = []
    for i in range(start, start + n):
        head = f'extern "C" __global__ void kernel(float* y) {{ y[0] = {i};\n'
        body = "".join(f'  asm volatile("{words[j % 6]} %0, %1;");\n' for j in range(size // 36))
        src = (head + body)[: size - 2] + "}\n"
        g = Genome(src, {"variant": "ab"[i % 2], "threads": 32 * (1 + i % 32)})
        ok = rng.random() < 0.7
        ev = (Evaluation(Status.OK, fitness=float(rng.random()), resources={"registers": int(rng.integers(256))},
                         metrics={"cases": {"M=4096,N=4096:bfloat16": {"time_ms": float(rng.random())}}})
              if ok else Evaluation.failure(Status.COMPILE_ERROR, "error: something at line 3"))
        out.append(Record(g, ev, parents=(f"{i - 1:032x}",) if i else (), operator="bench"))
    return out


def run_archive(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The archive itself: inserts, then sampling latency, reopen time and disk use."""
    rng = np.random.default_rng(0)
    path = root / "arch"
    problem = make_problem()
    ar = Archive(problem, path, durability=args.durability)
    insert_s = 0.0
    done = 0
    while done < args.records:
        batch = make_batch(done, min(args.batch, args.records - done), args.size, rng)
        t = time.perf_counter()
        ar.add_many(batch)
        insert_s += time.perf_counter() - t
        done += len(batch)
    t = time.perf_counter()
    ar.sync()  # with durability="process" the adds are on the disk only now: count the flush
    sync_s = time.perf_counter() - t
    insert_s += sync_s
    ar.save_state({"generation": 1, "rng": rng.bit_generator.state})

    lat = []
    srng = np.random.default_rng(1)
    for _ in range(1000):
        t = time.perf_counter()
        ar.sample_elites(8, srng)
        lat.append(time.perf_counter() - t)
    elites = ar.n_elites
    ar.close()

    t = time.perf_counter()
    ar = Archive(problem, path)
    state = ar.load_state()
    ar.sample_elites(1, srng)  # loads the elite index
    reopen_s = time.perf_counter() - t
    assert state is not None and len(ar) == args.records
    disk = ar.store.disk_bytes()  # type: ignore[attr-defined]
    ar.close()
    q = statistics.quantiles(lat, n=10)
    return {"insert_records_per_s": args.records / insert_s, "insert_s": insert_s, "final_sync_s": sync_s,
            "sample_elites_8_median_us": statistics.median(lat) * 1e6, "sample_elites_8_p90_us": q[8] * 1e6,
            "elites": elites, "reopen_resume_ms": reopen_s * 1e3, "disk_bytes": disk,
            "disk_bytes_per_record": disk / args.records}


def run_floor(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """A bare py-lmdb loop writing the same encoded records: the ceiling for the archive."""
    rng = np.random.default_rng(0)
    path = root / "bare"
    env = lmdb.open(str(path), map_size=4 * args.records * (args.size + 4096) + (1 << 30), max_dbs=4,
                    sync=args.durability == "full", readahead=False)
    records, index = env.open_db(b"records"), env.open_db(b"index")
    stop = threading.Event()

    def flush() -> None:  # what LMDBStore does with durability="process"
        while not stop.wait(1.0):
            env.sync(True)

    flusher = threading.Thread(target=flush, daemon=True)
    if args.durability == "process":
        flusher.start()
    insert_s = 0.0
    done = 0
    while done < args.records:
        batch = make_batch(done, min(args.batch, args.records - done), args.size, rng)
        items = sorted((r.id.encode(), dumps(r.replace(seq=done + j))) for j, r in enumerate(batch))
        seqs = [(b"s" + (done + j).to_bytes(8, "big"), r.id.encode()) for j, r in enumerate(batch)]
        t = time.perf_counter()
        with env.begin(write=True) as txn:
            txn.cursor(db=records).putmulti(items)
            txn.cursor(db=index).putmulti(seqs)
        insert_s += time.perf_counter() - t
        done += len(batch)
    t = time.perf_counter()
    stop.set()
    if flusher.is_alive():
        flusher.join()
    env.sync(True)
    sync_s = time.perf_counter() - t
    insert_s += sync_s
    env.close()
    st = os.stat(path / "data.mdb")
    disk = st.st_blocks * 512
    return {"insert_records_per_s": args.records / insert_s, "insert_s": insert_s, "final_sync_s": sync_s,
            "disk_bytes": disk, "disk_bytes_per_record": disk / args.records}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--records", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=8192, help="source bytes per record")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--durability", default="full", choices=["full", "process"],
                    help="the archive's durability (default: full, the library's default)")
    ap.add_argument("--floor", action="store_true",
                    help="time a bare py-lmdb loop writing the same encoded records instead of the archive")
    ap.add_argument("--dir", default=None, help="where to put the archive (default: a temp dir)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()

    root = Path(args.dir or tempfile.mkdtemp(prefix="archive-bench-"))
    for name in ("arch", "bare"):
        if (root / name).exists():
            shutil.rmtree(root / name)
    config = ("floor-" if args.floor else "") + args.durability
    measured = run_floor(args, root) if args.floor else run_archive(args, root)
    res = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(), "lmdb": lmdb.__version__, "config": config,
        "durability": args.durability, "floor": args.floor, "records": args.records, "source_bytes": args.size,
        "batch": args.batch, **measured,
    }
    what = "bare py-lmdb insert" if args.floor else "batched insert"
    rows = [("configuration", f"{config} ({'bare py-lmdb loop' if args.floor else 'Archive.add_many'})"),
            ("records", f"{args.records:,} x {args.size} B source"),
            (what, f"{res['insert_records_per_s']:,.0f} records/s (batches of {args.batch}; final sync "
                   f"{res['final_sync_s'] * 1e3:.0f} ms included)")]
    if not args.floor:
        rows += [("sample_elites(8)", f"median {res['sample_elites_8_median_us']:.1f} us, "
                                      f"p90 {res['sample_elites_8_p90_us']:.1f} us ({res['elites']} elites)"),
                 ("reopen + resume", f"{res['reopen_resume_ms']:.1f} ms")]
    rows.append(("disk", f"{res['disk_bytes'] / 2**20:,.1f} MiB, {res['disk_bytes_per_record']:,.0f} B/record"))
    for k, v in rows:
        print(f"{k:<20} {v}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"archive_bench-{dt.date.today().isoformat()}-{config}"
    f = out / f"{stem}.json"
    n = 2
    while f.exists():
        f = out / f"{stem}-{n}.json"
        n += 1
    f.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {f}")
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
