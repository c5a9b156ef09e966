"""Core value types shared by every package: Genome, Problem, Evaluation, Record, Lesson.

This module (with :mod:`evo.space` and :mod:`evo.codec`) is the one place that
``operators``, ``fitness`` and ``archive`` import from ``evo``; it never imports the
engine and depends on the standard library and numpy only.

The harness contract a :class:`Problem` describes
-------------------------------------------------
The harness (``fitness``), never the genome, allocates every buffer and launches the
kernel. For one :class:`Case` (a shape and a dtype) the Problem says:

* ``signature(case)`` -> the kernel's buffer arguments, in order, as :class:`ArgSpec`
  (name, element count, storage dtype, role ``"in"``, ``"out"`` or ``"workspace"``);
  a workspace is memory the kernel may use freely (per-CTA partial sums, tickets):
  the harness hands it over all zeros and the kernel must return it all zeros, which
  is checked after every checked launch, so no state survives from one launch to the
  next;
* ``scalars(case)`` -> the scalar arguments that follow the buffers, as
  ``(ctype, value)`` pairs with ctype in ``int32``, ``int64``, ``uint32``, ``float32``;
* ``make_inputs(case, rng, xp)`` -> float32/float64/int arrays for every ``"in"`` buffer
  (``xp`` is numpy or cupy); the harness rounds them to the storage dtype. An input may
  instead be a deferred draw (``fitness.normal_draw``), which the harness draws straight
  into the buffer in its storage dtype (``fitness.materialize`` turns one into an array);
* ``reference(inputs, case, xp)`` -> the expected value of every ``"out"`` buffer,
  computed from the *stored* (rounded) inputs upcast to float32, in float32 or better;
* ``launch(params, case, device)`` -> a :class:`Launch` (grid, block, dynamic shared
  memory, optional cluster shape);
* ``bytes_moved(case)`` -> the fewest bytes the operation must move (for the
  bandwidth metric and the fraction of the measured ceiling).

Params reach the kernel as compile-time definitions (one ``-D NAME=VALUE`` each) and
reach the launch through ``launch``. With ``dtype_defines(params, dtype)`` (optional) the
harness builds a genome once per distinct set of extra definitions it gives over the dtypes
(e.g. ``-DDTYPE_CODE=2``), and each case runs the build of its dtype: a kernel that picks its
dtype at compile time then carries that dtype's code alone, and its registers are that code's.
Every callable must be a top-level function so that the Problem can be pickled into spawned
worker processes.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import re
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from evo.space import Axis, CategoricalAxis, NumericAxis, ParamSpace, SpaceError

__all__ = [
    "ArgSpec",
    "Case",
    "DeviceInfo",
    "Evaluation",
    "Genome",
    "Launch",
    "Lesson",
    "Problem",
    "ProblemError",
    "Record",
    "Status",
    "canonical_json",
    "normalize_source",
]

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8, "uint8": 1,
               "int8": 1, "uint32": 4}
KNOWN_TARGET = re.compile(r"^(sm|compute)_(50|52|53|60|61|62|70|72|75|80|86|87|89|90a?|100a?|101a?|103a?|120a?|121a?)$")


class ProblemError(ValueError):
    """A Problem that cannot be evaluated as described; the message says what to fix."""


# --------------------------------------------------------------------------- helpers

_COMMENT_OR_STRING = re.compile(
    r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', re.DOTALL
)
_SPLIT_LITERALS = re.compile("(" + _COMMENT_OR_STRING.pattern + ")", re.DOTALL)
_WS = re.compile(r"\s+")
_PUNCT = r"[{}()\[\];,<>=+\-*/%&|^!~?:.]"
_SPACE_AROUND_PUNCT = re.compile(r"\s+(?=" + _PUNCT + r")|(?<=" + _PUNCT + r")\s+")
_ONE_SPACE_AROUND_PUNCT = re.compile(r" (?=" + _PUNCT + r")|(?<=" + _PUNCT + r") ")  # after runs became " "


def normalize_source(source: str) -> str:
    """Canonical form of CUDA C++/PTX source for content hashing.

    Comments are removed, runs of whitespace collapse to one space, and whitespace next
    to punctuation is dropped, so two sources that differ only in layout or comments
    normalise to the same text. String and character literals are kept verbatim
    (inline PTX lives in string literals, where spacing is part of the instruction
    text only up to PTX's own whitespace rules, so it is collapsed there too).
    """
    if "\x00" in source:
        return _normalize_source_by_parts(source)
    # One pass over the code with a NUL standing for each literal (NUL is neither space
    # nor punctuation, so the code's rules act on each stretch between literals alone).
    pieces = _SPLIT_LITERALS.split(source)
    literals = []
    for i in range(1, len(pieces), 2):
        tok = pieces[i]
        if tok[0] == "/":
            pieces[i] = " "
        else:
            literals.append(" ".join(tok.split()))  # quotes at both ends: the same as _WS.sub(" ", tok)
            pieces[i] = "\x00"
    text = _ONE_SPACE_AROUND_PUNCT.sub("", " ".join("".join(pieces).split()))  # str.split: the same spaces as \s
    if literals:
        code = text.split("\x00")
        text = "".join(x for pair in zip(code[:-1], literals, strict=True) for x in pair) + code[-1]
    return text.strip()


def _normalize_source_by_parts(source: str) -> str:
    """:func:`normalize_source` part by part (sources that hold NUL characters themselves)."""

    def repl(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok.startswith("/"):
            return " "
        return "\x00" + _WS.sub(" ", tok) + "\x00"

    text = _COMMENT_OR_STRING.sub(repl, source)
    parts = text.split("\x00")
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # a literal
            out.append(part)
        else:
            out.append(_SPACE_AROUND_PUNCT.sub("", _WS.sub(" ", part)))
    return "".join(out).strip()


_SCALAR_TYPES = (str, int, float, bool, type(None), bytes)


def _plain(value: Any) -> Any:
    """Convert to JSON/msgpack-safe plain values (tuples to lists, numpy scalars to Python)."""
    t = type(value)
    if t in _SCALAR_TYPES:  # fast path: exact built-in types (the common case)
        return value
    if t is dict or isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if t is list or t is tuple or isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, bytes)):
        return value
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    return value


def canonical_json(value: Any) -> str:
    """Deterministic JSON text (sorted keys, no spaces) used for hashing."""
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), allow_nan=True, default=repr)


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return types.MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return _plain(value)


def thaw(value: Any) -> Any:
    """Deep copy of a frozen structure as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


def _plain_map(value: Any) -> Any:
    """``_plain(value)`` for a field declared as a Mapping, fast for flat dicts of scalars."""
    if type(value) is not dict:
        return _plain(value)
    if not value:
        return {}
    out = {}
    for k, v in value.items():
        t = type(v)
        out[k if type(k) is str else str(k)] = v if t in _SCALAR_TYPES else (
            _plain_map(v) if t is dict else _plain(v))
    return out


# --------------------------------------------------------------------------- Genome


@dataclass(frozen=True, eq=False)
class Genome:
    """An immutable kernel genome: device source plus params.

    Attributes:
        source: CUDA C++ with inline PTX, or raw PTX when ``language == "ptx"``.
        params: Tiling and code knobs, name -> int/float/str/bool (nested lists and dicts
            are allowed and kept immutable). They reach the code as ``-D`` definitions.
        entry: The kernel's entry-point name (``extern "C" __global__``).
        language: ``"cuda"`` or ``"ptx"``.

    Two genomes whose normalised source, params, entry and language agree have the same
    :attr:`id` and are the same record.
    """

    source: str
    params: Mapping[str, Any] = field(default_factory=dict)
    entry: str = "kernel"
    language: str = "cuda"

    def __post_init__(self) -> None:
        if not isinstance(self.source, str):
            raise TypeError(f"Genome.source must be str, got {type(self.source).__name__}")
        if self.language not in ("cuda", "ptx"):
            raise ValueError(f"Genome.language must be 'cuda' or 'ptx', got {self.language!r}")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.entry or ""):
            raise ValueError(f"Genome.entry must be a C identifier, got {self.entry!r}")
        object.__setattr__(self, "params", _freeze(dict(self.params)))
        digest = hashlib.sha256()
        digest.update(self.language.encode())
        digest.update(b"\x00")
        digest.update(self.entry.encode())
        digest.update(b"\x00")
        digest.update(normalize_source(self.source).encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
        digest.update(canonical_json(self.params).encode())
        object.__setattr__(self, "_id", digest.hexdigest()[:32])

    @property
    def id(self) -> str:
        """Content hash (32 hex digits) of normalised source, params, entry and language."""
        return self._id  # type: ignore[attr-defined,no-any-return]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Genome) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"Genome(id={self.id[:12]}, entry={self.entry!r}, params={dict(self.params)!r}, {len(self.source)} chars)"

    def __reduce__(self) -> tuple[Any, ...]:
        # params are a mappingproxy, which pickle cannot copy: rebuild from plain data.
        return (Genome.from_dict, (self.to_dict(),))

    def with_params(self, **changes: Any) -> Genome:
        """A new genome with some params replaced."""
        p = thaw(self.params)
        p.update(changes)
        return Genome(self.source, p, self.entry, self.language)

    def with_source(self, source: str) -> Genome:
        """A new genome with the source replaced."""
        return Genome(source, thaw(self.params), self.entry, self.language)

    def defines(self) -> list[str]:
        """The params as ``-DNAME=VALUE`` compiler options (bools become 0/1)."""
        out = []
        for k in sorted(self.params):
            v = self.params[k]
            if isinstance(v, bool):
                v = int(v)
            elif isinstance(v, (Mapping, tuple)):
                continue  # structured params reach the launch, not the preprocessor
            out.append(f"-D{k}={v}")
        return out

    def _plain_params(self) -> dict[str, Any]:
        """``thaw(self.params)``, computed once per genome; callers must not mutate it."""
        try:
            return self.__dict__["_thawed"]  # type: ignore[no-any-return]
        except KeyError:
            pass
        thawed = dict(self.params)
        for v in thawed.values():
            if type(v) not in _SCALAR_TYPES:
                thawed = thaw(self.params)
                break
        object.__setattr__(self, "_thawed", thawed)
        return thawed

    def _payload(self) -> dict[str, Any]:
        """:meth:`to_dict` sharing the cached params dict (for encoding only; do not mutate)."""
        return {"source": self.source, "params": self._plain_params(), "entry": self.entry,
                "language": self.language, "id": self._id}  # type: ignore[attr-defined]

    def to_dict(self) -> dict[str, Any]:
        thawed = self._plain_params()
        params = dict(thawed)
        for v in params.values():
            if type(v) not in _SCALAR_TYPES:
                params = thaw(thawed)
                break
        return {"source": self.source, "params": params, "entry": self.entry, "language": self.language,
                "id": self.id}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, trust_id: bool = False) -> Genome:
        """Rebuild a genome; with ``trust_id`` a stored ``id`` is reused instead of re-hashing.

        Re-hashing normalises the whole source, which dominates decoding time for large
        archives; the archive, which wrote the id itself, passes ``trust_id=True``.
        """
        if trust_id and isinstance(d.get("id"), str):
            g = object.__new__(cls)
            object.__setattr__(g, "source", d["source"])
            object.__setattr__(g, "params", _freeze(dict(d.get("params", {}))))
            object.__setattr__(g, "entry", d.get("entry", "kernel"))
            object.__setattr__(g, "language", d.get("language", "cuda"))
            if not isinstance(g.source, str) or g.language not in ("cuda", "ptx"):
                raise ValueError("stored genome has an invalid source or language")
            object.__setattr__(g, "_id", d["id"])
            return g
        return cls(d["source"], d.get("params", {}), d.get("entry", "kernel"), d.get("language", "cuda"))


