"""LLM backends over the official ``openai`` and ``anthropic`` clients.

Both SDKs are imported lazily inside the constructors, so importing :mod:`operators` or
:mod:`operators.llm` never loads them. The SDKs' own retries are switched off
(``max_retries=0``): this module retries itself with exponential backoff and jitter on
429, 5xx, connection errors and timeouts, honours ``Retry-After``, counts every attempt,
limits concurrent calls with a semaphore, accounts tokens and cost per model and stops
at a hard budget shared through a :class:`CostLedger`.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "DEFAULT_PRICES",
    "AnthropicBackend",
    "BudgetExceeded",
    "Completion",
    "CostLedger",
    "LLMBackend",
    "LLMError",
    "OpenAIBackend",
    "from_env",
    "price_for",
]

log = logging.getLogger(__name__)

Message = Mapping[str, str]

#: USD per 1M tokens as ``(input, output)``, matched by the longest model-name prefix.
#: Unknown and local models cost 0; pass ``prices=`` to a backend to override.
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5-nano": (0.05, 0.40),
    "gpt-5": (1.25, 10.00),
    "o3-mini": (1.10, 4.40),
    "o4-mini": (1.10, 4.40),
    "o3": (2.00, 8.00),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-haiku-4-5": (1.00, 5.00),
    "claude-3-7-sonnet": (3.00, 15.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-opus-4": (15.00, 75.00),
}


class LLMError(RuntimeError):
    """An LLM call that failed for good (after retries, or a non-retryable error)."""

    def __init__(self, message: str, *, attempts: int = 1, status: int | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.status = status


class BudgetExceeded(RuntimeError):
    """The shared cost cap is reached; no further LLM call starts. The engine ends the run."""


@dataclass(frozen=True)
class Completion:
    """One LLM answer with its accounting.

    Attributes:
        text: The answer's text.
        model: The model id the provider reports (falls back to the requested one).
        prompt_tokens: Input tokens as counted by the provider.
        completion_tokens: Output tokens as counted by the provider.
        cost: USD, from the backend's price table (0 for unknown/local models).
        latency: Wall seconds of the successful attempt.
        finish_reason: ``"stop"``, ``"length"`` (truncated) or the provider's value.
        provider: ``"openai"`` or ``"anthropic"``.
        attempts: Requests made for this answer (1 when no retry was needed).
        backend: The name of the backend that answered (its configured model).
    """

    text: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    latency: float = 0.0
    finish_reason: str = "stop"
    provider: str = ""
    attempts: int = 1
    backend: str = ""


@runtime_checkable
class LLMBackend(Protocol):
    """Anything with ``complete(messages, **params) -> Completion``."""

    def complete(self, messages: Sequence[Message], **params: Any) -> Completion:
        """Answer a chat given as ``[{"role": ..., "content": ...}, ...]``."""
        ...


def price_for(model: str, prices: Mapping[str, tuple[float, float]] | None = None) -> tuple[float, float]:
    """USD per 1M (input, output) tokens for ``model``: the longest matching prefix, else 0."""
    table = dict(DEFAULT_PRICES)
    if prices:
        table.update(prices)
    if model in table:
        return table[model]
    best = ""
    for key in table:
        if model.startswith(key) and len(key) > len(best):
            best = key
    return table[best] if best else (0.0, 0.0)


class CostLedger:
    """Thread-safe token and cost accounting with an optional hard cap, shareable by backends.

    Args:
        max_cost: USD cap. Once the spent total reaches it, :meth:`check` (called before
            every request) raises :class:`BudgetExceeded`. ``None``: no cap.
    """

    def __init__(self, max_cost: float | None = None) -> None:
        if max_cost is not None and max_cost < 0:
            raise ValueError(f"max_cost must be >= 0 or None, got {max_cost}")
        self.max_cost = max_cost
        self._lock = threading.Lock()
        self._by_model: dict[str, dict[str, float]] = {}

    @property
    def spent(self) -> float:
        """USD spent so far, all models."""
        with self._lock:
            return sum(u["cost"] for u in self._by_model.values())

    def check(self) -> None:
        """Raise :class:`BudgetExceeded` when the cap is reached."""
        if self.max_cost is None:
            return
        spent = self.spent
        if spent >= self.max_cost:
            raise BudgetExceeded(f"LLM budget exhausted: spent ${spent:.4f} of ${self.max_cost:.4f}; "
                                 "raise the cost budget to continue")

    def _row(self, model: str) -> dict[str, float]:
        return self._by_model.setdefault(model, {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                                 "cost": 0.0, "retries": 0, "errors": 0})

    def record(self, model: str, prompt_tokens: int, completion_tokens: int, cost: float, retries: int = 0) -> None:
        """Account one successful call."""
        with self._lock:
            row = self._row(model)
            row["calls"] += 1
            row["prompt_tokens"] += prompt_tokens
            row["completion_tokens"] += completion_tokens
            row["cost"] += cost
            row["retries"] += retries

    def record_error(self, model: str, retries: int = 0) -> None:
        """Account one call that failed for good."""
        with self._lock:
            row = self._row(model)
            row["errors"] += 1
            row["retries"] += retries

    def usage(self) -> dict[str, dict[str, float]]:
        """Per-model ``{calls, prompt_tokens, completion_tokens, cost, retries, errors}``."""
        with self._lock:
            return {m: dict(r) for m, r in self._by_model.items()}


class _RetryingBackend:
    """Shared machinery: semaphore, retries with backoff, accounting, budget."""

    provider = ""

    def __init__(self, model: str, *, timeout: float = 60.0, max_retries: int = 4, max_concurrency: int = 4,
                 prices: Mapping[str, tuple[float, float]] | None = None, ledger: CostLedger | None = None,
                 backoff_base: float = 1.0, backoff_max: float = 60.0, default_params: Mapping[str, Any] | None = None,
                 name: str | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.model = model
        self.name = name or model
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.max_concurrency = int(max_concurrency)
        self.prices = dict(prices or {})
        self.ledger = ledger if ledger is not None else CostLedger()
        self.backoff_base = float(backoff_base)
        self.backoff_max = float(backoff_max)
        self.default_params = dict(default_params or {})
        self._sleep = sleep
        self._sem = threading.Semaphore(self.max_concurrency)
        self._jitter = random.Random()
        self.attempts = 0  # every HTTP request made, across calls

    # -- subclass hooks -------------------------------------------------------------
    def _request(self, messages: Sequence[Message], params: dict[str, Any]) -> Completion:
        raise NotImplementedError

    def _classify(self, exc: BaseException) -> tuple[bool, float | None, int | None]:
        """(retryable, retry_after seconds, HTTP status) for an exception from the SDK."""
        raise NotImplementedError

    # -- public -----------------------------------------------------------------------
    def cost_of(self, model: str, prompt_tokens: int, completion_tokens: int) -> float:
        """USD for a call, from the price table (the configured model's price first)."""
        pin, pout = price_for(self.model, self.prices)
        if (pin, pout) == (0.0, 0.0) and model != self.model:
            pin, pout = price_for(model, self.prices)
        return (prompt_tokens * pin + completion_tokens * pout) / 1e6

    def backoff(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry ``attempt`` (1-based): ``Retry-After`` if given, else
        exponential with full jitter, capped at ``backoff_max``."""
        if retry_after is not None and retry_after >= 0:
            return min(retry_after, self.backoff_max)
        cap = min(self.backoff_max, self.backoff_base * (2 ** (attempt - 1)))
        return self._jitter.uniform(cap / 2, cap)

    def complete(self, messages: Sequence[Message], **params: Any) -> Completion:
        """Send ``messages`` and return the answer; retries transient failures.

        Raises:
            BudgetExceeded: the shared ledger's cap is reached (checked before each attempt).
            LLMError: a non-retryable error, or retries exhausted.
        """
        if not messages:
            raise ValueError("messages is empty")
        call = {**self.default_params, **params}
        with self._sem:
            last: BaseException | None = None
            status: int | None = None
            for attempt in range(self.max_retries + 1):
                self.ledger.check()
                self.attempts += 1
                t0 = time.perf_counter()
                try:
                    c = self._request(messages, dict(call))
                except Exception as exc:  # noqa: BLE001 - classified below
                    retryable, retry_after, status = self._classify(exc)
                    last = exc
                    if not retryable or attempt == self.max_retries:
                        break
                    wait = self.backoff(attempt + 1, retry_after)
                    log.warning("%s %s: %s (attempt %d/%d), retrying in %.2fs", self.provider, self.model,
                                _short(exc), attempt + 1, self.max_retries + 1, wait)
                    self._sleep(wait)
                    continue
                latency = time.perf_counter() - t0
                cost = self.cost_of(c.model, c.prompt_tokens, c.completion_tokens)
                self.ledger.record(self.name, c.prompt_tokens, c.completion_tokens, cost, retries=attempt)
                return Completion(text=c.text, model=c.model or self.model, prompt_tokens=c.prompt_tokens,
                                  completion_tokens=c.completion_tokens, cost=cost, latency=latency,
                                  finish_reason=c.finish_reason, provider=self.provider, attempts=attempt + 1,
                                  backend=self.name)
            n = attempt + 1
            self.ledger.record_error(self.name, retries=attempt)
            what = "retries exhausted" if n > 1 else "not retryable"
            raise LLMError(f"{self.provider} {self.model}: {_short(last)} ({what} after {n} attempt{'s' * (n > 1)})",
                           attempts=n, status=status) from last

    def usage(self) -> dict[str, dict[str, float]]:
        """Per-model token/cost accounting of this backend's ledger (shared ledgers show all)."""
        return self.ledger.usage()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r})"


