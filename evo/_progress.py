"""Live progress of a run: evaluations, best fitness, coverage, rate, GPU busy, LLM cost.

With ``rich`` importable and stderr a terminal the display is a transient
``rich.live.Live`` (it disappears when the run ends, leaving the log); otherwise (no rich,
or output redirected to a file or a pipe) a plain line goes to stderr every ``interval``
seconds. Independently, a summary line is logged at INFO level on
``logging.getLogger("evo.engine")`` every ``interval`` seconds, so runs under a job
scheduler leave a trace without any display.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

__all__ = ["Progress", "format_snapshot"]

log = logging.getLogger("evo.engine")


def _fmt(v: Any, spec: str = ".4g") -> str:
    if v is None:
        return "-"
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def format_snapshot(s: Mapping[str, Any]) -> str:
    """One line: ``evals 12 | best 3.14 | cov 25.0% | 40.0/min | gpu 80% | $0.0123 | in flight 4``."""
    parts = [f"evals {s.get('evaluations', 0)}", f"best {_fmt(s.get('best'))}"]
    if s.get("coverage") is not None:
        parts.append(f"cov {s['coverage']:.1%}")
    parts.append(f"{_fmt(s.get('rate'), '.1f')}/min")
    if s.get("gpu_busy") is not None:
        parts.append(f"gpu {s['gpu_busy']:.0%}")
    parts.append(f"${s.get('cost', 0.0):.4f}")
    parts.append(f"in flight {s.get('in_flight', 0)}")
    if s.get("duplicates"):
        parts.append(f"dup {s['duplicates']}")
    return " | ".join(parts)


class Progress:
    """Progress display and periodic log line for :meth:`evo.Engine.run`.

    Args:
        enabled: False turns the display off (the periodic log line stays).
        interval: Seconds between plain lines and log lines.
        stream: Where the display goes (default stderr).
        use_rich: None = use rich when importable and the stream is a terminal; True
            forces rich, False forces plain lines.
    """

    def __init__(self, enabled: bool = True, *, interval: float = 5.0, stream: TextIO | None = None,
                 use_rich: bool | None = None) -> None:
        self.enabled = enabled
        self.interval = interval
        self.stream = stream if stream is not None else sys.stderr
        self._live: Any = None
        self._last_line = 0.0
        self._last_log = time.monotonic()
        self._last_live = 0.0
        self.lines = 0
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        if enabled and (use_rich is True or (use_rich is None and tty)):
            try:
                from rich.console import Console
                from rich.live import Live
            except ImportError:
                self._live = None
            else:
                console = Console(file=self.stream, stderr=self.stream is sys.stderr)
                self._live = Live("", console=console, transient=True, auto_refresh=False)
                self._live.start()

    @property
    def uses_rich(self) -> bool:
        """Whether the rich display is active."""
        return self._live is not None

    def update(self, snapshot: Mapping[str, Any], force: bool = False) -> None:
        """Show ``snapshot`` (keys: evaluations, best, coverage, rate, gpu_busy, cost, in_flight)."""
        now = time.monotonic()
        line = format_snapshot(snapshot)
        if now - self._last_log >= self.interval or force:
            log.info("%s", line)
            self._last_log = now
        if not self.enabled:
            return
        if self._live is not None:
            if force or now - self._last_live >= 0.25:
                self._live.update(line, refresh=True)
                self._last_live = now
        elif force or now - self._last_line >= self.interval:
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last_line = now
            self.lines += 1

    def close(self) -> None:
        """Stop the live display."""
        if self._live is not None:
            self._live.stop()
            self._live = None
