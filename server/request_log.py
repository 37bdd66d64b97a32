"""One structured log line per A2A request: who called what, and how it ended.

The endpoint fills a `RequestInfo` as the request passes through (the gate adds the
payer and the payment outcome) and writes it once at the end, as key=value text or
as a JSON line. Nothing secret is ever a field: callers appear as a key's name or
"anonymous", tokens not at all. The agent field is the public label (see
`server.metrics.agent_label`), never a hidden or made-up name.

A request cannot write a line: in text lines every value with a space, a quote or a
character that is not printable (a newline, a tab, an escape, U+2028) is written as a
JSON string, escapes and all; JSON lines escape everything outside ASCII, so no reader
splitting on any line boundary sees a forged line.
"""

from __future__ import annotations

import json
import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("a2a_gate.requests")

# Outcomes are a small fixed set (they are metric labels too); `detail` carries the reason.
OUTCOMES = frozenset(
    {
        "ok",
        "paid",
        "replay",
        "payment_required",
        "rejected",
        "verify_unavailable",
        "store_unavailable",
        "in_flight",
        "limited",
        "unauthenticated",
        "forbidden",
        "not_found",
        "unavailable",
        "rpc_error",
        "internal_error",
        "agent_error",  # the agent raised: its task failed, uncharged
    }
)


@dataclass
class RequestInfo:
    agent: str
    client: str
    caller: str = "anonymous"
    method: str = ""
    outcome: str = ""
    detail: str = ""
    payer: str = ""
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        _current.set(self)  # the request's own: work it starts (an agent's run) inherits it

    def set(self, outcome: str, detail: str = "") -> None:
        assert outcome in OUTCOMES, outcome
        if self.outcome == "agent_error":
            return  # what the agent did outranks how a later step names the answer
        self.outcome, self.detail = outcome, detail

    def fields(self, status: int) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "caller": self.caller,
            "method": self.method or "-",
            "outcome": self.outcome,
            "detail": self.detail,
            "payer": self.payer,
            "status": status,
            "client": self.client,
            "latency_ms": round((time.perf_counter() - self.started) * 1000, 2),
        }


_current: ContextVar[RequestInfo | None] = ContextVar("a2a_gate_request_info", default=None)


def agent_failed(detail: str) -> None:
    """The agent working for the current request raised: its line says `outcome=agent_error`.

    Called from the agent's run, which inherits the request's context; a run that outlives
    its request (a non-blocking send) finds the line already written, and nothing changes.
    """
    info = _current.get()
    if info is not None:
        info.set("agent_error", detail)


def write(info: RequestInfo, status: int) -> None:
    if logger.isEnabledFor(logging.INFO):
        logger.info("request", extra={"fields": info.fields(status)})


class TextFormatter(logging.Formatter):
    """`2026-11-30T10:00:00Z INFO a2a_gate.requests agent=echo caller=key:ops ...`"""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
        fields = getattr(record, "fields", None)
        if fields is None:
            text = f"{stamp} {record.levelname} {record.name} {_printable(record.getMessage())}"
        else:
            text = f"{stamp} {record.levelname} {record.name} " + " ".join(
                f"{k}={_quote(v)}" for k, v in fields.items() if v != ""
            )
        if record.exc_info:  # indented, escaped: a message in a traceback cannot start a line of its own
            text += "".join("\n    " + _printable(line) for line in self.formatException(record.exc_info).split("\n"))
        return text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"ts": round(record.created, 3), "level": record.levelname, "logger": record.name}
        fields = getattr(record, "fields", None)
        if fields is None:
            line["message"] = record.getMessage()
        else:
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)  # ASCII: U+2028 and friends are escaped, not line breaks


def _quote(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (not text or not text.isprintable() or " " in text or '"' in text) else text


def _printable(text: str) -> str:
    """A free-form message on one line: characters that are not printable written as escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def configure(json_lines: bool = False, level: str = "info") -> None:
    """Send the a2a_gate loggers to stderr in the chosen format."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger("a2a_gate")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
