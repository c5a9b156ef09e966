"""Parameter spaces and descriptor axes.

A :class:`ParamSpace` is the set of tiling and code knobs a Problem lets the search
change (choices, integer and float ranges, booleans) plus named constraints that a
valid assignment must satisfy. Descriptor axes (:class:`NumericAxis`,
:class:`CategoricalAxis`) are the dimensions of the MAP-Elites grid.

This module depends on the standard library and numpy only, so every package may
import it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

ParamValue = Union[int, float, str, bool]

__all__ = [
    "Axis",
    "Bool",
    "CategoricalAxis",
    "Choice",
    "Condition",
    "Constraint",
    "FloatRange",
    "IntRange",
    "NumericAxis",
    "Param",
    "ParamSpace",
    "ParamValue",
    "SpaceError",
]


class SpaceError(ValueError):
    """A parameter assignment or descriptor that does not fit its space."""


@dataclass(frozen=True)
class Choice:
    """A parameter that takes one of an explicit, ordered list of values.

    Order matters: mutation moves to a neighbouring value more often than to a far one.

    ``default`` (optional, one of ``values``): the value of a genome that lacks the param,
    i.e. one made before the knob existed (a warm start from an older archive fills it in);
    it should be the value under which the kernel behaves as it did then.
    """

    values: tuple[ParamValue, ...]
    default: ParamValue | None

    def __init__(self, values: Iterable[ParamValue], default: ParamValue | None = None) -> None:
        vals = tuple(values)
        if not vals:
            raise SpaceError("Choice needs at least one value")
        object.__setattr__(self, "values", vals)
        object.__setattr__(self, "default", default)
        if default is not None and not self.contains(default):
            raise SpaceError(f"Choice default {default!r} is not one of its values {list(vals)}")

    def contains(self, value: Any) -> bool:
        # bool is an int subclass: True must not match 1, nor 1 match True.
        return any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in self.values)

    def sample(self, rng: np.random.Generator) -> ParamValue:
        return self.values[int(rng.integers(len(self.values)))]

    def neighbours(self, value: ParamValue) -> list[ParamValue]:
        if value not in self.values:
            return list(self.values)
        i = self.values.index(value)
        return [self.values[j] for j in (i - 1, i + 1) if 0 <= j < len(self.values)]

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "choice", "values": list(self.values)}
        if self.default is not None:
            out["default"] = self.default
        return out


@dataclass(frozen=True)
class IntRange:
    """An integer in ``[low, high]`` (inclusive) on a grid of ``step``, optionally log-spaced."""

    low: int
    high: int
    step: int = 1
    log: bool = False

    def __post_init__(self) -> None:
        if self.high < self.low:
            raise SpaceError(f"IntRange high {self.high} < low {self.low}")
        if self.step < 1:
            raise SpaceError(f"IntRange step must be >= 1, got {self.step}")
        if self.log and self.low < 1:
            raise SpaceError("a log IntRange needs low >= 1")

    def contains(self, value: Any) -> bool:
        return (
            isinstance(value, (int, np.integer))
            and not isinstance(value, bool)
            and self.low <= int(value) <= self.high
            and (int(value) - self.low) % self.step == 0
        )

    def clip(self, value: float) -> int:
        v = min(max(int(round(value)), self.low), self.high)
        return self.low + ((v - self.low) // self.step) * self.step

    def sample(self, rng: np.random.Generator) -> int:
        if self.log:
            v = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
            return self.clip(v)
        n = (self.high - self.low) // self.step
        return self.low + int(rng.integers(n + 1)) * self.step

    def neighbours(self, value: int) -> list[int]:
        if self.log:
            cands = [self.clip(value / 2), self.clip(value * 2)]
        else:
            cands = [value - self.step, value + self.step]
        return [c for c in cands if self.contains(c) and c != value]

    def describe(self) -> dict[str, Any]:
        return {"kind": "int", "low": self.low, "high": self.high, "step": self.step, "log": self.log}


@dataclass(frozen=True)
class FloatRange:
    """A float in ``[low, high]``."""

    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not (self.high >= self.low):
            raise SpaceError(f"FloatRange high {self.high} < low {self.low}")

    def contains(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and self.low <= value <= self.high

    def sample(self, rng: np.random.Generator) -> float:
        if self.log:
            return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return float(rng.uniform(self.low, self.high))

    def neighbours(self, value: float) -> list[float]:
        d = (self.high - self.low) * 0.1
        return [v for v in (value - d, value + d) if self.low <= v <= self.high]

    def describe(self) -> dict[str, Any]:
        return {"kind": "float", "low": self.low, "high": self.high, "log": self.log}


@dataclass(frozen=True)
class Bool:
    """A boolean switch."""

    def contains(self, value: Any) -> bool:
        return isinstance(value, (bool, np.bool_))

    def sample(self, rng: np.random.Generator) -> bool:
        return bool(rng.integers(2))

    def neighbours(self, value: bool) -> list[bool]:
        return [not value]

    def describe(self) -> dict[str, Any]:
        return {"kind": "bool"}


Param = Union[Choice, IntRange, FloatRange, Bool]


@dataclass(frozen=True)
class Constraint:
    """A named predicate over a full parameter assignment.

    Args:
        description: Human-readable rule, e.g. ``"threads is a multiple of 32"``. It is
            part of the Problem's fingerprint and is shown in rejection messages.
        check: ``check(params) -> bool``; must be a top-level (picklable) function when the
            Problem travels to worker processes.
    """

    description: str
    check: Callable[[Mapping[str, Any]], bool]

    def __call__(self, params: Mapping[str, Any]) -> bool:
        try:
            return bool(self.check(params))
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return False


@dataclass(frozen=True)
class Condition:
    """When a param matters: outside ``active(params)`` it changes neither code nor launch.

    A conditional (inactive) param, as in ConfigSpace or Optuna's define-by-run spaces: e.g.
    a pipeline depth that only one code path reads. :meth:`ParamSpace.canonical` sets an
    inactive param to ``default``, so genomes that differ only there are one genome, one
    record and one GPU evaluation; mutation operators leave inactive params alone.

    Args:
        param: The conditional param's name.
        active: ``active(params) -> bool``; reads only params that are themselves
            unconditional. Must be a top-level (picklable) function when the Problem
            travels to worker processes.
        default: The value an inactive ``param`` takes (one of its allowed values).
        description: Human-readable rule, e.g. ``"PIPE only with STAGE 3"``.
    """

    param: str
    active: Callable[[Mapping[str, Any]], bool]
    default: ParamValue
    description: str = ""

    def __call__(self, params: Mapping[str, Any]) -> bool:
        try:
            return bool(self.active(params))
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return True  # unknown: treat the param as one that matters


@dataclass(frozen=True)
class ParamSpace:
    """The knobs a Problem exposes, the rules a valid assignment follows, and which knobs
    matter when (:class:`Condition`)."""

    params: Mapping[str, Param] = field(default_factory=dict)
    constraints: tuple[Constraint, ...] = ()
    conditions: tuple[Condition, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", dict(self.params))
        object.__setattr__(self, "constraints", tuple(self.constraints))
        object.__setattr__(self, "conditions", tuple(self.conditions))
        seen: set[str] = set()
        for c in self.conditions:
            if c.param not in self.params:
                raise SpaceError(f"condition on unknown param {c.param!r} (known: {', '.join(sorted(self.params))})")
            if c.param in seen:
                raise SpaceError(f"param {c.param!r} has two conditions; combine them in one active() function")
            seen.add(c.param)
            if not self.params[c.param].contains(c.default):
                raise SpaceError(f"condition on {c.param!r}: default {c.default!r} is outside "
                                 f"{self.params[c.param].describe()}")

    def active(self, values: Mapping[str, Any]) -> list[str]:
        """Names of the params that matter for ``values`` (all but the inactive conditional ones)."""
        off = {c.param for c in self.conditions if not c(values)}
        return [name for name in self.params if name not in off]

    def canonical(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` with every inactive conditional param set to its condition's default.

        Conditions are judged on ``values`` as given (they read unconditional params only).
        Two assignments with the same canonical form compile and launch the same way.
        """
        out = dict(values)
        for c in self.conditions:
            if c.param in out and not c(values):
                out[c.param] = c.default
        return out

    def __contains__(self, name: object) -> bool:
        return name in self.params

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)

    def violations(self, values: Mapping[str, Any]) -> list[str]:
        """Every reason ``values`` is not a valid assignment (empty when valid)."""
        out: list[str] = []
        for name, spec in self.params.items():
            if name not in values:
                out.append(f"missing param {name!r}")
            elif not spec.contains(values[name]):
                out.append(f"param {name}={values[name]!r} is outside {spec.describe()}")
        for name in values:
            if name not in self.params:
                out.append(f"unknown param {name!r} (known: {', '.join(sorted(self.params))})")
        if not out:
            out.extend(f"violates constraint: {c.description}" for c in self.constraints if not c(values))
        return out

    def is_valid(self, values: Mapping[str, Any]) -> bool:
        return not self.violations(values)

    def validate(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Return ``values`` as a plain dict or raise :class:`SpaceError` listing every problem."""
        bad = self.violations(values)
        if bad:
            raise SpaceError("; ".join(bad))
        return dict(values)

    def sample(self, rng: np.random.Generator, max_tries: int = 1000) -> dict[str, Any]:
        """Draw a random valid assignment (rejection sampling against the constraints)."""
        for _ in range(max_tries):
            cand = {name: spec.sample(rng) for name, spec in self.params.items()}
            if self.is_valid(cand):
                return cand
        raise SpaceError(f"no valid assignment found in {max_tries} draws; are the constraints satisfiable?")

    def describe(self) -> dict[str, Any]:
        """A plain, deterministic description (used in fingerprints and prompts).

        Conditions are left out: they change which genomes count as one, not what a genome
        means or how it is scored, so an archive stays resumable when they are added.
        """
        return {
            "params": {k: self.params[k].describe() for k in sorted(self.params)},
            "constraints": [c.description for c in self.constraints],
        }


@dataclass(frozen=True)
class NumericAxis:
    """A descriptor axis over ``[low, high)`` split into ``bins`` equal bins.

    Values below ``low`` fall in the first bin and values at or above ``high`` in the last,
    so a record is never lost to the grid because of a slightly wide descriptor.

    Args:
        name: The descriptor's name.
        low: Lower bound.
        high: Upper bound.
        bins: Number of bins.
        source: Where the value comes from: ``"params"``, ``"resources"`` or ``"metrics"``
            (a top-level numeric metric). Defaults to looking in that order.
    """

    name: str
    low: float
    high: float
    bins: int
    source: str | None = None

    def __post_init__(self) -> None:
        if self.bins < 1 or not (self.high > self.low):
            raise SpaceError(f"axis {self.name!r}: needs bins >= 1 and high > low")

    def index(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise SpaceError(f"descriptor {self.name}={value!r} is not a number")
        v = float(value)
        if math.isnan(v):
            raise SpaceError(f"descriptor {self.name} is NaN")
        i = int((v - self.low) / (self.high - self.low) * self.bins)
        return min(max(i, 0), self.bins - 1)

    @property
    def size(self) -> int:
        return self.bins

    def label(self, i: int) -> str:
        w = (self.high - self.low) / self.bins
        return f"[{self.low + i * w:g},{self.low + (i + 1) * w:g})"

    def describe(self) -> dict[str, Any]:
        return {"kind": "numeric", "name": self.name, "low": self.low, "high": self.high, "bins": self.bins,
                "source": self.source}


@dataclass(frozen=True)
class CategoricalAxis:
    """A descriptor axis over a fixed list of categories."""

    name: str
    values: tuple[Any, ...]
    source: str | None = None

    def __init__(self, name: str, values: Sequence[Any], source: str | None = None) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "values", tuple(values))
        object.__setattr__(self, "source", source)
        if not self.values:
            raise SpaceError(f"axis {name!r}: needs at least one category")

    def index(self, value: Any) -> int:
        for i, v in enumerate(self.values):
            if v == value and type(v) is type(value):
                return i
        for i, v in enumerate(self.values):
            if v == value:
                return i
        raise SpaceError(f"descriptor {self.name}={value!r} is not one of {list(self.values)}")

    @property
    def size(self) -> int:
        return len(self.values)

    def label(self, i: int) -> str:
        return str(self.values[i])

    def describe(self) -> dict[str, Any]:
        return {"kind": "categorical", "name": self.name, "values": list(self.values), "source": self.source}


Axis = Union[NumericAxis, CategoricalAxis]
