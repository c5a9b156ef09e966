"""The operator registry: names, instances, classes and plain functions to operators.

:func:`resolve` is the one place the engine turns what the user passed into an
:class:`~operators.Operator`. It accepts

* a registered name (:func:`register`), a built-in name (``"param_mutation"``,
  ``"param_crossover"``, ``"param_random"``, ``"param_sweep"``, ``"screened_param_mutation"``
  (:class:`~operators.Screened` around a param mutation), and the LLM operators ``"llm_diff"``,
  ``"llm_rewrite"``, ``"llm_crossover"``, ``"llm_repair"``, imported only when asked
  for), or the name of an entry point in the ``evo.operators`` group of any installed
  distribution;
* an :class:`Operator` instance (returned as is) or subclass (instantiated);
* a plain function ``f(parents, ctx) -> list[Genome | Proposal]``, wrapped in a
  :class:`FunctionOperator`.

What a name stands for (a registry entry or an entry point) may be an Operator
subclass, an Operator instance, a zero-argument factory returning an Operator, or a
propose function (a callable that takes ``(parents, ctx)``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from evo.types import Genome, Record
from operators._base import Operator, OperatorContext, Proposal

__all__ = ["ENTRY_POINT_GROUP", "FunctionOperator", "UnknownOperatorError", "available", "register", "resolve",
           "unregister"]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "evo.operators"

T = TypeVar("T")

_lock = threading.RLock()
_registry: dict[str, Any] = {}

# Built-ins: name -> (module, attribute), imported when first resolved.
_BUILTIN: dict[str, tuple[str, str]] = {
    "param_mutation": ("operators._param", "ParamMutation"),
    "param_crossover": ("operators._param", "ParamCrossover"),
    "param_random": ("operators._param", "ParamRandom"),
    "param_sweep": ("operators._param", "ParamSweep"),
    "screened_param_mutation": ("operators._screen", "Screened"),
    "llm_diff": ("operators.llm", "LLMDiff"),
    "llm_rewrite": ("operators.llm", "LLMRewrite"),
    "llm_crossover": ("operators.llm", "LLMCrossover"),
    "llm_repair": ("operators.llm", "LLMRepair"),
}


class UnknownOperatorError(KeyError):
    """A name that is neither registered, built in, nor an ``evo.operators`` entry point."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class FunctionOperator(Operator):
    """An operator made from a plain function ``fn(parents, ctx) -> children``.

    ``fn`` may return a list of :class:`Genome` / :class:`Proposal`, a single one, or
    ``None`` (no children). Anything else is a programming error (``TypeError``).

    Args:
        fn: The propose function.
        name: Operator name; defaults to ``fn.__name__``.
        n_parents: Parents it takes; defaults to ``fn.n_parents`` if set, else 1.
        uses_failed_parents: Defaults to ``fn.uses_failed_parents`` if set, else False.
    """

    name = "function"

    def __init__(self, fn: Callable[[Sequence[Record], OperatorContext], Any], *, name: str | None = None,
                 n_parents: int | None = None, uses_failed_parents: bool | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"FunctionOperator needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__  # type: ignore[misc]
        if self.name == "<lambda>":
            self.name = "lambda"  # type: ignore[misc]
        n = n_parents if n_parents is not None else getattr(fn, "n_parents", 1)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"n_parents of operator {self.name!r} must be an int >= 0, got {n!r}")
        self.n_parents = n  # type: ignore[misc]
        ufp = uses_failed_parents if uses_failed_parents is not None else getattr(fn, "uses_failed_parents", False)
        self.uses_failed_parents = bool(ufp)  # type: ignore[misc]

    def propose(self, parents: Sequence[Record], ctx: OperatorContext) -> list[Proposal | Genome]:
        """Call the function and check what it returned."""
        out = self.fn(parents, ctx)
        if out is None:
            return []
        if isinstance(out, (Genome, Proposal)):
            return [out]
        if isinstance(out, (str, bytes)) or not hasattr(out, "__iter__"):
            raise TypeError(f"operator {self.name!r} returned {type(out).__name__}; "
                            "return a list of Genome or Proposal")
        items = list(out)
        for item in items:
            if not isinstance(item, (Genome, Proposal)):
                raise TypeError(f"operator {self.name!r} returned a {type(item).__name__} among its children; "
                                "return Genome or Proposal objects")
        return items

    def __repr__(self) -> str:
        return f"FunctionOperator({self.name!r}, n_parents={self.n_parents})"


