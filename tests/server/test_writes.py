"""One send per answer (`server/writes.py`): uvicorn's own protocols, both of them, with the
gate's mixins, over a transport that records what it is handed.

An answer's head and body reach the transport as one write; a kept-alive connection's next
answer is its own write; a streamed answer's chunks are handed over as they are sent, not
when the stream ends; closing hands over what is gathered; a turn that gathers more than
`GATHER_BYTES` hands it over at once, so flow control sees it; and a real gate answers
pipelined requests whole and in order on both.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from uvicorn.server import ServerState

from server.config import HttpConfig
from server.deadlines import server_config
from server.writes import GATHER_BYTES, GatheredWrites
from tests.support.gate_process import GateProcess, free_port


class Recorder(asyncio.Transport):
    """What the socket would be sent, one entry per write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def make_app(gate: dict[str, asyncio.Event]) -> Starlette:
    async def answer(request: Request) -> JSONResponse:
        return JSONResponse({"jsonrpc": "2.0", "id": 1, "result": {"text": "x" * 200}})

    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: first\n\n"
        await gate["release"].wait()
        yield b"data: second\n\n"

    async def stream(request: Request) -> StreamingResponse:
        return StreamingResponse(chunks(), media_type="text/event-stream")

    return Starlette(routes=[Route("/answer", answer), Route("/stream", stream)])


def request(path: str, *, close: bool = False) -> bytes:
    connection = b"connection: close\r\n" if close else b""
    return b"GET %s HTTP/1.1\r\nhost: 127.0.0.1\r\n%s\r\n" % (path.encode(), connection)


async def connected(implementation: str, gate: dict[str, asyncio.Event]) -> tuple[Any, Recorder]:
    config = server_config(make_app(gate), HttpConfig(implementation=implementation), log_level="warning")
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = Recorder()
    protocol.connection_made(transport)
    return protocol, transport


async def turns(count: int = 20) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


IMPLEMENTATIONS = ["h11", "httptools"]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_an_answer_leaves_in_one_write_and_the_next_in_its_own(implementation: str) -> None:
    async def run() -> None:
        protocol, transport = await connected(implementation, {"release": asyncio.Event()})
        protocol.data_received(request("/answer"))
        await turns()
        assert len(transport.writes) == 1, transport.writes
        head, _, body = transport.writes[0].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and body.endswith(b'"}}')
        assert b"content-length: %d" % len(body) in head
        protocol.data_received(request("/answer", close=True))
        await turns()
        assert len(transport.writes) == 2 and transport.writes[1].startswith(b"HTTP/1.1 200")
        assert transport.closed  # closed after what it gathered was handed over

    asyncio.run(run())


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_streamed_answer_leaves_as_it_is_sent(implementation: str) -> None:
    async def run() -> None:
        gate = {"release": asyncio.Event()}
        protocol, transport = await connected(implementation, gate)
        protocol.data_received(request("/stream"))
        await turns()
        sent = b"".join(transport.writes)
        assert b"data: first" in sent and b"data: second" not in sent  # not held until the stream ends
        gate["release"].set()
        await turns()
        assert b"data: second" in b"".join(transport.writes)

    asyncio.run(run())


def test_writes_of_one_turn_are_handed_over_together_at_its_end() -> None:
    async def run() -> None:
        real = Recorder()
        writes = GatheredWrites(real, asyncio.get_running_loop())
        writes.write(b"head")
        writes.write(b"body")
        assert real.writes == [] and writes.get_write_buffer_size() == 8
        await asyncio.sleep(0)
        assert real.writes == [b"headbody"] and writes.get_write_buffer_size() == 0

    asyncio.run(run())


def test_a_large_turn_is_handed_over_at_once() -> None:
    async def run() -> None:
        real = Recorder()
        writes = GatheredWrites(real, asyncio.get_running_loop())
        writes.write(b"x" * GATHER_BYTES)
        assert real.writes == []
        writes.write(b"y")  # past the bound: the transport has it now, and its flow control with it
        assert real.writes == [b"x" * GATHER_BYTES + b"y"]
        writes.write(b"z")
        await asyncio.sleep(0)
        assert real.writes[1:] == [b"z"]

    asyncio.run(run())


def test_close_hands_over_abort_drops_and_a_closed_transport_gets_nothing() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        real = Recorder()
        writes = GatheredWrites(real, loop)
        writes.write(b"last words")
        writes.close()
        assert real.writes == [b"last words"] and real.closed

        real = Recorder()
        writes = GatheredWrites(real, loop)
        writes.write(b"never")
        writes.abort()
        await asyncio.sleep(0)
        assert real.writes == [] and real.closed

        real = Recorder()
        writes = GatheredWrites(real, loop)
        writes.write(b"too late")
        real.closed = True  # the peer went away during the turn
        await asyncio.sleep(0)
        assert real.writes == []

    asyncio.run(run())


