"""One transfer to payTo is evidence for one claim, not for every nonce its transaction spent.

When the facilitator cannot settle, the gate asks the chain: the transaction that spent the
authorization's nonce must carry a `Transfer(payer, payTo, >= price)`. A payer who sees two of
its payments owed (`payment-verified`) can spend both nonces in ONE transaction of its own (a
contract calling `transferWithAuthorization` twice, as Multicall does): the first authorization
pays payTo the price, the second pays someone else 1 unit. The receipt then holds one transfer of
the price to payTo, and the transaction spent both nonces. Both claims may not read that one
transfer as their payment: one price was paid, so at most one claim is `settled`.

A real gate process, the development facilitator refusing to settle (HTTP 500), and a small
JSON-RPC chain on loopback that answers the gate's three questions (`authorizationState`,
`AuthorizationUsed` logs, the receipt) for that transaction. The development chain has no
transaction with two transfers, so it cannot express this one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from devnet.payer import encode_header
from gate.chain import AUTHORIZATION_USED_TOPIC, TRANSFER_TOPIC, address_word
from tests.support.gate_helpers import cli
from tests.support.gate_process import free_port
from tests.support.paid import ASSET, PAY_TO, PaidSetup, Payer, paid_config, send_body
from tests.support.serve import serve_app

SOMEONE_ELSE = "0x1111111111111111111111111111111111111111"
MULTICALL_TX = "0x" + "ab" * 32
PRICE = 1000


class OneTransactionChain:
    """Nonces spent by one payer transaction whose receipt logs are given; everything else unused."""

    def __init__(self) -> None:
        self.spent: set[str] = set()
        self.logs: list[dict[str, Any]] = []

    def spend_in_one_transaction(self, payer: str, paying: str, elsewhere: str) -> None:
        """`paying` moves the price to payTo, `elsewhere` 1 unit to someone else: one transaction."""
        self.spent = {paying.lower(), elsewhere.lower()}
        self.logs = [
            self.log([AUTHORIZATION_USED_TOPIC, "0x" + address_word(payer), paying.lower()], "0x"),
            self.log([TRANSFER_TOPIC, "0x" + address_word(payer), "0x" + address_word(PAY_TO)], self.word(PRICE)),
            self.log([AUTHORIZATION_USED_TOPIC, "0x" + address_word(payer), elsewhere.lower()], "0x"),
            self.log([TRANSFER_TOPIC, "0x" + address_word(payer), "0x" + address_word(SOMEONE_ELSE)], self.word(1)),
        ]
        for index, log in enumerate(self.logs):
            log["logIndex"] = hex(index)

    def spend_beside_a_payment_by_another_address(self, payer: str, nonce: str) -> None:
        """`nonce` moves 1 unit to someone else; in the same transaction ANOTHER address pays payTo the price."""
        self.spent = {nonce.lower()}
        self.logs = [
            self.log([AUTHORIZATION_USED_TOPIC, "0x" + address_word(payer), nonce.lower()], "0x"),
            self.log([TRANSFER_TOPIC, "0x" + address_word(payer), "0x" + address_word(SOMEONE_ELSE)], self.word(1)),
            self.log(
                [TRANSFER_TOPIC, "0x" + address_word(SOMEONE_ELSE), "0x" + address_word(PAY_TO)], self.word(PRICE)
            ),
        ]
        for index, log in enumerate(self.logs):
            log["logIndex"] = hex(index)

    def log(self, topics: list[str], data: str) -> dict[str, Any]:
        return {"address": ASSET.lower(), "topics": topics, "data": data, "transactionHash": MULTICALL_TX}

    @staticmethod
    def word(value: int) -> str:
        return "0x" + value.to_bytes(32, "big").hex()

    def answer(self, method: str, params: list[Any]) -> Any:
        if method == "eth_call":
            nonce = "0x" + params[0]["data"][-64:].lower()
            return self.word(1 if nonce in self.spent else 0)
        if method == "eth_getLogs":
            topic, _, nonce = params[0]["topics"]
            if topic == AUTHORIZATION_USED_TOPIC and nonce.lower() in self.spent:
                return [log for log in self.logs if log["topics"][0] == topic and log["topics"][2] == nonce.lower()]
            return []
        if method == "eth_getTransactionReceipt":
            if params[0] == MULTICALL_TX and self.spent:
                return {"transactionHash": MULTICALL_TX, "status": "0x1", "logs": self.logs}
            return None
        return None

    def app(self) -> Starlette:
        async def rpc(request: Request) -> JSONResponse:
            body = await request.json()
            return JSONResponse(
                {"jsonrpc": "2.0", "id": body["id"], "result": self.answer(body["method"], body["params"])}
            )

        return Starlette(routes=[Route("/", rpc, methods=["POST"])])


def chain_checking_gate(rpc_url: str, tmp_path: Path, facilitator: str, start_gate, write_config) -> PaidSetup:
    port = free_port()
    config = paid_config(f"http://127.0.0.1:{port}", facilitator)
    config = config.replace("settle_backoff_seconds = 0.05", "settle_backoff_seconds = 0.05\nsettle_passes = 1")
    config += f'\n[networks."eip155:84532"]\nrpc_url = "{rpc_url}/"\n'
    gate = start_gate(write_config(config), port=port)
    return PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")


def nonce_of(token: dict[str, Any]) -> str:
    return token["payload"]["authorization"]["nonce"]


def test_one_transfer_to_pay_to_settles_at_most_one_of_the_nonces_its_transaction_spent(
    tmp_path: Path, facilitator: str, start_gate, write_config
) -> None:
    chain = OneTransactionChain()
    with serve_app(chain.app(), wait_on_exit=False) as rpc_url:
        paid = chain_checking_gate(rpc_url, tmp_path, facilitator, start_gate, write_config)
        paid.faults(settle="http500")
        payer = Payer()
        tokens = [payer.token_for(paid.gate.url, "paid") for _ in range(2)]
        for number, token in enumerate(tokens):
            answer = paid.post("paid", send_body(f"job {number}"), {"PAYMENT-SIGNATURE": encode_header(token)}).json()
            assert answer["result"]["metadata"]["x402.payment.status"] == "payment-verified", answer  # delivered, owed
        assert paid.claim_states() == ["settle_failed", "settle_failed"]

        # the payer spends both nonces in one transaction: one pays payTo the price, one pays 1 elsewhere
        chain.spend_in_one_transaction(payer.address, nonce_of(tokens[0]), nonce_of(tokens[1]))
        cli("reconcile", "--config", str(paid.gate.config))

        settled = paid.payment_rows("settle")
        observed = {
            "claims": sorted(paid.claim_states()),
            "settle_rows_naming_the_one_transaction": sum(r["transaction"] == MULTICALL_TX for r in settled),
            "paid_to_pay_to": PRICE,
        }
        assert observed["settle_rows_naming_the_one_transaction"] <= 1, (
            f"one transfer of {PRICE} to payTo counted as {observed['settle_rows_naming_the_one_transaction']}"
            f" payments: {json.dumps(observed)}"
        )
        assert observed["claims"] == ["settled", "unsettled"], observed


def test_a_transfer_to_pay_to_from_another_address_is_not_the_payers_payment(
    tmp_path: Path, facilitator: str, start_gate, write_config
) -> None:
    """The payer spends its nonce on 1 unit elsewhere; the same transaction carries a transfer of the
    price to payTo from another address. That is not this authorization paying: written off."""
    chain = OneTransactionChain()
    with serve_app(chain.app(), wait_on_exit=False) as rpc_url:
        paid = chain_checking_gate(rpc_url, tmp_path, facilitator, start_gate, write_config)
        paid.faults(settle="http500")
        payer = Payer()
        token = payer.token_for(paid.gate.url, "paid")
        answer = paid.post("paid", send_body("job"), {"PAYMENT-SIGNATURE": encode_header(token)}).json()
        assert answer["result"]["metadata"]["x402.payment.status"] == "payment-verified", answer
        chain.spend_beside_a_payment_by_another_address(payer.address, nonce_of(token))
        cli("reconcile", "--config", str(paid.gate.config))
        assert paid.claim_states() == ["unsettled"], paid.payment_rows()[-1]
