"""Archive benchmark: batched insert rate, sample_elites latency, reopen time, bytes per record.

Run on purpose (not a test)::

    python3 benchmarks/archive_bench.py                 # 100,000 records of 8 KB sources
    python3 benchmarks/archive_bench.py -n 20000 --batch 500

Prints a table and writes ``benchmarks/results/archive_bench-<date>.json``.
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
import time
from pathlib import Path

import numpy as np

from archive import Archive
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--records", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=8192, help="source bytes per record")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--dir", default=None, help="where to put the archive (default: a temp dir)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    root = Path(args.dir or tempfile.mkdtemp(prefix="archive-bench-"))
    path = root / "arch"
    if path.exists():
        shutil.rmtree(path)
    problem = make_problem()
    ar = Archive(problem, path)
    insert_s = 0.0
    done = 0
    while done < args.records:
        batch = make_batch(done, min(args.batch, args.records - done), args.size, rng)
        t = time.perf_counter()
        ar.add_many(batch)
        insert_s += time.perf_counter() - t
        done += len(batch)
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
    res = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(), "records": args.records, "source_bytes": args.size,
        "batch": args.batch, "insert_records_per_s": args.records / insert_s, "insert_s": insert_s,
        "sample_elites_8_median_us": statistics.median(lat) * 1e6, "sample_elites_8_p90_us": q[8] * 1e6,
        "elites": elites, "reopen_resume_ms": reopen_s * 1e3, "disk_bytes": disk,
        "disk_bytes_per_record": disk / args.records,
    }
    rows = [("records", f"{args.records:,} x {args.size} B source"),
            ("batched insert", f"{res['insert_records_per_s']:,.0f} records/s (batches of {args.batch})"),
            ("sample_elites(8)", f"median {res['sample_elites_8_median_us']:.1f} us, "
                                 f"p90 {res['sample_elites_8_p90_us']:.1f} us ({elites} elites)"),
            ("reopen + resume", f"{res['reopen_resume_ms']:.1f} ms"),
            ("disk", f"{disk / 2**20:,.1f} MiB, {res['disk_bytes_per_record']:,.0f} B/record")]
    for k, v in rows:
        print(f"{k:<18} {v}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    f = out / f"archive_bench-{dt.date.today().isoformat()}.json"
    f.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {f}")
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
