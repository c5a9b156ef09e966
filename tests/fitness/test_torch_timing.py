"""fitness.time_calls: torch callables timed with the Timing stage's method."""

from __future__ import annotations

import pytest

from fitness import CallTiming, time_calls
from fitness._device import gpu_available


def test_time_calls_needs_a_call():
    with pytest.raises(ValueError, match="at least one call"):
        time_calls([])


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available()) and gpu_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _torch_cuda(), reason="needs torch with a CUDA device")
def test_gpu_time_calls_graph_batches_and_copy_speed():
    import torch

    xs = [torch.randn(1 << 26, device="cuda") for _ in range(2)]  # 256 MiB each
    ys = [torch.empty_like(x) for x in xs]
    calls = [(lambda x=x, y=y: y.copy_(x)) for x, y in zip(xs, ys, strict=True)]
    res = time_calls(calls)
    assert isinstance(res, CallTiming) and res.graph
    assert res.batches >= 10 and res.calls_per_batch % 2 == 0
    tbs = 2 * xs[0].numel() * 4 / (res.time_ms * 1e-3) / 1e12
    assert 1.0 < tbs < 6.0 and res.spread < 0.1
    eager = time_calls(calls, use_graph=False)
    assert not eager.graph and abs(eager.time_ms / res.time_ms - 1) < 0.2
