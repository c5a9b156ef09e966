"""The versioned msgpack codec: round trips (hypothesis) and refusals."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evo.codec import SCHEMA_VERSION, CodecError, dumps, loads, pack_raw, unpack_raw
from evo.types import Evaluation, Genome, Lesson, Record, Status

# text without surrogates (they cannot be UTF-8 encoded), astral characters included
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
ident = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
floats = st.floats(allow_nan=True, allow_infinity=True)
scalars = st.one_of(st.integers(-(2**63), 2**63 - 1), floats, text, st.booleans(), st.none())
nested = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(text, c, max_size=4)),
                      max_leaves=12)
params = st.dictionaries(ident, st.one_of(st.integers(-1000, 1000), st.floats(allow_nan=False), text, st.booleans(),
                                          st.lists(st.integers(0, 64), max_size=3),
                                          st.dictionaries(ident, st.integers(0, 9), max_size=2)), max_size=5)
genomes = st.builds(Genome, source=text, params=params, entry=ident, language=st.sampled_from(["cuda", "ptx"]))


@st.composite
def evaluations(draw: Any) -> Evaluation:
    status = draw(st.sampled_from(list(Status)))
    fitness = draw(st.floats(allow_nan=False)) if status is Status.OK else draw(st.none() | st.floats())
    arts = draw(st.dictionaries(text, st.one_of(text, st.binary(max_size=64)), max_size=3))
    metrics = draw(st.dictionaries(text, nested, max_size=3))
    return Evaluation(status, fitness, metrics=metrics, resources={"registers": draw(st.integers(0, 255))},
                      artifacts=arts, stage_times={"compile": draw(floats)}, device={"name": draw(text)})


records = st.builds(Record, genome=genomes, evaluation=evaluations(), parents=st.lists(text, max_size=3).map(tuple),
                    operator=text, generation=st.integers(0, 10**6), island=st.integers(0, 64),
                    cell=st.none() | st.lists(st.integers(0, 100), max_size=3).map(tuple),
                    descriptors=st.dictionaries(text, scalars, max_size=3), created=st.floats(0, 2e9),
                    seq=st.integers(-1, 2**40), meta=st.dictionaries(text, nested, max_size=3))
lessons = st.builds(Lesson, operator=text, child_id=text, change=text, outcome=text, parent_id=st.none() | text,
                    delta=st.none() | floats, message=text, generation=st.integers(0, 99), created=floats,
                    seq=st.integers(-1, 2**40))


def _same(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to NaN and tuples as lists."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if hasattr(a, "to_dict") and hasattr(b, "to_dict"):
        return type(a) is type(b) and _same(a.to_dict(), b.to_dict())
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(genomes, evaluations(), records, lessons))
def test_round_trip(value: Any) -> None:
    back = loads(dumps(value))
    assert _same(back, value)
    if isinstance(value, (Genome, Record)):
        assert back.id == value.id


def test_huge_source_and_bytes() -> None:
    src = ("asm volatile(\"fma.rn.f32 %0, %1, %2, %3;\"); // \U0001f680 \u00e9\n" * 20000)[:1_000_000]
    rec = Record(Genome(src, {"t": 1}), Evaluation(Status.COMPILE_ERROR, artifacts={"cubin": b"\x00\xff" * 1000,
                                                                                     "log": "x"}),
                 meta={"m": {"inf": math.inf, "nan": math.nan}})
    back = loads(dumps(rec))
    assert back.genome.source == src and back.id == rec.id and back.evaluation.artifacts["cubin"] == b"\x00\xff" * 1000
    assert back.meta["m"]["inf"] == math.inf and math.isnan(back.meta["m"]["nan"])


def test_raw_round_trip() -> None:
    data = {"a": [1, 2.5, None, b"x"], "b": {"c": "\U0010ffff"}}
    assert unpack_raw(pack_raw(data)) == data
    with pytest.raises(CodecError, match="expected raw"):
        unpack_raw(dumps(Genome("x")))


@pytest.mark.parametrize("cut", [1, 5, 20, -1])
def test_truncated(cut: int) -> None:
    data = dumps(Record(Genome("kernel source " * 10), Evaluation(Status.OK, fitness=1.0)))
    with pytest.raises(CodecError):
        loads(data[:cut])


def test_trailing_bytes_newer_version_and_junk() -> None:
    data = dumps(Genome("x"))
    with pytest.raises(CodecError, match="trailing"):
        loads(data + b"\x00")
    with pytest.raises(CodecError, match="upgrade"):
        loads(msgpack.packb([SCHEMA_VERSION + 1, "genome", Genome("x").to_dict()]))
    with pytest.raises(CodecError, match="unknown kind"):
        loads(msgpack.packb([SCHEMA_VERSION, "spaceship", {}]))
    with pytest.raises(CodecError):
        loads(msgpack.packb({"not": "an envelope"}))
    with pytest.raises(CodecError, match="failed validation"):
        loads(msgpack.packb([SCHEMA_VERSION, "genome", {"source": "x", "language": "python"}]))
    with pytest.raises(CodecError):
        loads("text")  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        dumps({"a": 1})  # type: ignore[arg-type]