GATE_CONFIG = """
database = "gate.db"

[http]
implementation = "IMPLEMENTATION"

[facilitator]
url = "http://127.0.0.1:9"  # configured, never reached: a request without a token is answered 402

[agents.paid]
price = { network = "eip155:84532", asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e", amount = "1000", pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C" }
"""

SEND = (
    b'{"jsonrpc":"2.0","id":ID,"method":"message/send","params":{"message":{"kind":"message",'
    b'"role":"user","messageId":"mID","parts":[{"kind":"text","text":"hi"}]}}}'
)


def read_head(sock: socket.socket, data: bytes = b"") -> tuple[bytes, bytes]:
    """An answer's head, from what was received already (`data`) and what follows; (head, the rest)."""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "closed before a whole head"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def read_answers(sock: socket.socket, count: int, data: bytes = b"") -> list[tuple[int, bytes]]:
    """`count` whole HTTP/1.1 answers (status, body), each framed by its content-length, from what
    was received already (`data`) and what follows."""
    answers: list[tuple[int, bytes]] = []
    while len(answers) < count:
        head, data = read_head(sock, data)
        length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        while len(data) < length:
            chunk = sock.recv(65536)
            assert chunk, "closed inside a body"
            data += chunk
        answers.append((int(head.split(b" ", 2)[1]), data[:length]))
        data = data[length:]
    assert data == b"", data[:200]  # nothing more than the answers asked for
    return answers


def paid_head(length: int, headers: bytes = b"") -> bytes:
    """The head of a `message/send` to the priced agent without a token (answered 402)."""
    return (
        b"POST /a2a/paid HTTP/1.1\r\nHost: gate\r\nContent-Type: application/json\r\n"
        b"%sContent-Length: %d\r\n\r\n" % (headers, length)
    )


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def gate(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateProcess]:
    """A real gate per HTTP implementation, shared by the tests below (each on its own connection)."""
    folder = tmp_path_factory.mktemp(f"writes-{request.param}")
    config = folder / "gate.toml"
    config.write_text(GATE_CONFIG.replace("IMPLEMENTATION", request.param))
    with GateProcess(config, folder / "gate.log", port=free_port()) as process:
        yield process


def test_pipelined_requests_are_answered_whole_and_in_order_by_a_real_gate(gate: GateProcess) -> None:
    """A client may send its next requests before the first answer (HTTP/1.1 pipelining): the
    answers, each gathered into one write, still leave whole and in the order asked."""
    requests = []
    for i in range(1, 6):
        body = SEND.replace(b"ID", str(i).encode())
        requests.append(paid_head(len(body)) + body)
        requests.append(b"GET /healthz HTTP/1.1\r\nHost: gate\r\n\r\n")
    with socket.create_connection(("127.0.0.1", gate.port), timeout=15) as sock:
        sock.sendall(b"".join(requests))  # all ten in one go
        answers = read_answers(sock, len(requests))
    assert [status for status, _ in answers] == [402, 200] * 5
    for _, body in answers[::2]:
        assert json.loads(body)["payment_required"]["resource"]["url"].endswith("/a2a/paid")
    assert all(json.loads(body) == {"status": "ok"} for _, body in answers[1::2])


def test_an_interim_100_continue_leaves_before_the_body_is_sent(gate: GateProcess) -> None:
    """curl and others send `Expect: 100-continue` with a larger body and hold the body back until
    the interim answer comes (curl waits a second): the 100 is written as the application reads
    the body, and gathered writes hand it over at the end of that turn, not with the answer."""
    body = SEND.replace(b"ID", b"1")
    head = paid_head(len(body), b"Expect: 100-continue\r\n")
    with socket.create_connection(("127.0.0.1", gate.port), timeout=5) as sock:
        sock.sendall(head)
        interim, rest = read_head(sock)
        assert interim.startswith(b"HTTP/1.1 100 "), interim[:200]
        sock.sendall(body)
        [(status, answer)] = read_answers(sock, 1, rest)
    assert status == 402 and json.loads(answer)["payment_required"]["resource"]["url"].endswith("/a2a/paid")


def test_answers_carry_a_date_and_name_no_server_software(gate: GateProcess) -> None:
    """`server: uvicorn` is off (`server_config`): it tells a scanner what runs here. The date
    an origin server with a clock must send (RFC 9110 6.6.1) stays."""
    body = SEND.replace(b"ID", b"1")
    for request in (paid_head(len(body)) + body, b"GET /healthz HTTP/1.1\r\nHost: gate\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", gate.port), timeout=5) as sock:
            sock.sendall(request)
            head, _ = read_head(sock)
        assert re.search(rb"(?im)^date: ", head) and not re.search(rb"(?im)^server:", head), head