# --------------------------------------------------------------------------- Evaluation


class Status(str, enum.Enum):
    """Outcome of an evaluation. Only ``OK`` records occupy archive cells."""

    OK = "ok"
    REJECTED = "rejected"
    COMPILE_ERROR = "compile_error"
    INCORRECT = "incorrect"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Evaluation:
    """The result of scoring one genome.

    Attributes:
        status: The outcome.
        fitness: Higher is better; ``None`` unless ``status`` is OK.
        metrics: Measured figures. By convention ``metrics["cases"]`` maps a case key
            (:attr:`Case.key`) to ``{"time_ms", "spread", "gbps", "fraction", ...}`` and
            ``metrics["fraction"]`` is the objective's fraction of the measured ceiling.
        resources: From the compiler: ``registers``, ``shared_bytes``, ``spill_bytes``,
            ``stack_bytes``, ...
        artifacts: Text (or bytes) an operator can read: ``compile_log``,
            ``mismatch``, ``reason``, ``traceback``.
        stage_times: Wall seconds per stage.
        device: Where it ran (:meth:`DeviceInfo.to_dict`), empty for CPU-only scoring.
    """

    status: Status
    fitness: float | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    resources: Mapping[str, Any] = field(default_factory=dict)
    artifacts: Mapping[str, Any] = field(default_factory=dict)
    stage_times: Mapping[str, float] = field(default_factory=dict)
    device: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))
        if self.fitness is not None:
            object.__setattr__(self, "fitness", float(self.fitness))
        if self.status is Status.OK and (self.fitness is None or math.isnan(self.fitness)):
            raise ValueError("an OK Evaluation needs a finite or infinite (not NaN) fitness")

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    def case_times(self) -> dict[str, float]:
        """Time in ms per case key from ``metrics["cases"]``: the finite, positive ``time_ms``
        values of an OK evaluation (empty when it failed or reports no cases)."""
        cases = self.metrics.get("cases") if self.ok and isinstance(self.metrics, Mapping) else None
        if not isinstance(cases, Mapping):
            return {}
        out: dict[str, float] = {}
        for key, m in cases.items():
            t = m.get("time_ms") if isinstance(m, Mapping) else None
            if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0:
                out[str(key)] = float(t)
        return out

    @property
    def reason(self) -> str:
        """The most useful single artifact for a failure (reason, mismatch or compile log)."""
        for key in ("reason", "mismatch", "compile_log", "traceback"):
            v = self.artifacts.get(key)
            if v:
                return v if isinstance(v, str) else repr(v)
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status._value_,
            "fitness": self.fitness,
            "metrics": _plain_map(self.metrics),
            "resources": _plain_map(self.resources),
            "artifacts": dict(self.artifacts),
            "stage_times": _plain_map(self.stage_times),
            "device": _plain_map(self.device),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Evaluation:
        return cls(
            status=Status(d["status"]),
            fitness=d.get("fitness"),
            metrics=d.get("metrics", {}),
            resources=d.get("resources", {}),
            artifacts=d.get("artifacts", {}),
            stage_times=d.get("stage_times", {}),
            device=d.get("device", {}),
        )

    @classmethod
    def failure(cls, status: Status, reason: str, **kw: Any) -> Evaluation:
        """A failed evaluation with ``reason`` as its artifact."""
        arts = dict(kw.pop("artifacts", {}))
        arts.setdefault("reason", reason)
        return cls(status=status, fitness=None, artifacts=arts, **kw)


