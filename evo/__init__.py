"""The kernel factory's engine and core types.

Core types (importable without loading the engine):
    :mod:`evo.types`  Genome, Problem, Case, ArgSpec, Launch, DeviceInfo, Evaluation, Status,
                      Record, Lesson
    :mod:`evo.space`  ParamSpace, Choice, IntRange, FloatRange, Bool, Constraint, Condition,
                      NumericAxis, CategoricalAxis
    :mod:`evo.codec`  versioned msgpack codec

Engine (loaded lazily on first access):
    Engine, EngineConfig, Budget, Candidate

``import evo`` loads neither cupy nor the LLM SDKs.
"""

from __future__ import annotations

import importlib
from typing import Any

from evo.space import (
    Bool,
    CategoricalAxis,
    Choice,
    Condition,
    Constraint,
    FloatRange,
    IntRange,
    NumericAxis,
    ParamSpace,
    SpaceError,
)
from evo.types import (
    ArgSpec,
    Case,
    DeviceInfo,
    Evaluation,
    Genome,
    Launch,
    Lesson,
    Problem,
    ProblemError,
    Record,
    Status,
)

__version__ = "0.1.0"

_LAZY = {
    "Engine": "evo.engine",
    "EngineConfig": "evo.engine",
    "Budget": "evo.engine",
    "Candidate": "evo.engine",
}

__all__ = [
    "ArgSpec", "Bool", "Budget", "Candidate", "Case", "CategoricalAxis", "Choice", "Condition", "Constraint", "DeviceInfo",
    "Engine", "EngineConfig", "Evaluation", "FloatRange", "Genome", "IntRange", "Launch", "Lesson", "NumericAxis",
    "ParamSpace", "Problem", "ProblemError", "Record", "SpaceError", "Status", "__version__",
]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'evo' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value
