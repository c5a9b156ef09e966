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


def nvcc_compile(kernel: str, defines: list[str], tmp: Path, source: str | None = None) -> str:
    """Compile examples/kernels/<kernel> (or ``source``, written to ``tmp/<kernel>``) for sm_90a into
    ``tmp/<kernel>.cubin``; return ptxas' -v output (raises on error)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    src = KERNEL_DIR / kernel
    if source is not None:
        src = tmp / kernel
        src.write_text(source)
    out = tmp / (kernel + ".cubin")
    cmd = [nvcc, "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-Xptxas", "-v", *defines,
           "-o", str(out), str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if res.returncode != 0:
        raise AssertionError(f"nvcc failed for {defines}:\n{res.stderr[-3000:]}")
    return res.stderr


def nvcc_ptx(kernel: str, defines: list[str], tmp: Path) -> str:
    """The PTX nvcc generates for examples/kernels/<kernel> with ``defines`` (compute_90a)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    out = tmp / (kernel + ".ptx")
    cmd = [nvcc, "-ptx", "-arch=compute_90a", "-O3", *defines, "-o", str(out), str(KERNEL_DIR / kernel)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if res.returncode != 0:
        raise AssertionError(f"nvcc -ptx failed for {defines}:\n{res.stderr[-3000:]}")
    return out.read_text()
