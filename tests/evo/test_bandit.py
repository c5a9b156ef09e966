"""The operator bandit: UCB on improvement per unit cost."""

from __future__ import annotations

import numpy as np
import pytest

from evo._bandit import OperatorBandit


def _simulate(bandit: OperatorBandit, means: dict[str, float], costs: dict[str, float], steps: int,
              seed: int = 0) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    pulls = dict.fromkeys(means, 0)
    for _ in range(steps):
        name = bandit.choose(rng)
        pulls[name] += 1
        improvement = max(rng.normal(means[name], 0.05), 0.0)
        bandit.update(name, improvement, costs[name])
    return pulls


def test_prefers_the_better_operator() -> None:
    b = OperatorBandit(["good", "bad"], exploration=0.3, discount=1.0)
    pulls = _simulate(b, {"good": 0.5, "bad": 0.1}, {"good": 1.0, "bad": 1.0}, 400)
    assert pulls["good"] > 3 * pulls["bad"], pulls
    assert b.summary()["good"]["mean"] > b.summary()["bad"]["mean"]


def test_reward_is_per_unit_cost() -> None:
    # same improvement, but "pricey" costs 10x: the cheap one should win
    b = OperatorBandit(["cheap", "pricey"], exploration=0.3)
    pulls = _simulate(b, {"cheap": 0.3, "pricey": 0.3}, {"cheap": 1.0, "pricey": 10.0}, 300)
    assert pulls["cheap"] > 3 * pulls["pricey"], pulls


def test_discount_follows_a_change() -> None:
    b = OperatorBandit(["a", "b"], exploration=0.2, discount=0.95)
    _simulate(b, {"a": 0.5, "b": 0.0}, {"a": 1, "b": 1}, 200, seed=1)
    late = _simulate(b, {"a": 0.0, "b": 0.5}, {"a": 1, "b": 1}, 200, seed=2)
    assert late["b"] > late["a"], late


def test_every_arm_tried_first_and_allowed_subset() -> None:
    b = OperatorBandit(["x", "y", "z"])
    rng = np.random.default_rng(0)
    first = set()
    for _ in range(3):
        n = b.choose(rng)
        first.add(n)
        b.update(n, 0.0)
    assert first == {"x", "y", "z"}
    for _ in range(20):
        assert b.choose(rng, allowed=["y"]) == "y"
    with pytest.raises(ValueError, match="no operator"):
        b.choose(rng, allowed=["nope"])


def test_state_round_trip_and_validation() -> None:
    b = OperatorBandit(["a", "b"], discount=0.9)
    b.update("a", 0.4, 2.0)
    b.update("b", -1.0)  # negative counts as 0
    c = OperatorBandit(["a", "b", "c"], discount=0.9)
    c.load(b.state())
    assert c.state()["a"] == b.state()["a"]
    assert c.arms["b"].reward == 0.0
    assert c.arms["c"].pulls == 0
    d = OperatorBandit(["a"])
    d.load(b.state())  # operators no longer configured are dropped
    assert list(d.arms) == ["a"]
    with pytest.raises(ValueError, match="repeat"):
        OperatorBandit(["a", "a"])
    with pytest.raises(ValueError, match="at least one"):
        OperatorBandit([])
    with pytest.raises(ValueError, match="discount"):
        OperatorBandit(["a"], discount=0.0)
