"""Resubscription streams are bounded, and a task followed through the store is polled once.

A real gate with small caps: streams past the cap per task, per owner (a key) and per
client address are refused with -32603 `too_many_streams` (retryable), and a stream that
ends gives its slot back. In-process, on a SQLite file: fifty streams following a task that
runs nowhere share ONE store poller; the store is read about once per poll, not once per stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from server.app import Services
from server.config import default_settings
from server.jsonrpc import Call
from server.tasks import new_task, set_status
from tests.support.gate_helpers import bearer, rpc_body, v03_message
from tests.support.gate_process import GateProcess, free_port

KEY_A, KEY_B = "a2g_stream_bounds_key_a_0123456789", "a2g_stream_bounds_key_b_0123456789"
V1 = {"A2A-Version": "1.0"}


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateProcess]:
    import hashlib

    folder = tmp_path_factory.mktemp("stream-bounds")
    keys = "".join(
        f'\n[[keys]]\nname = "{name}"\nsha256 = "{hashlib.sha256(key.encode()).hexdigest()}"\nagents = ["*"]\n'
        for name, key in (("a", KEY_A), ("b", KEY_B))
    )
    config = folder / "gate.toml"
    config.write_text(
        'database = "gate.db"\n\n[streams]\nmax_per_task = 2\nmax_per_owner = 3\nmax_per_client = 4\n\n'
        '[agents.slow]\nbackend = "python"\ncallable = "tests.support.agents:slow"\n' + keys
    )
    with GateProcess(config, folder / "gate.log", port=free_port()) as process:
        yield process


def start_task(gate: GateProcess, key: str) -> str:
    body = rpc_body("message/send", {"message": v03_message("sleep 20"), "configuration": {"blocking": False}})
    answer = httpx.post(f"{gate.url}/a2a/slow", json=body, headers=bearer(key), timeout=10).json()
    return answer["result"]["id"]


@contextlib.contextmanager
def open_stream(client: httpx.Client, gate: GateProcess, task_id: str, key: str) -> Iterator[dict[str, Any] | str]:
    """A SubscribeToTask stream held open: its first event (the task), or the JSON-RPC error answered instead."""
    body = rpc_body("SubscribeToTask", {"id": task_id}, call_id="s")
    with client.stream("POST", f"{gate.url}/a2a/slow", json=body, headers={**bearer(key), **V1}) as response:
        if not response.headers["content-type"].startswith("text/event-stream"):
            response.read()
            yield response.json()["error"]
            return
        for line in response.iter_lines():
            if line.startswith("data:"):
                yield "open"
                return


def refusal(error: Any) -> tuple[int, str]:
    metadata = error["data"][0]["metadata"]
    assert metadata["retryable"] == "true", error
    return error["code"], f"{metadata['code']}:{metadata['scope']}"


def test_resubscriptions_past_the_caps_are_refused_and_slots_come_back(gate: GateProcess) -> None:
    first, second = start_task(gate, KEY_A), start_task(gate, KEY_A)
    other = start_task(gate, KEY_B)
    with httpx.Client(timeout=10) as client, contextlib.ExitStack() as held:
        assert held.enter_context(open_stream(client, gate, first, KEY_A)) == "open"
        assert held.enter_context(open_stream(client, gate, first, KEY_A)) == "open"
        with open_stream(client, gate, first, KEY_A) as third:
            assert refusal(third) == (-32603, "too_many_streams:task")
        assert held.enter_context(open_stream(client, gate, second, KEY_A)) == "open"
        with open_stream(client, gate, second, KEY_A) as past_owner:  # key a holds 3
            assert refusal(past_owner) == (-32603, "too_many_streams:owner")
        assert held.enter_context(open_stream(client, gate, other, KEY_B)) == "open"  # 4 from this address
        with open_stream(client, gate, other, KEY_B) as past_client:
            assert refusal(past_client) == (-32603, "too_many_streams:client")
    with httpx.Client(timeout=10) as client:  # the closed streams gave their slots back (bounded wait)
        for _ in range(50):
            with open_stream(client, gate, first, KEY_A) as again:
                if again == "open":
                    break
            asyncio.run(asyncio.sleep(0.1))
        assert again == "open", again


def test_streams_of_a_task_running_nowhere_share_one_store_poller(tmp_path) -> None:
    streams = 50

    async def run() -> None:
        services = Services(default_settings(str(tmp_path / "gate.db")))
        await services.open_store()
        methods, store = services.methods, services.store
        methods.watches.interval = 0.05
        reads: list[str] = []
        try:
            task = new_task(None, v03_message("hi"))
            set_status(task, "working")  # stored as running, run by no process here
            await store.create(task, agent="echo", owner="key:ops")
            services.db.conn.set_trace_callback(  # type: ignore[attr-defined]
                lambda sql: reads.append(sql) if sql.startswith("SELECT document FROM tasks") else None
            )
            call = Call(
                id=1, method="tasks/resubscribe", dialect="0.3", operation="subscribe", params={"id": task["id"]}
            )
            responses = [await methods.subscribe(call, "echo", "key:ops", f"198.51.100.{i}") for i in range(streams)]
            iterators = [r.body_iterator.__aiter__() for r in responses]  # type: ignore[attr-defined]
            for events in iterators:
                await anext(events)  # the task as it is: each stream is open
            assert list(methods.watches.watches) == [task["id"]]
            assert methods.watches.watches[task["id"]].readers == streams
            reads.clear()
            set_status(task, "completed")
            await store.save(task)
            finals = await asyncio.wait_for(asyncio.gather(*(anext(e) for e in iterators)), 10)
            assert all(b'"final":true' in f or b'"final": true' in f for f in finals), finals[0]
            assert len(reads) < 5, f"{len(reads)} store reads for {streams} streams"  # one poller, not fifty
            for events in iterators:
                with contextlib.suppress(StopAsyncIteration):
                    await anext(events)
            assert methods.watches.watches == {} and not any(methods.slots.open.values())
        finally:
            await services.db.close()

    asyncio.run(run())
