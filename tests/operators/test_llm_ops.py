"""The LLM operators against the fake provider over real HTTP, through both official SDKs."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from evo.types import Evaluation, Genome, Lesson, Record, Status
from operators import OperatorContext, OperatorError, Proposal
from operators.llm import (
    AnthropicBackend,
    BudgetExceeded,
    CostLedger,
    LLMCrossover,
    LLMDiff,
    LLMRepair,
    LLMRewrite,
    OpenAIBackend,
)
from tests.evo.cpu_problem import make_problem, seed_genome
from tests.operators.llm_server import FakeLLMServer, Reply, count_words, fake_llm  # noqa: F401

HW = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "copy_gbps": 4021.5}
OLD_LINE = "acc[u * VEC + v] = i < n ? a * x[i] + y[i] : 0.0f;"
NEW_LINE = "acc[u * VEC + v] = i < n ? fmaf(a, x[i], y[i]) : 0.0f;"


def record(genome: Genome, fitness: float | None = 2.0, status: Status = Status.OK, **kw: Any) -> Record:
    if status is Status.OK:
        ev = Evaluation(Status.OK, fitness, metrics={"fraction": 0.5, "cases": {"N=1000:float32": {
            "time_ms": 0.0123, "gbps": 2900.0, "fraction": 0.72}}}, resources={"registers": 18, "spill_bytes": 0})
    else:
        ev = Evaluation(status, None, artifacts=kw.pop("artifacts", {}))
    return Record(genome, ev, **kw)


class ArchiveView:
    """A read-only archive view with the methods the operators use."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records

    def best(self) -> Record | None:
        ok = [r for r in self.records if r.fitness is not None]
        return max(ok, key=lambda r: r.fitness) if ok else None

    def sample_elites(self, n: int, rng: np.random.Generator) -> list[Record]:
        idx = rng.permutation(len(self.records))[:n]
        return [self.records[i] for i in idx]

    def __contains__(self, genome_id: object) -> bool:
        return any(r.id == genome_id for r in self.records)


@pytest.fixture(params=["openai", "anthropic"])
def backend(request: pytest.FixtureRequest, fake_llm: FakeLLMServer) -> Any:  # noqa: F811
    if request.param == "openai":
        b = OpenAIBackend(model="gpt-4o-mini", base_url=fake_llm.openai_url, api_key="test", timeout=5,
                          max_retries=2, backoff_base=0.001)
    else:
        b = AnthropicBackend(model="claude-sonnet-4-5", base_url=fake_llm.anthropic_url, api_key="test", timeout=5,
                             max_retries=2, backoff_base=0.001)
    b.server = fake_llm
    return b


def ctx_for(backend: Any, archive: Any = None, lessons: tuple[Lesson, ...] = (), seed: int = 0) -> OperatorContext:
    return OperatorContext(rng=np.random.default_rng(seed), problem=make_problem(), lessons=lessons,
                           archive=archive, llm=backend, generation=3, hardware=HW)


def diff_answer(search: str, replace: str, params: dict[str, Any] | None = None) -> str:
    text = f"Use a fused multiply-add.\n\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"
    if params is not None:
        text += "\n```json\n" + json.dumps({"params": params}) + "\n```\n"
    return text


def only(children: list[Any]) -> Proposal:
    assert len(children) == 1 and isinstance(children[0], Proposal)
    return children[0]


# ------------------------------------------------------------------------------- LLMDiff


def test_diff_well_formed(backend: Any) -> None:
    parent = record(seed_genome())
    srv = backend.server
    answer = diff_answer(OLD_LINE, NEW_LINE, {"UNROLL": 2})
    srv.push(answer)
    p = only(LLMDiff().propose([parent], ctx_for(backend)))
    assert NEW_LINE in p.genome.source and OLD_LINE not in p.genome.source
    assert p.genome.params["UNROLL"] == 2 and p.genome.entry == "axpy"
    assert p.note == "llm_diff: 1 block, params UNROLL 1->2"
    req = srv.requests[-1]
    assert p.meta["model"] == backend.model
    assert p.meta["prompt_tokens"] == req.prompt_tokens and p.meta["completion_tokens"] == count_words(answer)
    assert p.meta["cost"] > 0 and p.meta["latency"] > 0
    prompt = req.prompt
    for expected in ("out[i] = a * x[i] + y[i]", "NVIDIA H200", "4021", "SMs: 132", OLD_LINE, '"UNROLL"',
                     "N=1000:float32", "time_ms 0.0123", "registers 18", "SEARCH"):
        assert expected in prompt, f"prompt lacks {expected!r}"


