"""The money simulation's payment channels: the development chain's settlement contract, and payers.

The chain is `devnet.batch_settlement.BatchSettlementContract` over a `devnet.ledger.DevLedger`
(with the dev chain's Permit2 for Permit2 deposits), its clock the simulation's; the facilitator
answering the gate's `batch-settlement` calls is the x402 package's own scheme over it
(`devnet.channels.ChannelFacilitator`, the development facilitator's), and the gate's JSON-RPC
questions about channels are the dev chain's `ChainRpc`. Nothing here decides what the contract
accepts: what the development chain refuses, the simulation's chain refuses.

A payer signs with the x402 package's client code (`sign_voucher`, the deposit payload builders),
its deposits valid in the simulation's time. What an adversarial payer does besides is here too:
a voucher signature in a form the contract refuses (high s, or v as 0/1), a withdrawal
(`initiateWithdraw`, `finalizeWithdraw`, sent as the payer), and many channels opened cheaply
(signed once per process, the same for every run: one payer, a channel per salt).
"""

from __future__ import annotations

import functools
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import eth_utils
from eth_account import Account
from eth_utils import keccak
from x402.mechanisms.evm.batch_settlement.abi import BATCH_SETTLEMENT_ABI
from x402.mechanisms.evm.batch_settlement.authorizer_signer import LocalAuthorizerSigner
from x402.mechanisms.evm.batch_settlement.client.eip3009 import create_batch_settlement_eip3009_deposit_payload
from x402.mechanisms.evm.batch_settlement.client.permit2 import create_batch_settlement_permit2_deposit_payload
from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher
from x402.mechanisms.evm.batch_settlement.constants import ERC3009_DEPOSIT_COLLECTOR_ADDRESS
from x402.mechanisms.evm.batch_settlement.facilitator.deposit_eip3009 import build_eip3009_deposit_collector_data
from x402.mechanisms.evm.batch_settlement.facilitator.utils import to_contract_channel_config
from x402.mechanisms.evm.batch_settlement.types import ChannelConfig, DepositPayload
from x402.mechanisms.evm.batch_settlement.utils import compute_channel_id
from x402.mechanisms.evm.multicall import encode_contract_call
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.schemas import PaymentRequirements
from x402.schemas.helpers import parse_payment_payload, parse_payment_requirements

from devnet.batch_settlement import BatchSettlementContract
from devnet.chain import ChainRpc, LedgerEvmSigner
from devnet.channels import DEV_RECEIVER_AUTHORIZER_KEY, ChannelFacilitator
from devnet.ledger import DevLedger, LedgerRevert
from devnet.permit2 import Permit2Contracts

NETWORK = "eip155:84532"
ASSET = "0x036cbd53842c5426634e7929541ec2318f3dcf7e"
# the facilitator's receiver-authorizer (the development key): it countersigns the gate's claims
RECEIVER_AUTHORIZER = LocalAuthorizerSigner(DEV_RECEIVER_AUTHORIZER_KEY).address.lower()
WITHDRAW_DELAY = 900
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
DECOYS = 101  # channels opened at once: more than a page of any listing the gate reads (100)
OTHERS = 3  # channels another payer opens one at a time (after the decoys' salts)
DECOY_VALID_BEFORE = 2_000_000_000  # a decoy deposit's window (the simulation's clock starts at 1.9e9)


class ChannelChain:
    """The development chain's settlement contract, and the x402 facilitator scheme over it."""

    def __init__(self, path: Path, clock: Any) -> None:
        self.ledger = DevLedger(str(path))
        self.permit2 = Permit2Contracts(self.ledger)
        self.contract = BatchSettlementContract(self.ledger, permit2=self.permit2, clock=clock)
        self.signer = LedgerEvmSigner(self.ledger, contracts=[self.permit2, self.contract])
        self.facilitator = ChannelFacilitator(self.signer, self.contract)
        assert self.facilitator.authorizer.address.lower() == RECEIVER_AUTHORIZER
        self.rpc = ChainRpc(self.signer)

    def decide(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """A facilitator `verify` or `settle` of a channel payload, as the development facilitator answers it."""
        payload = parse_payment_payload(body["paymentPayload"])
        requirements = parse_payment_requirements(2, body["paymentRequirements"])
        result = getattr(self.facilitator.scheme, kind)(payload, requirements)
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)  # type: ignore[no-any-return]

    def channel(self, channel_id: str) -> tuple[int, int, int, int]:
        """(balance, total claimed, pending withdrawal, when it was initiated) as the contract holds them."""
        key = bytes.fromhex(channel_id.removeprefix("0x"))
        balance, claimed = self.contract.call(self.contract.address, "channels", (key,))
        amount, initiated = self.contract.call(self.contract.address, "pendingWithdrawals", (key,))
        return int(balance), int(claimed), int(amount), int(initiated)

    def deposit_decoys(self, first: int = 0, count: int = DECOYS) -> None:
        """The decoy payer's deposits into its channels `first` to `first + count`, one transaction (`multicall`)."""
        calls = [encode_contract_call(BATCH_SETTLEMENT_ABI, "deposit", *args) for _, args in decoys()[first:][:count]]
        self.contract.transact(self.contract.address, "multicall", (calls,), DECOY_ACCOUNT.address)

    def channels(self) -> dict[str, tuple[int, int]]:
        """Every channel on the contract: (balance, total claimed), read from its state at once."""
        with self.ledger.contract_transaction(commit=False) as db:
            rows = db.execute("SELECT channel_id, balance, total_claimed FROM bs_channels").fetchall()
        return {row[0].lower(): (int(row[1]), int(row[2])) for row in rows}

    def transact(self, function: str, config: dict[str, Any], *args: Any) -> str | None:
        """The payer's own transaction to the contract; None when the contract refuses it."""
        contract_config = to_contract_channel_config(ChannelConfig.from_dict(config))
        try:
            return self.contract.transact(self.contract.address, function, (contract_config, *args), config["payer"])
        except LedgerRevert:
            return None

    def close(self) -> None:
        self.ledger.db.conn.close()


