"""Do STAGE 3 cluster grids ask for more clusters than fit at once, and does capping them pay?

Usage (on a GPU): ``python3 benchmarks/rmsnorm_occupancy.py [time limit in s] > occ.jsonl``.

For STAGE 3 cluster genomes at long rows, with PERSISTENT 0-4 and WSMEM 0/1: the Problem's launch,
cuOccupancyMaxActiveClusters for it, and the time of the Problem's grid against the same kernel with
its grid capped at the clusters that fit at once (the kernel strides over tiles by gridDim, so any grid
is correct; y of both grids is compared bit for bit).
"""
import ctypes
import json
import sys
import time

import cupy as cp
import numpy as np

from evo.types import Case
from examples.rmsnorm_problem import forward_source, fwd_launch
from fitness._compile import compile_source

lib = ctypes.CDLL("libcuda.so.1")


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint),
                ("bx", ctypes.c_uint), ("by", ctypes.c_uint), ("bz", ctypes.c_uint),
                ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("nattrs", ctypes.c_uint)]


def max_active_clusters(fn_ptr: int, grid: int, block: int, smem: int) -> int | str:
    """cuOccupancyMaxActiveClusters for a 1-D launch of ``fn_ptr`` (an error code as text on failure)."""
    cfg = LaunchConfig(grid, 1, 1, block, 1, 1, smem, None, None, 0)
    n = ctypes.c_int(-1)
    rc = lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), ctypes.c_void_p(fn_ptr), ctypes.byref(cfg))
    return n.value if rc == 0 else f"rc={rc}"


def blocks_per_sm(fn_ptr: int, block: int, smem: int) -> int | str:
    """CTAs of ``fn_ptr`` resident per SM at this block size and dynamic shared memory."""
    n = ctypes.c_int(-1)
    rc = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), ctypes.c_void_p(fn_ptr), block,
                                                          ctypes.c_size_t(smem))
    return n.value if rc == 0 else f"rc={rc}"


def timed(fn, grid: int, block: int, smem: int, args: tuple) -> float:
    """Mean ms of 10 back-to-back launches after 3 warm-ups (CUDA events, no L2 flush)."""
    for _ in range(3):
        fn((grid, 1, 1), (block, 1, 1), args, shared_mem=smem)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    for _ in range(10):
        fn((grid, 1, 1), (block, 1, 1), args, shared_mem=smem)
    e1.record()
    e1.synchronize()
    return cp.cuda.get_elapsed_time(e0, e1) / 10


BASE = {"THREADS": 128, "TPR": 128, "VEC_BYTES": 16, "LOAD_HINT": 3, "STORE_HINT": 1, "STAGE": 3,
        "MAX_VECS": 4, "CLUSTER": 16, "PERSISTENT": 0, "RSQRT_APPROX": 1, "PIPE": 1, "TILE_ROWS": 2,
        "OCCUPANCY": 0, "WSMEM": 0, "PREFETCH": 0}
SHAPES = [(32768, 65536), (16384, 131072), (8192, 262144)]


def variants() -> list[dict[str, int]]:
    """The STAGE 3 genomes compared: cluster size, threads, PERSISTENT 0-4, WSMEM, PIPE."""
    out = []
    for cl, th, tr in [(16, 128, 2), (8, 128, 2), (16, 256, 1)]:
        for k in (0, 1, 2, 3, 4):
            for ws in (0, 1):
                for pipe in ((1,) if k == 0 else (1, 2)):
                    if k == 0 and ws:
                        continue
                    out.append({**BASE, "CLUSTER": cl, "THREADS": th, "TPR": th, "TILE_ROWS": tr,
                                "PERSISTENT": k, "WSMEM": ws, "PIPE": pipe})
    return out


