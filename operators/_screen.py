"""Screened proposals: many cheap children, a model of the archive's timings, one child to the GPU.

An evaluation costs GPU seconds; a param operator's proposal costs microseconds. So
:class:`Screened` asks its inner operator for a *pool* of children, predicts each child's
time on every timed case from the records already measured (:class:`ParamSurrogate`), and
hands the engine the child most likely to set a new best time on some case. The rest are
dropped unevaluated. This is the model-guided step that Bayesian-optimisation tuners take
over a parameter space, kept small: a distance-weighted nearest-neighbour model over the
params, fitted per source text, with an optimistic bound that widens away from measured
points so that unexplored regions still get picked.

The surrogate sees only params: it is fitted on OK records whose source is the child's own
(a param operator keeps its parent's source), so LLM rewrites are never screened on another
source's timings. With fewer than ``min_records`` such records the wrapper passes the first
children through unscreened, and says so in the note.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from evo.space import Bool, Choice, FloatRange, IntRange, ParamSpace
from evo.types import Genome, Record
from operators._base import Operator, OperatorContext, OperatorError, Proposal

__all__ = ["ParamSurrogate", "Screened"]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class _Coder:
    """Maps a param assignment to per-param coordinates in [0, 1] and category labels.

    Int and float ranges become their relative position, on a log scale where every value
    is positive and they span more than a factor of 4 (tile sizes, thread counts). A numeric
    choice is half position, half category: its values may be sizes (128 is nearer 256 than
    1024) or codes (a hint or algorithm number, where 1 is not nearer 2 than 5), and the
    Problem does not say which. Bools and other choices are categories. The distance between
    two assignments sums, over params, the position gap and the category mismatch, so each
    param weighs at most 1.
    """

    def __init__(self, space: ParamSpace) -> None:
        self.names = list(space.params)
        self._enc: dict[str, tuple[str, Any]] = {}
        for name, spec in space.params.items():
            if isinstance(spec, Bool):
                self._enc[name] = ("cat", None)
            elif isinstance(spec, Choice):
                vals = list(spec.values)
                if vals and all(_is_number(v) for v in vals) and len(vals) > 1:
                    self._enc[name] = ("num", self._scale([float(v) for v in vals]))
                else:
                    self._enc[name] = ("cat", None)
            elif isinstance(spec, (IntRange, FloatRange)):
                self._enc[name] = ("ord", self._scale([float(spec.low), float(spec.high)]))
            else:  # an unknown spec type: compare values for equality
                self._enc[name] = ("cat", None)
        self.category_weights = np.array([0.5 if self._enc[n][0] == "num" else 1.0 for n in self.names])
        """Weight of each param's category mismatch: 1/2 for numeric choices, else 1."""

    @staticmethod
    def _scale(vals: Sequence[float]) -> tuple[bool, float, float]:
        lo, hi = min(vals), max(vals)
        log = lo > 0 and hi / lo > 4.0
        a, b = (math.log(lo), math.log(hi)) if log else (lo, hi)
        return log, a, (b - a) or 1.0

    def coords(self, params: Mapping[str, Any]) -> tuple[np.ndarray, list[Any]]:
        """(positions, NaN where a param has none; category labels, None where it has none).

        A numeric choice's position and its category each count half (see the class)."""
        ords = np.full(len(self.names), np.nan)
        cats: list[Any] = [None] * len(self.names)
        for i, name in enumerate(self.names):
            kind, sc = self._enc[name]
            v = params.get(name)
            if kind in ("ord", "num") and _is_number(v):
                log, a, span = sc
                x = math.log(v) if log and v > 0 else float(v)
                ords[i] = min(max((x - a) / span, -1.0), 2.0) * (0.5 if kind == "num" else 1.0)
            if kind != "ord" or not _is_number(v):
                cats[i] = (type(v).__name__, repr(v))
        return ords, cats


