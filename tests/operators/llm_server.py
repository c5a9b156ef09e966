"""A fake LLM provider on 127.0.0.1 for tests: real HTTP, OpenAI and Anthropic wire formats.

``FakeLLMServer`` runs :class:`http.server.ThreadingHTTPServer` in a thread on a free
port. It answers ``POST /v1/chat/completions`` (OpenAI) and ``POST /v1/messages``
(Anthropic) with JSON bodies shaped as the official SDKs expect, records every request
(path, headers, JSON body) and replies from a script: a queue of :class:`Reply` values
and, when the queue is empty, ``default`` (a :class:`Reply`, a string or a function
``request -> Reply | str``).

Token counts are deterministic: the number of whitespace-separated words in the request
messages (and system prompt) and in the reply text.

Usage::

    with FakeLLMServer() as srv:
        srv.push("```cuda\\n...\\n```")
        backend = OpenAIBackend(base_url=srv.openai_url, api_key="x")
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer.

    Attributes:
        text: The assistant text.
        status: HTTP status; non-200 sends a provider-shaped error body.
        headers: Extra response headers (e.g. ``{"Retry-After": "0"}``).
        delay: Seconds to wait before answering (longer than the client timeout -> timeout).
        finish_reason: ``"stop"`` or ``"length"`` (mapped to ``max_tokens`` for Anthropic).
        model: Model id to report (default: the requested one).
    """

    text: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    finish_reason: str = "stop"
    model: str | None = None


def count_words(text: str) -> int:
    """The fake tokenizer: whitespace-separated words."""
    return len(text.split())


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks
        return " ".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


@dataclass
class Request:
    """A recorded request."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    time: float

    @property
    def provider(self) -> str:
        return "anthropic" if self.path.endswith("/messages") else "openai"

    @property
    def prompt(self) -> str:
        """All message text (system included), joined with blank lines."""
        parts = []
        if self.body.get("system"):
            parts.append(_content_text(self.body["system"]))
        parts += [_content_text(m.get("content")) for m in self.body.get("messages", [])]
        return "\n\n".join(parts)

    @property
    def prompt_tokens(self) -> int:
        return count_words(self.prompt)


class FakeLLMServer:
    """The fake provider. Use as a context manager or call :meth:`start` / :meth:`stop`."""

    def __init__(self, default: Reply | str | Callable[[Request], Reply | str] | None = None) -> None:
        self.default = default
        self.queue: collections.deque[Reply | str] = collections.deque()
        self.requests: list[Request] = []
        self.completion_tokens = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- script ---------------------------------------------------------------------
    def push(self, *replies: Reply | str) -> None:
        """Queue replies, answered in order before ``default``."""
        with self._lock:
            self.queue.extend(replies)

    def _next(self, req: Request) -> Reply:
        with self._lock:
            item: Any = self.queue.popleft() if self.queue else self.default
        if callable(item) and not isinstance(item, Reply):
            item = item(req)
        if item is None:
            return Reply(status=500, text="FakeLLMServer: script exhausted (no queued reply and no default)")
        return Reply(text=item) if isinstance(item, str) else item

    # -- lifecycle ------------------------------------------------------------------
    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def openai_url(self) -> str:
        """``base_url`` for the openai client."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        """``base_url`` for the anthropic client."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeLLMServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # silence stderr
                pass

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_raw": raw.decode("utf-8", "replace")}
                req = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time())
                with server._lock:
                    server.requests.append(req)
                if self.path not in ("/v1/chat/completions", "/v1/messages"):
                    self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}}, {})
                    return
                reply = server._next(req)
                if reply.delay and server._stop.wait(reply.delay):
                    return
                if reply.status != 200:
                    self._send(reply.status, server._error_body(req, reply), reply.headers)
                    return
                with server._lock:
                    server.completion_tokens += count_words(reply.text)
                self._send(200, server._ok_body(req, reply), reply.headers)

            def _send(self, status: int, obj: dict[str, Any], headers: dict[str, str]) -> None:
                data = json.dumps(obj).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), name="fake-llm",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- wire formats ---------------------------------------------------------------
    def _ok_body(self, req: Request, reply: Reply) -> dict[str, Any]:
        model = reply.model or req.body.get("model", "fake-model")
        pt, ct = req.prompt_tokens, count_words(reply.text)
        n = len(self.requests)
        if req.provider == "openai":
            return {
                "id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.text},
                             "finish_reason": reply.finish_reason, "logprobs": None}],
                "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
            }
        stop = "max_tokens" if reply.finish_reason == "length" else "end_turn"
        return {
            "id": f"msg_{n}", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": reply.text}], "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": pt, "output_tokens": ct},
        }

    @staticmethod
    def _error_body(req: Request, reply: Reply) -> dict[str, Any]:
        kind = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error",
                529: "overloaded_error"}.get(reply.status, "api_error")
        msg = reply.text or f"scripted HTTP {reply.status}"
        if req.provider == "openai":
            return {"error": {"message": msg, "type": kind, "param": None, "code": None}}
        return {"type": "error", "error": {"type": kind, "message": msg}}


def _fixture() -> Any:
    import pytest

    @pytest.fixture
    def fake_llm() -> Any:
        """A started :class:`FakeLLMServer`, stopped after the test."""
        with FakeLLMServer() as srv:
            yield srv

    return fake_llm


#: pytest fixture: ``from tests.operators.llm_server import fake_llm`` in a test module.
fake_llm = _fixture()