def main() -> None:
    """Time each variant at its Problem grid and capped at the clusters that fit; one JSON line each."""
    limit = float(sys.argv[1]) if len(sys.argv) > 1 else 150.0
    t0 = time.monotonic()
    src = forward_source()
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"# {name}, {sms} SMs", flush=True)
    w = {n: cp.random.standard_normal(n, dtype=cp.float32) for _, n in SHAPES}
    xs = {(m, n): (cp.random.standard_normal((m, n), dtype=cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
          for m, n in SHAPES}  # bf16 bits
    src_c = cp.empty(1 << 30, dtype=cp.uint8)
    dst_c = cp.empty_like(src_c)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(3):
        dst_c[...] = src_c
    e0.record()
    for _ in range(10):
        dst_c[...] = src_c
    e1.record()
    e1.synchronize()
    copy_gbs = 2 * (1 << 30) / (cp.cuda.get_elapsed_time(e0, e1) / 10 * 1e-3) / 1e9
    print(f"# copy {copy_gbs:.0f} GB/s (1 GiB, cupy elementwise copy)", flush=True)
    del src_c, dst_c
    from concurrent.futures import ThreadPoolExecutor

    vs = variants()
    with ThreadPoolExecutor(16) as pool:
        built = list(pool.map(lambda v: compile_source(src, entry="rmsnorm_fwd",
                                                       defines=[f"-D{k}={val}" for k, val in v.items()]), vs))
    print(f"# compiled {len(vs)} in {time.monotonic() - t0:.0f} s", flush=True)
    for v, res in zip(vs, built, strict=True):
        if time.monotonic() - t0 > limit:
            print("# time limit", flush=True)
            break
        if not res.ok:
            print(json.dumps({"params": v, "error": res.log[-300:]}), flush=True)
            continue
        mod = cp.cuda.function.Module()
        mod.load(res.cubin)
        fn = mod.get_function("rmsnorm_fwd")
        if v["CLUSTER"] > 8:
            cp.cuda.driver.funcSetAttribute(fn.ptr, 14, 1)
        for m, n in SHAPES:
            case = Case({"M": m, "N": n}, "bfloat16")
            la = fwd_launch(v, case, {"sm_count": sms})
            if la.shared_mem == 0:
                continue  # falls back to STAGE 2: not this experiment
            cp.cuda.driver.funcSetAttribute(fn.ptr, 8, la.shared_mem)
            grid, block, smem, cl = la.grid[0], la.block[0], la.shared_mem, v["CLUSTER"]
            mac = max_active_clusters(fn.ptr, grid, block, smem)
            bps = blocks_per_sm(fn.ptr, block, smem)
            x = xs[(m, n)]
            y1 = cp.empty_like(x)
            y2 = cp.empty_like(x)
            tail = (np.int32(m), np.int32(n), np.float32(1e-6), np.int32(2))
            t_prob = timed(fn, grid, block, smem, (x, w[n], y1, *tail))
            capped = min(grid, mac * cl) if isinstance(mac, int) and mac > 0 else grid
            t_cap = timed(fn, capped, block, smem, (x, w[n], y2, *tail)) if capped != grid else t_prob
            # y2 is written only by a capped launch; where the grid already fits there is nothing to compare
            same = bool(cp.array_equal(y1, y2)) if capped != grid else None
            gbs = 2 * m * n * 2 / (t_prob * 1e-3) / 1e9
            gbs_c = 2 * m * n * 2 / (t_cap * 1e-3) / 1e9
            print(json.dumps({"N": n, "CL": cl, "TH": block, "K": v["PERSISTENT"], "WS": v["WSMEM"],
                              "PIPE": v["PIPE"], "smem": smem, "grid_clusters": grid // cl,
                              "max_active_clusters": mac, "blocks_per_sm": bps,
                              "ms": round(t_prob, 4), "GBs": round(gbs), "ms_capped": round(t_cap, 4),
                              "GBs_capped": round(gbs_c), "same_y": same}), flush=True)
            del y1, y2
        mod = None


if __name__ == "__main__":
    main()