def _is_factory(fn: Callable[..., Any]) -> bool:
    """True when ``fn`` can be called with no arguments (a factory), False for ``f(parents, ctx)``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty:
            return False
    return True


def _materialize(obj: Any, name: str | None, *, n_parents: int | None = None, options: dict[str, Any] | None = None,
                 origin: str = "") -> Operator:
    """Turn a class, instance, factory or propose function into an Operator."""
    options = options or {}
    where = f" ({origin})" if origin else ""
    if isinstance(obj, Operator):
        if options:
            raise TypeError(f"options {sorted(options)} cannot be applied to the ready-made operator "
                            f"{obj!r}{where}; pass a class or a registered name instead")
        return obj
    if isinstance(obj, type):
        if not issubclass(obj, Operator):
            raise TypeError(f"{obj.__qualname__}{where} is a class but not an operators.Operator subclass")
        if inspect.isabstract(obj):
            raise TypeError(f"{obj.__qualname__}{where} is abstract: implement propose(parents, ctx)")
        op = obj(**options)
        if name and op.name != name:
            op.name = name  # type: ignore[misc]
        return op
    if callable(obj):
        if _is_factory(obj):
            made = obj(**options)
            if not isinstance(made, Operator):
                raise TypeError(f"factory {getattr(obj, '__qualname__', obj)!r}{where} returned "
                                f"{type(made).__name__}, expected an operators.Operator")
            if name and made.name != name:
                made.name = name  # type: ignore[misc]
            return made
        if options:
            raise TypeError(f"options {sorted(options)} cannot be applied to the propose function "
                            f"{getattr(obj, '__qualname__', obj)!r}{where}")
        return FunctionOperator(obj, name=name, n_parents=n_parents)
    raise TypeError(f"cannot make an operator from {type(obj).__name__}{where}: pass a name, an Operator "
                    "instance or subclass, or a function f(parents, ctx)")


def register(name: str, factory: Any = None, *, replace: bool = False) -> Any:
    """Register an operator under ``name``.

    Usable directly (``register("x", MyOp)``) or as a decorator on a class, a factory
    or a propose function (``@register("x")``); the decorated object is returned
    unchanged.

    Args:
        name: The name :func:`resolve` will accept. Registered names win over built-ins
            and entry points.
        factory: An Operator subclass, an Operator instance, a zero-argument factory
            returning an Operator, or a propose function ``f(parents, ctx)``.
        replace: Allow replacing a different object already registered under ``name``.

    Returns:
        ``factory`` (or, without it, a decorator that registers and returns its argument).

    Raises:
        ValueError: ``name`` is empty or already registered to something else.
        TypeError: ``factory`` cannot become an operator.
    """
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ValueError(f"operator name must be a non-empty string without surrounding spaces, got {name!r}")

    def deco(obj: T) -> T:
        if not (isinstance(obj, Operator) or callable(obj)):
            raise TypeError(f"register({name!r}, ...) needs an Operator subclass, instance, factory or function, "
                            f"got {type(obj).__name__}")
        if isinstance(obj, type) and not issubclass(obj, Operator):
            raise TypeError(f"register({name!r}, {obj.__qualname__}): the class is not an operators.Operator subclass")
        with _lock:
            old = _registry.get(name)
            if old is not None and old is not obj and not replace:
                raise ValueError(f"operator name {name!r} is already registered to {old!r}; "
                                 "pass replace=True or pick another name")
            _registry[name] = obj
        return obj

    if factory is None:
        return deco
    return deco(factory)


def unregister(name: str) -> None:
    """Remove a name added with :func:`register` (``KeyError`` if it was not registered)."""
    with _lock:
        del _registry[name]


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in found and found[ep.name].value != ep.value:
            log.warning("entry point %r in group %r is defined twice (%s and %s); using the first",
                        ep.name, ENTRY_POINT_GROUP, found[ep.name].value, ep.value)
            continue
        found.setdefault(ep.name, ep)
    return found


def available() -> list[str]:
    """Every name :func:`resolve` accepts: registered, built-in and entry points (sorted).

    Nothing is imported: the LLM operators and entry points are listed by name only.
    """
    with _lock:
        names = set(_registry) | set(_BUILTIN)
    names |= set(_entry_points())
    return sorted(names)


def _lookup(name: str) -> tuple[Any, str]:
    with _lock:
        if name in _registry:
            return _registry[name], "registered"
    if name in _BUILTIN:
        module, attr = _BUILTIN[name]
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            raise ImportError(f"operator {name!r} lives in {module}, which failed to import: {e}. "
                              "The LLM operators need the 'llm' extra: pip install 'ptx-kernel-factory[llm]'") from e
        return getattr(mod, attr), f"built-in {module}.{attr}"
    eps = _entry_points()
    if name in eps:
        ep = eps[name]
        dist = getattr(getattr(ep, "dist", None), "name", "?")
        origin = f"entry point {name} = {ep.value} of distribution {dist}"
        try:
            return ep.load(), origin
        except Exception as e:
            raise ImportError(f"could not load operator {name!r} from {origin}: {type(e).__name__}: {e}") from e
    raise UnknownOperatorError(
        f"unknown operator {name!r}; available: {', '.join(available())}. Register one with "
        f"operators.register({name!r}, MyOperator) or an entry point in group {ENTRY_POINT_GROUP!r}"
    )


def resolve(spec: Any, *, n_parents: int | None = None, **options: Any) -> Operator:
    """Turn a name, an Operator (instance or class) or a propose function into an Operator.

    Args:
        spec: A name (registered, built-in or an ``evo.operators`` entry point), an
            :class:`Operator` instance or subclass, or a function ``f(parents, ctx)``.
        n_parents: For a propose function: parents it takes (default ``f.n_parents`` or 1).
        **options: Constructor arguments when ``spec`` names or is a class/factory,
            e.g. ``resolve("param_mutation", n_changes=2)``.

    Returns:
        An operator. A class or factory resolved by name gets that name as its ``name``.

    Raises:
        UnknownOperatorError: (a ``KeyError``) for an unknown name; the message lists
            the available names.
        ImportError: The module behind a name failed to import.
        TypeError: ``spec`` cannot become an operator.
    """
    if isinstance(spec, str):
        obj, origin = _lookup(spec)
        return _materialize(obj, spec, n_parents=n_parents, options=options, origin=origin)
    return _materialize(spec, None, n_parents=n_parents, options=options)