def test_diff_whitespace_tolerant(backend: Any) -> None:
    parent = record(seed_genome())
    # Indentation and inner spacing differ from the parent; exact match fails, line match succeeds.
    search = "   int i = base  +  u * VEC + v;\n  " + OLD_LINE.replace(" ? ", "  ?  ")
    backend.server.push(diff_answer(search, "            int i = base + u * VEC + v;\n            " + NEW_LINE))
    p = only(LLMDiff().propose([parent], ctx_for(backend)))
    assert NEW_LINE in p.genome.source and p.note == "llm_diff: 1 block"
    assert p.genome.source.count("int i = base + u * VEC + v;") == 1


def test_diff_search_not_in_parent(backend: Any) -> None:
    backend.server.push(diff_answer(OLD_LINE, NEW_LINE) + diff_answer("float no_such_line = 1.0f;", "x"))
    with pytest.raises(OperatorError, match=r"edit block 2: SEARCH text not found in the parent") as ei:
        LLMDiff().propose([record(seed_genome())], ctx_for(backend))
    assert ei.value.meta["model"] == backend.model  # the call is still accounted


def test_diff_ambiguous_search(backend: Any) -> None:
    backend.server.push(diff_answer("#pragma unroll", "#pragma unroll 4"))
    with pytest.raises(OperatorError, match=r"edit block 1: SEARCH text is ambiguous: it matches 3 places"):
        LLMDiff().propose([record(seed_genome())], ctx_for(backend))


def test_diff_without_blocks_and_unclosed(backend: Any) -> None:
    backend.server.push("I would use fmaf here.", "<<<<<<< SEARCH\n" + OLD_LINE + "\n=======\n" + NEW_LINE)
    with pytest.raises(OperatorError, match="no SEARCH/REPLACE edit blocks"):
        LLMDiff().propose([record(seed_genome())], ctx_for(backend))
    with pytest.raises(OperatorError, match=r"not closed by '>>>>>>> REPLACE' \(truncated"):
        LLMDiff().propose([record(seed_genome())], ctx_for(backend))


def test_diff_that_changes_only_comments_is_a_duplicate(backend: Any) -> None:
    parent = record(seed_genome())
    backend.server.push(diff_answer(OLD_LINE, OLD_LINE + "  // same code"))
    with pytest.raises(OperatorError, match=f"duplicate of {parent.id}"):
        LLMDiff().propose([parent], ctx_for(backend))


def test_duplicate_of_archive_record(backend: Any) -> None:
    parent = record(seed_genome())
    existing = record(seed_genome().with_source(seed_genome().source.replace(OLD_LINE, NEW_LINE)), 3.0)
    backend.server.push(diff_answer(OLD_LINE, NEW_LINE))
    with pytest.raises(OperatorError, match=f"duplicate of {existing.id}"):
        LLMDiff().propose([parent], ctx_for(backend, archive=ArchiveView([parent, existing])))


# ---------------------------------------------------------------------------- LLMRewrite


def rewritten() -> str:
    return seed_genome().source.replace(OLD_LINE, NEW_LINE).replace("#pragma unroll\n    for (int k", "for (int k")


def test_rewrite(backend: Any) -> None:
    backend.server.push(f"Here it is.\n```cuda\n{rewritten()}```\n```json\n{{\"params\": {{\"VEC\": 2}}}}\n```")
    p = only(LLMRewrite().propose([record(seed_genome())], ctx_for(backend)))
    assert p.genome.source == rewritten() and p.genome.params["VEC"] == 2
    assert p.note == "llm_rewrite: rewrite, params VEC 1->2"
    assert "```cuda" in backend.server.requests[-1].prompt


def test_rewrite_no_code_block(backend: Any) -> None:
    backend.server.push("You could unroll the loop further and use vector loads.")
    with pytest.raises(OperatorError, match="^no code block in the response$"):
        LLMRewrite().propose([record(seed_genome())], ctx_for(backend))


def test_rewrite_truncated(backend: Any) -> None:
    backend.server.push(Reply(text=f"```cuda\n{rewritten()}```", finish_reason="length"),
                        "```cuda\n" + rewritten()[:200])
    with pytest.raises(OperatorError, match=r"truncated response \(finish_reason=length\)"):
        LLMRewrite().propose([record(seed_genome())], ctx_for(backend))
    with pytest.raises(OperatorError, match="truncated response: a code fence is opened but never closed"):
        LLMRewrite().propose([record(seed_genome())], ctx_for(backend))


