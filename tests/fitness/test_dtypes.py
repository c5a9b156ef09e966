"""Storage conversions, poison and checksums, on the CPU with numpy (and poison on a GPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fitness._dtypes import (
    checksum,
    from_storage,
    is_float,
    poison,
    poison_bits,
    storage_dtype,
    store_into,
    to_storage,
    upcast,
)
from tests.marks import needs_gpu


def _bf16_reference(x: np.ndarray) -> np.ndarray:
    """bfloat16 rounding through float64 arithmetic: nearest representable, ties to even."""
    out = np.empty(x.shape, dtype=np.uint16)
    for k, v in enumerate(x.astype(np.float32).tolist()):
        bits = int(np.float32(v).view(np.uint32))
        if np.isnan(v):
            out[k] = (bits >> 16) | 0x40
            continue
        lo = bits >> 16
        hi = lo + 1
        lo_v = float(np.uint32(lo << 16).view(np.float32))
        hi_v = float(np.uint32((hi & 0xFFFF) << 16).view(np.float32)) if (hi & 0x7F80) != 0x7F80 or (hi & 0x7F) == 0 \
            else float("nan")
        if np.isinf(hi_v):  # IEEE: past the largest finite value, "hi" sits where 2**128 would be
            hi_v = math.copysign(2.0**128, v)
        d_lo, d_hi = abs(v - lo_v), abs(hi_v - v) if np.isfinite(hi_v) else float("inf")
        if (bits & 0xFFFF) == 0:
            out[k] = lo
        elif (bits & 0xFFFF) == 0x8000:
            out[k] = lo if lo % 2 == 0 else hi
        else:
            out[k] = lo if d_lo < d_hi else hi
    return out


def test_bf16_round_to_nearest_even_known_values():
    vals = np.array([1.0, 1.0 + 2**-8, 1.0 + 2**-8 + 2**-20, 1.0 + 3 * 2**-8, -2.5, 0.0, -0.0,
                     np.inf, -np.inf, 3.4028235e38, 3.3895314e38], dtype=np.float32)
    bits = to_storage(vals, "bfloat16", np)
    assert bits.dtype == np.uint16
    assert bits.tolist()[:4] == [0x3F80, 0x3F80, 0x3F81, 0x3F82]  # tie to even down, above tie up, tie to even up
    assert bits[4] == 0xC020 and bits[5] == 0 and bits[6] == 0x8000
    assert bits[7] == 0x7F80 and bits[8] == 0xFF80
    assert bits[9] == 0x7F80  # float32 max rounds past the largest bf16 to infinity
    assert bits[10] == 0x7F7F  # the largest bf16 itself


def test_bf16_nan_stays_quiet_nan():
    nans = np.array([0x7F800001, 0xFFC00000, 0x7FFFFFFF], dtype=np.uint32).view(np.float32)
    bits = to_storage(nans, "bfloat16", np)
    back = from_storage(bits, "bfloat16", np)
    assert np.isnan(back).all()
    assert ((bits & 0x7F80) == 0x7F80).all() and ((bits & 0x40) != 0).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=40))
def test_bf16_matches_slow_reference(values):
    x = np.array(values, dtype=np.float32)
    assert to_storage(x, "bfloat16", np).tolist() == _bf16_reference(x).tolist()


def test_bf16_roundtrip_is_exact_for_representable_values():
    bits = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16)
    wide = from_storage(bits, "bfloat16", np)
    finite = np.isfinite(wide)
    assert np.array_equal(to_storage(wide[finite], "bfloat16", np), bits[finite])


def test_float16_native_and_upcast():
    x = np.array([1.0, 1.0 + 2**-11, 65520.0, -3.0], dtype=np.float32)
    s = to_storage(x, "float16", np)
    assert s.dtype == np.float16 and s[1] == 1.0 and np.isinf(s[2])
    u = upcast(s, "float16", np)
    assert u.dtype == np.float32 and u[3] == -3.0
    f = np.arange(4, dtype=np.float32)
    assert upcast(f, "float32", np) is not f  # a copy, never the stored buffer itself


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_poison_is_nan_for_floats(dtype):
    buf = np.zeros(7, dtype=storage_dtype(dtype))
    poison(buf, np)
    assert int(buf.view(f"u{buf.itemsize}")[0]) == poison_bits(dtype)
    assert np.isnan(from_storage(buf, dtype, np).astype(np.float64)).all()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_gpu_poison_sets_all_ones_and_nothing_around(dtype):
    import cupy as cp

    whole = cp.zeros(1003, dtype=storage_dtype(dtype))
    body = whole[1:1002]  # contiguous, not at the allocation's start: the memset path
    poison(body, cp)
    bits = whole.view(f"u{whole.itemsize}").get()
    assert int(bits[0]) == 0 and int(bits[-1]) == 0
    assert (bits[1:1002] == poison_bits(dtype)).all()
    strided = cp.zeros(20, dtype=storage_dtype(dtype))
    poison(strided[::2], cp)  # not contiguous: the fill path
    sb = strided.view(f"u{strided.itemsize}").get()
    assert (sb[::2] == poison_bits(dtype)).all() and (sb[1::2] == 0).all()
    poison(cp.zeros(0, dtype=storage_dtype(dtype)), cp)  # empty: nothing to set


def test_storage_dtype_rejects_unknown():
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        storage_dtype("float8")


def test_checksum_detects_every_single_word_change_and_swap():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2**32, size=257, dtype=np.uint32)
    base = checksum(a, np)
    for i in range(a.size):
        b = a.copy()
        b[i] ^= np.uint32(1 << int(rng.integers(32)))
        assert checksum(b, np) != base, i
    for i, j in [(0, 1), (3, 200), (10, 256)]:
        b = a.copy()
        b[i], b[j] = a[j], a[i]
        assert checksum(b, np) != base
    # adversarial: a difference of 2^31 swapped across 2^32 positions cannot cancel here
    c = np.zeros(64, dtype=np.uint32)
    c[0], c[32] = 0, 2**31
    d = c.copy()
    d[0], d[32] = c[32], c[0]
    assert checksum(c, np) != checksum(d, np)


def test_checksum_chunking_and_tail_bytes():
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, size=4 * 1000 + 3, dtype=np.uint8)
    assert checksum(a, np, chunk_words=7) == checksum(a, np)
    b = a.copy()
    b[-1] ^= 1
    assert checksum(b, np) != checksum(a, np)
    assert checksum(a[:-1], np) != checksum(np.concatenate([a[:-1], [0]]).astype(np.uint8), np)  # length counts


def test_checksum_views_of_other_dtypes():
    x = np.arange(10, dtype=np.float16)
    y = x.copy()
    y[3] = -y[3]
    assert checksum(x, np) != checksum(y, np)
    assert checksum(x, np) == checksum(x.copy(), np)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int32", "uint8"])
def test_store_into_writes_the_bits_of_to_storage(dtype):
    """One pass into the destination, the same bits as to_storage: rounding, overflow to infinity,
    NaN, and only the destination's elements touched."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(1001) * 3).astype(np.float32)
    x[:4] = [np.inf, -np.inf, np.nan, 3.3961776e38]
    x[4] = np.float32(1.0 + 2**-8)  # a bfloat16 tie
    src = x if is_float(dtype) else rng.integers(0, 100, size=x.size)
    want = to_storage(src, dtype, np)
    raw = np.full(src.size + 8, 7, dtype=storage_dtype(dtype))
    store_into(raw[4:-4], src, dtype, np)
    assert np.array_equal(raw[4:-4].view(np.uint8), want.view(np.uint8))
    assert np.all(raw[:4] == 7) and np.all(raw[-4:] == 7)


def test_store_into_rejects_a_wrong_destination():
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="needs uint16 x 8"):
        store_into(np.empty(8, np.float32), x, "bfloat16", np)
    with pytest.raises(ValueError, match="needs float32 x 8"):
        store_into(np.empty(7, np.float32), x, "float32", np)
