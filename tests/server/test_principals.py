"""Principals, DESIGN section 3 (and the anonymous 401 of 4.2), both ways.

No bearer, or a bearer that is no known key: anonymous. A known key that may not use
the agent, or is revoked: 403, final, never the payment path. An allowed key: the
free path, with its own attribution. Keys are stored hashed and never logged.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from devnet.payer import encode_header, new_private_key, sign_payment
from tests.conftest import FREE_CONFIG
from tests.support.gate_helpers import (
    artifact_texts,
    bearer,
    create_key,
    post,
    result,
    revoke_key,
    rpc_body,
    v03_message,
)
from tests.support.gate_process import GateProcess
from tests.support.serve import serve_app

PAYER = "0x1111111111111111111111111111111111111111"
PRICED = """
[facilitator]
url = "{facilitator}"

[agents.paid]
description = "Priced echo"
[agents.paid.price]
network = "eip155:84532"
asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
amount = "1000"
pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
"""
CONFIG_KEY = "a2g_configured-key-for-principals-test"
REVOKED_CONFIG_KEY = "a2g_configured-revoked-key-0000000000"


@dataclass
class Facilitator:
    """A facilitator that approves everything and records every call."""

    url: str = ""
    calls: list[str] = field(default_factory=list)

    def app(self) -> Starlette:
        async def verify(request: Request) -> JSONResponse:
            self.calls.append("verify")
            return JSONResponse({"isValid": True, "payer": PAYER})

        async def settle(request: Request) -> JSONResponse:
            self.calls.append("settle")
            return JSONResponse(
                {"success": True, "transaction": "0x" + "ab" * 32, "network": "eip155:84532", "payer": PAYER}
            )

        return Starlette(
            routes=[Route("/verify", verify, methods=["POST"]), Route("/settle", settle, methods=["POST"])]
        )


@dataclass
class Setup:
    gate: GateProcess
    config: Path
    facilitator: Facilitator
    keys: dict[str, str]

    def url(self, agent: str) -> str:
        return f"{self.gate.url}/a2a/{agent}"


LIMITS = "\n[limits]\nper_ip_per_minute = 100000\n"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """One gate for the module; tests that change state use keys no other test uses."""
    folder = tmp_path_factory.mktemp("principals")
    facilitator = Facilitator()
    with serve_app(facilitator.app()) as facilitator_url:
        facilitator.url = facilitator_url
        configured = (
            f'\n[[keys]]\nname = "configured"\nsha256 = "{hashlib.sha256(CONFIG_KEY.encode()).hexdigest()}"\n'
            'agents = ["echo"]\n'
            f'\n[[keys]]\nname = "old"\nsha256 = "{hashlib.sha256(REVOKED_CONFIG_KEY.encode()).hexdigest()}"\n'
            'agents = ["*"]\nrevoked = true\n'
        )
        config = folder / "gate.toml"
        config.write_text(FREE_CONFIG + LIMITS + PRICED.format(facilitator=facilitator_url) + configured)
        keys = {
            "alice": create_key(config, "alice", ["echo", "interrupting"]),
            "bob": create_key(config, "bob", ["echo", "interrupting"]),
            "carol": create_key(config, "carol", ["slow"]),
            "dave": create_key(config, "dave", ["echo"]),
            "root": create_key(config, "root"),
        }
        with GateProcess(config, folder / "gate.log") as gate:
            yield Setup(gate, config, facilitator, keys)


def payment_token(setup: Setup) -> str:
    """A real signed x402 v2 token for the priced agent (what a paying client sends)."""
    response = post(setup.url("paid"), rpc_body("message/send", {"message": v03_message("price?")}))
    assert response.status_code == 402
    return encode_header(sign_payment(response.json()["payment_required"], new_private_key()))


def call(setup: Setup, agent: str, headers: dict[str, str] | None = None, body: Any = None) -> httpx.Response:
    return post(setup.url(agent), body or rpc_body("message/send", {"message": v03_message("hi")}), headers)


# --- anonymous --------------------------------------------------------------------


def test_no_bearer_and_unknown_bearer_get_the_same_401_for_every_unpriced_door(setup: Setup) -> None:
    answers = []
    for agent in ("echo", "hidden", "no-such-agent", "slow"):
        for headers in (
            None,
            bearer("a2g_not-a-key"),
            {"Authorization": "Basic dXNlcjpwdw=="},
            {"Authorization": "Bearer"},
            bearer(CONFIG_KEY + "x"),
        ):
            response = call(setup, agent, headers)
            answers.append(
                (
                    response.status_code,
                    response.headers.get("www-authenticate"),
                    response.headers.get("content-type"),
                    response.content,
                )
            )

    assert set(answers) == {(401, "Bearer", "application/json", b'{"detail":"Not authenticated"}')}


def test_the_401_is_the_same_for_any_method_and_body(setup: Setup) -> None:
    bodies = [b"", b"{", rpc_body("tasks/get", {"id": "x"}), rpc_body("nope"), b"x" * 10_000]

    contents = {post(setup.url("echo"), body).content for body in bodies}

    assert contents == {b'{"detail":"Not authenticated"}'}


# --- refused keys -----------------------------------------------------------------


def test_a_known_key_not_allowed_for_the_agent_is_forbidden(setup: Setup) -> None:
    carol = bearer(setup.keys["carol"])

    for agent in ("echo", "interrupting", "hidden", "paid", "no-such-agent"):
        response = call(setup, agent, carol)
        assert response.status_code == 403, agent
        assert response.json() == {"detail": "Forbidden"}

    assert call(setup, "echo", bearer(CONFIG_KEY)).status_code == 200
    assert call(setup, "slow", bearer(CONFIG_KEY)).status_code == 403


def test_a_refused_key_stays_refused_when_the_request_also_carries_a_payment(setup: Setup) -> None:
    setup.facilitator.calls.clear()
    token = payment_token(setup)
    carol = bearer(setup.keys["carol"])
    message = v03_message("let me pay instead", metadata={"x402.payment.payload": {"x402Version": 2}})
    paying = [
        {**carol, "PAYMENT-SIGNATURE": token},
        {**carol, "X-PAYMENT": token},
        {
            **carol,
            "PAYMENT-SIGNATURE": token,
            "X-A2A-Extensions": "https://github.com/google-agentic-commerce/a2a-x402/blob/main/spec/v0.2",
        },
    ]

    for headers in paying:
        for agent in ("paid", "echo"):
            response = call(setup, agent, headers, rpc_body("message/send", {"message": message}))
            assert response.status_code == 403
            assert response.json() == {"detail": "Forbidden"}
            assert "payment-required" not in response.headers and "payment-response" not in response.headers

    assert setup.facilitator.calls == []
    # the same token, anonymously, would have reached the facilitator
    anonymous = call(setup, "paid", {"PAYMENT-SIGNATURE": token})
    assert anonymous.status_code == 200
    assert setup.facilitator.calls[0] == "verify"


def test_a_revoked_key_is_forbidden_within_a_few_seconds(setup: Setup) -> None:
    dave = bearer(setup.keys["dave"])
    assert call(setup, "echo", dave).status_code == 200

    revoke_key(setup.config, "dave")

    deadline = time.monotonic() + 6
    status = 200
    while time.monotonic() < deadline:
        status = call(setup, "echo", dave).status_code
        if status != 200:
            break
        time.sleep(0.2)
    assert status == 403
    assert call(setup, "echo", dave).json() == {"detail": "Forbidden"}
    assert call(setup, "echo", bearer(setup.keys["bob"])).status_code == 200


def test_a_key_revoked_in_the_config_file_is_forbidden(setup: Setup) -> None:
    response = call(setup, "echo", bearer(REVOKED_CONFIG_KEY))

    assert response.status_code == 403
    assert response.json() == {"detail": "Forbidden"}


# --- allowed keys -------------------------------------------------------------------


def test_an_allowed_key_takes_the_free_path_with_its_own_attribution(setup: Setup) -> None:
    setup.facilitator.calls.clear()
    response = call(setup, "echo", {"Authorization": f"bearer  {setup.keys['alice']}"})

    assert response.status_code == 200
    task = response.json()["result"]
    assert task["status"]["state"] == "completed"
    assert artifact_texts(task) == ["hi"]
    assert "metadata" not in task
    assert setup.facilitator.calls == []
    with sqlite3.connect(setup.config.parent / "gate.db") as db:
        [(owner,)] = db.execute("SELECT owner FROM tasks WHERE id = ?", (task["id"],)).fetchall()
    assert owner == "key:alice"


def test_a_principal_on_a_priced_agent_is_free(setup: Setup) -> None:
    setup.facilitator.calls.clear()
    response = call(setup, "paid", bearer(setup.keys["root"]))

    assert response.status_code == 200
    assert response.json()["result"]["status"]["state"] == "completed"
    assert setup.facilitator.calls == []


def test_a_wildcard_key_on_an_unknown_agent_is_not_found(setup: Setup) -> None:
    response = call(setup, "no-such-agent", bearer(setup.keys["root"]))

    assert response.status_code == 404


# --- one principal's tasks are invisible to another ---------------------------------


def test_another_principals_task_answers_exactly_like_an_unknown_id(setup: Setup) -> None:
    alice, bob = bearer(setup.keys["alice"]), bearer(setup.keys["bob"])
    done = result(setup.url("echo"), "message/send", {"message": v03_message("mine")}, alice)
    paused = result(setup.url("interrupting"), "message/send", {"message": v03_message("weather?")}, alice)

    def answer(agent: str, method: str, task_id: str, headers: dict[str, str]) -> bytes:
        version = {"A2A-Version": "1.0"} if method[0].isupper() else {}
        response = post(setup.url(agent), rpc_body(method, {"id": task_id}, call_id="same-id"), {**headers, **version})
        assert response.status_code == 200
        return response.content

    for method in ("tasks/get", "tasks/cancel", "GetTask", "CancelTask"):
        for agent, task in (("echo", done), ("interrupting", paused)):
            unknown = answer(agent, method, "00000000-0000-4000-8000-000000000000", bob)
            assert answer(agent, method, task["id"], bob) == unknown
            assert b"-32001" in unknown

    continued = post(
        setup.url("interrupting"),
        rpc_body("message/send", {"message": v03_message("Rome", taskId=paused["id"])}, "same-id"),
        bob,
    )
    nowhere = post(
        setup.url("interrupting"),
        rpc_body("message/send", {"message": v03_message("Rome", taskId="nope")}, "same-id"),
        bob,
    )
    assert continued.content == nowhere.content
    # alice's tasks were left alone
    mine = result(setup.url("interrupting"), "tasks/get", {"id": paused["id"]}, alice)
    assert mine["status"]["state"] == "input-required"


# --- secrets ------------------------------------------------------------------------


def database_bytes(folder: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(folder.glob("gate.db*")))


def test_keys_are_stored_hashed_and_never_logged(
    write_config: Callable[..., Path], start_gate: Callable[..., GateProcess]
) -> None:
    config = write_config(
        FREE_CONFIG + f'\n[[keys]]\nname = "configured"\n'
        f'sha256 = "{hashlib.sha256(CONFIG_KEY.encode()).hexdigest()}"\nagents = ["echo"]\n'
    )
    keys = {"erin": create_key(config, "erin", ["echo"]), "frank": create_key(config, "frank", ["slow"])}
    gate = start_gate(config)
    echo = f"{gate.url}/a2a/echo"
    for key in (*keys.values(), CONFIG_KEY, "a2g_unknown-key-should-not-be-logged"):
        post(echo, rpc_body("message/send", {"message": v03_message("hi")}), bearer(key))
        post(echo, b"{broken", bearer(key))
    gate.stop()

    stored = database_bytes(config.parent)
    log = gate.log.read_bytes()
    assert b"erin" in log  # the log is there to be read, and names callers by their key name
    for name, key in keys.items():
        assert key.encode() not in stored, name
        assert hashlib.sha256(key.encode()).hexdigest().encode() in stored, name
        assert key.split("_", 1)[1].encode() not in log, name
    for key in (CONFIG_KEY, "a2g_unknown-key-should-not-be-logged"):
        assert key.encode() not in stored and key.split("_", 1)[1].encode() not in log


def test_the_cli_lists_keys_without_the_keys(setup: Setup) -> None:
    from tests.support.gate_helpers import cli

    listing = cli("keys", "--config", str(setup.config), "list").stdout

    assert "alice" in listing and "carol" in listing
    for key in setup.keys.values():
        assert key not in listing
        assert hashlib.sha256(key.encode()).hexdigest() not in listing
