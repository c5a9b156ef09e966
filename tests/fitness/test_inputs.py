"""fitness.random_normal and deferred draws on the CPU (numpy); the fused device path is in test_fused.py."""

from __future__ import annotations

import numpy as np
import pytest

from fitness import NormalDraw, materialize, normal_draw, random_normal, seed_from
from fitness._dtypes import storage_dtype, store_into


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


def test_normal_draw_takes_its_seed_now_and_matches_random_normal():
    rng_a, rng_b = np.random.default_rng(11), np.random.default_rng(11)
    scale = np.linspace(0.5, 2.0, 30, dtype=np.float32)
    draw = normal_draw(rng_a, (30, 41), scale=scale)
    x = random_normal(rng_b, (30, 41), np, scale=scale)
    assert isinstance(draw, NormalDraw) and draw.shape == (30, 41) and draw.size == 1230
    assert np.array_equal(draw.values(np), x)
    assert np.array_equal(draw.values(np), x)  # drawing again gives the same values
    assert seed_from(rng_a) == seed_from(rng_b)  # both took one seed from their rng
    assert normal_draw(3, 5).shape == (5,)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_normal_draw_stores_the_bits_of_its_values(dtype):
    draw = normal_draw(4, (6, 7), shift=np.arange(6, dtype=np.float32))
    got = np.zeros(42, dtype=storage_dtype(dtype))
    draw.store_into(got, dtype, np)
    want = np.zeros(42, dtype=storage_dtype(dtype))
    store_into(want, draw.values(np).reshape(-1), dtype, np)
    assert got.tobytes() == want.tobytes() and got.any()


def test_normal_draw_store_errors_say_what_is_wrong():
    draw = normal_draw(4, (6, 7))
    with pytest.raises(ValueError, match="needs uint16 x 42 for 'bfloat16' values"):
        draw.store_into(np.zeros(41, dtype=np.uint16), "bfloat16", np)
    with pytest.raises(ValueError, match="needs float32 x 42"):
        draw.store_into(np.zeros(42, dtype=np.float16), "float32", np)
    with pytest.raises(ValueError, match="per-row vector has 5 values for 6 rows"):
        normal_draw(4, (6, 7), scale=np.ones(5)).values(np)


def test_materialize_draws_only_the_deferred_values():
    w = np.ones(3, dtype=np.float32)
    out = materialize({"x": normal_draw(8, (2, 3)), "w": w}, np)
    assert out["w"] is w
    assert out["x"].dtype == np.float32 and out["x"].shape == (2, 3)
    assert np.array_equal(out["x"], random_normal(8, (2, 3), np))
