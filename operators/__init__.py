"""Operators: how new genomes are proposed.

API index:
    Operator, OperatorContext, OperatorError, Proposal  the operator contract (``_base``)
    resolve(spec, *, n_parents=None, **options)         name / instance / class / function -> Operator
    register(name, factory=None, *, replace=False)      add a name (also a decorator)
    unregister(name), available()                       remove a name; every name resolve accepts
    FunctionOperator, UnknownOperatorError               a function as an operator; unknown-name error
    ENTRY_POINT_GROUP                                    ``"evo.operators"``, where plug-ins register
    ParamMutation, ParamCrossover, ParamRandom           parameter operators over ``Problem.params``
    ParamSweep                                           one-knob neighbours not in the archive (local search)
    Screened, ParamSurrogate                             a pool of children screened by a model of measured times
    param_diff(old, new)                                 ``"threads 256->512, vec 4->8"``
    operators.testing.OperatorContract                   test suite any operator can be run through

Imported lazily from :mod:`operators.llm` on first access (so ``import operators`` loads
neither openai nor anthropic): LLMDiff, LLMRewrite, LLMCrossover, LLMRepair,
OpenAIBackend, AnthropicBackend, LLMEnsemble, Completion, from_env, BudgetExceeded.

Plug-ins: see ``docs/plugins.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

from operators._base import Operator, OperatorContext, OperatorError, Proposal
from operators._param import ParamCrossover, ParamMutation, ParamRandom, ParamSweep, param_diff
from operators._registry import (
    ENTRY_POINT_GROUP,
    FunctionOperator,
    UnknownOperatorError,
    available,
    register,
    resolve,
    unregister,
)
from operators._screen import ParamSurrogate, Screened

_LAZY_LLM = (
    "LLMDiff",
    "LLMRewrite",
    "LLMCrossover",
    "LLMRepair",
    "OpenAIBackend",
    "AnthropicBackend",
    "LLMEnsemble",
    "Completion",
    "from_env",
    "BudgetExceeded",
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "FunctionOperator",
    "Operator",
    "OperatorContext",
    "OperatorError",
    "ParamCrossover",
    "ParamMutation",
    "ParamRandom",
    "ParamSurrogate",
    "ParamSweep",
    "Proposal",
    "Screened",
    "UnknownOperatorError",
    "available",
    "param_diff",
    "register",
    "resolve",
    "unregister",
    *_LAZY_LLM,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_LLM:
        llm = importlib.import_module("operators.llm")
        try:
            value = getattr(llm, name)
        except AttributeError:
            raise AttributeError(f"operators.llm does not define {name!r}") from None
        globals()[name] = value
        return value
    raise AttributeError(f"module 'operators' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_LLM))
