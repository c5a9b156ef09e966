"""Time one exported dispatch module's genomes built and called in several ways, side by side.

Written to find why a dispatch module (``evo.export``) can be slower than the Evaluator timed
the same genome on the same case. For every requested case the genome the module selects is
timed, in one process and with the peers benchmark's harness (:func:`fitness.time_calls` over
L2-cold rotated input sets), as:

``module``
    ``module.run`` on torch tensors, exactly as ``rmsnorm_peers.py`` calls it.
``module-cupy``
    ``module.run`` on cupy-allocated arrays (allocator and alignment of the buffers).
``nvcc``
    the module's launch with the kernel compiled as the gate compiles it
    (:func:`fitness.compile_source`, nvcc, the Problem's target) and loaded from the cubin.
``nvrtc``
    the same with the gate's NVRTC backend (``-arch=sm_90a``, no forced ftz).
``module`` again (``module-2``)
    so that order effects show.

``--rebuild OUT.py`` writes the module's genomes exported again with this checkout's
:func:`evo.export.export_module` (cubins built as the gate builds them), so a table timed
with an older module can be re-timed as today's export would run it.

    python benchmarks/rmsnorm_export_check.py --module benchmarks/results/rmsnorm-run25-h100.dispatch.py.xz \\
        --cases float16:16384x131072,float32:32768x256 --out $OUT/export_check.md
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_cases(text: str) -> list[tuple[str, int, int]]:
    """``"float16:16384x131072,float32:32768x256"`` -> ``[("float16", 16384, 131072), ...]``."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            dtype, mn = part.split(":")
            m, n = (int(v) for v in mn.lower().split("x"))
        except ValueError:
            raise SystemExit(f"bad case {part!r}: write DTYPE:MxN, e.g. float16:16384x131072") from None
        out.append((dtype, m, n))
    return out


def gate_kernel(g: dict[str, Any], backend: str, target: str) -> Any:
    """The genome compiled as the gate compiles it, loaded from its cubin (a cupy Function)."""
    import cupy

    from fitness import compile_source

    r = compile_source(g["source"], entry=g["entry"], defines=g["defines"], target=target, backend=backend)
    if not r.ok:
        raise RuntimeError(f"{backend} compile failed: {r.reason}\n{r.log[-2000:]}")
    mod = cupy.cuda.function.Module()
    mod.load(bytes(r.cubin))
    return _Loaded(mod, mod.get_function(g["entry"]))


class _Loaded:
    """A loaded cupy Function that a dispatch module of any version can call like its own kernel."""

    def __init__(self, module: Any, fn: Any) -> None:
        self.module, self.kernel = module, fn  # the module must outlive the function

    def __call__(self, *args: Any, **kw: Any) -> Any:
        return self.kernel(*args, **kw)

    @property
    def ptr(self) -> int:
        return int(self.kernel.ptr)

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        import cupy

        return int(cupy.cuda.driver.funcGetAttribute(8, self.kernel.ptr))

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        import cupy

        cupy.cuda.driver.funcSetAttribute(self.kernel.ptr, 8, int(value))

NAMES = ("module", "module-cupy", "nvcc", "nvrtc", "module-2")


