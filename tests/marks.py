"""Skip markers shared by the test suite (GPU tests also carry ``@pytest.mark.gpu``)."""

from __future__ import annotations

import pytest

from fitness._device import gpu_available

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no usable CUDA device")
"""Skips the test where no usable CUDA device is found."""

without_gpu = pytest.mark.skipif(gpu_available(), reason="checks the message on a machine without a GPU")
"""Runs the test only where no usable CUDA device is found (the clear-error paths)."""
