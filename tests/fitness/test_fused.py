"""The fused device kernels: they build with nvcc (CPU) and agree with the whole-array path (GPU)."""

from __future__ import annotations

import math
import re
import shutil
import subprocess

import numpy as np
import pytest

from fitness._dtypes import checksum, from_storage, storage_dtype, store_into, to_storage
from fitness._fused import _NAMES, SOURCE, fused_for
from fitness._gate import compare
from tests.fitness.conftest import needs_nvrtc
from tests.marks import needs_gpu


def test_fused_is_none_for_numpy():
    assert fused_for(np) is None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def _instantiations() -> str:
    """Explicit instantiations of the templates CuPy names (``_NAMES``), for plain compilers."""
    compares = [n for n in _NAMES if n.startswith("compare_norms<")]
    normals = [n for n in _NAMES if n.startswith("normal_into<")]
    assert len(compares) == 8 and normals == ["normal_into<0>", "normal_into<1>", "normal_into<2>"]
    inst = "\n".join(
        f"template __global__ void compare_norms<{n.split('<')[1].split(',')[0]}, {n.split(', ')[1].rstrip('>')}>("
        f"const typename Load<{n.split('<')[1].split(',')[0]}>::T*, const {n.split(', ')[1].rstrip('>')}*, "
        "long long, double*, u64*);" for n in compares)
    return inst + "\n" + "\n".join(
        f"template __global__ void normal_into<{k}>(typename Store<{k}>::T*, long long, u64, const float*, "
        "const float*, long long);" for k in range(3))


def test_fused_source_compiles_with_nvcc(tmp_path):
    inst = _instantiations()
    src = tmp_path / "fused.cu"
    src.write_text(SOURCE + "\n" + inst + "\n")
    proc = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90a", "-cubin", "-o", str(tmp_path / "fused.cubin"),
                           str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "fused.cubin").stat().st_size > 0


@needs_nvrtc
def test_fused_source_compiles_with_nvrtc_as_cupy_builds_it():
    # CuPy builds the module with NVRTC (no include paths, C++17); no spills in any kernel.
    from fitness import compile_source

    r = compile_source(SOURCE + "\n" + _instantiations(), entry="checksum_u32", options=("--std=c++17",),
                       backend="nvrtc")
    assert r.ok, r.log
    assert "bytes spill stores" in r.log and not re.search(r"[1-9]\d* bytes spill stores", r.log)


