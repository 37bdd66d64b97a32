"""Small helpers shared by the gate's end-to-end tests: keys, raw JSON-RPC, SSE, polling."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).parents[2]
KEY_LINE = re.compile(r"key \(shown once, keep it secret\): (\S+)")


def cli(
    *args: str, check: bool = True, cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `a2a-gate ...` (as `python -m gate.cli`) in `cwd`, with `env` added to the environment
    (A2A_GATE_CONFIG never comes from the caller's), and capture its output."""
    environment = {k: v for k, v in os.environ.items() if k != "A2A_GATE_CONFIG"} | (env or {})
    done = subprocess.run(
        [sys.executable, "-m", "gate.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environment,
        timeout=60,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"a2a-gate {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def create_key(config: Path, name: str, agents: Iterable[str] = ()) -> str:
    """Create an API key with the CLI against the config's database; returns the key."""
    args = ["keys", "--config", str(config), "create", name]
    for agent in agents:
        args += ["--agent", agent]
    match = KEY_LINE.search(cli(*args).stdout)
    assert match, "the CLI did not print the key"
    return match.group(1)


def revoke_key(config: Path, name: str) -> None:
    cli("keys", "--config", str(config), "revoke", name)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def v03_message(text: str = "hi", **fields: Any) -> dict[str, Any]:
    message: dict[str, Any] = {
        "kind": "message",
        "role": "user",
        "messageId": str(uuid.uuid4()),
        "parts": [{"kind": "text", "text": text}],
    }
    message.update(fields)
    return message


def rpc_body(method: str, params: dict[str, Any] | None = None, call_id: Any = 1) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": call_id, "method": method}
    if params is not None:
        body["params"] = params
    return body


def post(url: str, body: Any, headers: dict[str, str] | None = None, timeout: float = 10.0) -> httpx.Response:
    """POST a JSON value (or raw bytes) to `url`."""
    if isinstance(body, (bytes, str)):
        return httpx.post(
            url, content=body, headers={"content-type": "application/json", **(headers or {})}, timeout=timeout
        )
    return httpx.post(url, json=body, headers=headers, timeout=timeout)


def rpc(
    url: str, method: str, params: dict[str, Any] | None = None, headers: dict[str, str] | None = None, call_id: Any = 1
) -> dict[str, Any]:
    """One JSON-RPC call that must answer HTTP 200 with a JSON-RPC response."""
    response = post(url, rpc_body(method, params, call_id), headers)
    assert response.status_code == 200, (response.status_code, response.text)
    doc = response.json()
    assert doc["jsonrpc"] == "2.0" and doc["id"] == call_id, doc
    assert ("result" in doc) != ("error" in doc), doc
    return doc


def result(
    url: str, method: str, params: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    doc = rpc(url, method, params, headers)
    assert "result" in doc, doc
    return doc["result"]


def error_code(
    url: str, method: str, params: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> int:
    doc = rpc(url, method, params, headers)
    assert "error" in doc, doc
    return doc["error"]["code"]


def sse_events(text: str) -> list[dict[str, Any]]:
    """The JSON documents of every `data:` line of an SSE body (comments skipped)."""
    events = []
    for block in re.split(r"\r?\n\r?\n", text):
        data = [line[5:].lstrip() for line in re.split(r"\r?\n", block) if line.startswith("data:")]
        if data:
            events.append(json.loads("\n".join(data)))
    return events


def poll(
    fetch: Callable[[], dict[str, Any]],
    done: Callable[[dict[str, Any]], bool],
    timeout: float = 10.0,
    interval: float = 0.05,
) -> dict[str, Any]:
    """Call `fetch` until `done(result)`; the last result either way."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def wait_for(condition: Callable[[], bool], timeout: float = 20.0, interval: float = 0.05) -> None:
    """Wait until `condition()` holds; the test fails if it does not within `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(interval)


def swallow(call: Callable[[], object]) -> None:
    """Make a call expected to fail in any way (its server is killed under it): only the state after counts."""
    try:
        call()
    except Exception:  # noqa: BLE001 -- see above
        pass


def texts(parts: list[dict[str, Any]]) -> list[str]:
    return [p["text"] for p in parts if "text" in p]


def artifact_texts(task: dict[str, Any]) -> list[str]:
    return [t for artifact in task.get("artifacts") or [] for t in texts(artifact.get("parts") or [])]


def status_text(task: dict[str, Any]) -> str:
    message = task.get("status", {}).get("message") or {}
    return " ".join(texts(message.get("parts") or []))


GATE_RECURSION_LIMIT = 4000  # server.app caps the interpreter's limit at this


@contextlib.contextmanager
def gate_recursion_limit() -> Iterator[None]:
    """Run under the recursion limit the gate runs under.

    Some libraries this test process imports (py_ecc, under x402 and eth-account) raise
    the limit to 100000, where deeply nested JSON overflows the C stack (a segfault)
    instead of raising RecursionError.
    """
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(min(before, GATE_RECURSION_LIMIT))
    try:
        yield
    finally:
        sys.setrecursionlimit(before)