@pytest.mark.parametrize(("params_block", "match"), [
    ('{"params": {"UNROLL": 2,}}', r"params block is not valid JSON"),
    ('{"UNROLL": 2}', r'params block must be a JSON object \{"params"'),
    ('{"params": {"UNROLL": 3}}', r"invalid params proposed: param UNROLL=3 is outside"),
    ('{"params": {"UNROLL": 8, "VEC": 4}}', r"invalid params proposed: violates constraint: UNROLL \* VEC <= 16"),
    ('{"params": {"WARPS": 4}}', r"invalid params proposed: unknown param 'WARPS'"),
])
def test_invalid_params_reject_the_whole_proposal(backend: Any, params_block: str, match: str) -> None:
    backend.server.push(f"```cuda\n{rewritten()}```\n```json\n{params_block}\n```")
    with pytest.raises(OperatorError, match=match):
        LLMRewrite().propose([record(seed_genome())], ctx_for(backend))


# ------------------------------------------------------------------- crossover and repair


def test_crossover(backend: Any) -> None:
    a = record(seed_genome())
    b_src = seed_genome().source.replace("#pragma unroll\n        for (int v", "#pragma unroll 2\n        for (int v")
    b = record(Genome(b_src, {"UNROLL": 4, "VEC": 2, "THREADS": 256}, entry="axpy"), 2.5)
    assert LLMCrossover.n_parents == 2
    backend.server.push(f"```cuda\n{rewritten()}```\n```json\n{{\"params\": {{\"UNROLL\": 4, \"THREADS\": 256}}}}\n```")
    p = only(LLMCrossover().propose([a, b], ctx_for(backend)))
    assert p.genome.source == rewritten()
    assert dict(p.genome.params) == {"UNROLL": 4, "VEC": 1, "THREADS": 256}
    assert p.note == "llm_crossover: rewrite, params THREADS 128->256, UNROLL 1->4"
    prompt = backend.server.requests[-1].prompt
    assert "Parent A" in prompt and "Parent B" in prompt and "#pragma unroll 2" in prompt and a.id[:12] in prompt
    with pytest.raises(OperatorError, match="needs 2 parents"):
        LLMCrossover().propose([a], ctx_for(backend))


def test_repair_prompt_has_the_compile_log(backend: Any) -> None:
    broken = seed_genome().source.replace("acc[k]", "acc2[k]")
    log = 'cpu_axpy.cu(31): error: identifier "acc2" is undefined\n1 error detected in the compilation.'
    failed = record(Genome(broken, {"UNROLL": 1, "VEC": 1, "THREADS": 128}, entry="axpy"),
                    status=Status.COMPILE_ERROR, artifacts={"compile_log": log}, operator="llm_rewrite")
    assert LLMRepair.uses_failed_parents
    fixed = seed_genome().source.replace(OLD_LINE, NEW_LINE)
    backend.server.push(f"The array is named acc.\n```cuda\n{fixed}```")
    p = only(LLMRepair().propose([failed], ctx_for(backend)))
    assert p.genome.source == fixed
    prompt = backend.server.requests[-1].prompt
    assert 'identifier "acc2" is undefined' in prompt and "compile_error" in prompt and "acc2[k]" in prompt
    # Repair also takes SEARCH/REPLACE blocks, and mismatch reports reach the prompt.
    wrong = record(Genome(seed_genome().source.replace("a * x[i]", "x[i]"), {"UNROLL": 1, "VEC": 1, "THREADS": 128},
                          entry="axpy"), status=Status.INCORRECT,
                   artifacts={"mismatch": "case N=1000:float32: rel error 0.71 > 1e-05 at index 3"})
    backend.server.push(diff_answer("? x[i] + y[i]", "? a * x[i] + y[i]"))
    p = only(LLMRepair().propose([wrong], ctx_for(backend)))
    assert p.genome.source == seed_genome().source and p.note == "llm_repair: 1 block"
    assert "rel error 0.71" in backend.server.requests[-1].prompt


# ----------------------------------------------------------------------- prompt contents


def test_prompt_has_lessons_and_inspirations(backend: Any) -> None:
    parent = record(seed_genome())
    star_src = seed_genome().source.replace("float acc[", "float /*star*/ acc[")
    star = record(Genome(star_src, {"UNROLL": 2, "VEC": 2, "THREADS": 256}, entry="axpy"), 9.0)
    lessons = (
        Lesson("llm_rewrite", "c1", "rewrite with shared memory", "compile_error", parent_id="p0",
               message="ptxas error: too much shared data"),
        Lesson("param_mutation", "c2", "THREADS 128->256", "improved", parent_id=parent.id, delta=0.125),
        Lesson("llm_diff", "c3", "vectorised loads", "incorrect", parent_id="p9", message="rel error 0.5"),
    )
    backend.server.push(diff_answer(OLD_LINE, NEW_LINE))
    LLMDiff().propose([parent], ctx_for(backend, archive=ArchiveView([parent, star]), lessons=lessons))
    prompt = backend.server.requests[-1].prompt
    assert "Inspiration 1 " + star.id[:12] in prompt and "/*star*/" in prompt
    assert "ptxas error: too much shared data" in prompt and "rel error 0.5" in prompt
    assert "THREADS 128->256 -> improved (+12.5%)" in prompt
    assert prompt.index("On this parent:") < prompt.index("THREADS 128->256")


