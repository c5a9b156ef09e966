"""Search for fast RMSNorm forward kernels on an H100/H200, then compare and export them.

Usage::

    python examples/rmsnorm_h100.py --minutes 5 --archive runs/rmsnorm_h100.lmdb
    python examples/rmsnorm_h100.py --quick --evaluations 50
    python examples/rmsnorm_h100.py --backward --minutes 3     # dx and dw instead
    python examples/rmsnorm_h100.py --archive runs/new.lmdb --warm-start runs/rmsnorm_h100.lmdb
    python examples/rmsnorm_h100.py --archive runs/new.lmdb --warm-start runs/old.lmdb --warm-start-seeds all

On a machine without a usable GPU it stops at once with exit code 2. After the search it
prints, per timed case, the best record found against torch.nn.functional.rms_norm and
torch.compile of it (same timing method, where torch is installed), and exports the best
genome per shape to ``<archive>.dispatch.py`` (a cupy dispatch module that selects on N,
plus a torch custom op where torch is installed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # spawned workers inherit sys.path and re-import examples.* by name
    sys.path.insert(0, str(ROOT))

TORCH_OP = '''
try:
    import torch as _torch
except ImportError:  # torch is optional
    _torch = None

if _torch is not None:
    _DT = {_torch.bfloat16: "bfloat16", _torch.float16: "float16", _torch.float32: "float32"}

    @_torch.library.custom_op("evo_rmsnorm::fwd", mutates_args=())
    def rmsnorm(x: _torch.Tensor, w: _torch.Tensor) -> _torch.Tensor:
        """RMSNorm forward (eps 1e-6) over the last dim with the exported kernels; w is float32."""
        import cupy
        x2 = x.contiguous().view(-1, x.shape[-1])
        y = _torch.empty_like(x2)
        w32 = w.contiguous().to(_torch.float32)
        with cupy.cuda.ExternalStream(_torch.cuda.current_stream().cuda_stream):
            run(cupy.asarray(x2), cupy.asarray(w32), cupy.asarray(y),
                shape={"M": x2.shape[0], "N": x2.shape[1]}, dtype=_DT[x.dtype])
        return y.view_as(x)

    @rmsnorm.register_fake
    def _(x, w):
        return _torch.empty_like(x)
'''


def gpu_available() -> tuple[bool, str]:
    """Whether a CUDA GPU is usable here, and why not."""
    if shutil.which("nvidia-smi"):
        try:
            r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
            if r.returncode != 0 or "GPU" not in r.stdout:
                return False, "nvidia-smi lists no GPU"
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, f"nvidia-smi failed: {e}"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False, "cupy sees no CUDA device"
        cupy.zeros(1).sum()
    except Exception as e:  # noqa: BLE001 - any failure means no usable GPU
        return False, f"cupy cannot use the GPU ({type(e).__name__}: {e}); install the 'cuda' extra"
    return True, ""


def time_torch(fn: Any, case: Any, l2_bytes: int = 50 << 20, backward: bool = False) -> float:
    """Median ms per call of a torch RMSNorm, timed with the fitness Timing stage's method.

    Forward: ``fn(x, w)``; backward: ``fn(x, w, dy, rstd)`` (see :func:`rmsnorm_backward_torch`).
    Input sets rotate so that together they exceed 3x L2 (every call reads from HBM);
    batches are CUDA-graph replays where torch can capture them (see
    :func:`fitness.time_calls`). The forward gets ``w`` in the input's dtype (cast once,
    outside the timed calls); the backward gets it in float32, as the genomes do.
    """
    import torch

    from fitness import rotation_sets, time_calls

    m, n = case["M"], case["N"]
    dt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[case.dtype]
    elem = torch.finfo(dt).bits // 8
    one = (3 if backward else 2) * m * n * elem
    sets = rotation_sets(l2_bytes, one, most=16)
    xs = [torch.randn(m, n, device="cuda", dtype=dt) for _ in range(sets)]
    if not backward:
        w = torch.randn(n, device="cuda", dtype=dt)
        return time_calls([(lambda x=x: fn(x, w)) for x in xs]).time_ms
    w32 = torch.randn(n, device="cuda", dtype=torch.float32)
    dys = [torch.randn(m, n, device="cuda", dtype=dt) for _ in range(sets)]
    rstds = [torch.rsqrt(x.float().pow(2).mean(dim=1) + 1e-6) for x in xs]
    return time_calls([(lambda x=x, dy=dy, r=r: fn(x, w32, dy, r)) for x, dy, r in zip(xs, dys, rstds, strict=True)]
                      ).time_ms


def rmsnorm_backward_torch(x: Any, w: Any, dy: Any, rstd: Any) -> tuple[Any, Any]:
    """The reference backward in torch: dx (dtype of x) and dw (float32) from x, w, dy, rstd."""
    xhat = x.float() * rstd[:, None]
    g = dy.float() * w[None, :]
    c = (xhat * g).mean(dim=1, keepdim=True)
    dx = (rstd[:, None] * (g - xhat * c)).to(x.dtype)
    dw = (dy.float() * xhat).sum(dim=0)
    return dx, dw


def torch_providers(backward: bool = False) -> dict[str, Any]:
    """Eager torch and torch.compile (static shapes) of the forward, or of the reference
    backward with ``backward=True``; {} without torch."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return {}

    def eager(x: Any, w: Any) -> Any:
        return F.rms_norm(x, (x.shape[-1],), w, eps=1e-6)

    for knob in ("recompile_limit", "cache_size_limit"):  # one compile per shape: 33 cases, not 8
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    fn = rmsnorm_backward_torch if backward else eager
    return {"torch": fn, "torch.compile": torch.compile(fn, dynamic=False)}