def requirements(amount: int, valid_until: float, transfer_method: str = "eip3009") -> PaymentRequirements:
    """The offer a payer signs a deposit against, its window ending at `valid_until` in the
    simulation's time (the package's builders count the window from the real clock)."""
    extra: dict[str, Any] = {
        "name": "USDC",
        "version": "2",
        "receiverAuthorizer": RECEIVER_AUTHORIZER,
        "withdrawDelay": WITHDRAW_DELAY,
    }
    if transfer_method == "permit2":
        extra["assetTransferMethod"] = "permit2"
    return PaymentRequirements(
        scheme="batch-settlement",
        network=NETWORK,
        asset=ASSET,
        amount=str(amount),
        pay_to=PAY_TO_ADDRESS,
        max_timeout_seconds=max(1, int(valid_until - time.time())),
        extra=extra,
    )


PAY_TO_ADDRESS = "0x209693bc6afc0c5328ba36faf03c514ef312287c"


def channel_config(payer: str, salt: int = 0) -> dict[str, Any]:
    return {
        "payer": payer,
        "payerAuthorizer": payer,
        "receiver": PAY_TO_ADDRESS,
        "receiverAuthorizer": RECEIVER_AUTHORIZER,
        "token": ASSET,
        "withdrawDelay": WITHDRAW_DELAY,
        "salt": "0x" + format(salt, "064x"),
    }


def channel_id_of(config: dict[str, Any]) -> str:
    return compute_channel_id(ChannelConfig.from_dict(config), NETWORK).lower()  # type: ignore[no-any-return]


def voucher(account: Any, channel_id: str, cap: int) -> dict[str, Any]:
    return sign_voucher(EthAccountSigner(account), channel_id, str(cap), NETWORK).to_dict()  # type: ignore[no-any-return]


def deposit_payload(
    account: Any, config: dict[str, Any], amount: int, cap: int, valid_until: float, transfer_method: str
) -> dict[str, Any]:
    """A deposit of `amount` into the channel with its voucher for `cap`, signed by the x402 package's client."""
    build = (
        create_batch_settlement_permit2_deposit_payload
        if transfer_method == "permit2"
        else create_batch_settlement_eip3009_deposit_payload
    )
    offer = requirements(amount, valid_until, transfer_method)
    payload = build(EthAccountSigner(account), offer, ChannelConfig.from_dict(config), str(amount), str(cap))
    return payload.to_dict()  # type: ignore[no-any-return]


def non_canonical(signature: str, how: str) -> str:
    """The same signature in a form the contract's ECDSA refuses: `high-s` (s' = n - s, v flipped,
    which recovers the same signer) or `v01` (v given as 0/1 rather than 27/28)."""
    raw = bytes.fromhex(signature.removeprefix("0x"))
    r, s, v = raw[:32], int.from_bytes(raw[32:64], "big"), raw[64]
    if how == "high-s":
        return "0x" + (r + (SECP256K1_N - s).to_bytes(32, "big") + bytes([55 - v])).hex()
    return "0x" + (r + raw[32:64] + bytes([v - 27])).hex()


def canonical(signature: str) -> bool:
    """Low s and v 27/28: the only form OpenZeppelin's ECDSA (the contract's verifier) accepts."""
    raw = bytes.fromhex(signature.removeprefix("0x"))
    return len(raw) == 65 and int.from_bytes(raw[32:64], "big") <= SECP256K1_N // 2 and raw[64] in (27, 28)


DECOY_ACCOUNT = Account.from_key(keccak(text="a2a-gate money simulation decoy payer"))


@functools.cache
def decoys() -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """Many channels of one payer (a channel per salt), signed once per process: for each, the JSON of
    its first voucher's payload (for 1,000), and the arguments of the payer's own `deposit` of 10,000
    through the ERC-3009 collector (the transaction a payer sends without the gate)."""
    signed = []
    for salt in range(1, DECOYS + OTHERS + 1):
        config = channel_config(DECOY_ACCOUNT.address, salt)
        payload = deposit_payload(DECOY_ACCOUNT, config, 10_000, 1000, DECOY_VALID_BEFORE, "eip3009")
        data = build_eip3009_deposit_collector_data(DepositPayload.from_dict(payload))
        contract_config = to_contract_channel_config(ChannelConfig.from_dict(config))
        voucher_payload = {"type": "voucher", "channelConfig": payload["channelConfig"], "voucher": payload["voucher"]}
        signed.append((json.dumps(voucher_payload), (contract_config, 10_000, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data)))
    return tuple(signed)


def fresh_salt() -> str:
    return "0x" + secrets.token_hex(32)


def checksums_remembered(monkeypatch: Any) -> None:
    """`to_checksum_address` remembered, where the development chain and the x402 package call it (a
    hash per call, a hundred a deposit: half of what a channel's facilitator call costs). The same
    answers, sooner; for the simulation's time budget only."""
    original = eth_utils.to_checksum_address
    remembered = functools.lru_cache(maxsize=8192)(original)
    for name, module in list(sys.modules.items()):
        if name.startswith(("devnet.", "x402.")) and getattr(module, "to_checksum_address", None) is original:
            monkeypatch.setattr(module, "to_checksum_address", remembered)
