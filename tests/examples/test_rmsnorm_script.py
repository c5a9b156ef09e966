"""The example script stops at once, with exit code 2, where no GPU is usable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import _cuda_usable

ROOT = Path(__file__).resolve().parents[2]


def test_no_gpu_exits_2(tmp_path: Path) -> None:
    if _cuda_usable():
        pytest.skip("a GPU is present")
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "rmsnorm_h100.py"), "--archive",
                        str(tmp_path / "a.lmdb"), "--minutes", "0.1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "no usable GPU" in r.stderr
    assert not (tmp_path / "a.lmdb").exists()
