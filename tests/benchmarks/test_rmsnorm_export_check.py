"""benchmarks/rmsnorm_export_check.py: the parts that need no GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import rmsnorm_export_check as ec  # noqa: E402


def test_cases_parse_and_bad_ones_say_the_form() -> None:
    assert ec.parse_cases("float16:16384x131072, float32:32768X256,") == [
        ("float16", 16384, 131072), ("float32", 32768, 256)]
    with pytest.raises(SystemExit, match=r"bad case 'float16:16384'.*DTYPE:MxN"):
        ec.parse_cases("float16:16384")


def test_the_gate_build_loads_into_any_module_version() -> None:
    """The wrapper offers what old (RawKernel attribute) and new (Function pointer) modules use."""
    calls = []

    class Fn:
        ptr = 1234

        def __call__(self, *a, **kw):
            calls.append((a, kw))

    w = ec._Loaded(object(), Fn())
    w((1, 1, 1), (32, 1, 1), (), shared_mem=0)
    assert w.ptr == 1234 and w.kernel.ptr == 1234 and calls == [(((1, 1, 1), (32, 1, 1), ()), {"shared_mem": 0})]
