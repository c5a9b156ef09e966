"""Parameter operators: mutation, uniform crossover, fresh random draws and a one-knob sweep over a ParamSpace.

They change only ``genome.params`` (never the source) and hand back children that are
valid in ``ctx.problem.params``: a child that breaks a range or a constraint is
*repaired* (the offending params are drawn again, a bounded number of times) or, when
that fails, *rejected* with an :class:`~operators.OperatorError` that names the violated
rules. A child is never a copy of its parent: a no-op move is not a proposal.

Which params a constraint depends on is found by calling it on a mapping that records
the keys it reads, so repair re-draws just those (and first those the move itself did
not choose, so the intended change survives when it can).

Every random choice comes from ``ctx.rng``; the same seed gives the same children.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from evo.space import Constraint, ParamSpace
from evo.types import Genome, Record, thaw
from operators._base import Operator, OperatorContext, OperatorError, Proposal

__all__ = ["ParamCrossover", "ParamMutation", "ParamRandom", "ParamSweep", "param_diff"]

_MISSING = object()


# --------------------------------------------------------------------------- helpers


def _fmt(value: Any) -> str:
    if value is _MISSING:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def _same(a: Any, b: Any) -> bool:
    """Equality that keeps ``True`` apart from ``1`` and treats NaN as equal to NaN."""
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _same_params(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)


def param_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """A readable one-line diff of two param assignments.

    Changed keys read ``name old->new``; keys only in ``new`` read ``name (unset)->new``
    and keys only in ``old`` read ``name old->(unset)``. Keys appear in ``old``'s order,
    then the keys new in ``new``.

    Args:
        old: The parent's params.
        new: The child's params.

    Returns:
        For example ``"threads 256->512, vec 4->8"``; ``"no param change"`` when equal.
    """
    parts: list[str] = []
    keys = list(old) + [k for k in new if k not in old]
    for k in keys:
        a = old[k] if k in old else _MISSING
        b = new[k] if k in new else _MISSING
        if a is _MISSING or b is _MISSING or not _same(a, b):
            parts.append(f"{k} {_fmt(a)}->{_fmt(b)}")
    return ", ".join(parts) if parts else "no param change"


def _changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, list[Any]]:
    """``{name: [old, new]}`` for every changed key (plain data for ``Proposal.meta``)."""
    out: dict[str, list[Any]] = {}
    for k in list(old) + [k for k in new if k not in old]:
        a, b = old.get(k), new.get(k)
        if k not in old or k not in new or not _same(a, b):
            out[k] = [thaw(a), thaw(b)]
    return out


class _ReadRecorder(Mapping[str, Any]):
    """A read-only view of params that remembers which keys were read."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = data
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return self._data[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def _constraint_keys(constraint: Constraint, params: Mapping[str, Any], space: ParamSpace) -> set[str]:
    """The params ``constraint`` reads when checked on ``params`` (all params if unknown)."""
    rec = _ReadRecorder(params)
    try:
        constraint.check(rec)
    except Exception:  # a failing check still tells us what it read
        pass
    keys = {k for k in rec.read if k in space.params}
    return keys or set(space.params)


def _offending(space: ParamSpace, params: Mapping[str, Any]) -> tuple[set[str], list[str]]:
    """Params to re-draw and the violated rules (empty when ``params`` is valid)."""
    bad: set[str] = set()
    rules: list[str] = []
    for name, spec in space.params.items():
        if name not in params:
            bad.add(name)
            rules.append(f"missing param {name!r}")
        elif not spec.contains(params[name]):
            bad.add(name)
            rules.append(f"param {name}={params[name]!r} is outside {spec.describe()}")
    if rules:
        return bad, rules
    for c in space.constraints:
        if not c(params):
            bad |= _constraint_keys(c, params, space)
            rules.append(f"violates constraint: {c.description}")
    return bad, rules


def _mutable(space: ParamSpace) -> list[str]:
    """Params that can take more than one value."""
    out = []
    for name, spec in space.params.items():
        d = spec.describe()
        if d["kind"] == "choice" and len(d["values"]) < 2:
            continue
        if d["kind"] in ("int", "float") and not d["high"] > d["low"]:
            continue
        out.append(name)
    return out


def _draw_other(spec: Any, current: Any, rng: np.random.Generator, p_neighbour: float, tries: int = 16) -> Any:
    """A value of ``spec`` different from ``current``: a neighbour with ``p_neighbour``, else a random draw."""
    if current is not _MISSING and rng.random() < p_neighbour:
        try:
            near = [v for v in spec.neighbours(current) if spec.contains(v) and not _same(v, current)]
        except (TypeError, ValueError):
            near = []
        if near:
            return near[int(rng.integers(len(near)))]
    for _ in range(tries):
        v = spec.sample(rng)
        if current is _MISSING or not _same(v, current):
            return v
    return spec.sample(rng)


def _start(space: ParamSpace, genome: Genome, rng: np.random.Generator, role: str) -> dict[str, Any]:
    """The parent's params as a plain dict, missing params drawn; unknown params are an error."""
    params = thaw(genome.params)
    unknown = [k for k in params if k not in space.params]
    if unknown:
        raise OperatorError(
            f"{role} {genome.id[:12]} has params {unknown} that the problem's ParamSpace does not define "
            f"(known: {', '.join(sorted(space.params)) or 'none'}); add them to Problem.params or drop them from the genome"
        )
    for name, spec in space.params.items():
        if name not in params:
            params[name] = spec.sample(rng)
    return params


def _repair(
    space: ParamSpace,
    child: dict[str, Any],
    rng: np.random.Generator,
    *,
    protect: set[str],
    tries: int,
    choices: Mapping[str, Sequence[Any]] | None = None,
) -> tuple[dict[str, Any] | None, list[str], set[str]]:
    """Re-draw offending params until ``child`` is valid.

    The first three quarters of the tries leave ``protect`` (the params the move
    chose) alone; the rest may re-draw those too. With ``choices``, a key is drawn from
    its listed values (a crossover's parent values) in that first phase, then from the
    whole range.

    Returns:
        ``(valid child or None, the rules ``child`` violated (for messages), keys re-drawn)``.
    """
    bad, first_rules = _offending(space, child)
    if not first_rules:
        return child, [], set()
    redrawn: set[str] = set()
    current = dict(child)
    phase = (tries * 3) // 4
    for attempt in range(tries):
        bad, rules = _offending(space, current)
        if not rules:
            return current, first_rules, redrawn
        keys = [k for k in space.params if k in bad and (attempt >= phase or k not in protect)]
        if not keys:
            keys = [k for k in space.params if k in bad]
        for k in keys:
            opts = [v for v in (choices or {}).get(k, ()) if space.params[k].contains(v)]
            if opts and attempt < phase:
                current[k] = opts[int(rng.integers(len(opts)))]
            else:
                current[k] = space.params[k].sample(rng)
            redrawn.add(k)
    bad, rules = _offending(space, current)
    if not rules:
        return current, first_rules, redrawn
    return None, list(dict.fromkeys(first_rules + rules)), redrawn


def _reject(op: str, parent_ids: Sequence[str], rules: Sequence[str], tries: int) -> OperatorError:
    unique = list(dict.fromkeys(rules)) or ["no child could be made"]
    return OperatorError(
        f"{op}: no valid child of {', '.join(p[:12] for p in parent_ids)} after {tries} attempts; "
        f"violated: {'; '.join(unique)}. Loosen the constraints or widen the param ranges."
    )


def _space(ctx: OperatorContext, op: str) -> ParamSpace:
    space = ctx.problem.params
    if not isinstance(space, ParamSpace):
        raise TypeError(f"{op}: ctx.problem.params must be an evo.space.ParamSpace, got {type(space).__name__}")
    return space


def _check_parents(op: Operator, parents: Sequence[Record]) -> None:
    if len(parents) < op.n_parents:
        raise ValueError(f"{op.name} takes {op.n_parents} parent(s), got {len(parents)}")


# --------------------------------------------------------------------------- operators


class ParamMutation(Operator):
    """Change one to ``n_changes`` params of one parent.

    Each changed param moves to a neighbouring value (the next choice, a step or a
    doubling of an int range, a tenth of a float range, the other bool) with probability
    ``p_neighbour``, else to a random draw from its range. Invalid children are repaired
    by re-drawing the params behind each violated rule; when ``max_tries`` attempts all
    fail the operator raises :class:`OperatorError` naming the violated rules.

    Args:
        n_changes: Most params changed per child; each child changes ``k`` params with
            ``k`` drawn uniformly from ``1..n_changes`` (capped at the mutable params).
        p_neighbour: Probability of a neighbouring value rather than a random one.
        n_children: Children per call (distinct; fewer if the space runs out).
        max_tries: Attempts (each with its own repair) before giving up.
        repair: ``False`` rejects an invalid child at once instead of repairing it.
    """

    name = "param_mutation"
    n_parents = 1
    cost_weight = 0.05

    def __init__(self, n_changes: int = 1, p_neighbour: float = 0.7, *, n_children: int = 1,
                 max_tries: int = 32, repair: bool = True) -> None:
        if int(n_changes) < 1:
            raise ValueError(f"n_changes must be >= 1, got {n_changes}")
        if not 0.0 <= float(p_neighbour) <= 1.0:
            raise ValueError(f"p_neighbour must be in [0, 1], got {p_neighbour}")
        if int(n_children) < 1 or int(max_tries) < 1:
            raise ValueError("n_children and max_tries must be >= 1")
        self.n_changes = int(n_changes)
        self.p_neighbour = float(p_neighbour)
        self.n_children = int(n_children)
        self.max_tries = int(max_tries)
        self.repair = bool(repair)

    def __repr__(self) -> str:
        return (f"ParamMutation(n_changes={self.n_changes}, p_neighbour={self.p_neighbour}, "
                f"n_children={self.n_children})")

    def propose(self, parents: Sequence[Record], ctx: OperatorContext) -> list[Proposal | Genome]:
        """Mutate ``parents[0]``'s params; see the class docstring."""
        _check_parents(self, parents)
        space = _space(ctx, self.name)
        rng = ctx.rng
        parent = parents[0].genome
        original = thaw(parent.params)
        base = _start(space, parent, rng, "parent")
        active = set(space.active(base))  # a change of an inactive knob would be the parent again
        mutable = [n for n in _mutable(space) if n in active]
        if not mutable:
            raise OperatorError(f"{self.name}: no param of the problem can take more than one value")
        out: list[Proposal | Genome] = []
        seen: set[str] = {parent.id}
        why: dict[str, None] = {}
        for _ in range(self.max_tries * self.n_children):
            if len(out) >= self.n_children:
                break
            k = min(int(rng.integers(1, self.n_changes + 1)), len(mutable))
            picked = [mutable[i] for i in sorted(rng.choice(len(mutable), size=k, replace=False).tolist())]
            child = dict(base)
            for name in picked:
                child[name] = _draw_other(space.params[name], base[name], rng, self.p_neighbour)
            if self.repair:
                fixed, rules, redrawn = _repair(space, child, rng, protect=set(picked), tries=12)
                why.update(dict.fromkeys(rules))
            else:
                _, rules = _offending(space, child)
                if rules:
                    raise _reject(self.name, [parent.id], rules, 1)
                fixed, redrawn = child, set()
            if fixed is None:
                continue
            g = Genome(parent.source, fixed, parent.entry, parent.language)
            if g.id in seen:
                why["the change (after repair) led back to the parent or to a child already proposed"] = None
                continue
            seen.add(g.id)
            out.append(Proposal(g, note=param_diff(original, fixed),
                                meta={"changes": _changes(original, fixed), "repaired": sorted(redrawn)}))
        if not out:
            raise _reject(self.name, [parent.id], list(why), self.max_tries)
        return out


class ParamCrossover(Operator):
    """Uniform per-key crossover of two parents' params.

    The child keeps the first parent's source, entry and language and takes each param
    from either parent with probability ``1 - bias`` / ``bias`` (so ``bias=0.5`` is
    uniform). A child equal to either parent is drawn again; an invalid child is
    repaired, first from the two parents' values of the offending params, then from
    the whole range. Parents with the same params give :class:`OperatorError`.

    Args:
        bias: Probability that a param comes from the second parent.
        max_tries: Attempts before giving up.
        repair: ``False`` rejects an invalid child at once instead of repairing it.
    """

    name = "param_crossover"
    n_parents = 2
    cost_weight = 0.05

    def __init__(self, bias: float = 0.5, *, max_tries: int = 32, repair: bool = True) -> None:
        if not 0.0 < float(bias) < 1.0:
            raise ValueError(f"bias must be in (0, 1), got {bias}")
        if int(max_tries) < 1:
            raise ValueError("max_tries must be >= 1")
        self.bias = float(bias)
        self.max_tries = int(max_tries)
        self.repair = bool(repair)

    def __repr__(self) -> str:
        return f"ParamCrossover(bias={self.bias})"

    def propose(self, parents: Sequence[Record], ctx: OperatorContext) -> list[Proposal | Genome]:
        """Cross ``parents[0]`` and ``parents[1]``; see the class docstring."""
        _check_parents(self, parents)
        space = _space(ctx, self.name)
        rng = ctx.rng
        ga, gb = parents[0].genome, parents[1].genome
        original = thaw(ga.params)
        a = space.canonical(_start(space, ga, rng, "first parent"))
        b = space.canonical(_start(space, gb, rng, "second parent"))
        differ = [k for k in space.params if not _same(a[k], b[k])]
        if not differ:
            raise OperatorError(
                f"{self.name}: parents {ga.id[:12]} and {gb.id[:12]} have the same params; "
                "crossover has nothing to mix (pick parents that differ)"
            )
        same_code = ga.source == gb.source and ga.entry == gb.entry and ga.language == gb.language
        if same_code and len(differ) == 1:
            raise OperatorError(
                f"{self.name}: parents {ga.id[:12]} and {gb.id[:12]} differ in one param only "
                f"({differ[0]}); every mix would copy a parent"
            )
        choices = {k: [a[k], b[k]] for k in differ}
        why: dict[str, None] = {}
        for _ in range(self.max_tries):
            take_b = [k for k in differ if rng.random() < self.bias]
            if not take_b or (same_code and len(take_b) == len(differ)):
                why["every mix copied a parent"] = None
                continue
            child = dict(a)
            for k in take_b:
                child[k] = b[k]
            redrawn: set[str] = set()
            if self.repair:
                fixed, rules, redrawn = _repair(space, child, rng, protect=set(), tries=12, choices=choices)
                why.update(dict.fromkeys(rules))
            else:
                _, rules = _offending(space, child)
                if rules:
                    raise _reject(self.name, [ga.id, gb.id], rules, 1)
                fixed = child
            if fixed is None:
                continue
            g = Genome(ga.source, fixed, ga.entry, ga.language)
            if _same_params(fixed, a) or g.id in (ga.id, gb.id):
                why["the mix (after repair) copied a parent"] = None
                continue
            note = param_diff(original, fixed)
            return [Proposal(g, note=f"{note} (from {gb.id[:8]})",
                             meta={"changes": _changes(original, fixed), "from_second": sorted(take_b),
                                   "repaired": sorted(redrawn)})]
        raise _reject(self.name, [ga.id, gb.id], list(why), self.max_tries)


class ParamRandom(Operator):
    """A fresh random valid assignment on the parent's source (exploration and seeding).

    Args:
        max_tries: Draws (rejection sampling against the constraints) before giving up.
    """

    name = "param_random"
    n_parents = 1
    cost_weight = 0.05

    def __init__(self, *, max_tries: int = 200) -> None:
        if int(max_tries) < 1:
            raise ValueError("max_tries must be >= 1")
        self.max_tries = int(max_tries)

    def __repr__(self) -> str:
        return "ParamRandom()"

    def propose(self, parents: Sequence[Record], ctx: OperatorContext) -> list[Proposal | Genome]:
        """Draw new params for ``parents[0]``'s source."""
        _check_parents(self, parents)
        space = _space(ctx, self.name)
        rng = ctx.rng
        parent = parents[0].genome
        original = thaw(parent.params)
        why: dict[str, None] = {}
        for _ in range(self.max_tries):
            cand = {name: spec.sample(rng) for name, spec in space.params.items()}
            _, rules = _offending(space, cand)
            why.update(dict.fromkeys(rules))
            if rules:
                continue
            if _same_params(cand, original):
                why["every valid draw equalled the parent"] = None
                continue
            g = Genome(parent.source, cand, parent.entry, parent.language)
            return [Proposal(g, note=param_diff(original, cand), meta={"changes": _changes(original, cand)})]
        raise _reject(self.name, [parent.id], list(why), self.max_tries)


class ParamSweep(Operator):
    """Local search: the parent's one-knob neighbours that the archive has not seen yet.

    The neighbourhood is every valid genome that differs from the parent in exactly one
    param: each other value of a ``Choice`` (the whole line along that knob, as a tuner's
    single-parameter sweep), the neighbouring steps of an int or float range, the other
    ``Bool``. Neighbours that break a rule are left out (a one-knob change is never
    repaired into a many-knob one), as are genomes the archive already holds (``id in
    ctx.archive``). The rest are proposed in a random order, ``n_children`` per call, so
    repeated calls on an elite walk its whole neighbourhood without repeats. When nothing
    is left, the parent is a local optimum for single-knob moves and the operator raises
    :class:`OperatorError` saying so.

    Args:
        n_children: Neighbours per call.
    """

    name = "param_sweep"
    n_parents = 1
    cost_weight = 0.05

    def __init__(self, *, n_children: int = 1) -> None:
        if int(n_children) < 1:
            raise ValueError("n_children must be >= 1")
        self.n_children = int(n_children)

    def __repr__(self) -> str:
        return f"ParamSweep(n_children={self.n_children})"

    @staticmethod
    def _values(spec: Any, current: Any) -> list[Any]:
        d = spec.describe()
        if d["kind"] == "choice":
            vals = list(d["values"])
        else:
            try:
                vals = list(spec.neighbours(current))
            except (TypeError, ValueError):
                vals = []
        return [v for v in vals if spec.contains(v) and not _same(v, current)]

    def neighbours(self, parent: Genome, space: ParamSpace) -> list[dict[str, Any]]:
        """Every valid one-knob change of ``parent``'s params, in the space's param order."""
        base = thaw(parent.params)
        active = set(space.active(base))
        out: list[dict[str, Any]] = []
        for name in _mutable(space):
            if name not in active:
                continue
            current = base.get(name, _MISSING)
            if current is _MISSING:
                continue
            for v in self._values(space.params[name], current):
                cand = dict(base, **{name: v})
                if space.is_valid(cand):
                    out.append(cand)
        return out

    def propose(self, parents: Sequence[Record], ctx: OperatorContext) -> list[Proposal | Genome]:
        """Up to ``n_children`` unseen one-knob neighbours of ``parents[0]``."""
        _check_parents(self, parents)
        space = _space(ctx, self.name)
        parent = parents[0].genome
        original = thaw(parent.params)
        cands = self.neighbours(parent, space)
        if not cands:
            raise OperatorError(f"{self.name}: parent {parent.id[:12]} has no valid one-knob neighbour "
                                "(every single change breaks a rule of the space)")
        out: list[Proposal | Genome] = []
        for i in ctx.rng.permutation(len(cands)).tolist():
            g = Genome(parent.source, cands[i], parent.entry, parent.language)
            if ctx.archive is not None and g.id in ctx.archive:
                continue
            out.append(Proposal(g, note=param_diff(original, cands[i]),
                                meta={"changes": _changes(original, cands[i])}))
            if len(out) >= self.n_children:
                break
        if not out:
            raise OperatorError(f"{self.name}: all {len(cands)} one-knob neighbours of parent {parent.id[:12]} are "
                                "in the archive already: it is a local optimum for single-knob moves")
        return out
