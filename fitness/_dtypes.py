"""Storage dtypes, poison patterns and buffer checksums, written against an ``xp`` module.

Every function takes the array module (``numpy`` or ``cupy``) as ``xp`` so that the same
code runs inside a GPU worker on device arrays and in CPU tests on host arrays.

* bfloat16 has no native dtype in numpy or cupy: it is stored as ``uint16`` bit patterns;
  :func:`to_storage` rounds float32 to bfloat16 with round-to-nearest-even (NaN stays a
  quiet NaN, overflow becomes infinity), :func:`from_storage` widens exactly.
* float16 uses the native dtype (IEEE round-to-nearest-even on conversion).
* :func:`poison` fills a buffer with an all-ones bit pattern, a NaN for every float
  storage dtype, so an element the kernel never wrote is non-finite afterwards.
* :func:`checksum` is an exact position-weighted sum of the buffer's 32-bit words modulo
  2**64. For buffers under 8 GiB it detects every change of a single word and every swap
  of two differing words (the difference it makes is a nonzero integer smaller than
  2**64 in absolute value), at the cost of one streaming pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fitness._fused import fused_for

__all__ = [
    "STORAGE_DTYPES",
    "checksum",
    "from_storage",
    "is_float",
    "poison",
    "poison_bits",
    "storage_dtype",
    "store_into",
    "to_storage",
    "upcast",
]

#: Problem dtype name -> numpy dtype name of its storage.
STORAGE_DTYPES: dict[str, str] = {
    "float32": "float32",
    "float16": "float16",
    "bfloat16": "uint16",
    "float64": "float64",
    "int32": "int32",
    "int64": "int64",
    "uint32": "uint32",
    "int8": "int8",
    "uint8": "uint8",
}

_FLOATS = ("float32", "float16", "bfloat16", "float64")
_UINT_OF_SIZE = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}
_CHUNK_WORDS = 1 << 25  # 128 MiB of uint32 per checksum step


def storage_dtype(dtype: str) -> np.dtype:
    """The numpy dtype a buffer of Problem dtype ``dtype`` is stored as.

    Raises:
        ValueError: ``dtype`` is not a known storage dtype.
    """
    try:
        return np.dtype(STORAGE_DTYPES[dtype])
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(STORAGE_DTYPES)}") from None


def is_float(dtype: str) -> bool:
    """True for floating-point Problem dtypes (those that can hold NaN)."""
    return dtype in _FLOATS


def _f32_to_bf16_bits(x: Any, xp: Any) -> Any:
    fused = fused_for(xp)
    if fused is not None:
        return fused.f32_to_bf16(x)
    x = xp.ascontiguousarray(x, dtype=xp.float32)
    bits = x.view(xp.uint32)
    lsb = (bits >> xp.uint32(16)) & xp.uint32(1)
    rounded = (bits + xp.uint32(0x7FFF) + lsb) >> xp.uint32(16)
    quiet_nan = (bits >> xp.uint32(16)) | xp.uint32(0x0040)
    out = xp.where(xp.isnan(x), quiet_nan, rounded)
    return out.astype(xp.uint16)


def _bf16_bits_to_f32(bits: Any, xp: Any) -> Any:
    fused = fused_for(xp)
    if fused is not None:
        return fused.bf16_to_f32(bits)
    wide = xp.ascontiguousarray(bits, dtype=xp.uint16).astype(xp.uint32) << xp.uint32(16)
    return wide.view(xp.float32)


def to_storage(values: Any, dtype: str, xp: Any) -> Any:
    """Round ``values`` (float32/float64/int array) to the storage of ``dtype``.

    Args:
        values: Any real array; floats are first converted to float32 for bfloat16.
        dtype: Problem dtype name (``"bfloat16"`` gives ``uint16`` bit patterns).
        xp: ``numpy`` or ``cupy``.

    Returns:
        A new array of :func:`storage_dtype` ``(dtype)`` with the same shape.
    """
    if dtype == "bfloat16":
        return _f32_to_bf16_bits(values, xp)
    with np.errstate(over="ignore"):  # out-of-range values become +-inf, as the hardware does
        return xp.asarray(values).astype(storage_dtype(dtype).name)


def check_destination(dst: Any, dtype: str, n: int) -> None:
    """Raise ``ValueError`` unless ``dst`` is an array of ``storage_dtype(dtype)`` with ``n`` elements
    (the check of :func:`store_into` and of :meth:`fitness.NormalDraw.store_into`)."""
    want = storage_dtype(dtype)
    if dst.dtype != want or dst.size != n:
        raise ValueError(f"store_into: destination is {dst.dtype} x {dst.size}, needs {want} x {n} "
                         f"for {dtype!r} values")


def store_into(dst: Any, values: Any, dtype: str, xp: Any) -> None:
    """Write ``values`` rounded to the storage of ``dtype`` into ``dst``, in one pass.

    The same bits as ``dst[...] = to_storage(values, dtype, xp)`` without the intermediate
    array and its second copy (the Timing stage stores every case's inputs anew for each
    evaluation: for a 2**31-element float32 input that is 16 GB of memory traffic less).

    Args:
        dst: A contiguous array of :func:`storage_dtype` ``(dtype)`` with as many elements as ``values``.
        values: Any real array.
        dtype: Problem dtype name.
        xp: ``numpy`` or ``cupy``.

    Raises:
        ValueError: ``dst`` has the wrong dtype or element count.
    """
    check_destination(dst, dtype, values.size)
    if dtype == "bfloat16":
        fused = fused_for(xp)
        if fused is not None and dst.flags.c_contiguous:
            fused.f32_to_bf16(xp.asarray(values).reshape(dst.shape), out=dst)
            return
        dst[...] = _f32_to_bf16_bits(values, xp).reshape(dst.shape)
        return
    with np.errstate(over="ignore", invalid="ignore"):  # as to_storage: out-of-range floats become +-inf
        xp.copyto(dst, xp.asarray(values).reshape(dst.shape), casting="unsafe")


def from_storage(stored: Any, dtype: str, xp: Any) -> Any:
    """Widen a stored buffer exactly: float16/bfloat16 -> float32; others keep their dtype."""
    if dtype == "bfloat16":
        return _bf16_bits_to_f32(stored, xp)
    if dtype == "float16":
        return stored.astype(xp.float32)
    return stored


def upcast(stored: Any, dtype: str, xp: Any) -> Any:
    """The value a reference computes from: floats as float32 (float64 kept), ints as-is."""
    if dtype in ("float32", "float64") or not is_float(dtype):
        return stored.copy()
    return from_storage(stored, dtype, xp)


def poison_bits(dtype: str) -> int:
    """The all-ones bit pattern used as poison for ``dtype`` (a NaN for float dtypes)."""
    return (1 << (8 * storage_dtype(dtype).itemsize)) - 1


def _bits_view(buf: Any, xp: Any) -> Any:
    return buf.view(_UINT_OF_SIZE[buf.dtype.itemsize])


def poison(buf: Any, xp: Any) -> None:
    """Fill ``buf`` in place with the all-ones bit pattern of its element size.

    On cupy a contiguous buffer is set byte-wise (``cudaMemsetAsync`` to 0xFF on the current
    stream: all-ones whatever the element size, at the memory's full rate, where a fill
    kernel stores one narrow element per thread); anything else takes ``fill``.
    """
    if getattr(xp, "__name__", "") == "cupy" and buf.flags.c_contiguous:
        if buf.nbytes:
            xp.cuda.runtime.memsetAsync(buf.data.ptr, 0xFF, buf.nbytes, xp.cuda.get_current_stream().ptr)
        return
    view = _bits_view(buf, xp)
    view.fill(xp.iinfo(view.dtype).max)


def _as_bytes(buf: Any, xp: Any) -> Any:
    flat = buf.reshape(-1) if buf.flags.c_contiguous else xp.ascontiguousarray(buf).reshape(-1)
    return flat.view(xp.uint8)


def checksum(buf: Any, xp: Any, *, chunk_words: int = _CHUNK_WORDS) -> int:
    """Exact position-weighted checksum of ``buf``'s bytes.

    ``sum(word[i] * (2*i + 1)) mod 2**64`` over the buffer read as little-endian uint32
    words (a trailing partial word is zero-padded), plus the byte length. Computed in
    chunks so the temporaries stay small.

    Args:
        buf: A contiguous numpy or cupy array of any dtype.
        xp: Its array module.
        chunk_words: Words per step (tests use small values).

    Returns:
        The checksum as a Python int in ``[0, 2**64)``.
    """
    raw = _as_bytes(buf, xp)
    nbytes = int(raw.size)
    n_full = nbytes // 4
    total = 0
    mask = (1 << 64) - 1
    fused = fused_for(xp) if n_full else None
    if fused is not None:
        total = fused.checksum(raw[: 4 * n_full].view(xp.uint32))
    elif n_full:
        words = raw[: 4 * n_full].view(xp.uint32)
        for start in range(0, n_full, chunk_words):
            stop = min(n_full, start + chunk_words)
            w = words[start:stop].astype(xp.uint64)
            weights = xp.arange(2 * start + 1, 2 * stop + 1, 2, dtype=xp.uint64)
            part = int(xp.sum(w * weights, dtype=xp.uint64))
            total = (total + part) & mask
    tail = nbytes - 4 * n_full
    if tail:
        tail_bytes = bytes(int(b) for b in raw[4 * n_full:].tolist())
        word = int.from_bytes(tail_bytes + b"\x00" * (4 - tail), "little")
        total = (total + word * (2 * n_full + 1)) & mask
    return (total + nbytes * 0x9E3779B97F4A7C15) & mask
