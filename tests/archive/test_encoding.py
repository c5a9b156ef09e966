"""The record encoder of the insert path gives the bytes of the plain ``to_dict`` encoding.

``codec.dumps(Record)`` skips the defensive copies of ``Record.to_dict()`` (it shares the
genome's cached params); these tests hold it to the bytes of packing ``Record.to_dict()``,
the encoding archives were written with, over hypothesis-generated records and over the
values that need converting (other key types, tuples, numpy scalars, other mappings,
enums), and check that the archive stores exactly those bytes for a record that holds its
source.
"""

from __future__ import annotations

import collections
import math
import types
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archive import Archive, MemoryStore
from evo import codec
from evo.codec import SCHEMA_VERSION, CodecError, dumps, loads
from evo.types import Evaluation, Genome, Record, Status
from tests.archive.helpers import make_problem
from tests.evo.test_codec import _same, records, text


def _reference(rec: Record) -> bytes:
    """The encoding before the insert-path encoder: the copied ``to_dict`` payload."""
    return msgpack.packb([SCHEMA_VERSION, "record", rec.to_dict()], use_bin_type=True,
                         default=codec._default, strict_types=False)


keys = st.one_of(text, st.integers(-5, 5), st.booleans(), st.none(), st.floats(allow_nan=False))
odd_values = st.recursive(
    st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(), text, st.binary(max_size=8), st.none(), st.booleans(),
              st.integers(-100, 100).map(np.int64), st.floats(width=32).map(np.float32), st.floats().map(np.float64),
              st.sampled_from(list(Status))),
    lambda c: st.one_of(st.lists(c, max_size=3), st.lists(c, max_size=3).map(tuple),
                        st.dictionaries(keys, c, max_size=3),
                        st.dictionaries(text, c, max_size=3).map(types.MappingProxyType),
                        st.dictionaries(text, c, max_size=3).map(collections.OrderedDict)),
    max_leaves=10)
odd_maps = st.one_of(st.dictionaries(keys, odd_values, max_size=4),
                     st.dictionaries(text, odd_values, max_size=3).map(types.MappingProxyType))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records)
def test_same_bytes_as_to_dict(rec: Record) -> None:
    assert dumps(rec) == _reference(rec)
    assert _same(loads(dumps(rec)), rec)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(metrics=odd_maps, resources=odd_maps, artifacts=odd_maps, stage=odd_maps, device=odd_maps,
       descriptors=odd_maps, meta=odd_maps)
def test_same_bytes_with_values_that_need_the_copy(metrics: Any, resources: Any, artifacts: Any, stage: Any,
                                                    device: Any, descriptors: Any, meta: Any) -> None:
    ev = Evaluation(Status.OK, 1.0, metrics=metrics, resources=resources, artifacts=artifacts, stage_times=stage,
                    device=device)
    rec = Record(Genome("x", {"t": 1}), ev, parents=("a", "b"), cell=(1, 2), descriptors=descriptors, meta=meta)
    try:
        want = _reference(rec)
    except (TypeError, OverflowError, ValueError):
        with pytest.raises(CodecError):
            dumps(rec)
        return
    assert dumps(rec) == want


def test_edge_values() -> None:
    nested = {"cases": {"N=1": {"time_ms": 0.5, "runs": [1, 2, (3, 4)]}}, 7: {"x": np.float32(0.1)},
              "enum": Status.OK, Status.OK: "key"}
    rec = Record(Genome("x" * 600, {"t": (1, 2), "m": {"k": 1}}),
                 Evaluation(Status.OK, math.inf, metrics=nested, resources={"registers": np.int64(40)},
                            artifacts=types.MappingProxyType({"log": b"\x00", 3: "three"}),
                            stage_times=collections.OrderedDict(b=1.0, a=math.nan)),
                 meta={"big": 2**63 - 1, "neg": -(2**63)})
    assert dumps(rec) == _reference(rec)
    with pytest.raises(CodecError):
        dumps(rec.replace(meta={"too_big": 2**64}))


def test_archive_stores_the_same_bytes() -> None:
    store = MemoryStore()
    ar = Archive(make_problem(descriptors=False), store)
    rec = Record(Genome("y" * 100, {"t": 3}), Evaluation(Status.OK, 2.0, metrics={1: {"a": (1, 2)}}))
    out = ar.add(rec).record
    assert ar._raw(store.get, rec.id.encode()) == _reference(out)  # the bytes, through the schema-3 pointer
