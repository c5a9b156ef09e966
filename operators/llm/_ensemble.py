"""An ensemble of LLM backends chosen per call by weights and a cost-aware bandit."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from operators.llm._backends import BudgetExceeded, Completion, LLMError, Message

__all__ = ["LLMEnsemble"]

log = logging.getLogger(__name__)


class _Arm:
    __slots__ = ("backend", "key", "weight", "n", "reward", "cost", "calls", "failures")

    def __init__(self, backend: Any, key: str, weight: float) -> None:
        self.backend = backend
        self.key = key
        self.weight = weight
        self.n = 0          # reports received
        self.reward = 0.0   # sum of rewards in [0, 1]
        self.cost = 0.0     # sum of reported costs
        self.calls = 0      # completions served
        self.failures = 0   # calls that raised LLMError


class LLMEnsemble:
    """Several backends behind one ``complete``; each call picks one.

    The pick combines the fixed ``weights`` with a bandit that learns which model gives
    improvements per unit cost. With ``strategy="thompson"`` (default) each arm draws
    ``theta ~ Beta(1 + rewards, 1 + reports - rewards)`` and scores
    ``weight * theta / max(mean cost per report, cost_floor)``; with ``"ucb"`` the draw is
    replaced by the UCB1 bound. Free (local) models all sit at ``cost_floor``.

    The engine calls :meth:`report` when a child proposed by one model is told (``model``
    is ``Proposal.meta["model"]``, the arm name or any model id that arm has answered as);
    the LLM operators report failed proposals themselves with reward 0.

    Args:
        backends: The backends (each with ``complete`` and a ``name`` or ``model``).
        weights: Prior preference per backend (default equal); 0 disables one.
        strategy: ``"thompson"`` or ``"ucb"``.
        seed: Seed of the ensemble's own generator (picks are reproducible).
        cost_floor: USD below which a mean cost counts as this value.
        fallback: On :class:`LLMError` from the picked backend, try the others in score
            order before giving up.
    """

    def __init__(self, backends: Sequence[Any], weights: Sequence[float] | None = None, *,
                 strategy: str = "thompson", seed: int | None = 0, cost_floor: float = 1e-4,
                 fallback: bool = True) -> None:
        if not backends:
            raise ValueError("LLMEnsemble needs at least one backend")
        if weights is None:
            weights = [1.0] * len(backends)
        if len(weights) != len(backends):
            raise ValueError(f"{len(weights)} weights for {len(backends)} backends")
        if any(w < 0 or not math.isfinite(w) for w in weights) or not any(w > 0 for w in weights):
            raise ValueError(f"weights must be finite, >= 0 and not all 0, got {list(weights)}")
        if strategy not in ("thompson", "ucb"):
            raise ValueError(f"strategy must be 'thompson' or 'ucb', got {strategy!r}")
        self.strategy = strategy
        self.cost_floor = float(cost_floor)
        self.fallback = fallback
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._arms: list[_Arm] = []
        self._alias: dict[str, _Arm] = {}
        for b, w in zip(backends, weights, strict=True):
            key = str(getattr(b, "name", None) or getattr(b, "model", None) or type(b).__name__)
            if key in self._alias:
                key = f"{key}#{len(self._arms)}"
            arm = _Arm(b, key, float(w))
            self._arms.append(arm)
            self._alias[key] = arm
            model = getattr(b, "model", None)
            if isinstance(model, str):
                self._alias.setdefault(model, arm)

    @property
    def backends(self) -> list[Any]:
        """The member backends, in the order given."""
        return [a.backend for a in self._arms]

    @property
    def model(self) -> str:
        """Names of the members joined by ``+``."""
        return "+".join(a.key for a in self._arms)

    def _score(self, arm: _Arm, total: int) -> float:
        if arm.weight <= 0:
            return -math.inf
        mean_cost = max(arm.cost / arm.n if arm.n else 0.0, self.cost_floor)
        if self.strategy == "thompson":
            theta = float(self._rng.beta(1.0 + arm.reward, 1.0 + arm.n - arm.reward))
        else:
            if arm.n == 0:
                return math.inf
            theta = arm.reward / arm.n + math.sqrt(2.0 * math.log(max(total, 1)) / arm.n)
        return arm.weight * theta / mean_cost

    def ranking(self) -> list[str]:
        """Arm names in the order the next call would try them (draws from the bandit)."""
        with self._lock:
            total = sum(a.n for a in self._arms)
            scored = [(self._score(a, total), i) for i, a in enumerate(self._arms)]
        scored.sort(key=lambda t: (-t[0], t[1]))
        return [self._arms[i].key for s, i in scored if s != -math.inf]

    def complete(self, messages: Sequence[Message], **params: Any) -> Completion:
        """Answer with the backend the bandit picks (others as fallbacks on :class:`LLMError`).

        Raises:
            BudgetExceeded: from the member backends, never swallowed.
            LLMError: when the pick (and every fallback) failed.
        """
        order = self.ranking()
        if not self.fallback:
            order = order[:1]
        last: LLMError | None = None
        for key in order:
            arm = self._alias[key]
            try:
                c = arm.backend.complete(messages, **params)
            except BudgetExceeded:
                raise
            except LLMError as e:
                with self._lock:
                    arm.failures += 1
                    arm.n += 1
                log.warning("ensemble: %s failed (%s)%s", key, e, ", trying the next" if key != order[-1] else "")
                last = e
                continue
            with self._lock:
                arm.calls += 1
                if c.model and c.model not in self._alias:
                    self._alias[c.model] = arm
            if c.backend != key:
                c = Completion(**{**c.__dict__, "backend": key})
            return c
        assert last is not None
        raise last

    def report(self, model: str, improved: bool | float, cost: float = 0.0) -> None:
        """Tell the bandit how a proposal of ``model`` fared.

        Args:
            model: An arm name or a model id that arm answered as; unknown names are ignored
                (logged) so a stale record never breaks a run.
            improved: ``True``/``False`` or a reward in ``[0, 1]`` (clipped).
            cost: USD the proposal cost.
        """
        arm = self._alias.get(model)
        if arm is None:
            log.debug("ensemble.report: unknown model %r ignored", model)
            return
        r = float(improved)
        if not math.isfinite(r):
            r = 0.0
        with self._lock:
            arm.n += 1
            arm.reward += min(max(r, 0.0), 1.0)
            arm.cost += max(float(cost), 0.0)

    def stats(self) -> dict[str, dict[str, float]]:
        """Per arm: weight, reports, reward sum, cost sum, calls, failures."""
        with self._lock:
            return {a.key: {"weight": a.weight, "reports": a.n, "reward": a.reward, "cost": a.cost,
                            "calls": a.calls, "failures": a.failures} for a in self._arms}

    def usage(self) -> dict[str, dict[str, float]]:
        """Merged per-model token/cost usage of the members' ledgers."""
        out: dict[str, dict[str, float]] = {}
        seen: set[int] = set()
        for a in self._arms:
            ledger = getattr(a.backend, "ledger", None)
            if ledger is None or id(ledger) in seen:
                continue
            seen.add(id(ledger))
            for m, row in ledger.usage().items():
                acc = out.setdefault(m, {k: 0 for k in row})
                for k, v in row.items():
                    acc[k] = acc.get(k, 0) + v
        return out

    def __repr__(self) -> str:
        return f"LLMEnsemble({[a.key for a in self._arms]!r}, strategy={self.strategy!r})"

