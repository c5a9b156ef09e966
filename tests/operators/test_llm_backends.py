"""Backends over the official SDKs against the fake provider: retries, timeouts, budget, ensemble."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from operators.llm import (
    AnthropicBackend,
    BudgetExceeded,
    Completion,
    CostLedger,
    LLMBackend,
    LLMEnsemble,
    LLMError,
    OpenAIBackend,
    from_env,
    price_for,
)
from tests.operators.llm_server import FakeLLMServer, Reply, fake_llm  # noqa: F401

MSGS = [{"role": "system", "content": "be terse"}, {"role": "user", "content": "write a fast kernel please"}]


def make(provider: str, srv: FakeLLMServer, **kw: Any) -> Any:
    kw.setdefault("backoff_base", 0.001)
    kw.setdefault("timeout", 5)
    if provider == "openai":
        return OpenAIBackend(model=kw.pop("model", "gpt-4o-mini"), base_url=srv.openai_url, api_key="k", **kw)
    return AnthropicBackend(model=kw.pop("model", "claude-sonnet-4-5"), base_url=srv.anthropic_url, api_key="k", **kw)


PROVIDERS = pytest.mark.parametrize("provider", ["openai", "anthropic"])


@PROVIDERS
def test_completion_and_accounting(provider: str, fake_llm: FakeLLMServer) -> None:  # noqa: F811
    b = make(provider, fake_llm)
    assert isinstance(b, LLMBackend)
    fake_llm.push("one two three")
    c = b.complete(MSGS, temperature=0.5)
    assert isinstance(c, Completion)
    assert (c.text, c.prompt_tokens, c.completion_tokens, c.finish_reason, c.provider, c.attempts) == \
        ("one two three", 7, 3, "stop", provider, 1)
    pin, pout = price_for(b.model)
    assert pin > 0 and c.cost == pytest.approx((7 * pin + 3 * pout) / 1e6)
    req = fake_llm.requests[-1]
    assert req.body["model"] == b.model and req.body["temperature"] == 0.5
    if provider == "anthropic":  # the system message is split out
        assert req.body["system"] == "be terse" and [m["role"] for m in req.body["messages"]] == ["user"]
        assert req.body["max_tokens"] == 8192 and req.path == "/v1/messages"
    else:
        assert [m["role"] for m in req.body["messages"]] == ["system", "user"] and req.path == "/v1/chat/completions"
    assert b.usage() == {b.model: {"calls": 1, "prompt_tokens": 7, "completion_tokens": 3, "cost": c.cost,
                                   "retries": 0, "errors": 0}}


@PROVIDERS
def test_429_then_success_honours_retry_after(provider: str, fake_llm: FakeLLMServer) -> None:  # noqa: F811
    slept: list[float] = []
    b = make(provider, fake_llm, sleep=slept.append)
    fake_llm.push(Reply(status=429, headers={"Retry-After": "0.25"}), "fine")
    c = b.complete(MSGS)
    assert c.text == "fine" and c.attempts == 2 and len(fake_llm.requests) == 2
    assert slept == [0.25]
    assert b.usage()[b.model]["retries"] == 1


@PROVIDERS
def test_500_retried_then_error(provider: str, fake_llm: FakeLLMServer) -> None:  # noqa: F811
    slept: list[float] = []
    b = make(provider, fake_llm, max_retries=2, backoff_base=0.01, sleep=slept.append)
    fake_llm.default = Reply(status=500, text="upstream exploded")
    with pytest.raises(LLMError, match=r"InternalServerError.*retries exhausted after 3 attempts") as ei:
        b.complete(MSGS)
    assert ei.value.attempts == 3 and ei.value.status == 500 and len(fake_llm.requests) == 3
    assert len(slept) == 2 and 0.005 <= slept[0] <= 0.01 and 0.01 <= slept[1] <= 0.02  # exponential, jittered
    assert b.usage()[b.model]["errors"] == 1


@PROVIDERS
def test_client_error_not_retried(provider: str, fake_llm: FakeLLMServer) -> None:  # noqa: F811
    b = make(provider, fake_llm)
    fake_llm.push(Reply(status=400, text="bad request: unknown field"))
    with pytest.raises(LLMError, match=r"BadRequestError.*not retryable after 1 attempt"):
        b.complete(MSGS)
    assert len(fake_llm.requests) == 1


@PROVIDERS
def test_timeout_then_retry_and_failure(provider: str, fake_llm: FakeLLMServer) -> None:  # noqa: F811
    b = make(provider, fake_llm, timeout=0.3, max_retries=1)
    fake_llm.push(Reply(text="late", delay=3.0), "in time")
    t0 = time.monotonic()
    c = b.complete(MSGS)
    assert c.text == "in time" and c.attempts == 2 and time.monotonic() - t0 < 2.5
    fake_llm.push(Reply(text="late", delay=3.0), Reply(text="late", delay=3.0))
    with pytest.raises(LLMError, match=r"APITimeoutError.*retries exhausted after 2 attempts"):
        b.complete(MSGS)
    assert len(fake_llm.requests) == 4
    assert b.usage()[b.model] == {"calls": 1, "prompt_tokens": 7, "completion_tokens": 2, "cost": c.cost,
                                  "retries": 2, "errors": 1}


def test_budget_shared_across_backends(fake_llm: FakeLLMServer) -> None:  # noqa: F811
    ledger = CostLedger(max_cost=0.0105)
    prices = {"dear": (1000.0, 0.0)}  # 7 prompt tokens -> $0.007 a call
    oa = make("openai", fake_llm, model="dear", prices=prices, ledger=ledger)
    an = make("anthropic", fake_llm, model="dear", prices=prices, ledger=ledger)
    fake_llm.default = "ok"
    assert oa.complete(MSGS).cost == pytest.approx(0.007)
    an.complete(MSGS)  # starts under the cap (0.007 < 0.0105), ends over it
    with pytest.raises(BudgetExceeded, match=r"spent \$0.0140 of \$0.0105"):
        oa.complete(MSGS)
    with pytest.raises(BudgetExceeded):
        an.complete(MSGS)
    assert len(fake_llm.requests) == 2 and ledger.usage()["dear"]["calls"] == 2


def test_concurrency_limit(fake_llm: FakeLLMServer) -> None:  # noqa: F811
    lock = threading.Lock()
    state = {"now": 0, "max": 0}

    def slow(req: Any) -> Reply:
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        time.sleep(0.2)
        with lock:
            state["now"] -= 1
        return Reply(text="ok")

    fake_llm.default = slow
    b = make("openai", fake_llm, max_concurrency=2)
    threads = [threading.Thread(target=b.complete, args=(MSGS,)) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake_llm.requests) == 5 and state["max"] == 2


def test_prices() -> None:
    assert price_for("gpt-4o-mini-2024-07-18") == (0.15, 0.60)  # longest prefix, not gpt-4o
    assert price_for("claude-sonnet-4-5-20250929") == (3.0, 15.0)
    assert price_for("qwen2.5-coder:32b") == (0.0, 0.0)
    assert price_for("mine", {"mine": (1.0, 2.0)}) == (1.0, 2.0)


def test_from_env(monkeypatch: pytest.MonkeyPatch, fake_llm: FakeLLMServer) -> None:  # noqa: F811
    for var in ("EVO_LLM_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "EVO_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    assert from_env() is None
    monkeypatch.setenv("ANTHROPIC_API_KEY", "a")
    assert isinstance(from_env(), AnthropicBackend)
    monkeypatch.setenv("OPENAI_API_KEY", "o")
    b = from_env()
    assert isinstance(b, OpenAIBackend) and b.model == "gpt-4o-mini"
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.setenv("EVO_LLM_BASE_URL", fake_llm.openai_url)
    monkeypatch.setenv("EVO_LLM_MODEL", "qwen2.5-coder")
    local = from_env(backoff_base=0.001)
    assert isinstance(local, OpenAIBackend) and local.model == "qwen2.5-coder"
    fake_llm.push("local answer")
    c = local.complete(MSGS)  # no key needed for a local server
    assert c.text == "local answer" and c.cost == 0.0
    assert fake_llm.requests[-1].body["model"] == "qwen2.5-coder"


def test_missing_key_message(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("EVO_LLM_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="set OPENAI_API_KEY"):
        OpenAIBackend()
    with pytest.raises(ValueError, match="set ANTHROPIC_API_KEY"):
        AnthropicBackend()


def test_import_does_not_load_sdks() -> None:
    code = ("import sys, operators, operators.llm; from operators.llm import LLMDiff, from_env; "
            "bad = [m for m in ('openai', 'anthropic', 'httpx') if m in sys.modules]; "
            "assert not bad, bad; print('clean')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr


# ---------------------------------------------------------------------------------- ensemble


def test_ensemble_learns_from_reports(fake_llm: FakeLLMServer) -> None:  # noqa: F811
    fake_llm.default = lambda req: Reply(text=f"from {req.body['model']}")
    good = make("openai", fake_llm, model="local-good")
    bad = make("anthropic", fake_llm, model="local-bad")
    ens = LLMEnsemble([good, bad], seed=1)
    assert isinstance(ens, LLMBackend)
    for _ in range(30):
        ens.report("local-good", True, 0.0)
        ens.report("local-bad", False, 0.0)
    picks = [ens.complete(MSGS).backend for _ in range(20)]
    assert picks.count("local-good") >= 18
    s = ens.stats()
    assert s["local-good"]["reward"] == 30 and s["local-bad"]["reports"] == 30
    assert ens.usage()["local-good"]["calls"] == picks.count("local-good")


def test_ensemble_prefers_cheap_improvement(fake_llm: FakeLLMServer) -> None:  # noqa: F811
    ens = LLMEnsemble([make("openai", fake_llm, model="cheap"), make("openai", fake_llm, model="dear")],
                      strategy="ucb")
    for _ in range(20):  # same improvement rate, 50x the cost
        ens.report("cheap", 0.5, 0.001)
        ens.report("dear", 0.5, 0.05)
    assert ens.ranking()[0] == "cheap"


def test_ensemble_weights_and_fallback(fake_llm: FakeLLMServer) -> None:  # noqa: F811
    down = make("openai", fake_llm, model="down", max_retries=0)
    up = make("anthropic", fake_llm, model="up")
    fake_llm.default = lambda req: Reply(status=503) if req.body["model"] == "down" else Reply(text="ok")
    ens = LLMEnsemble([down, up], weights=[1.0, 0.0])
    with pytest.raises(LLMError, match="503|InternalServerError"):  # weight 0 disables the fallback arm
        ens.complete(MSGS)
    ens2 = LLMEnsemble([down, up], weights=[1000.0, 1.0], seed=0)
    c = ens2.complete(MSGS)
    assert c.text == "ok" and c.backend == "up" and ens2.stats()["down"]["failures"] == 1
    with pytest.raises(ValueError, match="weights"):
        LLMEnsemble([down, up], weights=[0.0, 0.0])


def test_ensemble_budget_propagates(fake_llm: FakeLLMServer) -> None:  # noqa: F811
    ledger = CostLedger(max_cost=0.0)
    ens = LLMEnsemble([make("openai", fake_llm, model="a", ledger=ledger),
                       make("openai", fake_llm, model="b", ledger=ledger)])
    with pytest.raises(BudgetExceeded):
        ens.complete(MSGS)
    assert fake_llm.requests == []