def _short(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _retry_after(response: Any) -> float | None:
    try:
        value = response.headers.get("retry-after")
    except AttributeError:
        return None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def _fit_params(create: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments the SDK method accepts; the rest travel in ``extra_body``.

    SDK releases add and drop sampling arguments (e.g. ``temperature``); sending the
    unknown ones as raw body fields keeps them working with any release.
    """
    import inspect

    try:
        known = set(inspect.signature(create).parameters)
    except (TypeError, ValueError):
        return params
    out = {k: v for k, v in params.items() if k in known}
    extra = {k: v for k, v in params.items() if k not in known}
    if extra:
        out["extra_body"] = {**extra, **dict(out.get("extra_body") or {})}
    return out


def _classify_sdk(sdk: Any, exc: BaseException) -> tuple[bool, float | None, int | None]:
    # Both SDKs share the same exception hierarchy names.
    if isinstance(exc, sdk.APIStatusError):
        status = int(exc.status_code)
        retryable = status in (408, 409, 429) or status >= 500
        return retryable, _retry_after(exc.response), status
    if isinstance(exc, (sdk.APITimeoutError, sdk.APIConnectionError)):
        return True, None, None
    return False, None, None


class OpenAIBackend(_RetryingBackend):
    """Chat completions through the official ``openai`` client.

    ``base_url`` reaches any OpenAI-compatible server (vLLM, Ollama, llama.cpp); such a
    server may need no key, so a dummy one is used when none is given.

    Args:
        model: Model id; default ``$EVO_LLM_MODEL`` or ``"gpt-4o-mini"``.
        api_key: Default ``$OPENAI_API_KEY``.
        base_url: Default ``$EVO_LLM_BASE_URL`` (then the SDK's default endpoint).
        timeout: Seconds per request.
        max_retries: Retries after the first attempt on 429/5xx/connection errors/timeouts.
        max_concurrency: Calls in flight at once from this backend.
        prices: ``{model prefix: (USD per 1M input, per 1M output)}`` overriding the defaults.
        ledger: A :class:`CostLedger` shared with other backends (budget cap).
        backoff_base: First backoff in seconds (doubles per retry; tests pass a tiny value).
        **kw: ``backoff_max``, ``default_params`` (e.g. ``{"temperature": 0.7}``), ``name``.
    """

    provider = "openai"

    def __init__(self, model: str | None = None, api_key: str | None = None, base_url: str | None = None,
                 timeout: float = 60.0, max_retries: int = 4, max_concurrency: int = 4,
                 prices: Mapping[str, tuple[float, float]] | None = None, ledger: CostLedger | None = None,
                 backoff_base: float = 1.0, **kw: Any) -> None:
        try:
            import openai
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("OpenAIBackend needs the openai package: pip install 'ptx-kernel-factory[llm]'") from e
        model = model or os.environ.get("EVO_LLM_MODEL") or "gpt-4o-mini"
        base_url = base_url or os.environ.get("EVO_LLM_BASE_URL") or None
        api_key = api_key or os.environ.get("OPENAI_API_KEY")
        if not api_key:
            if base_url is None:
                raise ValueError("OpenAIBackend needs an API key: pass api_key= or set OPENAI_API_KEY "
                                 "(or set base_url/EVO_LLM_BASE_URL for a local OpenAI-compatible server)")
            api_key = "not-needed"
        super().__init__(model, timeout=timeout, max_retries=max_retries, max_concurrency=max_concurrency,
                         prices=prices, ledger=ledger, backoff_base=backoff_base, **kw)
        self.base_url = base_url
        self._sdk = openai
        self._client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0)

    def _classify(self, exc: BaseException) -> tuple[bool, float | None, int | None]:
        return _classify_sdk(self._sdk, exc)

    def _request(self, messages: Sequence[Message], params: dict[str, Any]) -> Completion:
        create = self._client.chat.completions.create
        r = create(model=self.model, messages=[dict(m) for m in messages], **_fit_params(create, params))
        if not r.choices:
            raise LLMError(f"openai {self.model}: the response has no choices")
        choice = r.choices[0]
        usage = r.usage
        return Completion(text=choice.message.content or "", model=r.model or self.model,
                          prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                          completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
                          finish_reason=choice.finish_reason or "stop")


class AnthropicBackend(_RetryingBackend):
    """Messages through the official ``anthropic`` client (system messages are split out).

    Args:
        model: Model id; default ``$EVO_LLM_MODEL`` or ``"claude-sonnet-4-5"``.
        api_key: Default ``$ANTHROPIC_API_KEY``.
        base_url: The API root (the SDK appends ``/v1/messages``).
        max_tokens: Default output cap (Anthropic requires one).
        Other arguments as :class:`OpenAIBackend`.
    """

    provider = "anthropic"

    def __init__(self, model: str | None = None, api_key: str | None = None, base_url: str | None = None,
                 timeout: float = 60.0, max_retries: int = 4, max_concurrency: int = 4,
                 prices: Mapping[str, tuple[float, float]] | None = None, ledger: CostLedger | None = None,
                 backoff_base: float = 1.0, max_tokens: int = 8192, **kw: Any) -> None:
        try:
            import anthropic
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("AnthropicBackend needs the anthropic package: "
                              "pip install 'ptx-kernel-factory[llm]'") from e
        model = model or os.environ.get("EVO_LLM_MODEL") or "claude-sonnet-4-5"
        api_key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not api_key:
            if base_url is None:
                raise ValueError("AnthropicBackend needs an API key: pass api_key= or set ANTHROPIC_API_KEY")
            api_key = "not-needed"
        super().__init__(model, timeout=timeout, max_retries=max_retries, max_concurrency=max_concurrency,
                         prices=prices, ledger=ledger, backoff_base=backoff_base, **kw)
        self.base_url = base_url
        self.max_tokens = int(max_tokens)
        self._sdk = anthropic
        self._client = anthropic.Anthropic(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0)

    def _classify(self, exc: BaseException) -> tuple[bool, float | None, int | None]:
        return _classify_sdk(self._sdk, exc)

    def _request(self, messages: Sequence[Message], params: dict[str, Any]) -> Completion:
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        chat = [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] != "system"]
        params.setdefault("max_tokens", self.max_tokens)
        if system:
            params["system"] = system
        create = self._client.messages.create
        r = create(model=self.model, messages=chat, **_fit_params(create, params))
        text = "".join(getattr(b, "text", "") for b in r.content if getattr(b, "type", "") == "text")
        stop = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}.get(r.stop_reason or "",
                                                                                          r.stop_reason or "stop")
        return Completion(text=text, model=r.model or self.model, prompt_tokens=int(r.usage.input_tokens or 0),
                          completion_tokens=int(r.usage.output_tokens or 0), finish_reason=stop)


def from_env(**kw: Any) -> OpenAIBackend | AnthropicBackend | None:
    """The backend the environment asks for, or ``None``.

    ``EVO_LLM_BASE_URL`` set -> an OpenAI-compatible server at that URL; else
    ``OPENAI_API_KEY`` -> OpenAI; else ``ANTHROPIC_API_KEY`` -> Anthropic; else ``None``.
    ``EVO_LLM_MODEL`` picks the model. ``kw`` goes to the backend's constructor.
    """
    if os.environ.get("EVO_LLM_BASE_URL"):
        return OpenAIBackend(base_url=os.environ["EVO_LLM_BASE_URL"], **kw)
    if os.environ.get("OPENAI_API_KEY"):
        return OpenAIBackend(**kw)
    if os.environ.get("ANTHROPIC_API_KEY"):
        return AnthropicBackend(**kw)
    return None
