"""End to end: the engine with the four LLM operators against the fake provider.

The "model" is a scripted function of the prompt: it edits the parent it is shown
(a unique marker per answer, new params from a list), breaks the kernel on every third
answer (so compile errors become lessons) and fixes broken kernels in repair prompts.
Candidates compile with the real nvcc and are scored from ``ptxas -v`` (``cpu_problem``).
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import threading
from pathlib import Path

import pytest

from tests.operators.llm_server import FakeLLMServer, Reply, Request

pytestmark = pytest.mark.skipif(subprocess.run(["which", "nvcc"], capture_output=True).returncode != 0,
                                reason="nvcc not installed")

BASE_LINE = "int base = (blockIdx.x * THREADS + threadIdx.x) * VEC * UNROLL;"
OUT_LINE = "if (i < n) out[i] = acc[k];"
BROKEN_LINE = "if (i < n) out[i] = acc_missing[k];"
PARAMS = [{"UNROLL": 2, "VEC": 1, "THREADS": 128}, {"UNROLL": 2, "VEC": 2, "THREADS": 256},
          {"UNROLL": 4, "VEC": 2, "THREADS": 256}, {"UNROLL": 4, "VEC": 4, "THREADS": 512},
          {"UNROLL": 8, "VEC": 2, "THREADS": 512}, {"UNROLL": 1, "VEC": 4, "THREADS": 64}]


class ScriptedModel:
    """Answers like a (very predictable) model would, from what the prompt shows."""

    def __init__(self) -> None:
        self.counter = itertools.count(1)
        self.lock = threading.Lock()
        self.broke: list[int] = []  # request numbers whose answer broke the kernel

    def __call__(self, req: Request) -> Reply:
        with self.lock:
            n = next(self.counter)
        prompt = req.prompt
        parent = re.search(r"```cuda\n(.*?)\n```", prompt.split("## Parent", 1)[-1].split("## Failed", 1)[-1],
                           re.DOTALL)
        source = parent.group(1) if parent else ""
        params = json.dumps({"params": PARAMS[n % len(PARAMS)]})
        marker = f"    const int variant_{n} = {n}; (void)variant_{n};"
        if "## What went wrong" in prompt:  # repair: fix the missing array, add a marker
            fixed = source.replace("acc_missing", "acc").replace(BASE_LINE, BASE_LINE + "\n" + marker)
            return Reply(text=f"Renamed the array back.\n```cuda\n{fixed}\n```")
        breaks = n % 3 == 0 and OUT_LINE in source
        if breaks:
            self.broke.append(n)
        if "<<<<<<< SEARCH" in prompt:  # diff template
            blocks = f"<<<<<<< SEARCH\n{BASE_LINE}\n=======\n{BASE_LINE}\n{marker}\n>>>>>>> REPLACE\n"
            if breaks:
                blocks += f"<<<<<<< SEARCH\n{OUT_LINE}\n=======\n{BROKEN_LINE}\n>>>>>>> REPLACE\n"
            return Reply(text=f"Try a new tiling.\n{blocks}\n```json\n{params}\n```")
        child = source.replace(BASE_LINE, BASE_LINE + "\n" + marker)
        if breaks:
            child = child.replace(OUT_LINE, BROKEN_LINE)
        return Reply(text=f"```cuda\n{child}\n```\n```json\n{params}\n```")


def test_engine_with_llm_operators(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from archive import Archive
    from evo.engine import Budget, Engine, EngineConfig
    from operators.llm import LLMCrossover, LLMDiff, LLMRepair, LLMRewrite, OpenAIBackend
    from tests.evo.cpu_problem import make_evaluator, make_problem

    model = ScriptedModel()
    n_evals = 18
    with FakeLLMServer(default=model) as srv:
        llm = OpenAIBackend(model="local-coder", base_url=srv.openai_url, timeout=10, backoff_base=0.001)
        problem = make_problem()
        ev = make_evaluator(problem, tmp_path / "cache", compile_workers=2)
        ops = [LLMDiff(), LLMRewrite(), LLMCrossover(), LLMRepair()]
        try:
            cfg = EngineConfig(islands=1, in_flight=2, proposal_workers=2)
            with Engine(problem, Archive(problem, str(tmp_path / "run")), operators=ops, evaluator=ev, llm=llm,
                        config=cfg, seed=3) as eng:
                best = eng.run(Budget(evaluations=n_evals), progress=False)
                records = list(eng.archive.records())
                lessons = eng.archive.lessons.all()
        finally:
            ev.close()
        requests = list(srv.requests)

    assert best is not None and len(records) == n_evals
    by_op = {r.operator for r in records}
    assert {"llm_diff", "llm_rewrite"} & by_op, by_op
    llm_records = [r for r in records if r.operator.startswith("llm_")]
    assert llm_records and all(r.meta.get("model") == "local-coder" for r in llm_records)
    failed = [r for r in records if r.evaluation.status.value == "compile_error"]
    assert failed and "acc_missing" in failed[0].evaluation.reason
    # Lessons from earlier generations reach later prompts.
    first_fail = min(les.created for les in lessons if "acc_missing" in les.message)
    later = [r.prompt for r in requests if r.time > first_fail]
    assert any("Recent failures" in p and "acc_missing" in p.split("## Lessons", 1)[-1] for p in later), \
        "a compile error recorded as a lesson never reached a later prompt"
    improved = [les for les in lessons if les.outcome == "improved" and les.operator.startswith("llm_")]
    if improved:
        assert any("Changes that gave speedups" in p for p in later)

    # Tokens per evaluation, as the fake server counts them (words).
    prompt_tokens = sum(r.prompt_tokens for r in requests)
    per_eval = (prompt_tokens + srv.completion_tokens) / n_evals
    usage = llm.usage()["local-coder"]
    assert usage["prompt_tokens"] == prompt_tokens and usage["completion_tokens"] == srv.completion_tokens
    assert usage["cost"] == 0.0  # an unknown local model is free
    with capsys.disabled():
        print(f"\n[llm e2e] {len(requests)} LLM calls for {n_evals} evaluations: "
              f"{prompt_tokens / len(requests):.0f} prompt + {srv.completion_tokens / len(requests):.0f} completion "
              f"tokens per call, {per_eval:.0f} tokens per evaluation")
