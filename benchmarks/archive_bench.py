"""Archive benchmark: batched insert rate, sample_elites latency, reopen time, bytes per record.

Run on purpose (not a test)::

    python3 benchmarks/archive_bench.py                         # 100,000 records of 8 KB sources, each its own
    python3 benchmarks/archive_bench.py --share 10              # the engine's mix: ten records per source
    python3 benchmarks/archive_bench.py --durability process    # the opt-in faster durability
    python3 benchmarks/archive_bench.py --floor                 # bare py-lmdb, same bytes: the ceiling
    python3 benchmarks/archive_bench.py --configs full,process,floor-full,floor-process --repeats 3

Two workloads (``--share``):

* ``--share 1`` (default), the worst case: every record has its own 8 KB source, so every
  record stores 8 KB of text.
* ``--share K``, the mix an engine run writes: records come in groups of K that share one
  source (the first of each group brings a new source; the other K-1 are parameter variants
  of it, ``Genome(first.source, params)``, as the parameter operators make them), so the
  archive stores each source once (schema 2) and the other records refer to it.

What is timed: the ``Archive.add_many`` calls (one per batch; building the records is not
timed) plus one ``Archive.sync()`` at the end, so a ``"process"`` archive is timed until
its adds are on the disk, not only handed to the operating system. With the default
``"full"`` durability every add is on the disk when ``add_many`` returns and the final
sync costs nothing.

The records: 70% OK with random fitness and register counts (64 cells), 30% compile
errors, all but the first with a parent, and an 8 KB source each. The sources repeat a few
PTX lines and are far more compressible than real CUDA (about 15x against about 3-5x); the
archive stores sources as they are (no compression), so this does not flatter the figure.

``floor-full`` / ``floor-process`` write the bytes the archive stores for each record (a
record holding its source, or a reference for a variant) and the seq index with a bare
py-lmdb loop, in the same batches and with the same durability, without the archive (and
without timing the encoding): what the disk and LMDB alone allow on this machine, the
ceiling for the archive's insert rate.

``s2-full`` / ``s2-process`` run the archive in the schema-2 layout (records keyed by
genome id, the layout of archives created before schema 3, which this library keeps writing
in them), and ``floor2-full`` / ``floor2-process`` its bare-LMDB floor: the layouts side by side.

``gc-full`` / ``gc-process`` run the archive with Python's cyclic garbage collector left
running inside ``add_many`` (which pauses it for the batch): what the pause is worth.

Several configurations (``--configs``) and ``--repeats`` run in one process, rotating the
order every repeat, each on the same records, so that they are compared under the same
machine conditions (median and spread are reported). Prints a table and writes
``benchmarks/results/archive_bench-<date>-<label>.json`` (``-2``, ``-3``, ... when taken).
"""

from __future__ import annotations

import argparse
import contextlib
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
from unittest import mock

import lmdb
import numpy as np

from archive import Archive
from archive import _archive as archive_impl
from evo.codec import dumps, pack_raw
from evo.space import CategoricalAxis, Choice, IntRange, NumericAxis, ParamSpace
from evo.types import Evaluation, Genome, Problem, Record, Status

CONFIGS = ("full", "process", "floor-full", "floor-process", "gc-full", "gc-process", "s2-full", "s2-process",
           "floor2-full", "floor2-process")


def make_problem() -> Problem:
    return Problem(name="bench", params=ParamSpace({"variant": Choice(["a", "b"]), "threads": IntRange(32, 1024)}),
                   check_shapes=({"N": 1},), objective="geomean_speed",
                   descriptors=(NumericAxis("registers", 0, 256, 32, source="resources"),
                                CategoricalAxis("variant", ["a", "b"], source="params")))


