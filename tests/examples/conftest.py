"""Shared helpers for the RMSNorm example tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from examples.rmsnorm_problem import KERNEL_DIR


def _cuda_usable() -> bool:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False
        a = cupy.arange(4, dtype=cupy.float32)
        return float(a.sum()) == 6.0
    except Exception:
        return False


@pytest.fixture(scope="session")
def cuda_device() -> None:
    """Skip unless a CUDA device really runs a kernel."""
    if not _cuda_usable():
        pytest.skip("no usable CUDA device")


def _nvcc(kernel: str, mode: list[str], defines: list[str], out: Path, tmp: Path, source: str | None = None) -> str:
    """Run nvcc with ``mode`` and ``defines`` on examples/kernels/<kernel> (or ``source``, written to
    ``tmp/<kernel>``) writing ``out``; return its stderr (raises on error, skips where nvcc is missing)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    src = KERNEL_DIR / kernel
    if source is not None:
        src = tmp / kernel
        src.write_text(source)
    res = subprocess.run([nvcc, *mode, *defines, "-o", str(out), str(src)], capture_output=True, text=True,
                         timeout=240)
    if res.returncode != 0:
        raise AssertionError(f"nvcc {mode[0]} failed for {defines}:\n{res.stderr[-3000:]}")
    return res.stderr


def nvcc_compile(kernel: str, defines: list[str], tmp: Path, source: str | None = None) -> str:
    """Compile examples/kernels/<kernel> (or ``source``, written to ``tmp/<kernel>``) for sm_90a into
    ``tmp/<kernel>.cubin``; return ptxas' -v output (raises on error)."""
    return _nvcc(kernel, ["-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-Xptxas", "-v"], defines,
                 tmp / (kernel + ".cubin"), tmp, source)


def nvcc_ptx(kernel: str, defines: list[str], tmp: Path) -> str:
    """The PTX nvcc generates for examples/kernels/<kernel> with ``defines`` (compute_90a)."""
    out = tmp / (kernel + ".ptx")
    _nvcc(kernel, ["-ptx", "-arch=compute_90a", "-O3"], defines, out, tmp)
    return out.read_text()
