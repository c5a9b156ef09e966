"""fitness.random_normal on the CPU (numpy); the fused device path is in test_fused.py."""

from __future__ import annotations

import numpy as np
import pytest

from fitness import random_normal, seed_from


def test_seed_from_accepts_generators_and_ints():
    assert seed_from(7) == 7
    a = seed_from(np.random.default_rng(1))
    assert a == seed_from(np.random.default_rng(1)) and 0 <= a < 2**62


def test_random_normal_numpy_shape_and_statistics():
    x = random_normal(np.random.default_rng(3), (200, 500), np)
    assert x.dtype == np.float32 and x.shape == (200, 500)
    assert abs(float(x.mean())) < 0.02 and abs(float(x.std()) - 1.0) < 0.02
    again = random_normal(np.random.default_rng(3), (200, 500), np)
    assert np.array_equal(x, again)
    assert not np.array_equal(x, random_normal(np.random.default_rng(4), (200, 500), np))


def test_random_normal_per_row_scale_and_shift():
    scale = np.array([1.0, 10.0, 0.0], dtype=np.float32)
    shift = np.array([0.0, 0.0, 5.0], dtype=np.float32)
    base = random_normal(9, (3, 4000), np)
    x = random_normal(9, (3, 4000), np, scale=scale, shift=shift)
    assert np.allclose(x[1], 10 * base[1]) and np.allclose(x[0], base[0])
    assert np.all(x[2] == 5.0)
    assert random_normal(9, 10, np).shape == (10,)


def test_random_normal_rejects_a_wrong_row_vector():
    with pytest.raises(ValueError, match="per-row vector has 2 values for 3 rows"):
        random_normal(1, (3, 4), np, scale=[1.0, 2.0])