# --------------------------------------------------------------------------- Record & Lesson


@dataclass(frozen=True)
class Record:
    """A genome with its evaluation and lineage; failures are records too.

    Attributes:
        genome: The genome (its id is the record's key).
        evaluation: How it scored.
        parents: Ids of the parent genomes (empty for seeds).
        operator: Name of the operator that made it (``"seed"`` for seeds).
        generation: Engine generation counter when it was proposed.
        island: Island index.
        cell: MAP-Elites cell index (set by the archive; ``None`` for failures).
        descriptors: Descriptor values the cell was computed from.
        created: Unix time of creation.
        seq: Insertion order in the archive (assigned by the archive).
        meta: Free-form extra data (LLM model, cost, tokens, ...).
    """

    genome: Genome
    evaluation: Evaluation
    parents: tuple[str, ...] = ()
    operator: str = "seed"
    generation: int = 0
    island: int = 0
    cell: tuple[int, ...] | None = None
    descriptors: Mapping[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    seq: int = -1
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parents", tuple(self.parents))
        if self.cell is not None:
            object.__setattr__(self, "cell", tuple(int(i) for i in self.cell))

    @property
    def id(self) -> str:
        return self.genome.id

    @property
    def fitness(self) -> float | None:
        return self.evaluation.fitness

    @property
    def status(self) -> Status:
        return self.evaluation.status

    def replace(self, **changes: Any) -> Record:
        return replace(self, **changes)

    def _copy(self) -> Record:
        """A shallow copy that skips ``__init__`` (the fields are already normalised)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def _payload(self, genome: dict[str, Any]) -> dict[str, Any]:
        return {
            "genome": genome,
            "evaluation": self.evaluation.to_dict(),
            "parents": list(self.parents),
            "operator": self.operator,
            "generation": self.generation,
            "island": self.island,
            "cell": list(self.cell) if self.cell is not None else None,
            "descriptors": _plain_map(self.descriptors),
            "created": self.created,
            "seq": self.seq,
            "meta": _plain_map(self.meta),
        }

    def to_dict(self) -> dict[str, Any]:
        return self._payload(self.genome.to_dict())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Record:
        return cls(
            genome=Genome.from_dict(d["genome"], trust_id=True),
            evaluation=Evaluation.from_dict(d["evaluation"]),
            parents=tuple(d.get("parents", ())),
            operator=d.get("operator", "seed"),
            generation=int(d.get("generation", 0)),
            island=int(d.get("island", 0)),
            cell=tuple(d["cell"]) if d.get("cell") is not None else None,
            descriptors=d.get("descriptors", {}),
            created=float(d.get("created", 0.0)),
            seq=int(d.get("seq", -1)),
            meta=d.get("meta", {}),
        )


@dataclass(frozen=True)
class Lesson:
    """A short structured finding: what was tried, on which parent, what happened.

    Attributes:
        operator: Operator name.
        parent_id: The parent genome's id (``None`` for seeds).
        child_id: The child genome's id.
        change: What changed: a param diff (``"threads 256->512"``) or a source diff summary.
        outcome: ``"improved"``, ``"no_gain"``, ``"duplicate"`` or a failed :class:`Status` value.
        delta: Relative fitness change vs the parent (``+0.05`` = 5% better), ``None`` if
            either fitness is unknown.
        message: A short excerpt of the failure reason, if any.
        generation: Engine generation.
        created: Unix time.
        seq: Insertion order (assigned by the archive).
    """

    operator: str
    child_id: str
    change: str
    outcome: str
    parent_id: str | None = None
    delta: float | None = None
    message: str = ""
    generation: int = 0
    created: float = field(default_factory=time.time)
    seq: int = -1

    def replace(self, **changes: Any) -> Lesson:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "operator": self.operator,
            "child_id": self.child_id,
            "change": self.change,
            "outcome": self.outcome,
            "parent_id": self.parent_id,
            "delta": self.delta,
            "message": self.message,
            "generation": self.generation,
            "created": self.created,
            "seq": self.seq,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Lesson:
        return cls(**{k: d[k] for k in d if k in cls.__dataclass_fields__})

    def summary(self) -> str:
        """One line for prompts and tables."""
        d = f" ({self.delta:+.1%})" if self.delta is not None and math.isfinite(self.delta) else ""
        m = f": {self.message}" if self.message else ""
        return f"[{self.operator}] {self.change} -> {self.outcome}{d}{m}"


# --------------------------------------------------------------------------- Problem


@dataclass(frozen=True)
class Case:
    """One point to check or time: a shape (name -> size) and a storage dtype."""

    shape: Mapping[str, int]
    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", types.MappingProxyType({str(k): int(v) for k, v in self.shape.items()}))

    @property
    def key(self) -> str:
        """Stable text key, e.g. ``"M=32768,N=256:bfloat16"``."""
        return ",".join(f"{k}={v}" for k, v in self.shape.items()) + ":" + self.dtype

    def __getitem__(self, name: str) -> int:
        return self.shape[name]

    def __hash__(self) -> int:
        return hash(self.key)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Case, (dict(self.shape), self.dtype))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Case) and other.key == self.key

    @classmethod
    def from_key(cls, key: str) -> Case:
        dims, dtype = key.rsplit(":", 1)
        return cls({k: int(v) for k, v in (p.split("=") for p in dims.split(","))}, dtype)


ARG_ROLES = ("in", "out", "workspace")


@dataclass(frozen=True)
class ArgSpec:
    """A buffer argument of the kernel: ``numel`` elements of ``dtype``.

    ``role``: ``"in"`` (filled by ``make_inputs``, must not change), ``"out"`` (compared
    with the reference; poisoned before each launch) or ``"workspace"`` (zeroed once by the
    harness; the kernel may read and write it but must leave it all zeros when it returns).
    """

    name: str
    numel: int
    dtype: str
    role: str = "in"

    def __post_init__(self) -> None:
        if self.role not in ARG_ROLES:
            raise ProblemError(f"ArgSpec {self.name!r}: role must be one of {', '.join(map(repr, ARG_ROLES))}, "
                               f"got {self.role!r}")
        if self.dtype not in DTYPE_BYTES:
            raise ProblemError(f"ArgSpec {self.name!r}: unknown dtype {self.dtype!r} (known: {sorted(DTYPE_BYTES)})")

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Launch:
    """How the harness launches a kernel: grid, block, dynamic shared memory, cluster.

    Attributes:
        grid: CTAs per dimension (with ``resident``: the most the kernel may be given).
        block: Threads per CTA per dimension (1024 in all at most).
        shared_mem: Dynamic shared memory bytes per CTA.
        cluster: CTAs per cluster per dimension (``__cluster_dims__``), or ``None``.
        resident: The kernel strides over its work by ``gridDim`` (a persistent grid), so any
            grid up to ``grid`` computes the same result. The harness then launches no more
            CTAs than can run on the device at once with this block, shared memory and
            cluster (the driver's occupancy calculator; whole clusters, at least one): a
            persistent grid that asks for more would leave CTAs waiting for a second wave,
            each with a full share of the work. A 1-D grid (and cluster) only.
    """

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int = 0
    cluster: tuple[int, int, int] | None = None
    resident: bool = False

    def __post_init__(self) -> None:
        g = tuple(int(x) for x in (tuple(self.grid) + (1, 1, 1))[:3])
        b = tuple(int(x) for x in (tuple(self.block) + (1, 1, 1))[:3])
        object.__setattr__(self, "grid", g)
        object.__setattr__(self, "block", b)
        object.__setattr__(self, "resident", bool(self.resident))
        if self.cluster is not None:
            object.__setattr__(self, "cluster", tuple(int(x) for x in (tuple(self.cluster) + (1, 1, 1))[:3]))
        if min(g) < 1 or min(b) < 1:
            raise ProblemError(f"Launch grid {g} and block {b} must be positive")
        if b[0] * b[1] * b[2] > 1024:
            raise ProblemError(f"Launch block {b} has more than 1024 threads")
        if self.resident and (g[1:] != (1, 1) or (self.cluster is not None and self.cluster[1:] != (1, 1))):
            raise ProblemError(f"a resident Launch takes a 1-D grid and cluster (got grid {g}, cluster "
                               f"{self.cluster}): put the CTAs along x, or set resident=False")


@dataclass(frozen=True)
class DeviceInfo:
    """The GPU an evaluation ran on, with its ceilings measured in the same worker."""

    name: str
    compute_capability: str
    sm_count: int = 0
    l2_bytes: int = 0
    shared_per_block_optin: int = 0
    copy_gbps: float = 0.0
    index: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceInfo:
        return cls(**{k: d[k] for k in d if k in cls.__dataclass_fields__})


def _qualname(fn: Any) -> str | None:
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


@dataclass(frozen=True)
class Problem:
    """What the user describes: the operation, its inputs, its knobs and its objective.

    See the module docstring for the harness contract of the callables.

    Attributes:
        name: Short identifier.
        description: What the kernel computes and its contract (read by LLM operators).
        params: The parameter space.
        dtypes: Storage dtypes to check (and time).
        check_shapes: Shapes checked for correctness (include tiny and odd sizes).
        timed_shapes: Shapes timed (they are checked too).
        tolerances: Max ``||out-ref||/||ref||`` per dtype.
        target: Compiler target, e.g. ``"sm_90a"``.
        signature, scalars, make_inputs, reference, launch, bytes_moved: the harness
            contract (module docstring).
        objective: ``"geomean_fraction"`` (geometric mean over timed cases of the fraction
            of the measured copy bandwidth; needs ``bytes_moved``), ``"geomean_speed"``
            (geometric mean of 1/time), or a callable ``metrics -> fitness``.
        descriptors: MAP-Elites axes. An axis's value comes from the record's params,
            resources or top-level metrics (its ``source`` picks; default that order).
        seeds: Starting genomes.
        timed_dtypes: Dtypes timed (default: all of ``dtypes``).
        forbidden_sregs: Special registers a genome's ``asm`` may not read.
        allowed_includes: Headers a genome may include.
        compile_options: Extra compiler options.
        dtype_defines: ``(params, dtype) -> {name: int or str}``, compile-time definitions
            added to the params' when building for ``dtype`` (a top-level function). None
            (the default), or empty answers for every dtype: one build serves every dtype.
            Otherwise a genome is built once per distinct answer over ``dtypes``; each case
            runs its dtype's build, and the resources are the largest over the builds. The
            names may not be params (the harness raises ProblemError naming the clash).
        extra: Free-form data (hardware notes for prompts, ...), part of the fingerprint.
    """

    name: str
    params: ParamSpace
    check_shapes: tuple[Mapping[str, int], ...]
    dtypes: tuple[str, ...] = ("float32",)
    timed_shapes: tuple[Mapping[str, int], ...] = ()
    tolerances: Mapping[str, float] = field(default_factory=lambda: {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2})
    target: str = "sm_90a"
    description: str = ""
    signature: Callable[[Case], Sequence[ArgSpec]] | None = None
    scalars: Callable[[Case], Sequence[tuple[str, int | float]]] | None = None
    make_inputs: Callable[..., Mapping[str, Any]] | None = None
    reference: Callable[..., Mapping[str, Any]] | None = None
    launch: Callable[..., Launch] | None = None
    bytes_moved: Callable[[Case], int] | None = None
    objective: str | Callable[[Mapping[str, Any]], float] = "geomean_fraction"
    descriptors: tuple[Axis, ...] = ()
    seeds: tuple[Genome, ...] = ()
    timed_dtypes: tuple[str, ...] | None = None
    forbidden_sregs: tuple[str, ...] = ("%clock", "%clock64", "%globaltimer", "%globaltimer_lo", "%globaltimer_hi",
                                        "%pm0", "%pm1", "%pm2", "%pm3", "%pm4", "%pm5", "%pm6", "%pm7")
    allowed_includes: tuple[str, ...] = ("cuda_fp16.h", "cuda_bf16.h", "stdint.h", "cuda/std/cstdint",
                                         "cooperative_groups.h", "cuda_pipeline.h", "mma.h")
    compile_options: tuple[str, ...] = ()
    dtype_defines: Callable[[Mapping[str, Any], str], Mapping[str, int | str]] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("check_shapes", "timed_shapes", "dtypes", "descriptors", "seeds", "forbidden_sregs",
                     "allowed_includes", "compile_options"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "check_shapes", tuple(dict(s) for s in self.check_shapes))
        object.__setattr__(self, "timed_shapes", tuple(dict(s) for s in self.timed_shapes))
        if self.timed_dtypes is not None:
            object.__setattr__(self, "timed_dtypes", tuple(self.timed_dtypes))
        object.__setattr__(self, "tolerances", dict(self.tolerances))

    # -- validation ---------------------------------------------------------------

    def validate(self, *, needs_gpu_contract: bool = True) -> Problem:
        """Raise :class:`ProblemError` naming every problem found; return self if none.

        Checks: non-empty shape and dtype lists, tolerances non-negative and present for
        every dtype, a target the compiler knows, descriptor axes well formed, seeds that
        fit the parameter space and, when ``needs_gpu_contract``, that the harness
        callables are present.
        """
        errs: list[str] = []
        if not self.name or not re.fullmatch(r"[\w.\-]+", self.name):
            errs.append(f"name {self.name!r} must be non-empty letters, digits, '_', '-' or '.'")
        if not self.check_shapes:
            errs.append("check_shapes is empty: list at least one shape to check (include tiny and odd sizes)")
        if not self.dtypes:
            errs.append("dtypes is empty")
        for d in self.dtypes:
            if d not in DTYPE_BYTES:
                errs.append(f"dtype {d!r} unknown (known: {sorted(DTYPE_BYTES)})")
            tol = self.tolerances.get(d)
            if tol is None:
                errs.append(f"no tolerance for dtype {d!r}: add tolerances[{d!r}]")
            elif not (isinstance(tol, (int, float)) and tol >= 0 and math.isfinite(tol)):
                errs.append(f"tolerance for {d!r} is {tol!r}: it must be a finite number >= 0")
        for t in self.timed_dtypes or ():
            if t not in self.dtypes:
                errs.append(f"timed dtype {t!r} is not among dtypes {list(self.dtypes)}")
        for s in self.check_shapes + self.timed_shapes:
            if not s or any((not isinstance(v, int)) or v < 1 for v in s.values()):
                errs.append(f"shape {s!r} must map names to positive ints")
        if not KNOWN_TARGET.match(self.target or ""):
            errs.append(f"target {self.target!r} is not a compute target the compiler knows (e.g. 'sm_90a', 'sm_80')")
        names = [a.name for a in self.descriptors]
        if len(set(names)) != len(names):
            errs.append(f"descriptor axis names repeat: {names}")
        if isinstance(self.objective, str) and self.objective not in ("geomean_fraction", "geomean_speed"):
            errs.append(f"objective {self.objective!r} unknown: use 'geomean_fraction', 'geomean_speed' or a callable")
        if self.objective == "geomean_fraction" and needs_gpu_contract and self.bytes_moved is None:
            errs.append("objective 'geomean_fraction' needs bytes_moved(case)")
        if needs_gpu_contract:
            for fn in ("signature", "make_inputs", "reference", "launch"):
                if getattr(self, fn) is None:
                    errs.append(f"{fn} is missing: the harness needs it to run the kernel")
        for g in self.seeds:
            bad = self.params.violations(g.params)
            if bad:
                errs.append(f"seed {g.id[:12]}: {'; '.join(bad)}")
        if self.dtype_defines is not None:
            if not callable(self.dtype_defines):
                errs.append("dtype_defines must be a function (params, dtype) -> {name: value}")
            else:
                for g in self.seeds:
                    try:
                        self.builds(g.params)
                    except ProblemError as exc:
                        errs.append(f"seed {g.id[:12]}: {exc}")
        if errs:
            raise ProblemError(f"Problem {self.name!r} is not valid:\n  - " + "\n  - ".join(errs))
        return self

    # -- builds -----------------------------------------------------------------------

    def build_defines(self, params: Mapping[str, Any], dtype: str | None) -> list[str]:
        """The ``-DNAME=VALUE`` options ``dtype_defines`` adds to the build for ``dtype`` (sorted;
        none without ``dtype_defines`` or for ``dtype`` None).

        Raises:
            ProblemError: an answer that is not a mapping of C identifiers (not params) to ints
                or plain tokens.
        """
        if self.dtype_defines is None or dtype is None:
            return []
        defs = self.dtype_defines(params, dtype)
        if not isinstance(defs, Mapping):
            raise ProblemError(f"dtype_defines(params, {dtype!r}) returned {type(defs).__name__}; "
                               "return a mapping of definition names to values ({} for none)")
        out = []
        for k in sorted(defs):
            v = defs[k]
            if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_]\w*", k):
                raise ProblemError(f"dtype_defines(params, {dtype!r}): {k!r} is not a C identifier")
            if k in params:
                raise ProblemError(f"dtype_defines(params, {dtype!r}): {k!r} is also a param; rename the definition")
            if isinstance(v, bool) or not isinstance(v, (int, str)) or (
                    isinstance(v, str) and not re.fullmatch(r"[\w.+\-]+", v)):
                raise ProblemError(f"dtype_defines(params, {dtype!r})[{k!r}] = {v!r}: use an int or a plain token "
                                   "(letters, digits, '_', '.', '+', '-')")
            out.append(f"-D{k}={v}")
        return out

    def genome_defines(self, genome: Genome, dtype: str | None) -> list[str]:
        """Every ``-D`` option ``genome`` is built with for cases of ``dtype``: its params'
        (:meth:`Genome.defines`), then :meth:`build_defines`' (``dtype`` None: the params' alone)."""
        return genome.defines() + self.build_defines(genome.params, dtype)

    def builds(self, params: Mapping[str, Any]) -> dict[str, list[str]]:
        """The builds a genome with ``params`` needs: build name -> the options
        :meth:`build_defines` adds.

        One build ``""`` (no extra options) when every dtype gets the same options as none;
        otherwise one per distinct set of options, named after the first of ``dtypes`` that
        uses it (see :meth:`build_for`).
        """
        per = {d: self.build_defines(params, d) for d in self.dtypes}
        if all(not o for o in per.values()):
            return {"": []}
        out: dict[str, list[str]] = {}
        for d, opts in per.items():
            if opts not in out.values():
                out[d] = opts
        return out

    def build_for(self, params: Mapping[str, Any], dtype: str) -> str:
        """The name of the build (a key of :meth:`builds`) that cases of ``dtype`` run."""
        builds = self.builds(params)
        if list(builds) == [""]:
            return ""
        opts = self.build_defines(params, dtype)
        for name, o in builds.items():
            if o == opts:
                return name
        raise ProblemError(f"dtype {dtype!r} is not among the Problem's dtypes {list(self.dtypes)}")

    # -- cases ----------------------------------------------------------------------

    def check_cases(self) -> list[Case]:
        """Every (shape, dtype) to check: check shapes and timed shapes, all dtypes."""
        seen: dict[str, Case] = {}
        for s in self.check_shapes + self.timed_shapes:
            for d in self.dtypes:
                c = Case(s, d)
                seen.setdefault(c.key, c)
        return list(seen.values())

    def timed_cases(self) -> list[Case]:
        """Every (shape, dtype) to time."""
        return [Case(s, d) for s in self.timed_shapes for d in (self.timed_dtypes or self.dtypes)]

    # -- identity ---------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """A plain description of everything that makes two runs comparable."""
        out: dict[str, Any] = {
            "name": self.name,
            "target": self.target,
            "dtypes": list(self.dtypes),
            "timed_dtypes": list(self.timed_dtypes) if self.timed_dtypes else None,
            "check_shapes": [dict(s) for s in self.check_shapes],
            "timed_shapes": [dict(s) for s in self.timed_shapes],
            "tolerances": {k: self.tolerances[k] for k in sorted(self.tolerances)},
            "params": self.params.describe(),
            "objective": self.objective if isinstance(self.objective, str) else _qualname(self.objective),
            "descriptors": [a.describe() for a in self.descriptors],
            "contract": {fn: _qualname(getattr(self, fn)) for fn in
                         ("signature", "scalars", "make_inputs", "reference", "launch", "bytes_moved")},
            "compile_options": list(self.compile_options),
            "extra": _plain(self.extra),
        }
        if self.dtype_defines is not None:  # absent when unset, so problems without it keep their fingerprints
            out["contract"]["dtype_defines"] = _qualname(self.dtype_defines)
        return out

    def fingerprint(self) -> str:
        """Hash of :meth:`describe` (16 hex digits); the archive header stores it."""
        return hashlib.sha256(canonical_json(self.describe()).encode()).hexdigest()[:16]

    def diff(self, other_description: Mapping[str, Any]) -> list[str]:
        """Top-level fields of :meth:`describe` that differ from ``other_description``."""
        mine = self.describe()
        keys = sorted(set(mine) | set(other_description))
        return [k for k in keys if canonical_json(mine.get(k)) != canonical_json(other_description.get(k))]

    def descriptor_values(self, genome: Genome, evaluation: Evaluation) -> dict[str, Any]:
        """Values of every descriptor axis for a record, looked up by each axis's source."""
        out: dict[str, Any] = {}
        for axis in self.descriptors:
            sources = [axis.source] if axis.source else ["params", "resources", "metrics"]
            for src in sources:
                table = {"params": genome.params, "resources": evaluation.resources,
                         "metrics": evaluation.metrics}.get(src or "")
                if table is None:
                    raise SpaceError(f"axis {axis.name!r}: unknown source {src!r}")
                if axis.name in table:
                    out[axis.name] = table[axis.name]
                    break
            else:
                raise SpaceError(f"descriptor {axis.name!r} not found in {', '.join(sources)} of genome {genome.id[:12]}")
        return out


__all__ += ["DTYPE_BYTES", "thaw", "NumericAxis", "CategoricalAxis"]
