"""The official a2a-sdk 1.x client, unchanged, pays the A2A way and reaches a free agent with its key.

Activation goes through the SDK's own service parameters (`with_a2a_extensions`), the
token is signed by the x402 package and rides in the SDK message's metadata (a protobuf
Struct, so every number in it arrives as a double). Both the v1.0 transport and the
SDK's v0.3 compat transport (chosen by keeping the card's 0.3 interface) are driven,
with send and stream.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from a2a.client import (
    A2ACardResolver,
    A2AClientError,
    AuthInterceptor,
    Client,
    ClientCallContext,
    ClientConfig,
    ClientFactory,
    InMemoryContextCredentialStore,
)
from a2a.client.service_parameters import ServiceParametersFactory, with_a2a_extensions
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct

from tests.support.gate_helpers import create_key
from tests.support.in_band import EXTENSION_V02, forge
from tests.support.paid import PaidView, Payer


@pytest.fixture
def paid(shared_paid: PaidView) -> PaidView:
    """The shared paid gate and facilitator; each test counts only its own payer's work (PaidView)."""
    return shared_paid


ORIGINAL = "what is the weather in Lisbon?"


async def client_for(
    http: httpx.AsyncClient, url: str, *, streaming: bool, dialect: str, interceptors: list[Any] | None = None
) -> Client:
    """A client from the agent's card; for "0.3" the card's 0.3 interface is the one kept."""
    card = await A2ACardResolver(http, url).get_agent_card()
    if dialect == "0.3":
        keep = [i for i in card.supported_interfaces if i.protocol_version.startswith("0.3")]
        del card.supported_interfaces[:]
        card.supported_interfaces.extend(keep)
    return ClientFactory(ClientConfig(httpx_client=http, streaming=streaming)).create(card, interceptors)


def activated() -> ClientCallContext:
    return ClientCallContext(service_parameters=ServiceParametersFactory.create([with_a2a_extensions([EXTENSION_V02])]))


def message(text: str, *, task_id: str = "", metadata: dict[str, Any] | None = None) -> Message:
    out = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)], task_id=task_id)
    if metadata:
        struct = Struct()
        struct.update(metadata)
        out.metadata.CopyFrom(struct)
    return out


async def send(client: Client, msg: Message, context: ClientCallContext | None) -> list[dict[str, Any]]:
    return [
        MessageToDict(event) async for event in client.send_message(SendMessageRequest(message=msg), context=context)
    ]


def final_task(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The task as the events leave it: the last Task, updated by later status and artifact events."""
    task: dict[str, Any] = {}
    for event in events:
        if "task" in event:
            task = event["task"]
        elif "statusUpdate" in event:
            task["status"] = event["statusUpdate"]["status"]
        elif "artifactUpdate" in event:
            task.setdefault("artifacts", []).append(event["artifactUpdate"]["artifact"])
    return task


def x402(task: dict[str, Any]) -> dict[str, Any]:
    return task["status"]["message"]["metadata"]


async def pay_in_band(url: str, *, streaming: bool, dialect: str, payer: Payer, forged: bool = False) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30) as http:
        client = await client_for(http, url, streaming=streaming, dialect=dialect)
        try:
            asked = final_task(await send(client, message(ORIGINAL), activated()))
            assert asked["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
            assert x402(asked)["x402.payment.status"] == "payment-required"
            [offer] = x402(asked)["x402.payment.required"]["accepts"]
            token = payer.sign_v1(offer)
            if forged:
                token["payload"]["signature"] = forge(token["payload"]["signature"])
            paying = message(
                "Payment authorization provided",
                task_id=asked["id"],
                metadata={"x402.payment.status": "payment-submitted", "x402.payment.payload": token},
            )
            return final_task(await send(client, paying, activated()))
        finally:
            await client.close()


@pytest.mark.parametrize("dialect", ["1.0", "0.3"])
@pytest.mark.parametrize("streaming", [False, True], ids=["send", "stream"])
def test_sdk_client_pays_in_band_and_gets_the_original_answered(paid, dialect, streaming):
    done = asyncio.run(pay_in_band(f"{paid.gate.url}/a2a/paid", streaming=streaming, dialect=dialect, payer=Payer()))
    assert done["status"]["state"] == "TASK_STATE_COMPLETED", done
    assert done["artifacts"][-1]["parts"][0]["text"] == ORIGINAL
    metadata = x402(done)
    assert metadata["x402.payment.status"] == "payment-completed"
    assert metadata["x402.payment.receipts"][0]["success"] is True
    assert len(paid.ledger()["settlements"]) == 1


def test_sdk_client_refused_in_band_payment_is_payment_failed_on_the_task(paid):
    done = asyncio.run(
        pay_in_band(f"{paid.gate.url}/a2a/paid", streaming=False, dialect="1.0", payer=Payer(), forged=True)
    )
    assert done["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    metadata = x402(done)
    assert (metadata["x402.payment.status"], metadata["x402.payment.error"]) == ("payment-failed", "INVALID_SIGNATURE")
    assert metadata["x402.payment.receipts"][0]["success"] is False
    assert paid.ledger()["settlements"] == []


@pytest.mark.parametrize("dialect", ["1.0", "0.3"])
def test_sdk_client_pays_by_metadata_on_the_http_flow(paid, dialect):
    token = Payer().token_for(paid.gate.url)

    async def run() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=30) as http:
            client = await client_for(http, f"{paid.gate.url}/a2a/paid", streaming=False, dialect=dialect)
            try:
                return final_task(await send(client, message(ORIGINAL, metadata={"x402.payment.payload": token}), None))
            finally:
                await client.close()

    done = asyncio.run(run())
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    assert done["artifacts"][0]["parts"][0]["text"] == ORIGINAL
    assert x402(done)["x402.payment.status"] == "payment-completed"


def test_sdk_auth_interceptor_attaches_the_key_from_the_card(paid):
    api_key = create_key(paid.gate.config, "ops", ["echo"])

    async def run() -> tuple[dict[str, Any], BaseException | None]:
        store = InMemoryContextCredentialStore()
        await store.set_credentials("session-1", "apiKey", api_key)
        url = f"{paid.gate.url}/a2a/echo"
        async with httpx.AsyncClient(timeout=30) as http:
            keyed = await client_for(http, url, streaming=False, dialect="1.0", interceptors=[AuthInterceptor(store)])
            bare = await client_for(http, url, streaming=False, dialect="1.0")
            try:
                done = final_task(
                    await send(keyed, message("hello"), ClientCallContext(state={"sessionId": "session-1"}))
                )
                try:
                    await send(bare, message("hello"), None)
                    refused = None
                except A2AClientError as exc:
                    refused = exc
                return done, refused
            finally:
                await keyed.close()
                await bare.close()

    done, refused = asyncio.run(run())
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    assert done["artifacts"][0]["parts"][0]["text"] == "hello"
    assert refused is not None and "401" in str(refused)  # without the key: anonymous, and echo is free only with one
