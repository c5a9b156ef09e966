"""CPU emulation of the forward kernel's work split (head / vectors / tail, cluster ranks, rows).

A straight port of the index arithmetic in examples/kernels/rmsnorm_fwd.cu: every column of
every row must be read for the sum and written exactly once, for every alignment.
"""

from __future__ import annotations

import numpy as np
import pytest

from evo.types import Case
from examples.rmsnorm_problem import EXCHANGE_SLOTS, fwd_launch, pipe_weight_bytes, rmsnorm_numpy


def emulate(x: np.ndarray, w: np.ndarray, p: dict, esz: int, x_off: int = 0, y_off: int = 0,
            eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """Run the kernel's index logic; return (y, write counts). x_off/y_off: base byte offsets mod 16."""
    m, n = x.shape
    vb, tpr, threads, cluster = p["VEC_BYTES"], p["TPR"], p["THREADS"], p["CLUSTER"]
    e = vb // esz
    rpc = threads // tpr
    launch = fwd_launch(p, Case({"M": m, "N": n}, {4: "float32", 2: "bfloat16"}[esz]), None)
    grid = launch.grid[0]
    assert launch.block[0] == threads and grid % cluster == 0
    groups = grid // cluster
    y = np.full((m, n), np.nan)
    writes = np.zeros((m, n), dtype=int)
    for g in range(groups):
        row0 = g * rpc
        while row0 < m:
            for r in range(rpc):
                row = row0 + r
                if row >= m:
                    continue
                ax = (x_off + row * n * esz) % vb
                ay = (y_off + row * n * esz) % vb
                if ax != ay or ax % esz:  # no vectors: the whole row is "tail"
                    head, nvec = 0, 0
                else:
                    head = (vb - ax) // esz if ax else 0
                    head = min(head, n)
                    nvec = (n - head) // e
                nscalar = n - nvec * e
                vpc = -(-nvec // cluster)
                acc_cols: list[int] = []
                for rank in range(cluster):
                    v0 = rank * vpc
                    nv_cta = min(max(nvec - v0, 0), vpc)
                    for t in range(tpr):
                        nmine = (nv_cta - 1 - t) // tpr + 1 if t < nv_cta else 0
                        for k in range(nmine):
                            c = head + (v0 + t + k * tpr) * e
                            acc_cols.extend(range(c, c + e))
                        s = rank + cluster * t
                        while s < nscalar:
                            acc_cols.append(s if s < head else s + nvec * e)
                            s += cluster * tpr
                cols = np.array(acc_cols, dtype=int)
                xs = x[row].astype(np.float64)
                rstd = 1.0 / np.sqrt((xs[cols] ** 2).sum() / n + eps)
                y[row, cols] = xs[cols] * rstd * w[cols]
                np.add.at(writes[row], cols, 1)
            row0 += groups * rpc
    return y, writes


def check_every_element_once(emulator, p: dict, esz: int, offs: tuple[int, int], shapes, seed: int) -> None:
    """Each element read for its row's sum and written once, with the float64 RMSNorm's value."""
    rng = np.random.default_rng(seed)
    for m, n in shapes:
        x = rng.standard_normal((m, n))
        w = rng.standard_normal(n)
        y, writes = emulator(x, w, p, esz, *offs)
        assert (writes == 1).all(), f"shape {m}x{n}: columns written {np.unique(writes)} times"
        np.testing.assert_allclose(y, rmsnorm_numpy(x, w), rtol=1e-12, atol=1e-12)


CONFIGS = [
    {"THREADS": 128, "TPR": 32, "VEC_BYTES": 16, "CLUSTER": 1, "PERSISTENT": 0, "STAGE": 0},
    {"THREADS": 128, "TPR": 4, "VEC_BYTES": 8, "CLUSTER": 1, "PERSISTENT": 1, "STAGE": 2},
    {"THREADS": 64, "TPR": 64, "VEC_BYTES": 16, "CLUSTER": 4, "PERSISTENT": 0, "STAGE": 1},
    {"THREADS": 256, "TPR": 256, "VEC_BYTES": 4, "CLUSTER": 16, "PERSISTENT": 2, "STAGE": 0},
    {"THREADS": 64, "TPR": 16, "VEC_BYTES": 16, "CLUSTER": 1, "PERSISTENT": 8, "STAGE": 1},
]
SHAPES = [(1, 1), (3, 7), (2, 8), (5, 37), (17, 100), (4, 1031)]


@pytest.mark.parametrize("p", CONFIGS, ids=lambda p: "-".join(f"{v}" for v in p.values()))
@pytest.mark.parametrize("esz", [2, 4])
@pytest.mark.parametrize("offs", [(0, 0), (4, 4), (2, 6)])
def test_every_element_once(p: dict, esz: int, offs: tuple[int, int]) -> None:
    if esz == 4 and offs[0] % 4:
        pytest.skip("a float32 buffer is always 4-byte aligned")
    check_every_element_once(emulate, p, esz, offs, SHAPES, seed=0)



def emulate_pipe(x: np.ndarray, w: np.ndarray, p: dict, esz: int, x_off: int = 0, y_off: int = 0,
                 eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """STAGE 3: the bulk copies into shared memory (byte offsets), then the reads from it.

    With WSMEM the weight slice is bulk-copied to the front of shared memory too, and the
    normalisation reads the weights from there (also by byte offset). With a cluster, each
    rank's partial sum of a row goes into slot ``row * CLUSTER + rank`` of every rank's
    exchange buffer (``EXCHANGE_SLOTS // CLUSTER`` rows at most), which must be written once per tile.
    """
    m, n = x.shape
    vb, tpr, threads, cluster, pipe = p["VEC_BYTES"], p["TPR"], p["THREADS"], p["CLUSTER"], p["PIPE"]
    case = Case({"M": m, "N": n}, {4: "float32", 2: "bfloat16"}[esz])
    launch = fwd_launch(p, case, None)
    row_bytes = n * esz
    chunks = row_bytes // 16
    cpc = -(-chunks // cluster)
    slice_b = cpc * 16
    wsl = pipe_weight_bytes(p, case)
    assert wsl == (cpc * 64 // esz if p.get("WSMEM") else 0)
    xrows = p["TILE_ROWS"] if cluster == 1 else min(p["TILE_ROWS"], EXCHANGE_SLOTS // cluster)
    rows_pt = min((launch.shared_mem - wsl) // (pipe * slice_b), xrows) if slice_b else 0
    if (x_off | y_off) % 16 or row_bytes % 16 or rows_pt < 1:
        return emulate(x, w, dict(p, STAGE=2), esz, x_off, y_off, eps)  # the kernel's fallback
    assert launch.shared_mem >= wsl + pipe * rows_pt * slice_b
    flat = x.reshape(-1)  # element i lies at byte i * esz of the buffer
    wflat = w.astype(np.float64)  # float32 weight i lies at byte 4 * i
    tiles = -(-m // rows_pt)
    groups = launch.grid[0] // cluster
    y = np.full((m, n), np.nan)
    writes = np.zeros((m, n), dtype=int)
    for g in range(groups):
        for it, tile in enumerate(range(g, tiles, groups)):
            s = it % pipe
            row0 = tile * rows_pt
            nrows = min(rows_pt, m - row0)
            slots = np.full((cluster, xrows * cluster), np.nan)  # each rank's exchange buffer
            slices = {}
            for rank in range(cluster):
                c0 = rank * cpc
                mine = min(max(chunks - c0, 0), cpc)
                smem = np.full((wsl + pipe * rows_pt * slice_b) // esz, np.nan)
                base = wsl + s * rows_pt * slice_b
                wsm = np.full(wsl // 4, np.nan)  # the weight slice, float32 units
                if wsl:
                    src, nbytes = c0 * 64 // esz, mine * 64 // esz
                    assert src % 16 == 0 and nbytes % 16 == 0 and nbytes <= wsl
                    wsm[:nbytes // 4] = wflat[src // 4:(src + nbytes) // 4]
                copies = ([(row0 * row_bytes + c0 * 16, base, nrows * mine * 16)] if cluster == 1 else
                          [((row0 + i) * row_bytes + c0 * 16, base + i * slice_b, mine * 16) for i in range(nrows)])
                for src, dst, nbytes in copies:
                    assert src % 16 == 0 and dst % 16 == 0 and nbytes % 16 == 0 and dst + nbytes <= len(smem) * esz
                    smem[dst // esz:(dst + nbytes) // esz] = flat[src // esz:(src + nbytes) // esz]
                nv = mine * 16 // vb
                e = vb // esz
                # with a cluster the kernel normalises WROWS rows at a time (each vector's weights
                # loaded once for them): rows r0 .. r0 + nr - 1 at offsets r0 * slice + q * slice
                wrows = 1 if cluster == 1 or p.get("WSMEM") else min(xrows, 4)
                order = [r0 + q for r0 in range(0, nrows, wrows) for q in range(min(wrows, nrows - r0))]
                assert order == list(range(nrows))
                for rr in order:
                    vals, cols, ws = [], [], []
                    for t in range(tpr):
                        nmine = (nv - 1 - t) // tpr + 1 if t < nv else 0
                        for k in range(nmine):
                            off = (base + rr * slice_b + (k * tpr + t) * vb) // esz
                            vals.extend(smem[off:off + e])
                            c = c0 * 16 // esz + (k * tpr + t) * e
                            cols.extend(range(c, c + e))
                            if wsl:
                                wo = (k * tpr + t) * e * 4  # byte offset of the weights in the slice
                                assert wo % (16 if e % 4 == 0 else 4) == 0 and wo + 4 * e <= wsl
                                ws.extend(wsm[wo // 4:wo // 4 + e])
                    ws_row = np.array(ws) if wsl else None
                    slices[(rank, rr)] = (np.array(vals), np.array(cols, dtype=int), ws_row)
                    slot = rr * cluster + rank
                    assert slot < xrows * cluster and np.isnan(slots[:, slot]).all()
                    slots[:, slot] = (np.array(vals) ** 2).sum()  # st.async to every rank
            assert not np.isnan(slots[:, :nrows * cluster]).any()  # the tile's expected bytes arrive
            for (rank, rr), (vals, cols, ws_row) in slices.items():
                rstd = 1.0 / np.sqrt(slots[rank, rr * cluster:(rr + 1) * cluster].sum() / n + eps)
                y[row0 + rr, cols] = vals * rstd * (w[cols] if ws_row is None else ws_row)
                np.add.at(writes[row0 + rr], cols, 1)
    assert threads % tpr == 0
    return y, writes


PIPE_CONFIGS = [
    {"THREADS": 128, "TPR": 32, "VEC_BYTES": 16, "CLUSTER": 1, "PERSISTENT": 4, "STAGE": 3, "PIPE": 3, "TILE_ROWS": 4},
    {"THREADS": 64, "TPR": 8, "VEC_BYTES": 8, "CLUSTER": 1, "PERSISTENT": 0, "STAGE": 3, "PIPE": 2, "TILE_ROWS": 16},
    {"THREADS": 64, "TPR": 64, "VEC_BYTES": 16, "CLUSTER": 4, "PERSISTENT": 1, "STAGE": 3, "PIPE": 2, "TILE_ROWS": 2},
    {"THREADS": 32, "TPR": 32, "VEC_BYTES": 4, "CLUSTER": 16, "PERSISTENT": 2, "STAGE": 3, "PIPE": 4, "TILE_ROWS": 1},
    # more rows per tile than a cluster's exchange holds (EXCHANGE_SLOTS // CLUSTER = 4)
    {"THREADS": 32, "TPR": 32, "VEC_BYTES": 16, "CLUSTER": 16, "PERSISTENT": 0, "STAGE": 3, "PIPE": 1, "TILE_ROWS": 8},
    # tiles of up to 8 rows with a cluster: two chunks of four rows normalised together
    {"THREADS": 32, "TPR": 32, "VEC_BYTES": 16, "CLUSTER": 2, "PERSISTENT": 0, "STAGE": 3, "PIPE": 2, "TILE_ROWS": 8},
    {"THREADS": 64, "TPR": 64, "VEC_BYTES": 8, "CLUSTER": 4, "PERSISTENT": 2, "STAGE": 3, "PIPE": 1, "TILE_ROWS": 16},
    # the weight slice in shared memory, with and without a cluster
    {"THREADS": 64, "TPR": 64, "VEC_BYTES": 16, "CLUSTER": 4, "PERSISTENT": 1, "STAGE": 3, "PIPE": 2, "TILE_ROWS": 2,
     "WSMEM": 1},
    {"THREADS": 64, "TPR": 16, "VEC_BYTES": 8, "CLUSTER": 1, "PERSISTENT": 0, "STAGE": 3, "PIPE": 3, "TILE_ROWS": 4,
     "WSMEM": 1},
    {"THREADS": 32, "TPR": 32, "VEC_BYTES": 4, "CLUSTER": 8, "PERSISTENT": 2, "STAGE": 3, "PIPE": 1, "TILE_ROWS": 2,
     "WSMEM": 1},
]
PIPE_SHAPES = [(1, 8), (3, 16), (5, 40), (9, 256), (2, 1000), (4, 1032), (7, 24)]


@pytest.mark.parametrize("p", PIPE_CONFIGS, ids=lambda p: "-".join(f"{v}" for v in p.values()))
@pytest.mark.parametrize("esz", [2, 4])
@pytest.mark.parametrize("offs", [(0, 0), (16, 48), (4, 4)])
def test_pipeline_every_element_once(p: dict, esz: int, offs: tuple[int, int]) -> None:
    """STAGE 3 (and its fallback for unaligned rows or buffers): each element once, right value."""
    check_every_element_once(emulate_pipe, p, esz, offs, PIPE_SHAPES, seed=1)


def emulate_rowtile(x: np.ndarray, w: np.ndarray, p: dict, esz: int, x_off: int = 0, y_off: int = 0,
                    eps: float = 1e-6, paths: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """STAGE 4: groups of TPR threads, TILE_ROWS rows each per CTA step, vectors k * TPR + t.

    When every thread holds MAX_VECS vectors of a row (nv == TPR * MAX_VECS; the weights of a
    cudaMalloc'd buffer are 16-byte aligned), a CTA runs its whole steps (every row below M)
    untested first, then the rest through the tested loop; ``paths`` counts the rows of each.
    """
    m, n = x.shape
    vb, tpr, threads, rows_t, mv = p["VEC_BYTES"], p["TPR"], p["THREADS"], p["TILE_ROWS"], p["MAX_VECS"]
    row_bytes = n * esz
    nv = row_bytes // vb
    if (x_off | y_off) % vb or row_bytes % vb or nv > tpr * mv:
        return emulate(x, w, dict(p, STAGE=2), esz, x_off, y_off, eps)  # the kernel's fallback
    launch = fwd_launch(p, Case({"M": m, "N": n}, {4: "float32", 2: "bfloat16"}[esz]), None)
    grid, rpc, e = launch.grid[0], threads // tpr, vb // esz
    step = rpc * rows_t
    y = np.full((m, n), np.nan)
    writes = np.zeros((m, n), dtype=int)
    paths = paths if paths is not None else {}

    def normalise(row: int, cols: list[int], path: str) -> None:
        cols_a = np.array(cols, dtype=int)
        rstd = 1.0 / np.sqrt((x[row, cols_a] ** 2).sum() / n + eps)
        y[row, cols_a] = x[row, cols_a] * rstd * w[cols_a]
        np.add.at(writes[row], cols_a, 1)
        paths[path] = paths.get(path, 0) + 1

    for b in range(grid):
        base = b * step
        if nv == tpr * mv:
            while base + step <= m:  # no row or vector tested
                for r in range(rpc):
                    for j in range(rows_t):
                        normalise(base + r * rows_t + j, [c for t in range(tpr) for k in range(mv)
                                                          for c in range((k * tpr + t) * e, (k * tpr + t + 1) * e)],
                                  "whole")
                base += grid * step
        while base < m:
            for r in range(rpc):
                for j in range(rows_t):
                    row = base + r * rows_t + j
                    if row >= m:
                        continue
                    normalise(row, [c for t in range(tpr) for k in range(mv) if k * tpr + t < nv
                                    for c in range((k * tpr + t) * e, (k * tpr + t + 1) * e)], "tested")
            base += grid * step
    return y, writes


ROWTILE_CONFIGS = [
    {"THREADS": 128, "TPR": 32, "VEC_BYTES": 16, "CLUSTER": 1, "PERSISTENT": 0, "STAGE": 4, "MAX_VECS": 1,
     "TILE_ROWS": 4},
    {"THREADS": 64, "TPR": 8, "VEC_BYTES": 8, "CLUSTER": 1, "PERSISTENT": 2, "STAGE": 4, "MAX_VECS": 2,
     "TILE_ROWS": 3},
    {"THREADS": 32, "TPR": 4, "VEC_BYTES": 4, "CLUSTER": 1, "PERSISTENT": 1, "STAGE": 4, "MAX_VECS": 4,
     "TILE_ROWS": 2},
]
ROWTILE_SHAPES = [(1, 8), (3, 16), (9, 256), (37, 64), (5, 40), (2, 1000), (4, 1032), (70, 32)]


@pytest.mark.parametrize("p", ROWTILE_CONFIGS, ids=lambda p: "-".join(f"{v}" for v in p.values()))
@pytest.mark.parametrize("esz", [2, 4])
@pytest.mark.parametrize("offs", [(0, 0), (4, 4)])
def test_rowtile_every_element_once(p: dict, esz: int, offs: tuple[int, int]) -> None:
    """STAGE 4 (and its fallback for long, unaligned or odd rows): each element once, right value."""
    check_every_element_once(emulate_rowtile, p, esz, offs, ROWTILE_SHAPES, seed=2)


@pytest.mark.parametrize("m", [64, 70, 1])
def test_rowtile_whole_steps_and_rest(m: int) -> None:
    """An exact fit runs whole steps untested and only the partial last step through the tests."""
    p = ROWTILE_CONFIGS[0]  # 4 warps x 4 rows per step, one 16-byte vector per thread: N = 256 at 16-bit
    x = np.random.default_rng(3).standard_normal((m, 256))
    w = np.random.default_rng(4).standard_normal(256)
    paths: dict = {}
    y, writes = emulate_rowtile(x, w, p, 2, paths=paths)
    assert (writes == 1).all()
    np.testing.assert_allclose(y, rmsnorm_numpy(x, w), rtol=1e-12, atol=1e-12)
    assert paths.get("whole", 0) == m // 16 * 16 and paths.get("tested", 0) == m % 16


# --------------------------------------------------------------------------- STAGE 0, one vector per thread


def emulate_lean(x: np.ndarray, w: np.ndarray, p: dict, esz: int, x_off: int = 0, y_off: int = 0,
                 eps: float = 1e-6, paths: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """rmsnorm_lean (STAGE 0, MAX_VECS 1, no cluster). When x, y and the rows are VEC_BYTES-aligned,
    thread t of a row's group holds the row's vector t if the row has at most TPR vectors ("hold"),
    else reads vectors t, t + TPR, ... twice ("vec"); otherwise elements t, t + TPR, ... ("scalar")."""
    m, n = x.shape
    vb, tpr, threads = p["VEC_BYTES"], p["TPR"], p["THREADS"]
    row_bytes = n * esz
    vec = (x_off | y_off) % vb == 0 and row_bytes % vb == 0
    nv = row_bytes // vb
    path = "hold" if vec and nv <= tpr else "vec" if vec else "scalar"
    e = vb // esz
    rpc = threads // tpr
    grid = fwd_launch(p, Case({"M": m, "N": n}, {4: "float32", 2: "bfloat16"}[esz]), None).grid[0]
    y = np.full((m, n), np.nan)
    writes = np.zeros((m, n), dtype=int)
    for b in range(grid):
        row0 = b * rpc
        while row0 < m:  # the same trip count for every group of the CTA
            for r in range(rpc):
                row = row0 + r
                if row >= m:
                    continue
                cols_l: list[int] = []
                for t in range(tpr):
                    if path == "hold":
                        if t < nv:
                            cols_l.extend(range(t * e, t * e + e))
                    elif path == "vec":
                        for c in range(t * vb, row_bytes, tpr * vb):
                            cols_l.extend(range(c // esz, c // esz + e))
                    else:
                        cols_l.extend(range(t, n, tpr))
                cols = np.array(cols_l, dtype=int)
                xs = x[row].astype(np.float64)
                rstd = 1.0 / np.sqrt((xs[cols] ** 2).sum() / n + eps)
                y[row, cols] = xs[cols] * rstd * w[cols]
                np.add.at(writes[row], cols, 1)
            row0 += grid * rpc
    if paths is not None:
        paths[path] = paths.get(path, 0) + 1
    return y, writes


LEAN_CONFIGS = [
    {"THREADS": 256, "TPR": 256, "VEC_BYTES": 16, "CLUSTER": 1, "PERSISTENT": 0, "STAGE": 0, "MAX_VECS": 1},
    {"THREADS": 128, "TPR": 32, "VEC_BYTES": 8, "CLUSTER": 1, "PERSISTENT": 0, "STAGE": 0, "MAX_VECS": 1},
    {"THREADS": 64, "TPR": 16, "VEC_BYTES": 16, "CLUSTER": 1, "PERSISTENT": 2, "STAGE": 0, "MAX_VECS": 1},
]
LEAN_SHAPES = [(1, 8), (3, 16), (9, 256), (37, 64), (5, 40), (2, 1000), (4, 1032), (70, 32), (3, 4096), (2, 7)]


@pytest.mark.parametrize("p", LEAN_CONFIGS, ids=lambda p: "-".join(f"{v}" for v in p.values()))
@pytest.mark.parametrize("esz", [2, 4])
@pytest.mark.parametrize("offs", [(0, 0), (4, 4), (2, 6)])
def test_lean_every_element_once(p: dict, esz: int, offs: tuple[int, int]) -> None:
    """STAGE 0 with one vector per thread, and its two passes for long, unaligned or odd rows."""
    if esz == 4 and offs[0] % 4:
        pytest.skip("a float32 buffer is always 4-byte aligned")
    check_every_element_once(emulate_lean, p, esz, offs, LEAN_SHAPES, seed=4)


def test_lean_takes_the_fast_path_where_it_should() -> None:
    """Aligned rows of at most TPR vectors are held; longer aligned rows are read twice by vectors,
    odd N and unaligned views by elements."""
    p = LEAN_CONFIGS[0]  # 256 threads of one 16-byte vector: up to 2K 16-bit elements per row
    rng = np.random.default_rng(5)
    for n, offs, path in ((2048, (0, 0), "hold"), (2056, (0, 0), "vec"), (2047, (0, 0), "scalar"),
                          (8, (0, 0), "hold"), (2048, (2, 2), "scalar")):
        paths: dict = {}
        x, w = rng.standard_normal((3, n)), rng.standard_normal(n)
        emulate_lean(x, w, p, 2, *offs, paths=paths)
        assert paths == {path: 1}, (n, paths)


# --------------------------------------------------------------------------- backward, ALGO 1


def emulate_backward(x: np.ndarray, w: np.ndarray, dy: np.ndarray, rstd: np.ndarray, p: dict, esz: int,
                     aligned: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The persistent backward's work split (rows per CTA, 16-byte chunks per thread, the reduction
    slices of the last K tickets); returns (dx, dw, dx writes, partial reads per (CTA, column))."""
    from examples.rmsnorm_problem import bwd_launch

    m, n = x.shape
    threads, chunks, reducers = p["THREADS"], p["MAX_CHUNKS"], p["REDUCERS"]
    g = bwd_launch(p, Case({"M": m, "N": n}, {4: "float32", 2: "bfloat16"}[esz]), None).grid[0]
    e = 16 // esz
    vec = n % e == 0 and aligned
    dx = np.full((m, n), np.nan)
    writes = np.zeros((m, n), dtype=int)
    parts = np.zeros((g, n))
    rw = int(p.get("ROW_WARP", 0))
    gt = 32 * max(rw, 1)  # threads per row group
    ng = threads // gt  # row groups per CTA
    row_warp = rw > 0 and vec and n // e <= chunks * gt
    for b in range(g):
        # ROW_WARP: group q of CTA b takes rows b * ng + q, then every (g * ng)-th; its thread t chunks t, t + gt, ...
        rows = (sorted(r for q in range(ng) for r in range(b * ng + q, m, g * ng)) if row_warp
                else range(b, m, g))
        for row in rows:
            cols: list[int] = []
            for t in range(gt if row_warp else threads):
                if row_warp:
                    mine = [t + gt * k for k in range(chunks) if t + gt * k < n // e]
                    cols.extend(c * e + i for c in mine for i in range(e))
                elif vec:
                    nch = n // e
                    if nch <= chunks * threads:
                        mine = [t + k * threads for k in range(chunks) if t + k * threads < nch]
                    else:
                        mine = list(range(t, nch, threads))
                    cols.extend(c * e + i for c in mine for i in range(e))
                else:
                    cols.extend(range(t, n, threads))
            c = np.array(cols, dtype=int)
            dot = (x[row, c] * dy[row, c] * w[c]).sum()
            r = rstd[row]
            dx[row, c] = r * dy[row, c] * w[c] - x[row, c] * r ** 3 * dot / n
            np.add.at(writes[row], c, 1)
            np.add.at(parts[b], c, dy[row, c] * x[row, c] * r)
    reads = np.zeros((g, n), dtype=int)
    # TREE S: each group of S consecutive CTAs (the last one shorter) is summed in CTA order by its
    # last CTA into its first row; the reducers then read only those Gn rows (row q * S of group q).
    tree = int(p.get("TREE", 0))
    size_s = tree if tree > 0 else 1
    gn = -(-g // size_s)
    if tree > 0:
        for q in range(gn):
            first, size = q * tree, min(tree, g - q * tree)
            total = parts[first].copy()
            for u in range(1, size):
                total = total + parts[first + u]
                parts[first + u] = 0.0  # cleared by the group's last CTA
            reads[first:first + size] += 1
            parts[first] = total
        sums = parts[::tree][:gn]
    else:
        sums = parts
    k = min(reducers, gn, max(1, g // (2 * p["CTAS_PER_SM"])))  # the kernel's bound on waiting CTAs
    sms = -(-g // p["CTAS_PER_SM"])
    assert k == 1 or 2 * k <= sms  # never more waiting CTAs than half the SMs the grid was sized for
    sum_reads = np.zeros((gn, n), dtype=int)
    dw = np.full(n, np.nan)
    for ticket in range(gn - k, gn):
        s = ticket - (gn - k)
        lo, hi = n * s // k, n * (s + 1) // k
        lanes = 8  # column lanes: a power of two >= 8 covering the slice, at most threads
        while lanes < hi - lo and lanes < threads:
            lanes *= 2
        lanes = min(lanes, threads)
        groups = threads // lanes  # partial groups
        for j0 in range(lo, hi, lanes):
            for j in range(j0, min(j0 + lanes, hi)):
                by_group = []
                for grp in range(groups):  # group grp: partials grp, grp + groups, ... in order
                    qs = list(range(grp, gn, groups))
                    by_group.append(sum(sums[q, j] for q in qs))
                    sum_reads[qs, j] += 1
                dw[j] = sum(by_group)  # in group order
    assert (sum_reads == 1).all()  # every (group) sum reduced once
    if tree == 0:
        reads += sum_reads
    return dx, dw, writes, reads


@pytest.mark.parametrize("p", [
    {"THREADS": 128, "MAX_CHUNKS": 1, "CTAS_PER_SM": 4, "REDUCERS": 32},
    {"THREADS": 256, "MAX_CHUNKS": 2, "CTAS_PER_SM": 2, "REDUCERS": 64},
    {"THREADS": 128, "MAX_CHUNKS": 8, "CTAS_PER_SM": 1, "REDUCERS": 8},
    {"THREADS": 128, "MAX_CHUNKS": 4, "CTAS_PER_SM": 3, "REDUCERS": 64, "ROW_WARP": 1},
    {"THREADS": 256, "MAX_CHUNKS": 8, "CTAS_PER_SM": 1, "REDUCERS": 32, "ROW_WARP": 1},
    {"THREADS": 256, "MAX_CHUNKS": 4, "CTAS_PER_SM": 2, "REDUCERS": 64, "ROW_WARP": 4},
    {"THREADS": 512, "MAX_CHUNKS": 2, "CTAS_PER_SM": 1, "REDUCERS": 8, "ROW_WARP": 2},
    {"THREADS": 256, "MAX_CHUNKS": 2, "CTAS_PER_SM": 2, "REDUCERS": 64, "ROW_WARP": 2, "TREE": 8},
    {"THREADS": 128, "MAX_CHUNKS": 4, "CTAS_PER_SM": 3, "REDUCERS": 64, "TREE": 4},
    {"THREADS": 256, "MAX_CHUNKS": 8, "CTAS_PER_SM": 1, "REDUCERS": 32, "TREE": 16},
    {"THREADS": 128, "MAX_CHUNKS": 1, "CTAS_PER_SM": 4, "REDUCERS": 8, "TREE": 16},
])
@pytest.mark.parametrize("esz", [2, 4])
def test_backward_persistent_every_element_once(p: dict, esz: int) -> None:
    """Every dx element written once, every dw column reduced once over every CTA's partial,
    for chunked rows that fit the registers, rows that do not, odd N, M below the grid, and
    reducers with fewer columns than threads (the partials split over groups of threads); with
    TREE, every partial summed once into its group's sum and every group sum reduced once."""
    from examples.rmsnorm_problem import bwd_make_inputs, bwd_reference
    from fitness import materialize

    params = {"ALGO": 1, "SMEM_DW": 1, **p}
    rng = np.random.default_rng(3)
    for m, n, aligned in [(1, 7, True), (5, 1024, True), (300, 4096, True), (70, 40968, True), (9, 1000, False),
                          (6, 1026, True), (600, 1024, True), (600, 40, True)]:
        case = Case({"M": m, "N": n}, "float32")
        inp = materialize(bwd_make_inputs(case, rng, np))
        x, dy = inp["x"].reshape(m, n).astype(np.float64), inp["dy"].reshape(m, n).astype(np.float64)
        dx, dw, writes, reads = emulate_backward(x, inp["w"].astype(np.float64), dy, inp["rstd"].astype(np.float64),
                                                 params, esz, aligned)
        assert (writes == 1).all() and (reads == 1).all(), (m, n)
        ref = bwd_reference(inp, case, np)
        np.testing.assert_allclose(dx.reshape(-1), ref["dx"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(dw, ref["dw"], rtol=1e-4, atol=1e-4)