def _values(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal(n).astype(np.float32) * np.float32(3.0)
    x[::97] = np.float32(3.3961776e38)  # rounds to bf16 infinity
    x[5] = np.float32(np.inf)
    x[6] = np.float32(-np.inf)
    x[7] = np.float32(np.nan)
    x[8] = np.float32(1.0 + 2**-8)  # a tie
    return x


@pytest.mark.gpu
@needs_gpu
def test_gpu_fused_conversions_and_checksum_match_numpy():
    import cupy as cp

    assert fused_for(cp) is not None
    rng = np.random.default_rng(3)
    for n in (1, 7, 1000, 1 << 20, (1 << 20) + 3):
        x = _values(rng, max(n, 9))[:n] if n >= 9 else rng.standard_normal(n).astype(np.float32)
        bits_np = to_storage(x, "bfloat16", np)
        bits_cp = to_storage(cp.asarray(x), "bfloat16", cp)
        assert np.array_equal(bits_np, cp.asnumpy(bits_cp))
        back_np = from_storage(bits_np, "bfloat16", np)
        back_cp = from_storage(bits_cp, "bfloat16", cp)
        assert np.array_equal(back_np.view(np.uint32), cp.asnumpy(back_cp).view(np.uint32))
        for arr in (x, bits_np, x.view(np.uint8)[: max(0, x.nbytes - 3)]):
            assert checksum(arr, np) == checksum(cp.asarray(arr), cp)
    # unaligned start: the scalar path
    x = rng.integers(0, 2**32, size=4099, dtype=np.uint32)
    assert checksum(x[1:], np) == checksum(cp.asarray(x)[1:], cp)


@pytest.mark.gpu
@needs_gpu
def test_gpu_store_into_matches_to_storage():
    """store_into writes the bits of the device's to_storage into a view of a larger buffer (the
    harness's guarded buffers), leaving the bytes around it alone; the values are the host's.

    The device's float16 NaN is CUDA's canonical 0x7fff where numpy keeps the payload (0x7e00),
    so against the host only NaN-ness is compared at NaN positions.
    """
    import cupy as cp

    rng = np.random.default_rng(5)
    x = _values(rng, 4099)
    for dtype in ("float32", "float16", "bfloat16", "float64", "int32"):
        src = x if dtype != "int32" else rng.integers(-5, 5, size=x.size)
        want = cp.asnumpy(to_storage(cp.asarray(src), dtype, cp))
        raw = cp.full(x.size + 64, 0x5A, dtype=storage_dtype(dtype).name)
        store_into(raw[32:-32], cp.asarray(src), dtype, cp)
        got = cp.asnumpy(raw)
        assert np.array_equal(got[32:-32].view(np.uint8), want.view(np.uint8)), dtype
        assert np.all(got[:32] == raw.dtype.type(0x5A)) and np.all(got[-32:] == raw.dtype.type(0x5A))
        host = to_storage(src, dtype, np)
        if dtype == "bfloat16":
            host, got = from_storage(host, dtype, np), from_storage(got, dtype, np)
        assert np.array_equal(got[32:-32], host, equal_nan=dtype != "int32"), dtype
    with pytest.raises(ValueError, match="out must be"):
        fused_for(cp).f32_to_bf16(cp.zeros(4, cp.float32), out=cp.zeros(4, cp.float32))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_gpu_fused_compare_matches_whole_array_path(dtype):
    import cupy as cp

    fused = fused_for(cp)
    rng = np.random.default_rng(11)
    n = 300_001
    ref = rng.standard_normal(n).astype(np.float32)
    ref[10] = np.inf
    ref[11] = np.nan
    out = ref + rng.standard_normal(n).astype(np.float32) * np.float32(1e-3)
    out[10] = np.inf
    out[11] = np.nan
    out[12] = np.nan  # non-finite where the reference is finite
    out[13] = np.float32(-np.inf)
    stored = to_storage(out, dtype, np)
    wide = from_storage(stored, dtype, np)
    for r in (ref, ref.astype(np.float64)):
        want = compare("y", wide, r, 1e-2, np)
        e, q, nonfinite, special = fused.compare_norms(cp.asarray(stored), dtype, cp.asarray(r))
        assert nonfinite == want.nonfinite == 2
        assert special == want.special_mismatch == 0
        assert math.isclose(math.sqrt(q), want.ref_norm, rel_tol=1e-12)
        assert math.isclose(math.sqrt(e), want.err_norm, rel_tol=1e-9)
    # a special-value mismatch: the reference is +inf and the output is finite
    stored2 = to_storage(np.where(np.arange(n) == 10, np.float32(1.0), out), dtype, np)
    _e, _q, _nf, special = fused.compare_norms(cp.asarray(stored2), dtype, cp.asarray(ref))
    assert special == 1


@pytest.mark.gpu
@needs_gpu
def test_gpu_fused_normal_statistics_scale_and_seed():
    import cupy as cp

    from fitness import random_normal

    x = random_normal(5, (1000, 1001), cp)
    assert x.dtype == cp.float32 and x.shape == (1000, 1001)
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1.0) < 0.01
    assert bool(cp.isfinite(x).all())
    assert bool((random_normal(5, (1000, 1001), cp) == x).all())
    assert not bool((random_normal(6, (1000, 1001), cp) == x).all())
    scale = cp.arange(1000, dtype=cp.float32)
    y = random_normal(5, (1000, 1001), cp, scale=scale, shift=cp.ones(1000, dtype=cp.float32))
    assert bool(cp.allclose(y, x * scale[:, None] + 1.0))
    # the heavy tail exists: Box-Muller from 24-bit uniforms reaches about 5.6 sigma
    assert 4.0 < float(cp.abs(x).max()) < 6.0


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(1000, 1001), (3000, 3001), (7,), (5, 1), (1, 9)])
def test_gpu_deferred_draw_stores_the_bits_of_its_values(dtype, shape):
    import cupy as cp

    from fitness import normal_draw
    from fitness._dtypes import storage_dtype, store_into

    rows = shape[0]
    draw = normal_draw(17, shape, scale=cp.linspace(1e-3, 60.0, rows, dtype=cp.float32),
                       shift=cp.linspace(-2.0, 2.0, rows, dtype=cp.float32))
    n = draw.size
    want = cp.empty(n, dtype=storage_dtype(dtype))
    store_into(want, draw.values(cp).reshape(-1), dtype, cp)
    bits = f"u{want.itemsize}"
    aligned = cp.zeros(n, dtype=storage_dtype(dtype))
    draw.store_into(aligned, dtype, cp)  # the fused path, paired stores
    assert bool(cp.array_equal(aligned.view(bits), want.view(bits)))
    whole = cp.zeros(n + 2, dtype=storage_dtype(dtype))
    draw.store_into(whole[1:n + 1], dtype, cp)  # one element off alignment: single stores
    assert bool(cp.array_equal(whole[1:n + 1].view(bits), want.view(bits)))
    assert int(whole.view(bits)[0]) == 0 and int(whole.view(bits)[-1]) == 0


