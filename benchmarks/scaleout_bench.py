"""Evaluations per minute against the number of workers, for the local and the Ray executor.

CPU mode (default): the CPU-scorable Problem of ``tests/evo/cpu_problem.py`` (real nvcc
compiles, fitness from the resource report); workers are compile workers
(``Evaluator(compile_workers=w)``, ``RayExecutor(compile_concurrency=w)``). Each
configuration gets a fresh compile cache so every evaluation really compiles.

GPU mode (``--gpus``): the full stage list on a GPU Problem (``--problem
module:function``, default ``examples.rmsnorm_h100:make_problem``); workers are GPUs
(``Evaluator(devices=first w)``, ``RayExecutor(num_actors=w)``).

Usage:
    python benchmarks/scaleout_bench.py --workers 1 2 4 --evaluations 24 --out results/scaleout.json
    python benchmarks/scaleout_bench.py --gpus --workers 1 2 4 8 --evaluations 64

Prints a table and writes JSON (with the date, host and every measurement) to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import itertools
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _load(spec: str) -> Any:
    mod, _, fn = spec.partition(":")
    return getattr(importlib.import_module(mod), fn or "make_problem")


def _cpu_setup() -> tuple[Any, list[Any], list[Any]]:
    from fitness import Compile, HostScore, Resources, StaticCheck
    from tests.evo import cpu_problem

    problem = cpu_problem.make_problem()
    genomes = [cpu_problem.seed_genome(UNROLL=u, VEC=v, THREADS=t)
               for u, v, t in itertools.product((1, 2, 4, 8), (1, 2, 4), range(64, 513, 64)) if u * v <= 16]
    stages = [StaticCheck(), Compile(), Resources(), HostScore(cpu_problem.score_fn)]
    return problem, genomes, stages


def _gpu_setup(spec: str, n: int, seed: int) -> tuple[Any, list[Any], None]:
    import numpy as np

    problem = _load(spec)()
    if not problem.seeds:
        raise SystemExit(f"{spec} returned a Problem without seeds; the benchmark varies the seeds' params")
    rng = np.random.default_rng(seed)
    genomes = list(problem.seeds)
    seen = {g.id for g in genomes}
    tries = 0
    while len(genomes) < n and tries < 50 * n:
        tries += 1
        base = problem.seeds[len(genomes) % len(problem.seeds)]
        g = base.with_params(**problem.params.sample(rng))
        if g.id not in seen:
            seen.add(g.id)
            genomes.append(g)
    return problem, genomes, None


def _busy(value: Any) -> float | None:
    """The overall GPU busy fraction (the executors report ``{"overall", "per_device"}``)."""
    if isinstance(value, dict):
        value = value.get("overall")
    return None if value is None else float(value)


def _run(executor: Any, genomes: list[Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    futures = [executor.submit(g) for g in genomes]
    results = [f.result() for f in futures]
    wall = time.perf_counter() - t0
    by_status: dict[str, int] = {}
    for r in results:
        by_status[r.status.value] = by_status.get(r.status.value, 0) + 1
    stats = executor.stats()
    return {"evaluations": len(results), "seconds": wall, "per_minute": 60.0 * len(results) / wall,
            "by_status": by_status, "gpu_busy_fraction": _busy(stats.get("gpu_busy_fraction")),
            "respawns": stats.get("respawns")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--evaluations", type=int, default=24, help="evaluations per configuration")
    ap.add_argument("--executors", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    ap.add_argument("--gpus", action="store_true", help="GPU mode: workers are GPUs")
    ap.add_argument("--problem", default="examples.rmsnorm_h100:make_problem", help="GPU mode: module:function")
    ap.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: start a local one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON output path (default: benchmarks/results/scaleout-DATE.json)")
    args = ap.parse_args(argv)

    from fitness import Evaluator
    from fitness.ray import RayExecutor

    if args.gpus:
        problem, genomes, stages = _gpu_setup(args.problem, args.evaluations, args.seed)
    else:
        problem, genomes, stages = _cpu_setup()
    genomes = genomes[: args.evaluations]
    rows: list[dict[str, Any]] = []
    ray = None
    if "ray" in args.executors:
        import ray as _ray

        ray = _ray
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        if args.ray_address:
            ray.init(address=args.ray_address, log_to_driver=False)
        elif args.gpus:
            ray.init(log_to_driver=False)
        else:
            ray.init(num_cpus=max(args.workers), log_to_driver=False, include_dashboard=False)
    try:
        for kind in args.executors:
            for w in args.workers:
                with tempfile.TemporaryDirectory(prefix="scaleout-cache-") as cache:
                    if kind == "local":
                        kw: dict[str, Any] = {"devices": [str(i) for i in range(w)]} if args.gpus else \
                            {"compile_workers": w}
                        ex = Evaluator(problem, stages, cache_dir=cache, **kw)
                    else:
                        kw = {"num_actors": w} if args.gpus else {"compile_concurrency": w}
                        ex = RayExecutor(problem, stages, cache_dir=cache, **kw)
                    try:
                        row = {"executor": kind, "workers": w, **_run(ex, genomes)}
                    finally:
                        ex.close()
                rows.append(row)
                print(f"  {kind:5s} workers={w:2d}: {row['per_minute']:8.1f} evals/min "
                      f"({row['evaluations']} in {row['seconds']:.1f}s)", file=sys.stderr)
    finally:
        if ray is not None:
            ray.shutdown()

    base = {r["executor"]: r["per_minute"] for r in rows if r["workers"] == min(args.workers)}
    print(f"\n{'executor':8s} {'workers':>7s} {'evals/min':>10s} {'speedup':>8s} {'gpu busy':>9s}  statuses")
    for r in rows:
        busy = "-" if not args.gpus or r["gpu_busy_fraction"] is None else f"{r['gpu_busy_fraction']:.0%}"
        speed = r["per_minute"] / base[r["executor"]] if base.get(r["executor"]) else float("nan")
        print(f"{r['executor']:8s} {r['workers']:7d} {r['per_minute']:10.1f} {speed:8.2f} {busy:>9s}  {r['by_status']}")
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / f"scaleout-{dt.date.today()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "date": dt.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
        "cpus": os.cpu_count(), "mode": "gpu" if args.gpus else "cpu", "problem": problem.name,
        "evaluations": len(genomes), "rows": rows}, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