def summary(engine: Any, arch: Any, problem: Any, best: Any) -> str:
    """What the search did: evaluations, rate, GPU busy, what each operator gave, the best against the seeds."""
    run = engine.last_run or {}
    busy = run.get("gpu_busy")
    lines = [f"search: {run.get('evaluations', 0)} evaluations in {run.get('seconds', 0.0):.0f} s "
             f"({run.get('rate_per_min', 0.0):.1f}/min), GPU busy {busy:.0%}" if busy is not None else
             f"search: {run.get('evaluations', 0)} evaluations in {run.get('seconds', 0.0):.0f} s",
             f"stopped: {run.get('stop', '-')}; archive: {len(arch)} records, coverage {arch.coverage:.1%}"]
    from evo.report import operator_summary

    ops = operator_summary(list(arch.records()))
    if ops:
        lines.append("operators (whole archive): " + "; ".join(
            f"{o['operator']} {o['evaluations']} evaluated"
            + (f", {o['faster']} of {o['children']} faster than the parent" if o["children"] else "")
            + f", {o['new_best']} new best" for o in ops))
    skipped = engine.stats().get("warm_start_seeds_skipped", 0)
    if skipped:
        lines.append(f"warm start: {skipped} of the family's {len(problem.seeds)} seeds not timed again (the "
                     "warm-start archive timed them on this GPU; --warm-start-seeds all times them)")
    seeds = [arch.get(g.id) for g in problem.seeds]
    seed_fit = [r.evaluation.fitness for r in seeds if r is not None and r.evaluation.fitness is not None]
    if seed_fit and best is not None:
        top = max(seed_fit)
        lines.append(f"best fitness {best.fitness:.4f} (geomean fraction of copy bandwidth) vs best seed {top:.4f}: "
                     f"{best.fitness / top:.3f}x; best genome {best.genome.id[:12]} {dict(best.genome.params)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="wall-clock budget of the search")
    ap.add_argument("--evaluations", type=int, default=None, help="stop after this many evaluations")
    ap.add_argument("--archive", default=None, help="LMDB archive path, resumed if present (default "
                    "runs/rmsnorm_h100.lmdb, or runs/rmsnorm_bwd_h100.lmdb with --backward)")
    ap.add_argument("--backward", action="store_true",
                    help="search the backward Problem (dx and dw) instead of the forward")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="time 3 shapes instead of 11")
    ap.add_argument("--executor", choices=("local", "ray"), default="local")
    ap.add_argument("--ray-address", default=None)
    ap.add_argument("--no-compare", action="store_true", help="skip the torch comparison")
    ap.add_argument("--no-racing", action="store_true", help="time every case of every candidate in full "
                    "(default: a case far slower than its best so far stops after 3 batches)")
    ap.add_argument("--warm-start", default=None, metavar="ARCHIVE",
                    help="an earlier run's archive (e.g. before the kernel family changed): its elites and "
                    "per-case champions are re-evaluated first, as seeds, and its lessons copied (once)")
    ap.add_argument("--warm-start-per-case", type=int, default=3, metavar="K",
                    help="with --warm-start: each case's K fastest genomes of that archive (within 5%% of its "
                    "champion) are re-evaluated, not its champion alone: an archive searched on another GPU "
                    "ranks close genomes differently (an H100 archive's top 3 per case re-timed on an H200: "
                    "its fastest was not the H200's on 22 of 33 cases)")
    ap.add_argument("--warm-start-within", type=float, default=0.05, metavar="F",
                    help="with --warm-start-per-case K > 1: the runners-up taken are at most this fraction "
                    "slower than the case's champion in that archive (widen it, e.g. 0.25, for an archive "
                    "searched on another GPU)")
    ap.add_argument("--warm-start-seeds", choices=("auto", "all", "new"), default="auto",
                    help="with --warm-start: 'auto' leaves out the family's seeds that archive evaluated "
                    "for the same Problem on this same GPU (they lost there; its winners come back as elites "
                    "or champions) and times them all otherwise (another GPU, other shapes); 'all' always "
                    "times them; 'new' never times those it evaluated")
    ap.add_argument("--warm-start-keep-source", action="store_true",
                    help="with --warm-start: keep each genome's own kernel text; by default the genomes of that "
                    "archive that only changed the family's knobs take the family's current text (knobs "
                    "added since switched off), so its later knobs and fixes apply to them")
    ap.add_argument("--compare-dtypes", default="bfloat16,float16,float32",
                    help="dtypes compared against torch (torch.compile compiles once per case)")
    args = ap.parse_args(argv)
    if args.warm_start_per_case < 1:
        ap.error(f"--warm-start-per-case must be 1 or more (got {args.warm_start_per_case}; 1: the champions alone)")
    if not args.warm_start_within >= 0.0:
        ap.error(f"--warm-start-within must be a fraction >= 0 (got {args.warm_start_within})")
    if args.warm_start is not None:  # a clear error now, not after the GPU is set up
        import archive

        try:
            archive.Archive.open_readonly(args.warm_start).close()
        except archive.ArchiveError as e:
            print(f"rmsnorm_h100: --warm-start {args.warm_start}: {e}", file=sys.stderr)
            return 2

    ok, why = gpu_available()
    if not ok:
        print(f"rmsnorm_h100: no usable GPU: {why}. Run this on a machine with an H100/H200.", file=sys.stderr)
        return 2

    import archive
    from evo import Budget, Engine, EngineConfig
    from evo.export import export_module
    from evo.types import Case
    from examples.rmsnorm_problem import make_backward_problem, make_forward_problem

    if args.archive is None:
        args.archive = "runs/rmsnorm_bwd_h100.lmdb" if args.backward else "runs/rmsnorm_h100.lmdb"
    problem = make_backward_problem(quick=args.quick) if args.backward else make_forward_problem(quick=args.quick)
    from fitness.ray import make_executor

    kw = {"ray_address": args.ray_address} if args.executor == "ray" else {}
    evaluator = make_executor(args.executor, problem, **kw)
    llm = None
    if os.environ.get("EVO_LLM_BASE_URL") or os.environ.get("OPENAI_API_KEY") or os.environ.get("ANTHROPIC_API_KEY"):
        from operators import llm as llm_mod

        llm = llm_mod.from_env()
    Path(args.archive).parent.mkdir(parents=True, exist_ok=True)
    arch = archive.Archive(problem, args.archive)
    try:
        engine = Engine(problem, arch, evaluator=evaluator, llm=llm, seed=args.seed,
                        config=EngineConfig(racing=not args.no_racing, warm_start_per_case=args.warm_start_per_case,
                                            warm_start_within=args.warm_start_within,
                                            warm_start_seeds=args.warm_start_seeds,
                                            warm_start_rebase=not args.warm_start_keep_source),
                        warm_start=args.warm_start)
        best = engine.run(Budget(seconds=args.minutes * 60, evaluations=args.evaluations))
        if best is None:
            print("no correct kernel found; see the archive's failure records", file=sys.stderr)
            return 1
        from evo.export import best_per_case

        print(summary(engine, arch, problem, best))
        per_case = best_per_case(arch, problem)
        providers = {} if args.no_compare else torch_providers(backward=args.backward)
        head = f"{'case':34} {'best ms':>9} {'TB/s':>6} {'frac':>6}" + "".join(f" {p:>14}" for p in providers)
        print(head)
        for key, rec in per_case.items():
            case = Case.from_key(key)
            m = rec.evaluation.metrics["cases"][key]
            tbs = problem.bytes_moved(case) / (m["time_ms"] * 1e-3) / 1e12
            row = f"{key:34} {m['time_ms']:9.4f} {tbs:6.2f} {m.get('fraction', float('nan')):6.3f}"
            for fn in providers.values():
                if case.dtype not in args.compare_dtypes.split(","):
                    row += f" {'-':>14}"
                    continue
                try:
                    row += f" {time_torch(fn, case, backward=args.backward):11.4f} ms"
                except Exception as e:  # noqa: BLE001 - shown, never dropped
                    row += f" {'FAILED ' + type(e).__name__:>14}"
            print(row)
        out = export_module(arch, problem, Path(args.archive).with_suffix(".dispatch.py"),
                            extra_code="" if args.backward else TORCH_OP)
        print(f"exported {len(per_case)} genomes to {out}")
        return 0
    finally:
        arch.close()
        evaluator.close()


if __name__ == "__main__":
    sys.exit(main())
