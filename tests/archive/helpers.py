"""Shared builders for archive tests, importable from spawned processes.

Run as ``python -m tests.archive.helpers writer PATH SIDEFILE SEED [DURABILITY]`` to start
the crash-test writer: it adds records forever (half of them parameter variants of recent
records or of elites written before the last kill, sharing their source) and appends each id
to SIDEFILE (flushed and fsynced) only after ``add``/``add_many`` returned.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from archive import Archive, LMDBStore
from evo.codec import pack_raw, unpack_raw
from evo.space import CategoricalAxis, Choice, IntRange, NumericAxis, ParamSpace
from evo.types import Evaluation, Genome, Lesson, Problem, Record, Status


def make_problem(name: str = "rmsnorm-test", descriptors: bool = True, **kw: Any) -> Problem:
    axes = (NumericAxis("registers", 0, 256, 8, source="resources"),
            CategoricalAxis("variant", ["a", "b"], source="params")) if descriptors else ()
    return Problem(name=name, params=ParamSpace({"variant": Choice(["a", "b", "c"]), "threads": IntRange(32, 1024)}),
                   check_shapes=({"N": 1},), descriptors=axes, objective="geomean_speed", **kw)


def empty_archive_of_schema(path: Path, problem: Problem, version: int) -> None:
    """An empty LMDB archive at ``path`` whose header says ``version``, as an older library wrote it."""
    Archive(problem, path).close()
    s = LMDBStore(path)
    header = unpack_raw(s.get("header", b"meta"))  # type: ignore[arg-type]
    s.put("header", b"meta", pack_raw({**header, "schema_version": version}))
    s.close()


def make_source(i: int, size: int = 0) -> str:
    body = f'extern "C" __global__ void kernel(float* x) {{ x[threadIdx.x] = {i}.0f; }}\n'
    if size > len(body):
        pad = size - len(body)
        body += "// " + ("pad " * (pad // 4 + 1))[:max(pad - 4, 0)] + "\n"
    return body


def make_record(i: int, *, variant: str = "a", registers: Any = 32, fitness: float | None = None,
                status: Status = Status.OK, parents: tuple[str, ...] = (), operator: str = "seed",
                size: int = 0, threads: int = 256) -> Record:
    source = make_source(i, size)
    g = Genome(source, {"variant": variant, "threads": threads})
    if status is Status.OK:
        ev = Evaluation(Status.OK, fitness=float(i) if fitness is None else fitness,
                        metrics={"cases": {"N=1:float32": {"time_ms": 0.01 * (i + 1)}}},
                        resources={"registers": registers})
    else:
        ev = Evaluation.failure(status, f"failed {i}")
    sha = hashlib.sha256(source.encode()).hexdigest()
    return Record(g, ev, parents=parents, operator=operator, meta={"sha": sha})


def make_variant(rec: Record, threads: int, *, variant: str | None = None, fitness: float | None = None,
                 registers: Any = None, status: Status = Status.OK, operator: str = "params") -> Record:
    """A parameter variant of ``rec``: the very same source ``str`` with other params (shared source)."""
    g = rec.genome
    params = {"variant": variant or g.params["variant"], "threads": threads}
    child = Genome(g.source, params, g.entry, g.language)
    if status is Status.OK:
        regs = registers if registers is not None else rec.evaluation.resources.get("registers", 32)
        ev = Evaluation(Status.OK, fitness=float(threads) if fitness is None else fitness,
                        metrics={"cases": {"N=1:float32": {"time_ms": 1.0 / threads}}}, resources={"registers": regs})
    else:
        ev = Evaluation.failure(status, f"variant {threads} failed")
    return Record(child, ev, parents=(rec.id,), operator=operator, meta=dict(rec.meta))


def check_record(rec: Record) -> None:
    """Raise AssertionError if the stored source does not match its checksum."""
    assert hashlib.sha256(rec.genome.source.encode()).hexdigest() == rec.meta["sha"], rec.id


def writer(path: str, side: str, seed: int, durability: str = "full") -> None:  # pragma: no cover - subprocess
    from archive import Archive

    rng = np.random.default_rng(seed)
    problem = make_problem()
    ar = Archive(problem, path, durability=durability)  # type: ignore[arg-type]
    print("ready", flush=True)
    fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    i = seed * 1_000_000
    recent: list[Record] = []
    for rec in ar.sample_elites(4, rng):  # parents from earlier runs: their sources are shared too
        recent.append(rec)
    while True:
        k = int(rng.integers(1, 6))
        recs = []
        for j in range(k):
            if recent and rng.random() < 0.5:  # a parameter variant: shares its parent's source
                parent = recent[int(rng.integers(len(recent)))]
                recs.append(make_variant(parent, int(rng.integers(32, 1 << 20)), variant=("a", "b")[int(rng.integers(2))],
                                         registers=int(rng.integers(0, 256)), fitness=float(rng.random()),
                                         status=Status.OK if rng.random() < 0.8 else Status.COMPILE_ERROR))
            else:
                recs.append(make_record(i + j, variant=("a", "b")[int(rng.integers(2))],
                                        registers=int(rng.integers(0, 256)), fitness=float(rng.random()),
                                        size=int(rng.integers(100, 12000)),  # up to three pages: cut bodies too
                                        status=Status.OK if rng.random() < 0.8 else Status.COMPILE_ERROR))
        recent = (recent + recs[-2:])[-8:]
        i += k
        if k == 1:
            ar.add(recs[0])
        else:
            ar.add_many(recs)
        if rng.random() < 0.2:
            ar.lessons.append(Lesson("seed", recs[0].id, "x", "no_gain"))
            ar.save_state({"i": i})
        os.write(fd, "".join(r.id + "\n" for r in recs).encode())
        os.fsync(fd)


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1] == "writer":
        writer(sys.argv[2], sys.argv[3], int(sys.argv[4]), *sys.argv[5:6])