class ParamSurrogate:
    """Predicted log time per timed case for a param assignment, from measured records.

    Distance-weighted nearest neighbours: the ``k`` measured assignments nearest to the
    query (distance: see :class:`_Coder`, at most 1 per param) vote with weights
    ``1 / (d + d0)^2``. The prediction is their weighted mean of ``log(time_ms)``; its
    uncertainty is their weighted spread plus ``distance_penalty`` times the nearest
    distance (far from every measured point, the model knows little).

    Args:
        space: The Problem's params.
        k: Neighbours that vote.
        distance_penalty: Uncertainty (in log time) per unit of distance to the nearest
            measured assignment.
    """

    def __init__(self, space: ParamSpace, *, k: int = 5, distance_penalty: float = 0.05) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if distance_penalty < 0:
            raise ValueError(f"distance_penalty must be >= 0, got {distance_penalty}")
        self.space = space
        self.k = int(k)
        self.distance_penalty = float(distance_penalty)
        self._coder = _Coder(space)
        self._ords: list[np.ndarray] = []
        self._codes: list[list[int]] = []  # per row, each param's category as an integer (-1: none)
        self._labels: list[dict[Any, int]] = [{} for _ in self._coder.names]  # per param: label -> code
        self._rows: dict[str, int] = {}  # genome id -> row
        self._times: dict[str, dict[int, float]] = {}  # case key -> {row: log time}
        self._arrays: tuple[np.ndarray, np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]] | None = None

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def cases(self) -> list[str]:
        """Case keys with at least one measured time."""
        return list(self._times)

    def add(self, genome_id: str, params: Mapping[str, Any], times_ms: Mapping[str, float]) -> None:
        """Add one measured assignment: ``times_ms`` maps case keys to times (ms, > 0)."""
        if genome_id in self._rows:
            return
        row = self._rows[genome_id] = len(self._rows)
        o, c = self._coder.coords(params)
        self._ords.append(o)
        self._codes.append([-1 if label is None else codes.setdefault(label, len(codes))
                            for label, codes in zip(c, self._labels, strict=True)])
        for key, t in times_ms.items():
            if _is_number(t) and t > 0 and math.isfinite(t):
                self._times.setdefault(key, {})[row] = math.log(float(t))
        self._arrays = None

    def _stacked(self) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
        """(positions, category codes, case key -> (rows, log times)) as arrays, built once per change."""
        if self._arrays is None:
            per_case = {key: (np.fromiter(rows.keys(), dtype=np.int64, count=len(rows)),
                              np.fromiter(rows.values(), dtype=float, count=len(rows)))
                        for key, rows in self._times.items()}
            self._arrays = (np.vstack(self._ords), np.array(self._codes, dtype=np.int64), per_case)
        return self._arrays

    def add_record(self, record: Record) -> bool:
        """Add an OK record's per-case times (``metrics["cases"][key]["time_ms"]``); False if it has none."""
        times = record.evaluation.case_times()
        if not times:
            return False
        self.add(record.genome.id, record.genome.params, times)
        return True

    def best(self) -> dict[str, float]:
        """The lowest measured log time of each case."""
        return {key: min(rows.values()) for key, rows in self._times.items()}

    def _distances(self, params: Mapping[str, Any]) -> np.ndarray:
        o, c = self._coder.coords(params)
        ords, codes, _ = self._stacked()
        gap = np.abs(ords - o[None, :])
        both = ~np.isnan(ords) & ~np.isnan(o)[None, :]
        one = np.isnan(ords) != np.isnan(o)[None, :]  # ordered in one, missing in the other
        d = np.where(both, np.minimum(gap, 1.0), 0.0).sum(axis=1) + one.sum(axis=1)
        for j, label in enumerate(c):
            if label is not None:  # a label no row has (-2) differs from every row, "none" (-1) included
                d += self._coder.category_weights[j] * (codes[:, j] != self._labels[j].get(label, -2))
        return d

    def predict(self, params: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
        """``{case key: (mean log time, uncertainty)}`` for every case with measured times."""
        if not self._rows:
            return {}
        d_all = self._distances(params)
        out: dict[str, tuple[float, float]] = {}
        for key, (idx, y) in self._stacked()[2].items():
            d = d_all[idx]
            near = np.argsort(d, kind="stable")[: self.k]
            d, y = d[near], y[near]
            w = 1.0 / (d + 0.25) ** 2
            mu = float((w * y).sum() / w.sum())
            var = float((w * (y - mu) ** 2).sum() / w.sum())
            out[key] = (mu, math.sqrt(var) + self.distance_penalty * float(d.min()))
        return out


class Screened(Operator):
    """Propose ``pool`` children with ``inner``, send the one(s) most likely to set a new best time.

    Each child is scored by its optimistic predicted gain over the best time measured so far
    on every case: ``log(best) - (mean - kappa * uncertainty)`` from :class:`ParamSurrogate`;
    the score sums the positive gains over cases (a child that may take several cases
    outranks one that may take one), ties broken by the largest gain. With probability
    ``explore`` a pool child is sent at random instead, so the model's blind spots still get
    measured. Children already in the archive are dropped from the pool.

    Use it around a param operator (its children keep the parent's source), e.g.
    ``Screened(ParamMutation(), pool=8)``; its name is the inner name with ``screened_`` in
    front, so the bandit and the lessons keep screened and plain proposals apart.

    Args:
        inner: The operator (or a name :func:`operators.resolve` accepts) that makes the pool.
        pool: Children asked of ``inner`` per proposal.
        n_children: Children handed to the engine per proposal.
        kappa: Weight of the uncertainty in the optimistic bound.
        explore: Probability of sending a random pool child.
        min_records: Measured records of the child's source needed before screening starts.
        k: Neighbours of the surrogate.
    """

    def __init__(self, inner: Any = "param_mutation", *, pool: int = 8, n_children: int = 1, kappa: float = 1.0,
                 explore: float = 0.1, min_records: int = 8, k: int = 5) -> None:
        from operators._registry import resolve

        if int(pool) < 1 or int(n_children) < 1:
            raise ValueError(f"pool ({pool}) and n_children ({n_children}) must be >= 1")
        if int(n_children) > int(pool):
            raise ValueError(f"n_children ({n_children}) cannot exceed pool ({pool})")
        if not 0.0 <= float(explore) <= 1.0:
            raise ValueError(f"explore must be in [0, 1], got {explore}")
        if float(kappa) < 0:
            raise ValueError(f"kappa must be >= 0, got {kappa}")
        self.inner = resolve(inner)
        if self.inner.uses_failed_parents:
            raise ValueError(f"Screened: {self.inner.name!r} repairs failed parents; screening needs measured "
                             "times, wrap a param operator instead")
        self.name = f"screened_{self.inner.name}"  # type: ignore[misc]
        self.n_parents = self.inner.n_parents  # type: ignore[misc]
        self.cost_weight = self.inner.cost_weight  # type: ignore[misc]  # the pool costs CPU microseconds
        self.pool = int(pool)
        self.n_children = int(n_children)
        self.kappa = float(kappa)
        self.explore = float(explore)
        self.min_records = int(min_records)
        self.k = int(k)
        self._models: dict[str, ParamSurrogate] = {}  # source text -> model
        self._seen_seq = -1
        self._space: ParamSpace | None = None
        self._lock = threading.Lock()  # the engine may call propose from several threads

    def __repr__(self) -> str:
        return (f"Screened({self.inner!r}, pool={self.pool}, n_children={self.n_children}, kappa={self.kappa}, "
                f"explore={self.explore})")

    def _update(self, ctx: OperatorContext) -> None:
        """Fold the archive's new OK records into the per-source models."""
        space = ctx.problem.params
        if self._space is not space:
            self._models, self._seen_seq, self._space = {}, -1, space
        records = getattr(ctx.archive, "records", None) if ctx.archive is not None else None
        if records is None:  # no archive (isolated tests) or a view without records(): nothing measured
            return
        for rec in records("ok", self._seen_seq + 1):
            self._seen_seq = max(self._seen_seq, rec.seq)
            model = self._models.get(rec.genome.source)
            if model is None:
                model = self._models[rec.genome.source] = ParamSurrogate(space, k=self.k)
            model.add_record(rec)

    def _draw_pool(self, parents: Sequence[Record], ctx: OperatorContext) -> list[Proposal]:
        pool: list[Proposal] = []
        seen: set[str] = set()
        err: OperatorError | None = None
        for _ in range(3 * self.pool):
            if len(pool) >= self.pool:
                break
            try:
                got = self.inner.propose(parents, ctx)
            except OperatorError as e:
                err = e
                continue
            for p in got or []:
                p = p if isinstance(p, Proposal) else Proposal(p)
                gid = p.genome.id
                if gid in seen or (ctx.archive is not None and gid in ctx.archive):
                    continue
                seen.add(gid)
                pool.append(p)
        if not pool:
            if err is not None:
                raise OperatorError(f"{self.name}: {err}") from err
            raise OperatorError(f"{self.name}: {self.inner.name} proposed nothing new in {3 * self.pool} calls")
        return pool

    def score(self, genome: Genome, best: Mapping[str, float]) -> tuple[float, float] | None:
        """(sum of positive optimistic gains, largest gain) of ``genome`` against ``best``
        (case key -> best log time), or None when its source has too few measured records."""
        model = self._models.get(genome.source)
        if model is None or len(model) < self.min_records:
            return None
        pred = model.predict(genome.params)
        gains = [best[key] - (mu - self.kappa * sd) for key, (mu, sd) in pred.items() if key in best]
        if not gains:
            return None
        return float(sum(g for g in gains if g > 0)), float(max(gains))

    def propose(self, parents: Sequence[Record], ctx: OperatorContext) -> list[Proposal | Genome]:
        """Draw the pool, score it, return the top ``n_children``; see the class docstring."""
        pool = self._draw_pool(parents, ctx)
        with self._lock:
            self._update(ctx)
            best: dict[str, float] = {}
            for model in self._models.values():
                for key, t in model.best().items():
                    best[key] = min(best.get(key, t), t)
            scores = [self.score(p.genome, best) for p in pool]
        if any(s is None for s in scores):
            return [self._tag(p, f"unscreened: fewer than {self.min_records} measured records of this source", None)
                    for p in pool[: self.n_children]]
        order = sorted(range(len(pool)), key=lambda i: scores[i], reverse=True)  # type: ignore[arg-type,return-value]
        out: list[Proposal | Genome] = []
        for _ in range(min(self.n_children, len(pool))):
            if ctx.rng.random() < self.explore:
                i = order.pop(int(ctx.rng.integers(len(order))))
                out.append(self._tag(pool[i], f"explored: random 1 of {len(pool)}", scores[i]))
            else:
                i = order.pop(0)
                out.append(self._tag(pool[i], f"screened: best of {len(pool)}", scores[i]))
        return out

    def _tag(self, p: Proposal, how: str, score: tuple[float, float] | None) -> Proposal:
        meta = dict(p.meta)
        meta["screen"] = {"how": how.split(":")[0], "pool": self.pool}
        if score is not None:
            meta["screen"]["predicted_gain"] = round(score[1], 4)
            how += f", predicted best-case gain {100 * (math.exp(score[1]) - 1):+.1f}%"
        note = f"{p.note} ({how})" if p.note else how
        return Proposal(p.genome, note=note, meta=meta)
