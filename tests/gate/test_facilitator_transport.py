"""The facilitator client over a real socket: every way a facilitator's connection can go wrong
is `Unavailable` (our outage: the claim released, or a settle owed and asked again), never
another exception that would reach the caller as a 500.

The client runs httpx over aiohttp's connection pool (`httpx_aiohttp.AiohttpTransport`); what
that transport does not map to an httpx error (an answer aiohttp cannot parse) is caught too.
Each fault is a raw asyncio server on a loopback port, so the bytes are exactly the fault's.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest

from gate.config import FacilitatorConfig
from gate.facilitator import FacilitatorClient, Unavailable
from tests.support.gate_process import free_port

pytestmark = pytest.mark.system  # real servers on loopback ports

ANSWER = b'{"isValid": true, "payer": "0x1111111111111111111111111111111111111111"}'


def ok(body: bytes = ANSWER) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


# what the facilitator writes once it has read the request (None: nothing, it hangs up)
FAULTS: dict[str, bytes | None] = {
    "not http": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    "bad status line": b"HTTP/1.1 2OO OK\r\ncontent-length: 0\r\n\r\n",
    "header too long": b"HTTP/1.1 200 OK\r\nx-junk: " + b"a" * 200_000 + b"\r\n\r\n",
    "body cut short": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{",
    "bad chunking": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "hangs up after the request": None,
    "not json": ok(b"<html>busy</html>"),
    "json of another shape": ok(b'{"isValid": "yes"}'),
}


async def serve(answer: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]) -> asyncio.Server:
    return await asyncio.start_server(answer, "127.0.0.1", 0)


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One request off the socket: its request line, its headers (names lowercased) and its body."""
    start, *lines = (await reader.readuntil(b"\r\n\r\n")).rstrip(b"\r\n").split(b"\r\n")
    headers = {name.strip().lower(): value.strip() for name, value in (line.split(b":", 1) for line in lines)}
    return start, headers, await reader.readexactly(int(headers.get(b"content-length", b"0")))


async def verify_at(url: str, timeout: float = 1.0) -> object:
    """The client's verify against `url`: its verdict, or the exception it raised."""
    client = FacilitatorClient(FacilitatorConfig(url=url, timeout_seconds=timeout, max_wait_seconds=1.0))
    try:
        return await client.verify(2, {"payload": {}}, {"scheme": "exact"})
    except Exception as exc:  # noqa: BLE001 -- the test asks which one
        return exc
    finally:
        await client.aclose()


def outcome_of(fault: bytes | None) -> object:
    async def main() -> object:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            if fault is not None:
                writer.write(fault)
                await writer.drain()
            writer.close()

        server = await serve(answer)
        port = server.sockets[0].getsockname()[1]
        try:
            return await verify_at(f"http://127.0.0.1:{port}")
        finally:
            server.close()

    return asyncio.run(main())


@pytest.mark.parametrize("fault", list(FAULTS), ids=list(FAULTS))
def test_a_broken_answer_is_unavailable(fault: str) -> None:
    outcome = outcome_of(FAULTS[fault])
    assert isinstance(outcome, Unavailable), repr(outcome)


def test_a_good_answer_is_the_verdict() -> None:
    verdict = outcome_of(ok())
    assert not isinstance(verdict, Exception), repr(verdict)
    assert verdict.valid and verdict.payer == "0x" + "1" * 40  # type: ignore[attr-defined]


def test_a_facilitator_that_never_answers_is_a_timeout() -> None:
    async def main() -> object:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            await asyncio.sleep(30)

        server = await serve(answer)
        port = server.sockets[0].getsockname()[1]
        try:
            return await asyncio.wait_for(verify_at(f"http://127.0.0.1:{port}", timeout=0.3), 10)
        finally:
            server.close()

    outcome = asyncio.run(main())
    assert isinstance(outcome, Unavailable) and outcome.reason == "timeout", repr(outcome)


