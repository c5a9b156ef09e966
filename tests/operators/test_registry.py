"""The operator registry: names, instances, classes, functions, entry points and lazy LLM names."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

import operators
from evo.types import Genome
from operators import (
    FunctionOperator,
    Operator,
    OperatorError,
    ParamCrossover,
    ParamMutation,
    ParamRandom,
    Proposal,
    UnknownOperatorError,
    available,
    register,
    resolve,
    unregister,
)
from operators.testing import CONTRACT_SOURCE, OperatorContract, contract_problem, make_context, make_record


def bump_fast(parents, ctx):
    """A plain propose function: flip FAST."""
    g = parents[0].genome
    return [Proposal(g.with_params(FAST=not g.params["FAST"]), note="FAST flipped")]


class FlipFast(Operator):
    def propose(self, parents, ctx):
        return bump_fast(parents, ctx)


@pytest.fixture
def registered():
    names: list[str] = []
    yield names
    for n in names:
        unregister(n)


def _parent():
    prob = contract_problem()
    return prob, make_record(Genome(CONTRACT_SOURCE, {"THREADS": 256, "VEC": 4, "UNROLL": 2, "FAST": False}))


# --------------------------------------------------------------------------- built-ins


def test_builtin_names_resolve_to_fresh_instances():
    a = resolve("param_mutation")
    b = resolve("param_mutation")
    assert isinstance(a, ParamMutation) and a is not b and a.name == "param_mutation"
    assert isinstance(resolve("param_crossover"), ParamCrossover) and resolve("param_crossover").n_parents == 2
    assert isinstance(resolve("param_random"), ParamRandom)


def test_options_reach_the_constructor():
    op = resolve("param_mutation", n_changes=3, p_neighbour=0.2)
    assert (op.n_changes, op.p_neighbour) == (3, 0.2)
    with pytest.raises(TypeError):
        resolve("param_mutation", not_an_option=1)
    with pytest.raises(TypeError, match="ready-made operator"):
        resolve(ParamMutation(), n_changes=2)


def test_available_lists_builtins_and_llm_names_without_importing_llm():
    names = available()
    for n in ("param_mutation", "param_crossover", "param_random", "llm_diff", "llm_rewrite", "llm_crossover",
              "llm_repair"):
        assert n in names
    assert names == sorted(names)


def test_import_operators_loads_no_llm_sdk():
    code = textwrap.dedent("""
        import sys, operators
        operators.available()
        operators.resolve("param_mutation")
        bad = [m for m in ("openai", "anthropic", "operators.llm", "cupy", "ray") if m in sys.modules]
        assert not bad, bad
        print("clean")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr


@pytest.mark.skipif(importlib.util.find_spec("operators.llm") is None, reason="operators.llm not written yet")
def test_llm_names_are_lazy_attributes():
    llm = importlib.import_module("operators.llm")
    for name in ("LLMDiff", "LLMRewrite", "LLMCrossover", "LLMRepair", "OpenAIBackend", "AnthropicBackend",
                 "LLMEnsemble", "Completion", "from_env", "BudgetExceeded"):
        assert getattr(operators, name) is getattr(llm, name)
    from operators._registry import _BUILTIN

    for reg, attr in (("llm_diff", "LLMDiff"), ("llm_rewrite", "LLMRewrite"), ("llm_crossover", "LLMCrossover"),
                      ("llm_repair", "LLMRepair")):
        assert _BUILTIN[reg] == ("operators.llm", attr)
        assert issubclass(getattr(llm, attr), Operator)
        op = resolve(reg)
        assert isinstance(op, getattr(llm, attr)) and op.name == reg


def test_unknown_attribute_and_dir():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        operators.nope  # noqa: B018
    assert "LLMDiff" in dir(operators) and "resolve" in dir(operators)


# --------------------------------------------------------------------------- instances, classes, functions


def test_instance_is_returned_as_is_and_class_is_instantiated():
    op = ParamRandom()
    assert resolve(op) is op
    made = resolve(FlipFast)
    assert isinstance(made, FlipFast) and made.name == "flip_fast"


