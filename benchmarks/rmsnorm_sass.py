"""Static size of the RMSNorm forward genomes' loops: SASS instructions per stored vector, no GPU.

Compiles genomes of the forward kernel family (``nvcc 13 -arch sm_90a``, the Compile stage's
command line), disassembles the cubin with ``cuobjdump -sass`` and finds its loops (a backward
branch and its target). For every loop that stores y it reports the instructions, loads,
stores and shuffles it holds and the instructions per store (one store is one vector of one
row), and the dtype whose path it is (bf16 and fp16 packs differ; neither: fp32); by default
only loops that also reduce a row (shuffles in them), which leaves out the per-vector loops of
the STAGE 2 paths that other stages fall back to (``--all-loops`` shows them). With
``--source OLD.cu`` the same genomes are compiled from another kernel source as well and shown
beside, so a change to the kernel can be sized on this machine before the GPU times it.

The count is static: a loop's instructions, not the instructions a launch executes (a loop the
launch does not enter, or leaves early, counts the same). Nsight Compute's executed
instructions on the device are the measurement; this is the first look.

    python benchmarks/rmsnorm_sass.py --seeds 25,26,27,28
    python benchmarks/rmsnorm_sass.py --seeds 7 --source /tmp/rmsnorm_fwd_old.cu --out sass.md
    python benchmarks/rmsnorm_sass.py --params '{"STAGE": 4, "THREADS": 32, "TPR": 32, "MAX_VECS": 1}'

``--params`` takes a JSON object of knobs over the first seed's (or a list of them), checked as
``rmsnorm_fixed_cost.py --params`` checks its one.

``cuobjdump`` and the ``nvdisasm`` it runs are looked up on PATH, then in the
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` wheels (dev dependencies), then in ``triton``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "benchmarks"))

from rmsnorm_fixed_cost import genome_from_params  # noqa: E402

from evo.types import Genome  # noqa: E402
from examples.rmsnorm_problem import FWD_ENTRY, FWD_SEED_PARAMS, forward_source, make_forward_problem  # noqa: E402
from fitness._compile import compile_source  # noqa: E402

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


@dataclass(frozen=True)
class Instr:
    """One SASS instruction: its address, opcode (with modifiers) and operands."""

    addr: int
    op: str
    args: str


@dataclass(frozen=True)
class Loop:
    """A loop of the SASS (from a backward branch's target to the branch) and what it holds."""

    start: int
    end: int
    instructions: int
    loads: int
    stores: int
    shuffles: int
    dtype: str

    @property
    def per_store(self) -> float:
        """Instructions per stored vector (0 when the loop stores nothing)."""
        return self.instructions / self.stores if self.stores else 0.0


def find_tool(name: str) -> str | None:
    """A CUDA binary tool (``cuobjdump``, ``nvdisasm``): PATH, NVIDIA's wheels, then triton's copy."""
    exe = shutil.which(name)
    if exe:
        return exe
    places: list[Path] = []
    try:
        import nvidia  # the namespace package of NVIDIA's CUDA wheels (nvidia-cuda-cuobjdump, -nvdisasm)

        for base in getattr(nvidia, "__path__", []):
            places += sorted(Path(base).glob(f"*/bin/{name}"))
    except ImportError:
        pass
    try:
        import triton

        places += sorted(Path(triton.__file__).parent.glob(f"backends/nvidia/bin/{name}"))
    except ImportError:
        pass
    return next((str(p) for p in places if p.is_file()), None)


def disassemble(cubin: bytes, cuobjdump: str, nvdisasm: str | None = None) -> list[Instr]:
    """The cubin's SASS as instructions, in address order (cuobjdump runs ``nvdisasm``)."""
    env = dict(os.environ)
    if nvdisasm:
        env["NVDISASM_PATH"] = str(Path(nvdisasm).parent)
        env["PATH"] = os.pathsep.join([str(Path(nvdisasm).parent), env.get("PATH", "")])
    with tempfile.TemporaryDirectory(prefix="evo-sass-") as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        r = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass failed: {(r.stderr or r.stdout).strip()[-400:]}")
    return parse_sass(r.stdout)


def parse_sass(text: str) -> list[Instr]:
    """Instructions of ``cuobjdump -sass`` output (the encoding comments are skipped)."""
    found = []
    for m in _LINE.finditer(text):
        found.append(Instr(int(m.group(1), 16), m.group(2), m.group(3).strip()))
    return found


def _dtype(ops: Sequence[str]) -> str:
    if any(op.startswith("F2FP.BF16") for op in ops):
        return "bf16"
    if any(op.startswith("F2FP.F16") for op in ops):
        return "fp16"
    return "fp32"


def loops(instrs: Sequence[Instr]) -> list[Loop]:
    """Every loop (a BRA to a lower address) that stores to global memory, in address order."""
    out = []
    for ins in instrs:
        if not ins.op.startswith("BRA"):
            continue
        m = re.search(r"0x([0-9a-f]+)", ins.args)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= ins.addr:
            continue
        body = [i for i in instrs if target <= i.addr <= ins.addr]
        ops = [i.op for i in body]
        stores = sum(op.startswith("STG") for op in ops)
        if not stores:
            continue
        out.append(Loop(target, ins.addr, len(body), sum(op.startswith("LDG") for op in ops), stores,
                        sum(op.startswith("SHFL") for op in ops), _dtype(ops)))
    return sorted(out, key=lambda lp: lp.start)


def measure(source: str, params: Mapping[str, Any], cuobjdump: str, nvdisasm: str | None = None) -> dict[str, Any]:
    """Registers, spill bytes and the storing loops of one genome compiled from ``source``."""
    genome = Genome(source, dict(params), entry=FWD_ENTRY)
    res = compile_source(source, entry=FWD_ENTRY, defines=genome.defines())
    if not res.ok:
        raise SystemExit(f"compile failed for {dict(params)}: {res.reason}")
    report = res.resources or {}
    return {"registers": report.get("registers"), "spill_bytes": report.get("spill_store_bytes"),
            "loops": loops(disassemble(res.cubin, cuobjdump, nvdisasm))}


def _label(p: Mapping[str, Any]) -> str:
    keys = ("STAGE", "THREADS", "TPR", "MAX_VECS", "TILE_ROWS", "VEC_BYTES", "LOAD_HINT", "OCCUPANCY")
    return " ".join(f"{k[:2]}{p[k]}" for k in keys)


def _loops_cell(loops_: Sequence[Loop], every: bool) -> str:
    shown = [lp for lp in loops_ if every or lp.shuffles]
    return "; ".join(f"{lp.dtype} {lp.instructions} ({lp.stores} st, {lp.per_store:.1f}/st)" for lp in shown)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="", help="comma-separated indices into FWD_SEED_PARAMS")
    ap.add_argument("--params", default="", help="a JSON object (or list of them): knobs over the first seed's")
    ap.add_argument("--source", default="", help="another kernel source to compile the same genomes from, shown beside")
    ap.add_argument("--all-loops", action="store_true",
                    help="show every storing loop (default: those that also reduce a row: shuffles in them)")
    ap.add_argument("--out", default="", help="also write the Markdown table here")
    args = ap.parse_args(argv)
    variants: list[dict[str, Any]] = []
    for tok in filter(None, (s.strip() for s in args.seeds.split(","))):
        if not tok.isdigit() or int(tok) >= len(FWD_SEED_PARAMS):
            raise SystemExit(f"--seeds: {tok!r} is not a seed index (0..{len(FWD_SEED_PARAMS) - 1})")
        variants.append(dict(FWD_SEED_PARAMS[int(tok)]))
    if args.params:
        try:
            given = json.loads(args.params)
        except json.JSONDecodeError as e:
            raise SystemExit(f"--params: not JSON ({e})") from e
        problem = make_forward_problem()
        for p in given if isinstance(given, list) else [given]:  # each checked as rmsnorm_fixed_cost checks it
            variants.append(genome_from_params(problem, json.dumps(p))["params"])
    if not variants:
        raise SystemExit("name genomes with --seeds and/or --params")
    cuobjdump, nvdisasm = find_tool("cuobjdump"), find_tool("nvdisasm")
    if cuobjdump is None or nvdisasm is None:
        raise SystemExit("cuobjdump and nvdisasm not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm "
                         "(both in the dev extra) or put the CUDA toolkit's bin/ on PATH")
    other = Path(args.source).read_text() if args.source else None
    head = "| genome | registers / spill B | storing loops: dtype instructions (stores, per store) |"
    if other is not None:
        head += " --source: registers / spill B | --source: storing loops |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for i, p in enumerate(variants, 1):
        print(f"[{i}/{len(variants)}] {_label(p)}", file=sys.stderr, flush=True)
        new = measure(forward_source(), p, cuobjdump, nvdisasm)
        row = f"| {_label(p)} | {new['registers']} / {new['spill_bytes']} | {_loops_cell(new['loops'], args.all_loops)} |"
        if other is not None:
            old = measure(other, p, cuobjdump, nvdisasm)
            row += f" {old['registers']} / {old['spill_bytes']} | {_loops_cell(old['loops'], args.all_loops)} |"
        rows.append(row)
    table = "\n".join(rows)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
