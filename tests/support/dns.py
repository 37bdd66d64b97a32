"""A name server of a few lines for tests: answers A queries for the names it holds, on a loopback
UDP port, so nginx's `resolver` can be pointed at it and the answer changed while nginx runs."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class NameServer:
    def __init__(self) -> None:
        self.names: dict[str, str] = {}  # name -> IPv4 address
        self.asked: list[str] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stopped = threading.Event()

    def serve(self) -> None:
        while not self.stopped.is_set():
            try:
                query, peer = self.sock.recvfrom(512)
            except TimeoutError:
                continue
            answer = self.answer(query)
            if answer is not None:
                self.sock.sendto(answer, peer)

    def answer(self, query: bytes) -> bytes | None:
        if len(query) < 12:
            return None
        ident, _flags, questions = struct.unpack(">HHH", query[:6])
        if questions != 1:
            return None
        labels, at = [], 12
        while at < len(query) and query[at]:
            labels.append(query[at + 1 : at + 1 + query[at]].decode("ascii", "replace"))
            at += 1 + query[at]
        question = query[12 : at + 5]
        qtype = struct.unpack(">H", query[at + 1 : at + 3])[0] if at + 3 <= len(query) else 0
        name = ".".join(labels).lower()
        self.asked.append(name)
        address = self.names.get(name)
        if qtype != 1 or address is None:  # no such record: NXDOMAIN for unknown names, empty for AAAA
            rcode = 0 if address is not None else 3
            return struct.pack(">HHHHHH", ident, 0x8180 | rcode, 1, 0, 0, 0) + question
        record = struct.pack(">HHHIH", 0xC00C, 1, 1, 1, 4) + socket.inet_aton(address)
        return struct.pack(">HHHHHH", ident, 0x8180, 1, 1, 0, 0) + question + record


@contextmanager
def name_server() -> Iterator[NameServer]:
    server = NameServer()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stopped.set()
        thread.join(2)
        server.sock.close()
