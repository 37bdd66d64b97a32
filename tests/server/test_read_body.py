"""`server.jsonrpc.read_body` over the ASGI messages a server hands it: whole, in chunks, too large, cut off."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from server.jsonrpc import INVALID_REQUEST, RpcError, read_body


def request(messages: list[dict[str, Any]], headers: list[tuple[bytes, bytes]] = ()) -> Request:  # type: ignore[assignment]
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    return Request({"type": "http", "method": "POST", "path": "/", "headers": list(headers)}, receive)


def body(*chunks: bytes) -> list[dict[str, Any]]:
    return [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]


def read(req: Request, limit: int = 100) -> bytes:
    return asyncio.run(read_body(req, limit))


def test_a_body_is_read_whole_or_from_its_chunks() -> None:
    assert read(request(body(b'{"a": 1}'))) == b'{"a": 1}'
    assert read(request(body(b'{"a"', b"", b": 1}"))) == b'{"a": 1}'
    assert read(request([{"type": "http.request"}])) == b""  # no body key, no more_body


@pytest.mark.parametrize(
    ("messages", "headers", "message"),
    [
        (body(b"x" * 60, b"x" * 60), [], "Request body too large"),  # no length declared: counted as it comes
        (body(b"x"), [(b"content-length", b"101")], "Request body too large"),  # declared: refused unread
        (
            [{"type": "http.request", "body": b"x", "more_body": True}, {"type": "http.disconnect"}],
            [],
            "Request body incomplete",
        ),
        ([{"type": "http.disconnect"}], [], "Request body incomplete"),
    ],
)
def test_a_body_too_large_or_cut_off_is_an_invalid_request(
    messages: list[dict[str, Any]], headers: list[tuple[bytes, bytes]], message: str
) -> None:
    with pytest.raises(RpcError) as refused:
        read(request(messages, headers))
    assert refused.value.code == INVALID_REQUEST and refused.value.message == message