def test_plain_function_becomes_function_operator():
    op = resolve(bump_fast)
    assert isinstance(op, FunctionOperator) and op.name == "bump_fast" and op.n_parents == 1
    prob, parent = _parent()
    (child,) = op.propose([parent], make_context(prob, 0))
    assert child.genome.params["FAST"] is True

    def cross(parents, ctx):
        return None

    assert resolve(cross, n_parents=2).n_parents == 2
    cross.n_parents = 3
    cross.uses_failed_parents = True
    op3 = resolve(cross)
    assert op3.n_parents == 3 and op3.uses_failed_parents and op3.propose([], None) == []
    assert resolve(lambda parents, ctx: []).name == "lambda"
    with pytest.raises(ValueError, match="n_parents"):
        resolve(cross, n_parents=-1)


def test_function_operator_checks_what_it_returns():
    prob, parent = _parent()
    ctx = make_context(prob, 0)
    single = resolve(lambda parents, ctx: parents[0].genome.with_params(FAST=True))
    assert len(single.propose([parent], ctx)) == 1
    with pytest.raises(TypeError, match="returned str"):
        resolve(lambda parents, ctx: "source").propose([parent], ctx)
    with pytest.raises(TypeError, match="returned a dict among its children"):
        resolve(lambda parents, ctx: [{"source": "x"}]).propose([parent], ctx)


def test_things_that_are_not_operators():
    class NotAnOperator:
        pass

    with pytest.raises(TypeError, match="not an operators.Operator subclass"):
        resolve(NotAnOperator)
    with pytest.raises(TypeError, match="cannot make an operator from int"):
        resolve(3)
    with pytest.raises(TypeError, match="returned int"):
        resolve(lambda: 3)
    with pytest.raises(TypeError, match="abstract"):
        resolve(Operator)


# --------------------------------------------------------------------------- register


def test_register_class_factory_instance_and_function(registered):
    register("rt_class", FlipFast)
    registered.append("rt_class")
    op = resolve("rt_class")
    assert isinstance(op, FlipFast) and op.name == "rt_class"  # a class resolved by name takes the name

    @register("rt_factory")
    def make():
        return ParamMutation(n_changes=2)

    registered.append("rt_factory")
    assert make.__name__ == "make"  # the decorator returns the function unchanged
    op = resolve("rt_factory")
    assert isinstance(op, ParamMutation) and op.n_changes == 2 and op.name == "rt_factory"

    inst = ParamRandom()
    register("rt_instance", inst)
    registered.append("rt_instance")
    assert resolve("rt_instance") is inst

    register("rt_fn", bump_fast)
    registered.append("rt_fn")
    op = resolve("rt_fn")
    assert isinstance(op, FunctionOperator) and op.name == "rt_fn"
    assert {"rt_class", "rt_factory", "rt_instance", "rt_fn"} <= set(available())


def test_register_decorator_on_class(registered):
    @register("rt_deco")
    class Deco(FlipFast):
        pass

    registered.append("rt_deco")
    assert isinstance(resolve("rt_deco"), Deco)


def test_registered_names_override_builtins(registered):
    register("param_random", FlipFast)
    registered.append("param_random")
    assert isinstance(resolve("param_random"), FlipFast)


def test_register_conflicts_and_bad_input(registered):
    register("rt_dup", FlipFast)
    registered.append("rt_dup")
    register("rt_dup", FlipFast)  # the same object again is fine
    with pytest.raises(ValueError, match="already registered"):
        register("rt_dup", ParamRandom)
    register("rt_dup", ParamRandom, replace=True)
    assert isinstance(resolve("rt_dup"), ParamRandom)
    with pytest.raises(ValueError, match="non-empty"):
        register("", FlipFast)
    with pytest.raises(TypeError, match="not an operators.Operator subclass"):
        register("rt_bad", dict)
    with pytest.raises(TypeError):
        register("rt_bad", 42)
    assert "rt_bad" not in available()
    unregister("rt_dup")
    registered.remove("rt_dup")
    with pytest.raises(KeyError):
        unregister("rt_dup")


def test_unknown_name_lists_what_is_available():
    with pytest.raises(UnknownOperatorError) as ei:
        resolve("param_mutaton")
    assert isinstance(ei.value, KeyError)
    msg = str(ei.value)
    assert msg.startswith("unknown operator 'param_mutaton'; available:")
    assert "param_mutation" in msg and "evo.operators" in msg


def test_operator_error_from_builtin_is_catchable():
    prob, parent = _parent()
    with pytest.raises(OperatorError):
        resolve("param_crossover").propose([parent, parent], make_context(prob, 0))


# --------------------------------------------------------------------------- contract for wrapped functions


class TestFunctionOperatorContract(OperatorContract):
    def make_operator(self):
        return resolve(bump_fast)