def test_a_connection_reset_or_refused_is_unavailable() -> None:
    async def main() -> tuple[object, object]:
        async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST
            writer.transport.abort()

        server = await serve(reset)
        port = server.sockets[0].getsockname()[1]
        try:
            was_reset = await verify_at(f"http://127.0.0.1:{port}")
        finally:
            server.close()
        refused = await verify_at(f"http://127.0.0.1:{free_port()}")  # nothing listens there
        return was_reset, refused

    was_reset, refused = asyncio.run(main())
    assert isinstance(was_reset, Unavailable), repr(was_reset)
    assert isinstance(refused, Unavailable), repr(refused)


def test_a_kept_alive_connection_the_facilitator_closed_meanwhile_is_not_an_outage() -> None:
    """The pool reuses a connection the facilitator closed after its keep-alive: the next call
    opens another (aiohttp retries an idempotent-safe reconnect only before sending), and answers."""

    async def main() -> list[object]:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(ok())
            await writer.drain()
            writer.close()  # no keep-alive, without saying so

        server = await serve(answer)
        port = server.sockets[0].getsockname()[1]
        client = FacilitatorClient(FacilitatorConfig(url=f"http://127.0.0.1:{port}", timeout_seconds=1.0))
        outcomes: list[object] = []
        try:
            for _ in range(3):
                try:
                    outcomes.append(await client.verify(2, {"payload": {}}, {"scheme": "exact"}))
                except Unavailable as exc:
                    outcomes.append(exc)
                await asyncio.sleep(0.05)
        finally:
            await client.aclose()
            server.close()
        return outcomes

    outcomes = asyncio.run(main())
    assert all(isinstance(o, Unavailable) or o.valid for o in outcomes), outcomes  # type: ignore[attr-defined]
    assert any(not isinstance(o, Unavailable) for o in outcomes[1:]), outcomes


@pytest.mark.parametrize("base", ["", "/x402", "/x402/"], ids=["root", "sub-path", "sub-path with slash"])
def test_a_call_is_a_json_post_to_its_path_under_the_facilitators_url(base: str) -> None:
    """What the facilitator reads: `POST <its URL's path>/verify`, then `/settle`, each body the call's
    JSON, typed as JSON: a payload's non-ASCII text as sent, and an integer past 64 bits."""
    text = {"payload": {"memo": "café ☕"}, "accepted": {"scheme": "exact"}}
    wide = {"payload": {"memo": "café ☕", "n": 2**70}, "accepted": {"scheme": "exact"}}
    requirements = {"scheme": "exact", "extra": {"name": "USD Coin"}}
    seen: list[tuple[bytes, dict[bytes, bytes], bytes]] = []

    async def main() -> None:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                try:
                    seen.append(await read_request(reader))
                except asyncio.IncompleteReadError:
                    break
                writer.write(ok(b'{"isValid": true, "success": true, "payer": "0x' + b"1" * 40 + b'"}'))
                await writer.drain()
            writer.close()

        server = await serve(answer)
        port = server.sockets[0].getsockname()[1]
        client = FacilitatorClient(FacilitatorConfig(url=f"http://127.0.0.1:{port}{base}", max_wait_seconds=1.0))
        try:
            await client.verify(2, text, requirements)
            await client.settle(2, wide, requirements)
        finally:
            await client.aclose()
            server.close()

    asyncio.run(main())

    prefix = base.rstrip("/").encode()
    assert [start for start, _, _ in seen] == [
        b"POST " + prefix + b"/verify HTTP/1.1",
        b"POST " + prefix + b"/settle HTTP/1.1",
    ]
    for (_, headers, body), payload in zip(seen, (text, wide), strict=True):
        assert headers[b"content-type"] == b"application/json"
        sent = json.loads(body.decode("utf-8"))
        assert sent == {"x402Version": 2, "paymentPayload": payload, "paymentRequirements": requirements}
