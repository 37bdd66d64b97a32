"""A client cannot hold a connection by sending slowly, or by sending nothing.

Raw sockets against a real gate with short deadlines: a request head dribbled byte by
byte, a body that never finishes, a connection that never speaks and one left idle
after a request are each answered (408) or closed within their deadline, never held.
Every test runs against both of uvicorn's HTTP implementations (h11 and httptools).
Every loop here is bounded in time.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from tests.support.gate_process import GateProcess, free_port

HEAD_TIMEOUT = 1.5
BODY_TIMEOUT = 1.5
KEEP_ALIVE = 1.0
MAX_HEAD = 4096
SLACK = 2.0  # scheduling on a busy machine
GIVE_UP = 12.0  # the test's own bound: a server still holding the connection by then fails

DEADLINE_CONFIG = f"""
database = "gate.db"

[http]
head_timeout_seconds = {HEAD_TIMEOUT}
body_timeout_seconds = {BODY_TIMEOUT}
keep_alive_seconds = {KEEP_ALIVE}
max_head_bytes = {MAX_HEAD}
implementation = "IMPLEMENTATION"

[facilitator]
url = "http://127.0.0.1:9"  # configured, never reached: a request without a token is answered 402

[agents.paid]
price = {{ network = "eip155:84532", asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e", amount = "1000", pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C" }}

[agents.limited]
per_agent_per_minute = 1
price = {{ network = "eip155:84532", asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e", amount = "1000", pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C" }}
"""

BODY = (
    b'{"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {"kind": "message", '
    b'"role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": "hi"}]}}}'
)


@pytest.fixture(scope="module", params=["h11", "httptools"])
def gate(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateProcess]:
    """One gate per HTTP implementation: every test holds connections of its own, and nothing else."""
    folder = tmp_path_factory.mktemp(f"deadlines-{request.param}")
    config = folder / "gate.toml"
    config.write_text(DEADLINE_CONFIG.replace("IMPLEMENTATION", request.param))
    with GateProcess(config, folder / "gate.log", port=free_port()) as process:
        yield process


def connect(gate) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gate.port), timeout=GIVE_UP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def dribble(sock: socket.socket, data: bytes, interval: float = 0.25) -> tuple[bytes, float]:
    """Send `data` one byte at a time until the server answers or closes; (answer, seconds)."""
    started = time.monotonic()
    sock.setblocking(False)
    answer = b""
    for byte in data:
        if time.monotonic() - started > GIVE_UP:
            break
        try:
            chunk = sock.recv(65536)
            answer += chunk
            if not chunk:
                return answer, time.monotonic() - started
        except BlockingIOError:
            pass
        except ConnectionResetError:
            return answer, time.monotonic() - started
        try:
            sock.send(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            return answer + drain(sock), time.monotonic() - started
        time.sleep(interval)
    return answer, time.monotonic() - started


def drain(sock: socket.socket) -> bytes:
    sock.settimeout(1.0)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (OSError, TimeoutError):
        pass
    return data


def wait_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Read until the server closes the connection; (everything read, seconds)."""
    started = time.monotonic()
    sock.settimeout(GIVE_UP)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return data + b"<still open>", time.monotonic() - started
    except ConnectionResetError:
        pass
    return data, time.monotonic() - started


ENDLESS_HEADERS = b"POST /a2a/paid HTTP/1.1\r\nHost: gate\r\n" + b"X-Slow: " + b"a" * 400


def test_slow_request_head_is_cut_off(gate):
    with connect(gate) as sock:
        answer, seconds = dribble(sock, ENDLESS_HEADERS)
    assert seconds < HEAD_TIMEOUT + SLACK, f"the connection was held {seconds:.1f}s"
    assert answer.startswith(b"HTTP/1.1 408 ") or answer == b"", answer[:200]


def test_slow_head_after_a_kept_alive_request_is_cut_off(gate):
    """The deadline restarts with each request's first byte, not only on a new connection."""
    with connect(gate) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gate\r\n\r\n")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 "), first
        _, seconds = dribble(sock, ENDLESS_HEADERS)
    assert seconds < HEAD_TIMEOUT + SLACK, f"the connection was held {seconds:.1f}s"


