"""`Type=notify`: `a2a-gate serve` tells its service manager when it serves, from its main process,
once every worker's start-up is done: until then systemd holds `systemctl reload` (a SIGHUP)
and the start's own timeout applies. The protocol's own socket, as systemd binds it."""

from __future__ import annotations

import array
import socket
import threading

import httpx
import pytest

from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import paid_config


@pytest.mark.parametrize("workers", [1, 2])
def test_the_gate_says_ready_once_from_its_main_process_when_every_worker_serves(
    tmp_path, facilitator, write_config, workers
):
    port = free_port()
    config = write_config(paid_config(f"http://127.0.0.1:{port}", facilitator))
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(address)
        manager.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # who sent it: systemd's NotifyAccess=main
        manager.settimeout(60)
        extra = ["--workers", str(workers)] if workers > 1 else []
        gate = GateProcess(config, tmp_path / "gate.log", port=port, extra_args=extra, env={"NOTIFY_SOCKET": address})
        starter = threading.Thread(target=gate.start)
        starter.start()
        try:
            message, sender = receive(manager)
            started = gate.log.read_text().count("Application startup complete")  # at the moment it said so
            assert message == b"READY=1"
            assert gate.process is not None and sender == gate.process.pid
            assert started == workers, "ready before every worker served"
            assert httpx.get(f"{gate.url}/healthz", timeout=5).status_code == 200
            manager.settimeout(1.5)
            with pytest.raises(TimeoutError):
                receive(manager)  # said once
        finally:
            starter.join(60)
            gate.stop()


def receive(manager: socket.socket) -> tuple[bytes, int]:
    """One notification and the pid that sent it (SCM_CREDENTIALS: pid, uid, gid)."""
    credentials = array.array("i")
    message, ancillary, _, _ = manager.recvmsg(4096, socket.CMSG_SPACE(credentials.itemsize * 3))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            credentials.frombytes(data[: credentials.itemsize * 3])
    return message, credentials[0] if credentials else 0