def test_prompt_is_bounded_with_visible_marker(backend: Any) -> None:
    parent = record(seed_genome())
    big = [record(Genome(seed_genome().source + f'\n#define PAD{i} "' + "pad " * 3000 + '"\n', {"UNROLL": 1, "VEC": 1,
                                                                                  "THREADS": 128}, entry="axpy"),
                  1.0 + i) for i in range(3)]
    backend.server.push(diff_answer(OLD_LINE, NEW_LINE))
    op = LLMDiff(max_prompt_chars=6000)
    op.propose([parent], ctx_for(backend, archive=ArchiveView([parent, *big])))
    user = [m for m in backend.server.requests[-1].body["messages"] if m["role"] == "user"][0]["content"]
    assert len(user) <= 6000
    assert "[... truncated " in user and OLD_LINE in user  # the parent is protected; inspirations were cut


# ---------------------------------------------------------------- user-written subclass


class HintOperator(LLMRewrite):
    """A user operator: its own template, its own placeholder."""

    name = "hint_rewrite"
    template = "USER-TEMPLATE-7731 entry=$entry\nHint: $hint\n$parent\nReply with a ```cuda block."

    def sections(self, parents: Any, ctx: OperatorContext) -> dict[str, str]:
        secs = super().sections(parents, ctx)
        secs["hint"] = "use fmaf"
        return secs


def test_user_subclass_with_own_template(backend: Any, tmp_path: Any) -> None:
    backend.server.push(f"```cuda\n{rewritten()}```")
    p = only(HintOperator().propose([record(seed_genome())], ctx_for(backend)))
    assert p.note == "hint_rewrite: rewrite"
    prompt = backend.server.requests[-1].prompt
    assert "USER-TEMPLATE-7731 entry=axpy\nHint: use fmaf" in prompt and OLD_LINE in prompt
    assert "Inspirations" not in prompt  # the default template is not used
    # A template file passed at construction wins over the class attribute.
    path = tmp_path / "mine.txt"
    path.write_text("FILE-TEMPLATE-0042 $parent\n")
    backend.server.push(f"```cuda\n{rewritten()}```")
    HintOperator(template=str(path)).propose([record(seed_genome())], ctx_for(backend))
    assert backend.server.requests[-1].prompt.count("FILE-TEMPLATE-0042") == 1


# ------------------------------------------------------------------------ call failures


def test_no_backend_is_an_operator_error() -> None:
    with pytest.raises(OperatorError, match="no LLM backend"):
        LLMDiff().propose([record(seed_genome())], ctx_for(None))


def test_failed_call_is_an_operator_error(backend: Any) -> None:
    backend.server.push(Reply(status=500), Reply(status=500), Reply(status=500))
    with pytest.raises(OperatorError, match=r"LLM call failed: .*retries exhausted after 3 attempts"):
        LLMRewrite().propose([record(seed_genome())], ctx_for(backend))
    assert len(backend.server.requests) == 3


def test_budget_runs_out_mid_run(backend: Any) -> None:
    backend.prices = {backend.model: (1000.0, 1000.0)}  # dear, so each call costs a visible amount
    backend.ledger = CostLedger()
    srv = backend.server
    srv.default = "```cuda\n" + rewritten() + "```"
    op = LLMRewrite()
    parent = record(seed_genome())
    first = only(op.propose([parent], ctx_for(backend)))
    per_call = first.meta["cost"]
    assert per_call == pytest.approx((first.meta["prompt_tokens"] + first.meta["completion_tokens"]) * 1e-3)
    backend.ledger.max_cost = 2.5 * per_call  # room for two more calls
    done = 1
    with pytest.raises(BudgetExceeded, match="LLM budget exhausted"):
        for i in range(10):
            op.propose([parent], ctx_for(backend, seed=i))
            done += 1
    assert done == 3 and len(srv.requests) == 3  # no request started after the cap
    assert backend.ledger.spent == pytest.approx(3 * per_call)
    usage = backend.usage()[backend.model]
    assert usage["calls"] == 3 and usage["prompt_tokens"] == sum(r.prompt_tokens for r in srv.requests)