def test_slow_body_is_answered_408_and_closed(gate):
    head = b"POST /a2a/paid HTTP/1.1\r\nHost: gate\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: %d\r\n\r\n" % len(BODY)
    with connect(gate) as sock:
        sock.sendall(head + BODY[:10])
        answer, seconds = dribble(sock, BODY[10:])
        answer += drain(sock)
    assert seconds < BODY_TIMEOUT + SLACK, f"the connection was held {seconds:.1f}s"
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"connection: close" in answer.lower()


def test_a_refused_caller_is_answered_before_its_body_and_a_slow_body_still_closes(gate):
    """The limiter answers from the head (429 before the body is read); the body's deadline
    still runs, so dribbling the rest of it after the 429 cannot hold the connection."""
    head = b"POST /a2a/limited HTTP/1.1\r\nHost: gate\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: %d\r\n\r\n" % len(BODY)
    with connect(gate) as sock:  # the agent's one request a minute
        sock.sendall(head + BODY)
        assert sock.recv(65536).startswith(b"HTTP/1.1 402 ")
    with connect(gate) as sock:
        sock.sendall(head + BODY[:10])
        first = sock.recv(65536)
        while b"}" not in first and (chunk := sock.recv(65536)):  # head and JSON body may come apart
            first += chunk
        assert first.startswith(b"HTTP/1.1 429 "), first[:200]
        answer, seconds = dribble(sock, BODY[10:])
    assert seconds < BODY_TIMEOUT + SLACK, f"the connection was held {seconds:.1f}s"
    assert answer == b"", answer[:200]  # closed, with nothing more said


def test_a_request_head_too_large_is_refused(gate):
    with connect(gate) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gate\r\nX-Big: " + b"a" * (MAX_HEAD * 2))
        data, _ = wait_closed(sock)
    assert data.startswith(b"HTTP/1.1 400 "), data[:200]


def test_silent_connection_is_closed(gate):
    with connect(gate) as sock:
        data, seconds = wait_closed(sock)
    assert data == b"" and seconds < HEAD_TIMEOUT + SLACK, (data, seconds)


def test_idle_keep_alive_connection_is_closed(gate):
    with connect(gate) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gate\r\n\r\n")
        data, seconds = wait_closed(sock)
    assert data.startswith(b"HTTP/1.1 200 ") and not data.endswith(b"<still open>")
    assert seconds < KEEP_ALIVE + SLACK, seconds


def test_a_request_sent_at_ordinary_speed_is_answered(gate):
    """The guards change nothing for a client that sends its request in a few pieces."""
    head = b"POST /a2a/paid HTTP/1.1\r\nHost: gate\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(BODY)
    with connect(gate) as sock:
        for piece in (head[:20], head[20:], BODY[:30], BODY[30:]):
            sock.sendall(piece)
            time.sleep(0.2)
        data, _ = wait_closed(sock)
    assert data.startswith(b"HTTP/1.1 402 "), data[:200]  # read whole, parsed, and priced


def test_a_body_declared_too_large_is_refused_without_reading_it(gate):
    head = b"POST /a2a/paid HTTP/1.1\r\nHost: gate\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: 100000000\r\n\r\n"
    with connect(gate) as sock:
        sock.sendall(head)
        started = time.monotonic()
        sock.settimeout(GIVE_UP)
        answer = b""
        while b"}" not in answer and (chunk := sock.recv(65536)):  # head and JSON body may come apart
            answer += chunk
    assert time.monotonic() - started < BODY_TIMEOUT, "the gate waited for the body"
    assert answer.startswith(b"HTTP/1.1 200 ") and b"-32600" in answer, answer[:300]


def test_deadline_settings_are_checked(write_config):
    from tests.support.gate_helpers import cli

    config = write_config(
        '[http]\nhead_timeout_seconds = 0\nbody_timeout = 5\nimplementation = "fast"\n\n[agents.echo]\n'
    )
    done = cli("check-config", str(config), check=False)
    assert done.returncode == 2
    assert "http.head_timeout_seconds: must be greater than 0" in done.stderr
    assert "http.body_timeout: unknown key" in done.stderr
    assert "http.implementation: must be one of auto, h11, httptools" in done.stderr