def time_case(module: Any, dtype: str, m: int, n: int, *, target: str, rounds: int,
              names: tuple[str, ...] = NAMES, warmup_ms: float = 10.0) -> list[str]:
    """Table rows (one per variant in ``names``) for one case."""
    import cupy
    import torch

    from benchmarks.rmsnorm_peers import providers
    from fitness import rotation_sets, time_calls

    evo_call = providers(module)["evo (ours)"]
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    shape = {"M": m, "N": n}
    g = module.select(shape, dtype)
    elem = torch.finfo(tdt[dtype]).bits // 8
    free = torch.cuda.mem_get_info()[0]
    per_set = 2 * m * n * elem
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sets = rotation_sets(l2, per_set, most=16, fit=int(0.2 * free // per_set))
    xs = [torch.randn(m, n, device="cuda", dtype=tdt[dtype]) for _ in range(sets)]
    w = torch.randn(n, device="cuda", dtype=torch.float32)
    ys = [torch.empty_like(x) for x in xs]
    cxs = [cupy.array(cupy.asarray(x), copy=True) for x in xs]  # cupy-allocated copies
    cys = [cupy.empty_like(x) for x in cxs]
    cw = cupy.asarray(w)
    kernels: dict[str, Any] = {}
    for b in ("nvcc", "nvrtc"):
        if b in names:
            try:
                kernels[b] = gate_kernel(g, b, target)
            except RuntimeError as e:  # shown in the table, the other variants still timed
                kernels[b] = None
                print(f"{b} build of {g['id'][:8]} failed: {str(e)[:300]}", file=sys.stderr)
    own = module._kernel

    def with_module(x: Any, y: Any) -> Callable[[], None]:
        def call() -> None:
            with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                module.run(x, cw, y, shape=shape, dtype=dtype)
        return call

    def variant(name: str) -> list[Callable[[], None]]:
        """The variant's calls; the module's kernel is swapped for the variant's build until restored."""
        kern = kernels.get(name)
        module._kernel = (lambda _g: kern) if kern is not None else own
        module._dyn.clear()  # a new function needs its own shared-memory opt-in
        if name == "module-cupy":
            return [with_module(x, y) for x, y in zip(cxs, cys, strict=True)]
        if name.startswith("module"):
            return [evo_call(x, w) for x in xs]
        return [with_module(cupy.asarray(x), cupy.asarray(y)) for x, y in zip(xs, ys, strict=True)]

    res: dict[str, list[str]] = {k: [] for k in names}
    ref = torch.nn.functional.rms_norm(xs[0][:64].float(), (n,), w, eps=1e-6)  # rows enough to check a build
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            try:
                if name in kernels and kernels[name] is None:
                    raise RuntimeError(f"the {name} build failed")
                calls = variant(name)
                calls[0]()
                torch.cuda.synchronize()
                if name in kernels:
                    err = float((ys[0][:64].float() - ref).abs().max())
                    if err > 0.05 * float(ref.abs().max()):
                        raise RuntimeError(f"wrong result (max abs error {err:.3g})")
                t = time_calls(calls, warmup_ms=warmup_ms)
                res[name].append(f"{t.time_ms:.4f} (±{100 * t.spread:.1f}%)")
            except Exception as e:  # noqa: BLE001 - shown in the table
                res[name].append(f"FAILED {type(e).__name__}: {str(e)[:80]}")
            finally:
                module._kernel = own
                module._dyn.clear()
    return [f"| {dtype} {m}x{n} | {g['id'][:8]} | {name} | " + " | ".join(res[name]) + " |" for name in names]


def rebuild(module: Any, path: Path) -> Path:
    """Export ``module``'s genomes again with this checkout's exporter (forward RMSNorm Problem)."""
    from evo.export import export_module
    from evo.types import Evaluation, Genome, Record, Status
    from examples.rmsnorm_problem import make_forward_problem

    recs = []
    for g in module.GENOMES:
        genome = Genome(g["source"], dict(g["params"]), entry=g["entry"], language=g.get("language", "cuda"))
        if genome.id != g["id"]:
            raise SystemExit(f"--rebuild: genome of {g['case']} has id {genome.id[:12]}, the module says {g['id'][:12]}")
        m = {"time_ms": g["time_ms"], "fraction": g.get("fraction")}
        recs.append(Record(genome, Evaluation(Status.OK, fitness=1.0, metrics={"cases": {g["case"]: m}})))
    return export_module(recs, make_forward_problem(), path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", required=True, help="dispatch module (or its .xz)")
    ap.add_argument("--cases", default="all", help="comma list of DTYPE:MxN, or 'all' (the module's cases)")
    ap.add_argument("--rebuild", type=Path, help="write the module's genomes exported again to this .py and stop")
    ap.add_argument("--target", default="sm_90a", help="the gate's target (the Problem's)")
    ap.add_argument("--variants", default=",".join(NAMES), help=f"comma list of {', '.join(NAMES)}")
    ap.add_argument("--warmup-ms", type=float, default=10.0, help="warm-up before each variant's timing (ms)")
    ap.add_argument("--rounds", type=int, default=2, help="times each variant is timed, in rotating order")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    names = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    if not names or set(names) - set(NAMES):
        raise SystemExit(f"--variants: choose from {', '.join(NAMES)} (got {args.variants!r})")
    from benchmarks.rmsnorm_peers import import_dispatch

    module = import_dispatch(args.module)
    if args.rebuild is not None:
        print(f"rebuilt {len(module.GENOMES)} genomes into {rebuild(module, args.rebuild)}")
        return 0
    import cupy
    import torch

    props = torch.cuda.get_device_properties(0)
    lines = [f"# export check: {Path(args.module).name} on {props.name}", "",
             "ms per call (spread) by variant; rounds in rotating order.", "",
             "| case | genome | variant | " + " | ".join(f"round {i + 1}" for i in range(args.rounds)) + " |",
             "|---|---|---|" + "---|" * args.rounds]
    print("\n".join(lines), flush=True)
    cases = parse_cases(args.cases) if args.cases != "all" else [
        (g["dtype"], g["shape"]["M"], g["shape"]["N"]) for g in module.GENOMES]
    for dtype, m, n in cases:
        rows = time_case(module, dtype, m, n, target=args.target, rounds=args.rounds, names=names,
                         warmup_ms=args.warmup_ms)
        lines += rows
        print("\n".join(rows), flush=True)
        gc.collect()  # the case's buffers and modules, before the next case allocates (and captures)
        cupy.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
