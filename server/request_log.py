"""One structured log line per A2A request: who called what, and how it ended.

The endpoint fills a `RequestInfo` as the request passes through (the gate adds the
payer and the payment outcome) and writes it once at the end, as key=value text or
as a JSON line. Nothing secret is ever a field: callers appear as a key's name or
"anonymous", tokens not at all. The agent field is the public label (see
`server.metrics.agent_label`), never a hidden or made-up name.

Every line written while a request is served, whichever logger writes it (the gate's,
an agent's, uvicorn's), carries that request's id and, once it has one, its task's id:
both live in context variables (`REQUEST_ID`, `TASK_ID`), which the tasks a request
starts inherit. The id is echoed in `X-Request-Id` (`RequestIds`): a trusted proxy's
well-formed one is kept, so one id names the request in the proxy's log and ours;
anything else is replaced by a fresh one.

A request cannot write a line: in text lines every value with a space, a quote or a
character that is not printable (a newline, a tab, an escape, U+2028) is written as a
JSON string, escapes and all; JSON lines escape everything outside ASCII, so no reader
splitting on any line boundary sees a forged line.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import time
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.ids import random_bytes

logger = logging.getLogger("a2a_gate.requests")

REQUEST_ID: ContextVar[str] = ContextVar("a2a_gate_request_id", default="")
TASK_ID: ContextVar[str] = ContextVar("a2a_gate_task_id", default="")
REQUEST_ID_HEADER = "X-Request-Id"
WELL_FORMED_ID = re.compile(rb"[A-Za-z0-9._:-]{8,128}")  # nginx's $request_id, UUIDs, ULIDs

# Outcomes are a small fixed set (they are metric labels too); `detail` carries the reason.
# These are the server's; the anonymous path adds its own (`AnonymousPath.outcomes`, `allow`).
OUTCOMES = frozenset(
    {
        "ok",
        "store_unavailable",
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
_allowed: set[str] = set(OUTCOMES)


def allow(outcomes: Iterable[str]) -> None:
    """Outcomes an anonymous path names besides the server's (a fixed set all the same)."""
    _allowed.update(outcomes)


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
        assert outcome in _allowed, outcome
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


REQUEST_ID_NAME = REQUEST_ID_HEADER.lower().encode()


class RequestIds:
    """ASGI middleware: each HTTP request gets an id for its log lines and `X-Request-Id`.

    The id comes from the incoming header only when the direct peer is a trusted proxy
    and the value is well formed (`WELL_FORMED_ID`); otherwise it is minted here."""

    def __init__(self, app: ASGIApp, trusted: Iterable[str] = ()) -> None:
        self.app = app
        self.trust_all = "*" in trusted
        self.trusted = [ipaddress.ip_network(t, strict=False) for t in trusted if t != "*" and _is_network(t)]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = self.given(scope) or random_bytes(16).hex()
        header = (REQUEST_ID_NAME, request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        request_token, task_token = REQUEST_ID.set(request_id), TASK_ID.set("")
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(request_token)
            TASK_ID.reset(task_token)

    def given(self, scope: Scope) -> str | None:
        """The trusted proxy's id for this request, if it sent a well-formed one."""
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                client = scope.get("client")
                if client and WELL_FORMED_ID.fullmatch(value) and self.from_trusted(client[0]):
                    return value.decode("ascii")
                return None
        return None

    def from_trusted(self, host: str) -> bool:
        if self.trust_all:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        return any(address in network for network in self.trusted)


def _is_network(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


class LogContext(logging.Filter):
    """Puts the current request's and task's ids on every record (empty outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        record.task_id = TASK_ID.get()
        return True


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
        for name in ("request_id", "task_id"):
            value = getattr(record, name, "")
            if value:
                text += f" {name}={_quote(value)}"
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
        for name in ("request_id", "task_id"):
            value = getattr(record, name, "")
            if value:
                line[name] = value
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
    """Send every logger of the process to stderr in the chosen format: the gate's at `level`,
    the libraries' (uvicorn's, given `log_config=None`, httpx, psycopg) and Python's warnings
    through the same handler, so a JSON log holds nothing but JSON lines."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    handler.addFilter(LogContext())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)  # the libraries' chatter stays out, their warnings do not
    for name in ("a2a_gate", "uvicorn.error"):
        logging.getLogger(name).setLevel(level.upper())
    gate = logging.getLogger("a2a_gate")
    gate.handlers[:] = []
    gate.propagate = True
    logging.captureWarnings(True)
