"""The sweep's built-in variant sets are valid genomes of the forward Problem (no GPU needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import rmsnorm_sweep  # noqa: E402

from examples.rmsnorm_problem import make_forward_problem  # noqa: E402


@pytest.mark.parametrize("make", [rmsnorm_sweep.pipe_set, rmsnorm_sweep.short_set, rmsnorm_sweep.long_set,
                                  rmsnorm_sweep.reread_set])
@pytest.mark.parametrize("count", [40, 120])
def test_sets_are_valid_and_distinct(make, count: int) -> None:
    space = make_forward_problem(dtypes=["bfloat16"]).params
    variants = make(count)
    assert count // 2 <= len(variants) <= count
    assert all(space.is_valid(p) for p in variants), [space.violations(p) for p in variants if not space.is_valid(p)]
    assert len({tuple(sorted(p.items())) for p in variants}) == len(variants)  # no variant (seed) timed twice


def test_bad_shapes_argument_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="no standard shape"):
        rmsnorm_sweep.main(["--shapes", "7", "--set", "seeds"])
