"""The LLM operators: diff, full rewrite, crossover and repair.

Each builds a prompt from a replaceable template (see :mod:`operators.llm._prompts`),
asks ``ctx.llm`` (or the backend given to the operator), turns the answer into one child
genome and checks it before it can reach the compiler: params proposed in a ```json
block must satisfy the Problem's space, and a child whose :attr:`Genome.id` equals a
parent's or is already in the archive is rejected as a duplicate. Any unusable answer
raises :class:`OperatorError` with the reason; the error carries ``meta`` (model,
tokens, cost) so the engine can still account the call.

Extending: subclass one of them, set ``name`` and ``template`` (a path, a packaged
template name or the text) and, if needed, override :meth:`LLMOperator.sections` to add
placeholders of your own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from evo.types import Genome, Record, thaw
from operators._base import Operator, OperatorContext, OperatorError, Proposal
from operators.llm._backends import Completion, LLMError
from operators.llm._diff import apply_blocks, extract_code, extract_params, parse_blocks
from operators.llm._prompts import (
    load_template,
    render,
    render_failure,
    render_hardware,
    render_inspirations,
    render_lessons,
    render_problem,
    render_record,
    select_inspirations,
    select_lessons,
)

__all__ = ["LLMCrossover", "LLMDiff", "LLMOperator", "LLMRepair", "LLMRewrite"]


def _param_note(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    parts = [f"{k} {old.get(k)!r}->{new[k]!r}".replace("'", "") for k in sorted(new) if old.get(k) != new[k]]
    return ", ".join(parts)


class LLMOperator(Operator):
    """Base of the LLM operators: prompt, call, parse, validate, dedupe.

    Class attributes a subclass sets:
        template: Default template (packaged name like ``"diff.txt"``, a path or text).
        system_template: Default system message (same forms).
        mode: How the answer becomes source: ``"diff"`` (SEARCH/REPLACE blocks),
            ``"rewrite"`` (a fenced code block) or ``"either"``.

    Args:
        template: Overrides the class template (path or text).
        system: Overrides the system message (path or text).
        llm: A backend used instead of ``ctx.llm``.
        max_prompt_chars: Bound on the user prompt; longest sections are cut first.
        n_inspirations: Archive records shown (the best plus sampled elites).
        n_lessons: Lessons shown.
        temperature: Sampling temperature (``None``: the provider's default).
        max_tokens: Output cap (``None``: the backend's default).
        **llm_params: Further keyword arguments for ``complete`` (e.g. ``top_p``).
    """

    template: ClassVar[str] = "rewrite.txt"
    system_template: ClassVar[str] = "system.txt"
    mode: ClassVar[str] = "rewrite"
    cost_weight: ClassVar[float] = 20.0

    def __init__(self, template: str | os.PathLike[str] | None = None, *, system: str | os.PathLike[str] | None = None,
                 llm: Any = None, max_prompt_chars: int | None = 24000, n_inspirations: int = 3, n_lessons: int = 12,
                 temperature: float | None = None, max_tokens: int | None = None, **llm_params: Any) -> None:
        if self.mode not in ("diff", "rewrite", "either"):
            raise ValueError(f"{type(self).__name__}.mode must be 'diff', 'rewrite' or 'either', got {self.mode!r}")
        self.template_text = load_template(template if template is not None else type(self).template)
        self.system_text = load_template(system if system is not None else type(self).system_template).strip()
        self.llm = llm
        self.max_prompt_chars = max_prompt_chars
        self.n_inspirations = n_inspirations
        self.n_lessons = n_lessons
        self.llm_params = dict(llm_params)
        if temperature is not None:
            self.llm_params["temperature"] = temperature
        if max_tokens is not None:
            self.llm_params["max_tokens"] = max_tokens

    # -- prompt ------------------------------------------------------------------------

    def sections(self, parents: Sequence[Record], ctx: OperatorContext) -> dict[str, str]:
        """The placeholder values for the template; override to add your own."""
        parent = parents[0]
        ids = [p.id for p in parents]
        secs = {
            "problem": render_problem(ctx.problem, parent.genome.entry),
            "hardware": render_hardware(ctx.hardware or {}, ctx.problem),
            "parent": render_record(parent, "Parent" if len(parents) == 1 else "Parent A"),
            "parent_b": render_record(parents[1], "Parent B") if len(parents) > 1 else "",
            "failure": render_failure(parent) if not parent.evaluation.ok else "",
            "inspirations": render_inspirations(select_inspirations(ctx.archive, ctx.rng, ids, self.n_inspirations)),
            "lessons": render_lessons(select_lessons(ctx.lessons or (), ids, self.n_lessons)),
            "entry": parent.genome.entry,
            "generation": str(ctx.generation),
        }
        return secs

    def messages(self, parents: Sequence[Record], ctx: OperatorContext) -> list[dict[str, str]]:
        """The chat sent to the backend: system message and the rendered user prompt."""
        user = render(self.template_text, self.sections(parents, ctx), self.max_prompt_chars)
        msgs = [{"role": "user", "content": user}]
        if self.system_text:
            msgs.insert(0, {"role": "system", "content": self.system_text})
        return msgs

    # -- answer -> child ---------------------------------------------------------------

    def child_source(self, completion: Completion, parents: Sequence[Record]) -> tuple[str, str]:
        """(new source, note fragment) from the answer, per :attr:`mode`."""
        text = completion.text
        base = parents[0].genome.source
        if self.mode in ("diff", "either"):
            blocks = parse_blocks(text)
            if blocks or self.mode == "diff":
                src = apply_blocks(base, blocks)
                return src, f"{len(blocks)} block{'s' * (len(blocks) != 1)}"
        src = extract_code(text)
        return src, "rewrite"

    def child(self, completion: Completion, parents: Sequence[Record], ctx: OperatorContext) -> tuple[Genome, str]:
        """The child genome and its note; raises :class:`OperatorError` for unusable answers."""
        if completion.finish_reason == "length":
            raise OperatorError("truncated response (finish_reason=length): raise max_tokens or ask for a smaller "
                                "change")
        source, what = self.child_source(completion, parents)
        parent = parents[0]
        old = thaw(parent.genome.params)
        proposed = extract_params(completion.text)
        params = dict(old)
        if proposed is not None:
            params.update(proposed)
            bad = ctx.problem.params.violations(params)
            if bad:
                raise OperatorError("invalid params proposed: " + "; ".join(bad))
        genome = Genome(source, params, parent.genome.entry, parent.genome.language)
        for p in parents:
            if genome.id == p.id:
                raise OperatorError(f"duplicate of {p.id} (a parent): the answer changed nothing that matters")
        archive = ctx.archive
        if archive is not None and hasattr(archive, "__contains__") and genome.id in archive:
            raise OperatorError(f"duplicate of {genome.id} (already in the archive)")
        note = f"{self.name}: {what}"
        pn = _param_note(old, params)
        if pn:
            note += f", params {pn}"
        return genome, note

    # -- the operator ------------------------------------------------------------------

    def propose(self, parents: Sequence[Record], ctx: OperatorContext) -> list[Proposal | Genome]:
        """Ask the LLM once and return one child.

        Raises:
            OperatorError: no backend, a failed call or an unusable answer (``.meta`` holds
                the call's accounting when a call was made).
            BudgetExceeded: the LLM budget is spent (the engine ends the run).
        """
        if len(parents) < self.n_parents:
            raise OperatorError(f"{self.name} needs {self.n_parents} parents, got {len(parents)}")
        backend = self.llm if self.llm is not None else ctx.llm
        if backend is None:
            raise OperatorError(f"{self.name}: no LLM backend; pass llm= to the Engine (e.g. operators.llm.from_env()) "
                                "or set EVO_LLM_BASE_URL, OPENAI_API_KEY or ANTHROPIC_API_KEY")
        msgs = self.messages(parents, ctx)
        try:
            c = backend.complete(msgs, **self.llm_params)
        except LLMError as e:
            err = OperatorError(f"{self.name}: LLM call failed: {e}")
            err.meta = {"attempts": getattr(e, "attempts", 1)}  # type: ignore[attr-defined]
            raise err from e
        meta = {"model": c.model, "backend": c.backend or c.model, "prompt_tokens": c.prompt_tokens,
                "completion_tokens": c.completion_tokens, "cost": c.cost, "latency": c.latency,
                "finish_reason": c.finish_reason, "attempts": c.attempts, "prompt_chars": sum(len(m["content"])
                                                                                          for m in msgs)}
        try:
            genome, note = self.child(c, parents, ctx)
        except OperatorError as e:
            e.meta = meta  # type: ignore[attr-defined]
            report = getattr(backend, "report", None)
            if callable(report):
                report(meta["backend"], 0.0, c.cost)
            raise
        return [Proposal(genome, note, meta)]


class LLMDiff(LLMOperator):
    """Asks for SEARCH/REPLACE edit blocks and applies them strictly to the parent."""

    name: ClassVar[str] = "llm_diff"
    template: ClassVar[str] = "diff.txt"
    mode: ClassVar[str] = "diff"


class LLMRewrite(LLMOperator):
    """Asks for a full rewrite of the kernel inside a ```cuda fenced block."""

    name: ClassVar[str] = "llm_rewrite"
    template: ClassVar[str] = "rewrite.txt"
    mode: ClassVar[str] = "rewrite"


class LLMCrossover(LLMOperator):
    """Asks for one kernel combining two parents (full source in a ```cuda block)."""

    name: ClassVar[str] = "llm_crossover"
    n_parents: ClassVar[int] = 2
    template: ClassVar[str] = "crossover.txt"
    mode: ClassVar[str] = "rewrite"


class LLMRepair(LLMOperator):
    """Fixes a failed record: the prompt carries its compile log or mismatch report.

    Accepts a full source in a ```cuda block or SEARCH/REPLACE blocks.
    """

    name: ClassVar[str] = "llm_repair"
    uses_failed_parents: ClassVar[bool] = True
    template: ClassVar[str] = "repair.txt"
    mode: ClassVar[str] = "either"
