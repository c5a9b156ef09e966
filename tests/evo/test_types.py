"""Core value types: genome identity, evaluation rules, records, problems."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evo.space import CategoricalAxis, Choice, NumericAxis, ParamSpace, SpaceError
from evo.types import Evaluation, Genome, Launch, Lesson, Problem, ProblemError, Record, Status, normalize_source

SRC = """
// rmsnorm
extern "C" __global__ void kernel(float* y, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;   /* index */
    if (i < n) { asm volatile("add.f32 %0, %1, %2;" : "=f"(y[i]) : "f"(x[i]), "f"(1.0f)); }
}
"""


def test_id_ignores_whitespace_and_comments() -> None:
    a = Genome(SRC, {"threads": 256})
    relaid = SRC.replace("    ", "\t").replace("// rmsnorm", "// other comment").replace("/* index */", "")
    relaid = relaid.replace("i < n", "i<n").replace(") {", "){")
    b = Genome(relaid + "\n\n", {"threads": 256})
    assert a.id == b.id and a == b and hash(a) == hash(b) and len(a.id) == 32


def test_id_sees_code_params_entry_language() -> None:
    base = Genome(SRC, {"threads": 256})
    assert Genome(SRC, {"threads": 512}).id != base.id
    assert Genome(SRC, {"threads": 256, "vec": 4}).id != base.id
    assert Genome(SRC, {"threads": "256"}).id != base.id  # types matter
    assert Genome(SRC.replace("1.0f", "2.0f"), {"threads": 256}).id != base.id
    assert Genome(SRC.replace('"add.f32 %0', '"add.f32  %0'), {"threads": 256}).id == base.id  # PTX spacing
    assert Genome(SRC.replace("add.f32", "sub.f32"), {"threads": 256}).id != base.id  # inside the literal
    assert Genome(SRC, {"threads": 256}, entry="other").id != base.id
    assert Genome(SRC, {"b": 1, "a": 2}).id == Genome(SRC, {"a": 2, "b": 1}).id  # key order does not


def test_genome_is_immutable_and_validated() -> None:
    g = Genome(SRC, {"tile": [1, 2], "opt": {"x": 1}})
    with pytest.raises(AttributeError):
        g.source = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        g.params["tile"] = 3  # type: ignore[index]
    assert g.params["tile"] == (1, 2)
    with pytest.raises(ValueError):
        Genome(SRC, entry="not an identifier")
    with pytest.raises(ValueError):
        Genome(SRC, language="python")
    with pytest.raises(TypeError):
        Genome(b"bytes")  # type: ignore[arg-type]
    assert g.with_params(opt=2).params["opt"] == 2 and g.params["opt"]["x"] == 1
    assert Genome(SRC, {"flag": True, "n": 3}).defines() == ["-Dflag=1", "-Dn=3"]


def test_normalize_keeps_string_literals() -> None:
    assert normalize_source('a  =  "x  y" ;') == 'a="x y";'
    assert normalize_source("a /* c */ + // d\n b") == "a+b"
    assert normalize_source(' \u3000"a\x85 b" \t;\x1c') == '"a b";'  # every Unicode space, as \\s


_PIECES = st.sampled_from(['"', "'", "//", "/*", "*/", "\\", "\n", " ", "\t", "  ", "\u3000", "\x85", "\x1c", "{",
                           "(", ")", ";", "+", "-", "=", ":", ".", "<", "a", "b1", "asm", "%0", "_x", "\x00", "é"])


@settings(max_examples=800, deadline=None)
@given(st.lists(_PIECES, max_size=40).map("".join))
def test_normalize_one_pass_equals_part_by_part(source: str) -> None:
    """Genome ids depend on it: the one-pass form gives what the part-by-part form always gave."""
    from evo.types import _normalize_source_by_parts

    assert normalize_source(source) == _normalize_source_by_parts(source)


_PINNED = [  # (source, its normal form as every earlier version gave it): stored genome ids depend on it
    (SRC, 'extern "C" __global__ void kernel(float*y,const float*x,int n){int i=blockIdx.x*blockDim.x+threadIdx.x;'
          'if(i<n){asm volatile("add.f32 %0, %1, %2;":"=f"(y[i]):"f"(x[i]),"f"(1.0f));}}'),
    ('template <int N>  __device__ float f ( const float * __restrict__ p ) {\n  return p [ N ] * 2.0f ; // x\n}\n'
     'asm ( "mov.b32  %0 ,\\t%1 ;" : "=r" ( a ) : "r" ( b ) ) ;\nchar c = \' \' ; /* multi\nline */ int d = a ? b : c ;',
     'template<int N>__device__ float f(const float*__restrict__ p){return p[N]*2.0f;}asm("mov.b32 %0 ,\\t%1 ;"'
     ':"=r"(a):"r"(b));char c=\' \';int d=a?b:c;'),
]


@pytest.mark.parametrize("source, want", _PINNED)
def test_normalize_is_pinned(source: str, want: str) -> None:
    assert normalize_source(source) == want


def test_evaluation_rules() -> None:
    with pytest.raises(ValueError):
        Evaluation(Status.OK)
    with pytest.raises(ValueError):
        Evaluation(Status.OK, fitness=math.nan)
    assert Evaluation("ok", fitness=1).status is Status.OK  # type: ignore[arg-type]
    assert Evaluation(Status.OK, fitness=math.inf).ok
    f = Evaluation.failure(Status.COMPILE_ERROR, "error: x", artifacts={"compile_log": "log"})
    assert not f.ok and f.reason == "error: x" and f.fitness is None
    assert str(Status.TIMEOUT) == "timeout"


def test_record_and_lesson() -> None:
    g = Genome(SRC)
    r = Record(g, Evaluation(Status.OK, fitness=2.0), parents=["p"], cell=[1, 2])  # type: ignore[arg-type]
    assert r.parents == ("p",) and r.cell == (1, 2) and r.id == g.id and r.fitness == 2.0
    assert Record.from_dict(r.to_dict()) == r
    le = Lesson("mutate", "c", "threads 256->512", "improved", parent_id="p", delta=0.05)
    assert "+5.0%" in le.summary() and Lesson.from_dict(le.to_dict()) == le


def _problem(**kw: object) -> Problem:
    return Problem(name="p", params=ParamSpace({"variant": Choice(["a", "b"])}), check_shapes=({"N": 1},),
                   descriptors=(NumericAxis("registers", 0, 256, 8, source="resources"),
                                CategoricalAxis("variant", ["a", "b"], source="params")),
                   objective="geomean_speed", **kw)  # type: ignore[arg-type]


def test_problem_fingerprint_and_diff() -> None:
    p = _problem()
    assert p.validate(needs_gpu_contract=False) is p
    assert p.fingerprint() == _problem().fingerprint()
    q = _problem(target="sm_80")
    assert q.fingerprint() != p.fingerprint() and q.diff(p.describe()) == ["target"]
    with pytest.raises(Exception, match="target"):
        _problem(target="sm_12").validate(needs_gpu_contract=False)


def _per_dtype(params: object, dtype: str) -> dict[str, int]:
    """A dtype's build: its own code when the genome's variant is "b", one build for all otherwise."""
    return {"DT": {"float32": 0, "float16": 1, "bfloat16": 2}[dtype]} if params["variant"] == "b" else {}  # type: ignore[index]


def _fp16_like_fp32(params: object, dtype: str) -> dict[str, int | str]:
    return {"WIDE": "f32"} if dtype == "bfloat16" else {"WIDE": "native"}


def test_problem_dtype_builds() -> None:
    dts = ("float32", "float16", "bfloat16")
    p = _problem(dtypes=dts, dtype_defines=_per_dtype).validate(needs_gpu_contract=False)
    # one build when the answer is empty for every dtype
    assert p.builds({"variant": "a"}) == {"": []} and p.build_for({"variant": "a"}, "float16") == ""
    assert p.build_defines({"variant": "a"}, "float16") == []
    b = {"variant": "b"}
    assert p.builds(b) == {"float32": ["-DDT=0"], "float16": ["-DDT=1"], "bfloat16": ["-DDT=2"]}
    assert [p.build_for(b, d) for d in dts] == list(dts)
    assert p.build_defines(b, None) == []
    # dtypes with equal definitions share a build, named after the first of them
    q = _problem(dtypes=dts, dtype_defines=_fp16_like_fp32)
    assert q.builds({"variant": "a"}) == {"float32": ["-DWIDE=native"], "bfloat16": ["-DWIDE=f32"]}
    assert q.build_for({"variant": "a"}, "float16") == "float32"
    # part of the fingerprint when set (and only then: problems without it keep theirs)
    assert p.fingerprint() != _problem(dtypes=dts).fingerprint()
    assert "dtype_defines" not in _problem(dtypes=dts).describe()["contract"]
    assert p.describe()["contract"]["dtype_defines"].endswith("_per_dtype")
    assert p.diff(q.describe()) == ["contract"]


def _clashes(params: object, dtype: str) -> dict[str, int]:
    return {"variant": 1}


def _bad_value(params: object, dtype: str) -> dict[str, object]:
    return {"DT": "a b"}


def test_problem_dtype_defines_errors_name_the_fix() -> None:
    with pytest.raises(ProblemError, match="'variant' is also a param"):
        _problem(dtype_defines=_clashes, seeds=(Genome(SRC, {"variant": "a"}),)).validate(needs_gpu_contract=False)
    with pytest.raises(ProblemError, match="plain token"):
        _problem(dtype_defines=_bad_value).build_defines({"variant": "a"}, "float32")
    with pytest.raises(ProblemError, match="must be a function"):
        _problem(dtype_defines={"float32": {"DT": 0}}).validate(needs_gpu_contract=False)
    with pytest.raises(ProblemError, match="not among the Problem's dtypes"):
        _problem(dtypes=("float32",), dtype_defines=_per_dtype).build_for({"variant": "b"}, "float16")


def test_choice_default_is_one_of_its_values() -> None:
    assert Choice([0, 1], default=0).describe() == {"kind": "choice", "values": [0, 1], "default": 0}
    assert Choice([0, 1]).describe() == {"kind": "choice", "values": [0, 1]}
    with pytest.raises(SpaceError, match="not one of its values"):
        Choice([0, 1], default=2)
    with pytest.raises(SpaceError):
        Choice([0, 1], default=True)  # True is not 1 here


def test_descriptor_values_and_axes() -> None:
    p = _problem()
    g = Genome(SRC, {"variant": "b"})
    ev = Evaluation(Status.OK, fitness=1.0, resources={"registers": 40})
    vals = p.descriptor_values(g, ev)
    assert vals == {"registers": 40, "variant": "b"}
    assert [a.index(vals[a.name]) for a in p.descriptors] == [1, 1]
    ax = p.descriptors[0]
    assert ax.index(-5) == 0 and ax.index(1e9) == 7
    with pytest.raises(SpaceError):
        ax.index(math.nan)
    with pytest.raises(SpaceError):
        p.descriptors[1].index("c")
    with pytest.raises(SpaceError):
        p.descriptor_values(g, Evaluation(Status.OK, fitness=1.0))


def test_a_resident_launch_takes_a_one_dimensional_grid_and_cluster():
    la = Launch((528, 1), (128,), cluster=(16,), resident=1)
    assert la.resident is True and la.grid == (528, 1, 1) and la.cluster == (16, 1, 1)
    assert Launch((4, 1, 1), (32, 1, 1)).resident is False
    with pytest.raises(ProblemError, match="1-D grid and cluster"):
        Launch((4, 2, 1), (32, 1, 1), resident=True)
    with pytest.raises(ProblemError, match="1-D grid and cluster"):
        Launch((4, 2, 1), (32, 1, 1), cluster=(1, 2, 1), resident=True)
    Launch((4, 2, 1), (32, 1, 1))  # a 2-D grid is fine when not resident


def test_case_times_keeps_finite_positive_times_of_ok_evaluations() -> None:
    cases = {"a": {"time_ms": 0.5}, "b": {"time_ms": 0}, "c": {"time_ms": float("inf")}, "d": {"gbps": 1.0},
             "e": {"time_ms": True}, "f": 3.0, "g": {"time_ms": 2}}
    ev = Evaluation(Status.OK, fitness=1.0, metrics={"cases": cases})
    assert ev.case_times() == {"a": 0.5, "g": 2.0}
    assert Evaluation(Status.OK, fitness=1.0).case_times() == {}
    assert Evaluation.failure(Status.INCORRECT, "wrong", metrics={"cases": cases}).case_times() == {}