@pytest.mark.gpu
@needs_gpu
def test_gpu_fused_normal_rejects_bad_out_and_dtype():
    import cupy as cp

    from fitness._fused import fused_for

    fused = fused_for(cp)
    with pytest.raises(ValueError, match="dtype 'float64' is not one of"):
        fused.normal(1, (4, 4), dtype="float64")
    with pytest.raises(ValueError, match="out must be C-contiguous uint16 with 16 elements"):
        fused.normal(1, (4, 4), dtype="bfloat16", out=cp.empty(16, dtype=cp.float32))
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        fused.normal(1, (4, 4), dtype="float32", out=cp.empty(32, dtype=cp.float32)[::2])


_WALK_MAIN = r"""
#include <cstdio>
// Every thread's walk (pairs p = t, t + stride, ...) against division: each element written once,
// never past n, and its row is i / len.
static int walk(long long n, long long len, long long stride) {
    long long pairs = (n + 1) >> 1;
    static unsigned char seen[1 << 20];
    for (long long i = 0; i < n; ++i) seen[i] = 0;
    for (long long t = 0; t < stride && t < pairs; ++t) {
        RowWalk w(t, stride, len);
        for (long long p = t; p < pairs; p += stride) {
            long long i = 2 * p;
            if (w.row != i / len || w.col != i % len) { printf("n=%lld len=%lld stride=%lld p=%lld: row %lld col %lld\n", n, len, stride, p, w.row, w.col); return 1; }
            if (i + 1 < n && w.second() != (i + 1) / len) { printf("n=%lld len=%lld: second row of p=%lld\n", n, len, p); return 1; }
            seen[i] += 1;
            if (i + 1 < n) seen[i + 1] += 1;
            w.step();
        }
    }
    for (long long i = 0; i < n; ++i) if (seen[i] != 1) { printf("n=%lld len=%lld stride=%lld: element %lld written %d times\n", n, len, stride, i, (int)seen[i]); return 1; }
    return 0;
}
int main() {
    const long long lens[] = {1, 2, 3, 7, 64, 255, 256, 1000, 1001, 4099};
    const long long strides[] = {1, 2, 3, 5, 32, 255, 256, 1000, 2048, 4097};
    int bad = 0;
    for (long long len : lens)
        for (long long rows : {1LL, 2LL, 3LL, 17LL, 100LL})
            for (long long stride : strides) {
                long long n = len * rows;
                if (n <= (1 << 20)) bad |= walk(n, len, stride);
            }
    puts(bad ? "FAIL" : "OK");
    return bad;
}
"""


def test_generator_row_walk_matches_division_on_the_host(tmp_path):
    # RowWalk is the generator's own code (host-callable), compiled with nvcc and run on the CPU.
    src = tmp_path / "walk.cu"
    src.write_text(SOURCE + "\n" + _WALK_MAIN)
    exe = tmp_path / "walk"
    proc = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90a", "-o", str(exe), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("OK"), run.stdout[-2000:]
