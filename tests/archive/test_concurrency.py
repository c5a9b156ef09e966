"""Several processes add and read the same LMDB archive at once."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest

from evo.types import Status
from tests.archive.helpers import check_record, make_problem, make_record, make_variant

N_WORKERS = 4
OWN = 150
SHARED = 100


def _worker(path: str, w: int, map_size: int, durability: str) -> list[tuple[str, bool, int]]:
    from archive import Archive

    ar = Archive(make_problem(), path, map_size=map_size, durability=durability)  # type: ignore[arg-type]
    rng = np.random.default_rng(w)
    own = [make_record(10_000 * (w + 1) + i, registers=int(rng.integers(256)), variant="ab"[i % 2],
                       fitness=float(rng.random()), size=int(rng.integers(200, 4000)),
                       status=Status.OK if i % 5 else Status.INCORRECT) for i in range(OWN)]
    shared = [make_record(i, registers=i, fitness=float(i), size=2000) for i in range(SHARED)]
    # variants of shared records (the same for every worker): they share their parents' sources
    variants = [make_variant(shared[i], 64 + i, registers=(3 * i) % 256) for i in range(0, SHARED, 4)]
    order = own + shared + variants
    rng.shuffle(order)  # type: ignore[arg-type]
    out: list[tuple[str, bool, int]] = []
    i = 0
    while i < len(order):
        k = int(rng.integers(1, 8))
        batch = order[i:i + k]
        i += k
        results = ar.add_many(batch) if k > 1 else [ar.add(batch[0])]
        out.extend((r.record.id, r.duplicate, r.record.seq) for r in results)
        ar.sample_elites(4, rng)  # concurrent reads
        ar.best()
        len(ar)
    ar.close()
    return out


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("map_size", "durability"), [(1 << 30, "full"), (256 << 10, "full"), (1 << 30, "process")],
                         ids=["big-map", "tiny-map-grows", "process-durability"])
def test_processes_add_concurrently(tmp_path: Path, map_size: int, durability: str) -> None:
    from archive import Archive

    path = str(tmp_path / "arch")
    Archive(make_problem(), path).close()  # create the header first
    ctx = mp.get_context("spawn")
    with ctx.Pool(N_WORKERS) as pool:
        results = pool.starmap(_worker, [(path, w, map_size, durability) for w in range(N_WORKERS)])
    ar = Archive(make_problem(), path)
    records = list(ar.records())
    ids = [r.id for r in records]
    assert len(ids) == len(set(ids)) == len(ar) == N_WORKERS * OWN + SHARED + len(range(0, SHARED, 4))
    assert sorted(r.seq for r in records) == list(range(len(records)))
    for rec in records:
        check_record(rec)
    fresh = [(gid, seq) for res in results for gid, dup, seq in res if not dup]
    assert len(fresh) == len(records)  # every record was "new" for exactly one writer
    assert {gid: seq for gid, seq in fresh} == {r.id: r.seq for r in records}
    assert sum(ar.counts().values()) == len(records)
    best = ar.best()
    assert best is not None and best.fitness == max(r.fitness for r in records if r.status is Status.OK)
    ar.close()