def make_source(i: int, size: int) -> str:
    words = ["fma.rn.f32", "ld.global.v4.f32", "st.shared.f32", "bar.sync", "add.s32", "shfl.sync.bfly.b32"]
    head = f'extern "C" __global__ void kernel(float* y) {{ y[0] = {i};\n'
    body = "".join(f'  asm volatile("{words[j % 6]} %0, %1;");\n' for j in range(size // 36))
    return (head + body)[: size - 2] + "}\n"


def make_batch(start: int, n: int, size: int, rng: np.random.Generator, share: int = 1) -> list[Record]:
    """Records ``start .. start+n-1``; with ``share`` > 1, each group of ``share`` shares its first one's source."""
    out: list[Record] = []
    first: Genome | None = None
    for i in range(start, start + n):
        params = {"variant": "ab"[i % 2], "threads": 32 * (1 + i % 32)}
        if share > 1 and i % share and first is not None:
            g = Genome(first.source, params)  # a parameter variant: the very same source string
            parents: tuple[str, ...] = (first.id,)
        else:
            g = first = Genome(make_source(i, size), params)
            parents = (f"{i - 1:032x}",) if i else ()
        ok = rng.random() < 0.7
        ev = (Evaluation(Status.OK, fitness=float(rng.random()), resources={"registers": int(rng.integers(256))},
                         metrics={"cases": {"M=4096,N=4096:bfloat16": {"time_ms": float(rng.random())}}})
              if ok else Evaluation.failure(Status.COMPILE_ERROR, "error: something at line 3"))
        out.append(Record(g, ev, parents=parents, operator="bench"))
    return out


def run_archive(args: argparse.Namespace, root: Path, durability: str, gc_on: bool = False,
                schema: int | None = None) -> dict[str, Any]:
    """The archive itself: inserts, then sampling latency, reopen time and disk use.

    ``gc_on``: leave the cyclic garbage collector running inside ``add_many`` (the comparison
    for the pause it takes by default). ``schema``: create the archive with this schema
    version's layout instead of the current one.
    """
    if schema is not None:
        with mock.patch.object(archive_impl, "ARCHIVE_SCHEMA_VERSION", schema):
            return run_archive(args, root, durability, gc_on)
    if gc_on:
        with mock.patch.object(archive_impl, "_gc_paused", contextlib.nullcontext):
            return run_archive(args, root, durability)
    rng = np.random.default_rng(0)
    path = root / "arch"
    problem = make_problem()
    ar = Archive(problem, path, durability=durability)  # type: ignore[arg-type]
    insert_s = 0.0
    done = 0
    while done < args.records:
        batch = make_batch(done, min(args.batch, args.records - done), args.size, rng, args.share)
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


def _stored_bytes(rec: Record, carrier: str | None) -> bytes:
    """What the archive stores for ``rec``: the record, or (a variant) a reference to its carrier's source."""
    if carrier is None:
        return dumps(rec)
    g = rec.genome
    return pack_raw(rec._payload({"source_of": carrier, "params": g._plain_params(), "entry": g.entry,
                                  "language": g.language, "id": g.id}))


def run_floor(args: argparse.Namespace, root: Path, durability: str, schema: int = 3) -> dict[str, Any]:
    """A bare py-lmdb loop writing the bytes the archive stores, in the layout of ``schema``
    (3: an id -> seq pointer, the body by seq cut at a page boundary; 2: the bytes by id):
    the ceiling for the archive."""
    rng = np.random.default_rng(0)
    path = root / "bare"
    env = lmdb.open(str(path), map_size=4 * args.records * (args.size + 4096) + (1 << 30), max_dbs=4,
                    sync=durability == "full", readahead=False)
    records, index = env.open_db(b"records"), env.open_db(b"index")
    bodies, tails = env.open_db(b"bodies"), env.open_db(b"tails")
    page = env.stat()["psize"]
    stop = threading.Event()

    def flush() -> None:  # what LMDBStore does with durability="process"
        while not stop.wait(1.0):
            env.sync(True)

    flusher = threading.Thread(target=flush, daemon=True)
    if durability == "process":
        flusher.start()
    insert_s = 0.0
    done = 0
    while done < args.records:
        batch = make_batch(done, min(args.batch, args.records - done), args.size, rng, args.share)
        carriers: dict[int, str] = {}
        items = []
        for j, r in enumerate(batch):
            src = r.genome.source
            items.append((r.id.encode(), _stored_bytes(r.replace(seq=done + j), carriers.get(id(src)))))
            carriers.setdefault(id(src), r.id)
        seqs = [(b"s" + (done + j).to_bytes(8, "big"), r.id.encode()) for j, r in enumerate(batch)]
        body_items: list[tuple[bytes, bytes]] = []
        tail_items: list[tuple[bytes, bytes]] = []
        if schema >= 3:  # what Archive._insert_all writes (cut_body, the pointer)
            pointers = []
            for j, (key, data) in enumerate(items):
                sk = (done + j).to_bytes(8, "big")
                body, tail = archive_impl.cut_body(data, page)
                body_items.append((sk, body))
                if tail:
                    tail_items.append((sk, tail))
                pointers.append((key, sk + (b"\1" if tail else b"\0")))
            items = pointers
        items.sort()
        t = time.perf_counter()
        with env.begin(write=True) as txn:
            txn.cursor(db=records).putmulti(items)
            if body_items:
                txn.cursor(db=bodies).putmulti(body_items)
                if tail_items:
                    txn.cursor(db=tails).putmulti(tail_items)
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


def run_one(args: argparse.Namespace, config: str) -> dict[str, Any]:
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="archive-bench-"))
    for name in ("arch", "bare"):
        if (root / name).exists():
            shutil.rmtree(root / name)
    try:
        kind, _, durability = config.rpartition("-")
        if kind in ("floor", "floor2"):
            return run_floor(args, root, durability, schema=2 if kind == "floor2" else 3)
        return run_archive(args, root, durability, gc_on=kind == "gc", schema=2 if kind == "s2" else None)
    finally:
        for name in ("arch", "bare"):
            shutil.rmtree(root / name, ignore_errors=True)
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--records", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=8192, help="source bytes per record")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--share", type=int, default=1,
                    help="records per distinct source: 1 (default) every record its own, the worst case; "
                         "10 the engine's mix of one new source and nine parameter variants")
    ap.add_argument("--durability", default="full", choices=["full", "process"],
                    help="the archive's durability (default: full, the library's default)")
    ap.add_argument("--floor", action="store_true",
                    help="time a bare py-lmdb loop writing the same bytes instead of the archive")
    ap.add_argument("--configs", default=None,
                    help=f"comma-separated configurations to compare in one run, of {', '.join(CONFIGS)} "
                         "(default: the one --durability and --floor give)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of every configuration (order rotates)")
    ap.add_argument("--dir", default=None, help="where to put the archive (default: a temp dir)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    if args.share < 1 or args.batch % args.share:
        ap.error("--share must be >= 1 and divide --batch")
    configs = (args.configs.split(",") if args.configs else
               [("floor-" if args.floor else "") + args.durability])
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        ap.error(f"unknown configuration(s) {bad}; choose from {', '.join(CONFIGS)}")

    load0 = os.getloadavg()
    runs: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        k = rep % len(configs)
        for config in configs[k:] + configs[:k]:
            t = time.perf_counter()
            res = run_one(args, config)
            runs.append({"config": config, "repeat": rep, "load_1min_after": os.getloadavg()[0], **res})
            print(f"repeat {rep} {config:<14} {res['insert_records_per_s']:>9,.0f} records/s "
                  f"({time.perf_counter() - t:.0f} s with building)", flush=True)
    workload = "unique" if args.share == 1 else f"share{args.share}"
    summary: dict[str, Any] = {}
    for config in configs:
        mine = [r for r in runs if r["config"] == config]
        summary[config] = {k: _spread([r[k] for r in mine]) for k in mine[0]
                           if k not in ("config", "repeat") and isinstance(mine[0][k], (int, float))}
    res = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "load_1_5_15min_before": load0, "load_1_5_15min_after": os.getloadavg(),
        "python": platform.python_version(), "lmdb": lmdb.__version__, "workload": workload,
        "records": args.records, "source_bytes": args.size, "batch": args.batch, "share": args.share,
        "configs": configs, "repeats": args.repeats, "summary": summary, "runs": runs,
    }
    print(f"\n{args.records:,} records x {args.size} B source, batches of {args.batch}, workload {workload} "
          f"({'every record its own source' if args.share == 1 else f'{args.share} records per source'}); "
          f"{args.repeats} run(s) each, median [min - max]")
    for config in configs:
        s = summary[config]
        ins = s["insert_records_per_s"]
        line = (f"{config:<14} insert {ins['median']:>9,.0f} [{ins['min']:,.0f} - {ins['max']:,.0f}] records/s, "
                f"disk {s['disk_bytes_per_record']['median']:,.0f} B/record")
        if "sample_elites_8_median_us" in s:
            line += (f", sample_elites(8) median {s['sample_elites_8_median_us']['median']:.1f} us "
                     f"(p90 {s['sample_elites_8_p90_us']['median']:.1f}), reopen {s['reopen_resume_ms']['median']:.1f} ms")
        print(line)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    label = configs[0] if len(configs) == 1 else "compare"
    stem = f"archive_bench-{dt.date.today().isoformat()}-{workload}-{label}"
    f = out / f"{stem}.json"
    n = 2
    while f.exists():
        f = out / f"{stem}-{n}.json"
        n += 1
    f.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
