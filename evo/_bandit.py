"""Operator scheduling: a bandit over operators, rewarded with improvement per unit cost.

The engine asks :class:`OperatorBandit` which operator to call next and reports back
what each child achieved. The policy is UCB1 (Auer et al. 2002) on the mean reward per
unit cost, with an optional discount so that an operator that stopped paying off loses
its lead (a search moves through phases: parameter moves help early, source rewrites
later). Every arm is tried ``min_pulls`` times before the confidence bound decides.

Rewards are ``improvement / cost`` where improvement is the child's relative fitness
gain over its best parent (0 when it did not improve or failed) plus a bonus when it
opened a new archive cell, and cost is the operator's ``cost_weight`` plus its LLM
spend in units of ``dollars_per_unit``. The state is plain data so it survives in the
archive's engine state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ArmStats", "OperatorBandit"]


@dataclass
class ArmStats:
    """Running statistics of one operator.

    Attributes:
        pulls: Discounted number of rewards received.
        reward: Discounted sum of reward per unit cost.
        total_pulls: Undiscounted count (for reports).
        total_cost: Undiscounted cost spent.
    """

    pulls: float = 0.0
    reward: float = 0.0
    total_pulls: int = 0
    total_cost: float = 0.0

    @property
    def mean(self) -> float:
        """Mean (discounted) reward per unit cost; 0 before any pull."""
        return self.reward / self.pulls if self.pulls > 0 else 0.0


class OperatorBandit:
    """UCB1 over operator names on reward per unit cost.

    Args:
        names: The operators (arms).
        exploration: UCB exploration constant ``c`` in ``mean + c * sqrt(ln N / n)``.
        discount: Multiplier applied to every arm's statistics at each update
            (1.0 = plain UCB1; 0.99 forgets with a horizon of about 100 updates).
        min_pulls: Pulls of each arm before the bound decides (tried in random order).
    """

    def __init__(self, names: Sequence[str], *, exploration: float = 0.5, discount: float = 1.0,
                 min_pulls: int = 1) -> None:
        if not names:
            raise ValueError("OperatorBandit needs at least one operator name")
        if len(set(names)) != len(names):
            raise ValueError(f"operator names repeat: {list(names)}; give each operator a distinct name")
        if not 0.0 < discount <= 1.0:
            raise ValueError(f"discount must be in (0, 1], got {discount}")
        self.names = list(names)
        self.exploration = float(exploration)
        self.discount = float(discount)
        self.min_pulls = int(min_pulls)
        self.arms: dict[str, ArmStats] = {n: ArmStats() for n in self.names}

    def choose(self, rng: np.random.Generator, allowed: Iterable[str] | None = None) -> str:
        """The next operator to call.

        Args:
            rng: Source of tie-breaking and first-pull order.
            allowed: Restrict the choice (e.g. operators whose parents are available).

        Raises:
            ValueError: ``allowed`` holds no known operator.
        """
        names = [n for n in self.names if allowed is None or n in set(allowed)]
        if not names:
            raise ValueError(f"no operator to choose from (known: {self.names}, allowed: {allowed})")
        fresh = [n for n in names if self.arms[n].total_pulls < self.min_pulls]
        if fresh:
            return fresh[int(rng.integers(len(fresh)))]
        total = sum(self.arms[n].pulls for n in names)
        scores = []
        for n in names:
            a = self.arms[n]
            bonus = self.exploration * math.sqrt(math.log(max(total, 1.0) + 1.0) / max(a.pulls, 1e-9))
            scores.append(a.mean + bonus)
        best = max(scores)
        ties = [n for n, s in zip(names, scores, strict=True) if s >= best - 1e-12]
        return ties[int(rng.integers(len(ties)))]

    def update(self, name: str, improvement: float, cost: float = 1.0) -> float:
        """Record one outcome of ``name``; returns the reward credited.

        Args:
            name: The operator.
            improvement: Non-negative gain (negative values count as 0).
            cost: Positive cost of the call (cost weight plus LLM spend).
        """
        if name not in self.arms:
            self.names.append(name)
            self.arms[name] = ArmStats()
        cost = max(float(cost), 1e-9)
        gain = float(improvement) if math.isfinite(improvement) else 0.0
        reward = max(gain, 0.0) / cost
        if self.discount < 1.0:
            for a in self.arms.values():
                a.pulls *= self.discount
                a.reward *= self.discount
        a = self.arms[name]
        a.pulls += 1.0
        a.reward += reward
        a.total_pulls += 1
        a.total_cost += cost
        return reward

    def summary(self) -> dict[str, dict[str, float]]:
        """Per operator: pulls, mean reward per cost, total cost."""
        return {n: {"pulls": a.total_pulls, "mean": a.mean, "cost": a.total_cost} for n, a in self.arms.items()}

    # -- persistence ------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Plain data for the engine state."""
        return {n: [a.pulls, a.reward, a.total_pulls, a.total_cost] for n, a in self.arms.items()}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state` output; operators no longer configured are dropped."""
        for n, v in state.items():
            if n in self.arms:
                self.arms[n] = ArmStats(float(v[0]), float(v[1]), int(v[2]), float(v[3]))
