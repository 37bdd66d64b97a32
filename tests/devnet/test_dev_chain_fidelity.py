"""The development chain held to the contracts it stands for, rule by rule.

One test per row of docs/development-chain.md: x402BatchSettlement (and its two deposit
collectors), x402's exact and upto Permit2 proxies over Uniswap's Permit2, and Circle's FiatToken
EIP-3009 functions. Each drives the simulated contract directly (no HTTP) and checks that the dev
chain reverts where the contract reverts, with the contract's reason, changes nothing when it does,
and emits what the contract emits. Signatures are checked in every form a payer could send: the
canonical one, its high-s twin (`s' = n - s`, `v` flipped), `v` as 0/1, and EIP-2098's 64 bytes;
each verifier takes exactly the forms its contract takes (OpenZeppelin's ECDSA and Circle's
ECRecover: the canonical one only; Permit2: any `s`, 64 or 65 bytes, `v` 27/28).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from eth_abi import decode as abi_decode
from eth_account import Account
from x402.mechanisms.evm.batch_settlement.authorizer_signer import LocalAuthorizerSigner, sign_claim_batch, sign_refund
from x402.mechanisms.evm.batch_settlement.client.eip3009 import create_batch_settlement_eip3009_deposit_payload
from x402.mechanisms.evm.batch_settlement.client.permit2 import create_batch_settlement_permit2_deposit_payload
from x402.mechanisms.evm.batch_settlement.client.scheme import BatchSettlementEvmScheme
from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher
from x402.mechanisms.evm.batch_settlement.constants import (
    ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
    PERMIT2_DEPOSIT_COLLECTOR_ADDRESS,
)
from x402.mechanisms.evm.batch_settlement.facilitator.deposit_eip3009 import build_eip3009_deposit_collector_data
from x402.mechanisms.evm.batch_settlement.facilitator.deposit_permit2 import build_permit2_deposit_collector_data
from x402.mechanisms.evm.batch_settlement.facilitator.utils import to_contract_channel_config
from x402.mechanisms.evm.batch_settlement.types import VoucherClaim
from x402.mechanisms.evm.batch_settlement.utils import compute_channel_id
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.schemas import PaymentRequirements

from devnet.batch_settlement import EVENT_TOPICS, UINT128_MAX, BatchSettlementContract
from devnet.batch_settlement.state import store_channel
from devnet.chain import (
    AUTHORIZATION_CANCELED_TOPIC,
    AUTHORIZATION_USED_TOPIC,
    DEV_NETWORK,
    FACILITATOR_ADDRESS,
    TRANSFER_TOPIC,
    ChainRpc,
    JsonRpcError,
    LedgerEvmSigner,
    default_tokens,
)
from devnet.channels import DEV_RECEIVER_AUTHORIZER_KEY
from devnet.ledger import DEFAULT_INITIAL_BALANCE, DevLedger, LedgerRevert, Transfer
from devnet.payer import new_private_key, sign_cancel_authorization, sign_transfer_authorization
from devnet.permit2 import (
    NONCE_INVALIDATION_TOPIC,
    PERMIT2,
    SETTLED_TOPIC,
    SETTLED_WITH_PERMIT_TOPIC,
    UPTO_PROXY,
    Permit2Contracts,
)
from tests.support.channels import BATCH_SETTLEMENT_ADDRESS, WITHDRAW_DELAY, channel_offer, signed_transaction
from tests.support.dev_facilitator_helpers import PAY_TO, USDC_BASE_SEPOLIA
from tests.support.permit2_payments import resign_permit2, sign_upto, upto_offer

N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
ZERO = "0x" + "00" * 20
OTHER = "0x" + "22" * 20
RECEIVER_AUTHORIZER = Account.from_key(DEV_RECEIVER_AUTHORIZER_KEY).address
TOKEN = default_tokens()[USDC_BASE_SEPOLIA]


# -- signature forms -----------------------------------------------------------------------------


def high_s(signature: bytes) -> bytes:
    s = int.from_bytes(signature[32:64], "big")
    return signature[:32] + (N - s).to_bytes(32, "big") + bytes([55 - signature[64]])


def v_bit(signature: bytes) -> bytes:
    return signature[:64] + bytes([signature[64] - 27])


def compact(signature: bytes) -> bytes:
    vs = int.from_bytes(signature[32:64], "big") | ((signature[64] - 27) << 255)
    return signature[:32] + vs.to_bytes(32, "big")


def raw(signature: str) -> bytes:
    return bytes.fromhex(signature.removeprefix("0x"))


def test_the_forms_are_one_signature_each() -> None:
    """The non-canonical forms the tests send are the payer's own signature, re-encoded (what ecrecover
    would map to the same signer), so a refusal below is about the form and nothing else."""
    from eth_keys import keys

    key = Account.create()
    digest = os.urandom(32)
    signed = Account.unsafe_sign_hash(digest, key.key)
    canonical = bytes(signed.signature)
    assert signed.s <= N // 2 and canonical[64] in (27, 28)
    for form in (high_s(canonical), v_bit(canonical)):
        v = form[64] - 27 if form[64] >= 27 else form[64]
        vrs = (v, int.from_bytes(form[:32], "big"), int.from_bytes(form[32:64], "big"))
        assert keys.Signature(vrs=vrs).recover_public_key_from_msg_hash(digest).to_checksum_address() == key.address
    vs = int.from_bytes(compact(canonical)[32:], "big")
    assert (vs >> 255, vs & ((1 << 255) - 1)) == (canonical[64] - 27, signed.s)


# -- the world ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Channel:
    key: str
    payer: EthAccountSigner
    config: Any  # the package's ChannelConfig
    channel_id: str

    @property
    def contract_config(self) -> tuple[Any, ...]:
        return tuple(to_contract_channel_config(self.config))

    def voucher(self, max_claimable: int) -> bytes:
        return raw(sign_voucher(self.payer, self.channel_id, max_claimable, DEV_NETWORK).signature)

    def row(self, max_claimable: int, total: int, signature: bytes | None = None) -> tuple[Any, ...]:
        signature = self.voucher(max_claimable) if signature is None else signature
        return ((self.contract_config, max_claimable), signature, total)


class World:
    """The contracts over a fresh ledger, the settlement contract's clock in the test's hand."""

    def __init__(self, path: str) -> None:
        self.ledger = DevLedger(path)
        self.permit2 = Permit2Contracts(self.ledger)
        self.now = int(time.time())
        self.contract = BatchSettlementContract(self.ledger, permit2=self.permit2, clock=lambda: self.now)
        self.signer = LedgerEvmSigner(self.ledger, contracts=[self.permit2, self.contract])
        self.offer = PaymentRequirements.model_validate(channel_offer(RECEIVER_AUTHORIZER))
        self.authorizer = LocalAuthorizerSigner(DEV_RECEIVER_AUTHORIZER_KEY)
        self.channels: list[Channel] = []

    def channel(self, **changes: Any) -> Channel:
        key = new_private_key()
        payer = EthAccountSigner(Account.from_key(key))
        config = BatchSettlementEvmScheme(payer).build_channel_config(self.offer)
        config = dataclasses.replace(config, **changes)
        return Channel(key, payer, config, compute_channel_id(config, DEV_NETWORK))

    def deposit_data(self, channel: Channel, amount: int) -> bytes:
        payload = create_batch_settlement_eip3009_deposit_payload(
            channel.payer, self.offer, channel.config, amount, amount
        )
        return bytes(build_eip3009_deposit_collector_data(payload))

    def deposit(self, channel: Channel, amount: int) -> str:
        data = self.deposit_data(channel, amount)
        return self.send("deposit", channel.contract_config, amount, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data)

    def opened(self, amount: int = 10_000, **changes: Any) -> Channel:
        channel = self.channel(**changes)
        self.deposit(channel, amount)
        return channel

    def send(self, function_name: str, *args: Any, sender: str | None = None) -> str:
        return self.contract.transact(BATCH_SETTLEMENT_ADDRESS, function_name, args, sender)

    def reverts(self, function_name: str, *args: Any, sender: str | None = None) -> str:
        before = self.state()
        with pytest.raises(LedgerRevert) as caught:
            self.send(function_name, *args, sender=sender)
        assert self.state() == before  # a revert changes nothing
        return caught.value.reason

    def state(self) -> tuple[Any, ...]:
        snapshot = self.contract.snapshot()
        del snapshot["now"]
        holders = [PAY_TO, BATCH_SETTLEMENT_ADDRESS, ERC3009_DEPOSIT_COLLECTOR_ADDRESS]
        return snapshot, [self.ledger.balance_of(DEV_NETWORK, USDC_BASE_SEPOLIA, a) for a in holders]

    def logs(self, tx_hash: str) -> list[dict[str, Any]]:
        found = self.contract.receipt(tx_hash)
        assert found is not None
        return found[1]

    def record(self, channel: Channel) -> Any:
        return self.contract.channel(channel.channel_id)

    def claim(self, rows: list[tuple[Any, ...]]) -> str:
        return self.send("claim", rows, sender=PAY_TO)

    def authorized(self, rows: list[tuple[Any, ...]], authorizer: LocalAuthorizerSigner | None = None) -> bytes:
        claims = [
            VoucherClaim(
                channel=next(c for c in self.channels if c.contract_config == row[0][0]).config,
                max_claimable_amount=str(row[0][1]),
                signature="0x" + row[1].hex(),
                total_claimed=str(row[2]),
            )
            for row in rows
        ]
        return raw(sign_claim_batch(authorizer or self.authorizer, claims, DEV_NETWORK))


@pytest.fixture
def world(tmp_path: Any) -> Iterator[World]:
    built = World(str(tmp_path / "ledger.db"))
    yield built
    built.ledger.close()


def topics(logs: list[dict[str, Any]]) -> list[str]:
    return [log["topics"][0] for log in logs]


def balance(world: World, address: str) -> int:
    return world.ledger.balance_of(DEV_NETWORK, USDC_BASE_SEPOLIA, address)


# -- x402BatchSettlement.deposit ----------------------------------------------------------------


@pytest.mark.parametrize("field", ["payer", "receiver", "receiver_authorizer", "token"])
def test_deposit_refuses_a_zero_address_in_the_config(world, field):
    channel = world.channel(**{field: ZERO})
    data = world.deposit_data(world.channel(), 1000)
    reason = world.reverts("deposit", channel.contract_config, 1000, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data)
    assert reason.endswith("invalid channel config")


@pytest.mark.parametrize("delay", [899, 2_592_001])
def test_deposit_refuses_a_withdraw_delay_out_of_range(world, delay):
    channel = world.channel(withdraw_delay=delay)
    data = world.deposit_data(channel, 1000)
    reason = world.reverts("deposit", channel.contract_config, 1000, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data)
    assert reason.endswith("withdraw delay out of range")


def test_deposit_refuses_a_zero_amount(world):
    channel = world.channel()
    data = world.deposit_data(channel, 1000)
    assert world.reverts("deposit", channel.contract_config, 0, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data).endswith(
        "zero amount"
    )


@pytest.mark.parametrize("collector", [ZERO, OTHER])
def test_deposit_refuses_an_unknown_collector(world, collector):
    channel = world.channel()
    data = world.deposit_data(channel, 1000)
    assert world.reverts("deposit", channel.contract_config, 1000, collector, data).endswith(
        "unknown deposit collector"
    )


def test_deposit_refuses_a_balance_past_uint128(world):
    channel = world.opened(1000)
    record = world.record(channel)
    record.balance = UINT128_MAX - 10
    with world.ledger.contract_transaction() as db:
        store_channel(db, record)
    data = world.deposit_data(channel, 11)
    reason = world.reverts("deposit", channel.contract_config, 11, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data)
    assert reason.endswith("balance overflow")


def test_deposit_emits_channel_created_once_then_deposited_with_the_new_balance(world):
    channel = world.channel()
    first = world.logs(world.deposit(channel, 1000))
    second = world.logs(world.deposit(channel, 500))
    created, deposited = EVENT_TOPICS["ChannelCreated"], EVENT_TOPICS["Deposited"]
    assert topics(first) == [AUTHORIZATION_USED_TOPIC, TRANSFER_TOPIC, TRANSFER_TOPIC, created, deposited]
    assert topics(second) == [AUTHORIZATION_USED_TOPIC, TRANSFER_TOPIC, TRANSFER_TOPIC, deposited]
    assert abi_decode(["uint128", "uint128"], raw(second[-1]["data"])) == (500, 1500)
    assert world.record(channel).balance == 1500


# -- the ERC-3009 deposit collector: FiatToken's receiveWithAuthorization ------------------------


def erc3009_deposit(world: World, channel: Channel, amount: int, **changes: Any) -> bytes:
    payload = create_batch_settlement_eip3009_deposit_payload(
        channel.payer, world.offer, channel.config, amount, amount
    )
    authorization = payload.deposit.authorization.erc3009_authorization
    for name, value in changes.items():
        setattr(authorization, name, value)
    return bytes(build_eip3009_deposit_collector_data(payload))


def with_signature(data: bytes, form: Any) -> bytes:
    from eth_abi import encode as abi_encode

    valid_after, valid_before, salt, signature = abi_decode(["uint256", "uint256", "uint256", "bytes"], data)
    return abi_encode(["uint256", "uint256", "uint256", "bytes"], [valid_after, valid_before, salt, form(signature)])


@pytest.mark.parametrize(
    ("form", "reason"),
    [
        (high_s, "ECRecover: invalid signature 's' value"),
        (v_bit, "ECRecover: invalid signature 'v' value"),
        (compact, "ECRecover: invalid signature length"),
    ],
)
def test_erc3009_deposit_takes_only_the_canonical_signature(world, form, reason):
    channel = world.channel()
    data = with_signature(world.deposit_data(channel, 1000), form)
    assert world.reverts("deposit", channel.contract_config, 1000, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data) == reason


def test_erc3009_deposit_binds_the_amount_and_the_payer(world):
    channel = world.channel()
    data = world.deposit_data(channel, 1000)
    reason = world.reverts("deposit", channel.contract_config, 1001, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data)
    assert reason == "FiatTokenV2: invalid signature"


def test_erc3009_deposit_refuses_outside_its_window(world):
    channel = world.channel()
    now = int(time.time())
    early = erc3009_deposit(world, channel, 1000, valid_after=str(now + 600))
    late = erc3009_deposit(world, channel, 1000, valid_before=str(now - 1))
    for data, reason in ((early, "not yet valid"), (late, "expired")):
        got = world.reverts("deposit", channel.contract_config, 1000, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data)
        assert got.endswith(f"authorization is {reason}")


def test_erc3009_deposit_spends_its_nonce_once(world):
    channel = world.channel()
    data = world.deposit_data(channel, 1000)
    world.send("deposit", channel.contract_config, 1000, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data)
    reason = world.reverts("deposit", channel.contract_config, 1000, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, data)
    assert reason == "FiatTokenV2: authorization is used or canceled"


# -- the Permit2 deposit collector --------------------------------------------------------------


def permit2_deposit(world: World, channel: Channel, amount: int) -> tuple[bytes, Any]:
    payload = create_batch_settlement_permit2_deposit_payload(
        channel.payer, world.offer, channel.config, amount, amount
    )
    return bytes(build_permit2_deposit_collector_data(payload)), payload


def with_permit2_signature(data: bytes, form: Any) -> bytes:
    from eth_abi import encode as abi_encode

    nonce, deadline, signature, permit = abi_decode(["uint256", "uint256", "bytes", "bytes"], data)
    return abi_encode(["uint256", "uint256", "bytes", "bytes"], [nonce, deadline, form(signature), permit])


@pytest.mark.parametrize(("form", "accepted"), [(high_s, True), (compact, True), (v_bit, False)])
def test_permit2_deposit_takes_the_forms_permit2_takes(world, form, accepted):
    channel = world.channel()
    data, _ = permit2_deposit(world, channel, 1000)
    args = (channel.contract_config, 1000, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, with_permit2_signature(data, form))
    if accepted:
        world.send("deposit", *args)
        assert world.record(channel).balance == 1000
    else:
        assert world.reverts("deposit", *args) == "InvalidSignature()"


def test_permit2_deposit_spends_its_nonce_once(world):
    channel = world.channel()
    data, payload = permit2_deposit(world, channel, 1000)
    world.send("deposit", channel.contract_config, 1000, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, data)
    again = world.reverts("deposit", channel.contract_config, 1000, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, data)
    assert again == "InvalidNonce()"
    nonce = int(payload.deposit.authorization.permit2_authorization.nonce)
    assert world.permit2.nonce_used(channel.payer.address, nonce)


# -- x402BatchSettlement.claim / claimWithSignature --------------------------------------------


def test_claim_refuses_an_empty_batch(world):
    assert world.reverts("claim", [], sender=PAY_TO).endswith("no claims")


def test_claim_is_the_receiver_sides_alone(world):
    channel = world.opened()
    assert world.reverts("claim", [channel.row(1000, 1000)], sender=channel.payer.address).endswith(
        "caller is not authorized"
    )
    world.send("claim", [channel.row(1000, 1000)], sender=RECEIVER_AUTHORIZER)  # the receiver authorizer may
    assert world.record(channel).total_claimed == 1000


def test_claim_row_at_or_below_the_claimed_total_is_a_no_op_checked_no_further(world):
    channel = world.opened()
    world.claim([channel.row(2000, 2000)])
    garbage = b"\x01" * 65  # a row the contract skips is never verified
    tx = world.claim([channel.row(1000, 1000), channel.row(2000, 2000, garbage), channel.row(5000, 1500)])
    assert world.logs(tx) == [] and world.record(channel).total_claimed == 2000


def test_claim_refuses_a_total_above_the_voucher(world):
    channel = world.opened()
    assert world.reverts("claim", [channel.row(1000, 1001)], sender=PAY_TO).endswith(
        "claim exceeds voucher maxClaimableAmount"
    )


def test_claim_refuses_a_total_above_the_channel_balance(world):
    channel = world.opened(1000)
    assert world.reverts("claim", [channel.row(1001, 1001)], sender=PAY_TO).endswith("claim exceeds channel balance")
    never_funded = world.channel()
    assert world.reverts("claim", [never_funded.row(1, 1)], sender=PAY_TO).endswith("claim exceeds channel balance")


def test_claim_refuses_a_voucher_another_key_signed(world):
    channel = world.opened()
    forged = world.channel().voucher(1000)  # the same amount, signed by someone else
    assert world.reverts("claim", [channel.row(1000, 1000, forged)], sender=PAY_TO).endswith(
        "invalid voucher signature"
    )


@pytest.mark.parametrize(
    ("form", "error"),
    [
        (high_s, "ECDSAInvalidSignatureS(0x"),
        (v_bit, "ECDSAInvalidSignature()"),
        (compact, "ECDSAInvalidSignatureLength(64)"),
    ],
)
def test_claim_takes_a_payer_authorizers_voucher_only_in_ecdsa_recover_calldatas_form(world, form, error):
    channel = world.opened()
    signature = form(channel.voucher(1000))
    assert world.reverts("claim", [channel.row(1000, 1000, signature)], sender=PAY_TO).startswith(error)


def test_claim_checks_a_zero_payer_authorizers_voucher_as_the_payers_through_signature_checker(world):
    channel = world.opened(payer_authorizer=ZERO)
    for form in (high_s, v_bit, compact):
        signature = form(channel.voucher(1000))
        assert world.reverts("claim", [channel.row(1000, 1000, signature)], sender=PAY_TO).endswith(
            "invalid voucher signature"
        )
    world.claim([channel.row(1000, 1000)])  # the payer's own canonical signature
    assert world.record(channel).total_claimed == 1000


def test_claim_one_bad_row_reverts_the_whole_batch(world):
    good, bad = world.opened(), world.opened()
    rows = [good.row(1000, 1000), bad.row(1000, 1000, high_s(bad.voucher(1000)))]
    assert world.reverts("claim", rows, sender=PAY_TO).startswith("ECDSAInvalidSignatureS(")
    assert world.record(good).total_claimed == 0


def test_claim_emits_claimed_with_the_delta_and_counts_it_for_the_receiver(world):
    channel = world.opened()
    world.claim([channel.row(1000, 1000)])
    logs = world.logs(world.claim([channel.row(3000, 2500)]))
    assert topics(logs) == [EVENT_TOPICS["Claimed"]]
    assert logs[0]["topics"][1] == "0x" + channel.channel_id[2:]
    assert abi_decode(["uint128", "uint128"], raw(logs[0]["data"])) == (1500, 2500)
    assert world.contract.receiver_totals(PAY_TO, USDC_BASE_SEPOLIA) == (2500, 0)


def test_claim_with_signature_needs_the_receiver_authorizers_canonical_signature(world):
    channel = world.opened()
    world.channels = [channel]
    rows = [channel.row(1000, 1000)]
    good = world.authorized(rows)
    someone = world.authorized(rows, LocalAuthorizerSigner(new_private_key()))
    for signature in (someone, high_s(good), v_bit(good), compact(good)):
        assert world.reverts("claimWithSignature", rows, signature, sender=OTHER).endswith(
            "invalid receiver authorizer signature"
        )
    world.send("claimWithSignature", rows, good, sender=OTHER)  # a relay may send it
    assert world.record(channel).total_claimed == 1000


def test_claim_with_signature_refuses_rows_of_another_receiver_authorizer(world):
    mine, theirs = world.opened(), world.opened(receiver_authorizer=OTHER)
    world.channels = [mine, theirs]
    rows = [mine.row(1000, 1000), theirs.row(1000, 1000)]
    assert world.reverts("claimWithSignature", rows, world.authorized(rows), sender=OTHER).endswith(
        "claims name different receiver authorizers"
    )


# -- x402BatchSettlement.settle ----------------------------------------------------------------


def test_settle_sweeps_exactly_the_claimed_and_unsettled_total_once(world):
    channel = world.opened()
    world.claim([channel.row(2000, 2000)])
    before = balance(world, PAY_TO)
    logs = world.logs(world.send("settle", PAY_TO, USDC_BASE_SEPOLIA, sender=OTHER))  # anyone may settle
    assert topics(logs) == [TRANSFER_TOPIC, EVENT_TOPICS["Settled"]]
    assert abi_decode(["uint128"], raw(logs[1]["data"])) == (2000,)
    assert balance(world, PAY_TO) - before == 2000
    assert world.logs(world.send("settle", PAY_TO, USDC_BASE_SEPOLIA)) == []  # nothing left: a no-op
    assert balance(world, PAY_TO) - before == 2000


# -- x402BatchSettlement.refund / refundWithSignature --------------------------------------------


def test_refund_is_the_receiver_sides_alone_and_never_zero(world):
    channel = world.opened()
    assert world.reverts("refund", channel.contract_config, 100, sender=channel.payer.address).endswith(
        "caller is not authorized"
    )
    assert world.reverts("refund", channel.contract_config, 0, sender=PAY_TO).endswith("zero amount")


def test_refund_is_capped_to_the_unclaimed_rest_and_advances_the_nonce_even_when_capped_to_nothing(world):
    channel = world.opened(3000)
    world.claim([channel.row(2000, 2000)])
    payer_before = balance(world, channel.payer.address)
    logs = world.logs(world.send("refund", channel.contract_config, 5000, sender=PAY_TO))
    assert topics(logs) == [EVENT_TOPICS["Refunded"], TRANSFER_TOPIC]
    assert abi_decode(["uint128"], raw(logs[0]["data"])) == (1000,)
    assert balance(world, channel.payer.address) - payer_before == 1000
    assert world.logs(world.send("refund", channel.contract_config, 5000, sender=PAY_TO)) == []
    record = world.record(channel)
    assert (record.balance, record.total_claimed, record.refund_nonce) == (2000, 2000, 2)


def test_refund_emptying_an_unclaimed_channel_closes_it(world):
    channel = world.opened(1000)
    logs = world.logs(world.send("refund", channel.contract_config, 1000, sender=PAY_TO))
    assert topics(logs) == [EVENT_TOPICS["Refunded"], EVENT_TOPICS["ChannelClosed"], TRANSFER_TOPIC]


def test_refund_shrinks_or_clears_a_pending_withdrawal(world):
    channel = world.opened(3000)
    world.send("initiateWithdraw", channel.contract_config, 2000, sender=channel.payer.address)
    world.send("refund", channel.contract_config, 500, sender=PAY_TO)
    assert world.record(channel).withdraw_amount == 1500
    world.send("refund", channel.contract_config, 1500, sender=PAY_TO)
    assert (world.record(channel).withdraw_amount, world.record(channel).withdraw_initiated_at) == (0, 0)


def test_refund_with_signature_needs_the_current_nonce_and_the_authorizers_canonical_signature(world):
    channel = world.opened()
    signature = raw(sign_refund(world.authorizer, channel.channel_id, 100, 0, DEV_NETWORK))
    stale = raw(sign_refund(world.authorizer, channel.channel_id, 100, 1, DEV_NETWORK))
    assert world.reverts("refundWithSignature", channel.contract_config, 100, 1, stale).endswith("invalid refund nonce")
    for form in (high_s, v_bit, compact):
        assert world.reverts("refundWithSignature", channel.contract_config, 100, 0, form(signature)).endswith(
            "invalid receiver authorizer signature"
        )
    world.send("refundWithSignature", channel.contract_config, 100, 0, signature, sender=OTHER)
    assert world.record(channel).refund_nonce == 1
    assert world.reverts("refundWithSignature", channel.contract_config, 100, 0, signature).endswith(
        "invalid refund nonce"
    )


# -- x402BatchSettlement.initiateWithdraw / finalizeWithdraw --------------------------------------


def test_initiate_withdraw_is_the_payers_side_alone(world):
    channel = world.opened()
    assert world.reverts("initiateWithdraw", channel.contract_config, 100, sender=PAY_TO).endswith(
        "caller is not authorized"
    )


def test_initiate_withdraw_refuses_zero_more_than_the_unclaimed_rest_and_a_second_one(world):
    channel = world.opened(3000)
    world.claim([channel.row(2000, 2000)])
    payer = channel.payer.address
    assert world.reverts("initiateWithdraw", channel.contract_config, 0, sender=payer).endswith("zero amount")
    assert world.reverts("initiateWithdraw", channel.contract_config, 1001, sender=payer).endswith(
        "withdrawal exceeds unclaimed balance"
    )
    logs = world.logs(world.send("initiateWithdraw", channel.contract_config, 1000, sender=payer))
    assert topics(logs) == [EVENT_TOPICS["WithdrawInitiated"]]
    assert abi_decode(["uint128", "uint40"], raw(logs[0]["data"])) == (1000, world.now + WITHDRAW_DELAY)
    assert world.reverts("initiateWithdraw", channel.contract_config, 1, sender=payer).endswith(
        "withdrawal already pending"
    )


def test_finalize_withdraw_waits_out_the_delay_to_the_second(world):
    channel = world.opened(3000)
    payer = channel.payer.address
    assert world.reverts("finalizeWithdraw", channel.contract_config, sender=payer).endswith("no pending withdrawal")
    world.send("initiateWithdraw", channel.contract_config, 1000, sender=payer)
    world.now += WITHDRAW_DELAY - 1
    assert world.reverts("finalizeWithdraw", channel.contract_config, sender=payer).endswith(
        "withdraw delay has not elapsed"
    )
    assert world.reverts("finalizeWithdraw", channel.contract_config, sender=PAY_TO).endswith(
        "caller is not authorized"
    )
    world.now += 1
    logs = world.logs(world.send("finalizeWithdraw", channel.contract_config, sender=payer))
    assert topics(logs) == [EVENT_TOPICS["WithdrawFinalized"], TRANSFER_TOPIC]
    assert world.record(channel).balance == 2000


def test_a_claim_before_the_finalize_takes_priority_over_the_withdrawal(world):
    """The binding's race: a claim that lands inside the delay is paid; the withdrawal is capped."""
    channel = world.opened(3000)
    payer = channel.payer.address
    world.send("initiateWithdraw", channel.contract_config, 3000, sender=payer)
    world.claim([channel.row(2500, 2500)])
    world.now += WITHDRAW_DELAY
    logs = world.logs(world.send("finalizeWithdraw", channel.contract_config, sender=payer))
    assert abi_decode(["uint128"], raw(logs[0]["data"])) == (500,)
    record = world.record(channel)
    assert (record.balance, record.total_claimed) == (2500, 2500)


def test_a_claim_after_the_finalize_exceeds_the_balance(world):
    """...and a claim that comes after the withdrawal finalized finds the money gone."""
    channel = world.opened(3000)
    payer = channel.payer.address
    world.send("initiateWithdraw", channel.contract_config, 3000, sender=payer)
    world.now += WITHDRAW_DELAY
    logs = world.logs(world.send("finalizeWithdraw", channel.contract_config, sender=payer))
    assert topics(logs) == [EVENT_TOPICS["WithdrawFinalized"], EVENT_TOPICS["ChannelClosed"], TRANSFER_TOPIC]
    assert world.reverts("claim", [channel.row(2500, 2500)], sender=PAY_TO).endswith("claim exceeds channel balance")


def test_a_payers_own_transaction_in_its_high_s_form_is_refused(world):
    """A node takes a transaction's own signature in its low-s form only (EIP-2): the high-s twin of a
    payer's ``initiateWithdraw`` is refused and nothing happens; the canonical one runs."""
    import rlp

    channel = world.opened(3000)
    node = ChainRpc(world.signer)
    raw_tx = raw(signed_transaction(channel.key, "initiateWithdraw", channel.contract_config, 1000))
    fields = rlp.decode(raw_tx[1:])  # type 2: [..., yParity, r, s]
    y_parity, s = int.from_bytes(fields[-3], "big"), int.from_bytes(fields[-1], "big")
    twin = [*fields[:-3], (1 - y_parity).to_bytes(1, "big").lstrip(b"\x00"), fields[-2], (N - s).to_bytes(32, "big")]
    twin_raw = raw_tx[:1] + rlp.encode(twin)
    with pytest.raises(JsonRpcError, match="invalid transaction v, r, s values"):
        node.answer("eth_sendRawTransaction", ["0x" + twin_raw.hex()])
    assert world.record(channel).withdraw_initiated_at == 0
    node.answer("eth_sendRawTransaction", ["0x" + raw_tx.hex()])
    assert world.record(channel).withdraw_amount == 1000


def test_multicall_is_all_or_nothing(world):
    from eth_abi import encode as abi_encode

    channel = world.opened()
    table = {name: sel for sel, (name, _, _) in world.contract.functions.items()}
    inputs = {name: types for _, (name, types, _) in world.contract.functions.items()}
    good = table["settle"] + abi_encode(inputs["settle"], [PAY_TO, USDC_BASE_SEPOLIA])
    refund = table["refund"] + abi_encode(inputs["refund"], [channel.contract_config, 0])  # ZeroRefund
    assert world.reverts("multicall", [good, refund], sender=PAY_TO).endswith("zero amount")


# -- x402's Permit2 proxies over Permit2 ----------------------------------------------------------


@pytest.fixture(scope="module")
def upto() -> dict[str, Any]:
    kind = {
        "x402Version": 2,
        "scheme": "upto",
        "network": DEV_NETWORK,
        "extra": {"facilitatorAddress": FACILITATOR_ADDRESS},
    }
    return upto_offer(kind, 5000)


def permit2_chain() -> tuple[LedgerEvmSigner, Permit2Contracts]:
    ledger = DevLedger(":memory:")
    contracts = Permit2Contracts(ledger)
    return LedgerEvmSigner(ledger, contracts=[contracts]), contracts


def upto_args(signed: dict[str, Any], amount: int, signature: bytes | None = None) -> tuple[Any, ...]:
    auth = signed["payload"]["permit2Authorization"]
    permit = ((auth["permitted"]["token"], int(auth["permitted"]["amount"])), int(auth["nonce"]), int(auth["deadline"]))
    witness = (auth["witness"]["to"], auth["witness"]["facilitator"], int(auth["witness"]["validAfter"]))
    signature = raw(signed["payload"]["signature"]) if signature is None else signature
    return permit, amount, auth["from"], witness, signature


def upto_reverts(contracts: Permit2Contracts, args: tuple[Any, ...], sender: str = FACILITATOR_ADDRESS) -> str:
    with pytest.raises(LedgerRevert) as caught:
        contracts.transact(UPTO_PROXY, "settle", args, sender)
    return caught.value.reason


@pytest.mark.parametrize(("form", "accepted"), [(high_s, True), (compact, True), (v_bit, False)])
def test_permit2_takes_the_signature_forms_signature_verification_takes(upto, form, accepted):
    (signer, contracts), key = permit2_chain(), new_private_key()
    signed = sign_upto(upto, key)
    args = upto_args(signed, 10, form(raw(signed["payload"]["signature"])))
    if accepted:
        contracts.transact(UPTO_PROXY, "settle", args, FACILITATOR_ADDRESS)
        assert signer.get_balance(Account.from_key(key).address, USDC_BASE_SEPOLIA) == DEFAULT_INITIAL_BALANCE - 10
    else:
        assert upto_reverts(contracts, args) == "InvalidSignature()"


def test_permit2_refuses_a_signature_of_any_other_length(upto):
    (_, contracts), key = permit2_chain(), new_private_key()
    signed = sign_upto(upto, key)
    for length in (0, 63, 66):
        assert upto_reverts(contracts, upto_args(signed, 10, b"\x01" * length)) == "InvalidSignatureLength()"


def test_permit2_checks_the_nonce_before_the_signature(upto):
    (_, contracts), key = permit2_chain(), new_private_key()
    signed = sign_upto(upto, key)
    contracts.transact(UPTO_PROXY, "settle", upto_args(signed, 10), FACILITATOR_ADDRESS)
    assert upto_reverts(contracts, upto_args(signed, 10, b"\x01" * 65)) == "InvalidNonce()"


def test_permit2_refuses_a_past_deadline(upto):
    (_, contracts), key = permit2_chain(), new_private_key()
    signed = sign_upto(upto, key)
    expired = resign_permit2(signed, key, deadline=int(time.time()) - 1)
    assert upto_reverts(contracts, upto_args(expired, 10)).startswith("SignatureExpired(")
    alive = resign_permit2(signed, key, deadline=int(time.time()) + 5)  # `block.timestamp > deadline` reverts
    contracts.transact(UPTO_PROXY, "settle", upto_args(alive, 10), FACILITATOR_ADDRESS)


def test_upto_proxy_checks_the_ceiling_and_the_witness_facilitator_first(upto):
    (_, contracts), key = permit2_chain(), new_private_key()
    signed = sign_upto(upto, key)
    bad = upto_args(signed, 5001, b"")  # refused before Permit2 reads the signature
    assert upto_reverts(contracts, bad) == "AmountExceedsPermitted()"
    assert upto_reverts(contracts, upto_args(signed, 10, b""), sender=OTHER) == "UnauthorizedFacilitator()"
    assert upto_reverts(contracts, upto_args(signed, 0)) == "InvalidAmount()"
    early = resign_permit2(signed, key, validAfter=int(time.time()) + 600)
    assert upto_reverts(contracts, upto_args(early, 10)) == "PaymentTooEarly()"


def test_proxies_refuse_a_zero_owner_or_destination_before_permit2(upto):
    (_, contracts), key = permit2_chain(), new_private_key()
    permit, amount, owner, (to, facilitator, valid_after), signature = upto_args(sign_upto(upto, key), 10)
    no_owner = (permit, amount, ZERO, (to, facilitator, valid_after), signature)
    no_destination = (permit, amount, owner, (ZERO, facilitator, valid_after), signature)
    assert upto_reverts(contracts, no_owner) == "InvalidOwner()"
    assert upto_reverts(contracts, no_destination) == "InvalidDestination()"


def test_upto_proxy_settle_with_permit_needs_the_2612_value_to_be_the_permitted_amount(upto):
    (_, contracts), key = permit2_chain(), new_private_key()
    signed = sign_upto(upto, key)
    permit2612 = (4999, int(time.time()) + 600, b"\x00" * 32, b"\x00" * 32, 27)
    with pytest.raises(LedgerRevert, match=r"Permit2612AmountMismatch\(\)"):
        contracts.transact(UPTO_PROXY, "settleWithPermit", (permit2612, *upto_args(signed, 10)), FACILITATOR_ADDRESS)
    permit2612 = (5000, *permit2612[1:])
    tx = contracts.transact(UPTO_PROXY, "settleWithPermit", (permit2612, *upto_args(signed, 10)), FACILITATOR_ADDRESS)
    found = contracts.receipt(tx)
    assert found is not None and topics(found[1]) == [TRANSFER_TOPIC, SETTLED_WITH_PERMIT_TOPIC]


def test_upto_settle_emits_the_tokens_transfer_then_settled(upto):
    (_, contracts), key = permit2_chain(), new_private_key()
    tx = contracts.transact(UPTO_PROXY, "settle", upto_args(sign_upto(upto, key), 10), FACILITATOR_ADDRESS)
    found = contracts.receipt(tx)
    assert found is not None and topics(found[1]) == [TRANSFER_TOPIC, SETTLED_TOPIC]


def test_invalidate_unordered_nonces_spends_the_senders_bits_and_says_so(upto):
    (_, contracts), key = permit2_chain(), new_private_key()
    owner = Account.from_key(key).address
    signed = sign_upto(upto, key)
    nonce = int(signed["payload"]["permit2Authorization"]["nonce"])
    tx = contracts.transact(PERMIT2, "invalidateUnorderedNonces", (nonce >> 8, 1 << (nonce & 0xFF)), owner)
    found = contracts.receipt(tx)
    assert found is not None and topics(found[1]) == [NONCE_INVALIDATION_TOPIC]
    assert upto_reverts(contracts, upto_args(signed, 10)) == "InvalidNonce()"


# -- FiatToken's EIP-3009 functions ----------------------------------------------------------------


def fiat_transfer(key: str, **changes: Any) -> tuple[Transfer, bytes]:
    now = int(time.time())
    fields: dict[str, Any] = {
        "to": PAY_TO,
        "value": 1000,
        "nonce": "0x" + os.urandom(32).hex(),
        "valid_after": now - 60,
        "valid_before": now + 600,
    }
    fields.update(changes)
    signed = sign_transfer_authorization(key, asset=USDC_BASE_SEPOLIA, **fields)
    transfer = Transfer.create(
        network=DEV_NETWORK,
        asset=USDC_BASE_SEPOLIA,
        from_address=signed["from"],
        to_address=signed["to"],
        value=int(signed["value"]),
        valid_after=int(signed["validAfter"]),
        valid_before=int(signed["validBefore"]),
        nonce=signed["nonce"],
    )
    return transfer, raw(signed["signature"])


def fiat_chain(tmp_path: Any) -> LedgerEvmSigner:
    return LedgerEvmSigner(DevLedger(str(tmp_path / "token.db")))


def fiat_reverts(signer: LedgerEvmSigner, transfer: Transfer, signature: bytes) -> str:
    before = signer.ledger.balance_of(DEV_NETWORK, USDC_BASE_SEPOLIA, transfer.from_address)
    with pytest.raises(LedgerRevert) as caught:
        signer.submit_transfer(transfer, signature)
    assert signer.ledger.balance_of(DEV_NETWORK, USDC_BASE_SEPOLIA, transfer.from_address) == before
    assert not signer.ledger.authorization_state(DEV_NETWORK, USDC_BASE_SEPOLIA, transfer.from_address, transfer.nonce)
    return caught.value.reason


@pytest.mark.parametrize(
    ("form", "reason"),
    [
        (high_s, "ECRecover: invalid signature 's' value"),
        (v_bit, "ECRecover: invalid signature 'v' value"),
        (compact, "ECRecover: invalid signature length"),
    ],
)
def test_transfer_with_authorization_takes_only_the_canonical_signature(tmp_path, form, reason):
    signer, key = fiat_chain(tmp_path), new_private_key()
    transfer, signature = fiat_transfer(key)
    assert fiat_reverts(signer, transfer, form(signature)) == reason


def transfer_args(transfer: Transfer, signature: bytes) -> tuple[Any, ...]:
    t = transfer
    return (t.from_address, t.to_address, t.value, t.valid_after, t.valid_before, raw(t.nonce), signature)


@pytest.mark.parametrize("form", [high_s, v_bit])
def test_an_eth_call_of_transfer_with_authorization_refuses_the_same_forms(tmp_path, form):
    """What the x402 package's verify simulates: the same rule, so a non-canonical EIP-3009 payment is
    refused at verify, before any work."""
    signer, key = fiat_chain(tmp_path), new_private_key()
    transfer, signature = fiat_transfer(key)
    with pytest.raises(LedgerRevert, match="ECRecover"):
        signer.read_contract(
            USDC_BASE_SEPOLIA, [], "transferWithAuthorization", *transfer_args(transfer, form(signature))
        )
    signer.read_contract(USDC_BASE_SEPOLIA, [], "transferWithAuthorization", *transfer_args(transfer, signature))


def test_transfer_with_authorization_binds_every_field_to_the_signer(tmp_path):
    signer, key = fiat_chain(tmp_path), new_private_key()
    transfer, signature = fiat_transfer(key)
    assert (
        fiat_reverts(signer, dataclasses.replace(transfer, value=1001), signature) == "FiatTokenV2: invalid signature"
    )
    other, _ = fiat_transfer(new_private_key())
    assert fiat_reverts(signer, dataclasses.replace(other, nonce=transfer.nonce), signature) == (
        "FiatTokenV2: invalid signature"
    )


def test_transfer_with_authorization_checks_its_window_before_its_signature(tmp_path):
    signer, key = fiat_chain(tmp_path), new_private_key()
    now = int(time.time())
    early, _ = fiat_transfer(key, valid_after=now + 600)
    late, _ = fiat_transfer(key, valid_before=now)  # `now < validBefore` is required
    assert fiat_reverts(signer, early, b"\x01" * 65) == "FiatTokenV2: authorization is not yet valid"
    assert fiat_reverts(signer, late, b"\x01" * 65) == "FiatTokenV2: authorization is expired"


def test_transfer_with_authorization_spends_its_nonce_once_and_emits_used_then_transfer(tmp_path):
    signer, key = fiat_chain(tmp_path), new_private_key()
    transfer, signature = fiat_transfer(key)
    tx = signer.submit_transfer(transfer, signature)
    assert topics(signer.wait_for_transaction_receipt(tx).logs) == [AUTHORIZATION_USED_TOPIC, TRANSFER_TOPIC]
    assert fiat_reverts_used(signer, transfer, b"\x01" * 65) == "FiatTokenV2: authorization is used or canceled"


def fiat_reverts_used(signer: LedgerEvmSigner, transfer: Transfer, signature: bytes) -> str:
    with pytest.raises(LedgerRevert) as caught:
        signer.submit_transfer(transfer, signature)
    return caught.value.reason


def test_transfer_with_authorization_refuses_a_short_balance_and_the_zero_address(tmp_path):
    signer, key = fiat_chain(tmp_path), new_private_key()
    rich, signature = fiat_transfer(key, value=DEFAULT_INITIAL_BALANCE + 1)
    assert fiat_reverts(signer, rich, signature) == "ERC20: transfer amount exceeds balance"
    nowhere, signature = fiat_transfer(key, to=ZERO)
    assert fiat_reverts(signer, nowhere, signature) == "ERC20: transfer to the zero address"


def test_cancel_authorization_takes_only_the_canonical_signature_and_spends_the_nonce(tmp_path):
    signer, key = fiat_chain(tmp_path), new_private_key()
    nonce = "0x" + os.urandom(32).hex()
    signed = sign_cancel_authorization(key, asset=USDC_BASE_SEPOLIA, nonce=nonce)
    signature, authorizer = raw(signed["signature"]), signed["authorizer"]
    for form, reason in ((high_s, "'s' value"), (v_bit, "'v' value"), (compact, "length")):
        with pytest.raises(LedgerRevert, match=f"ECRecover: invalid signature {reason}"):
            signer.cancel_authorization(USDC_BASE_SEPOLIA, authorizer, nonce, form(signature))
    assert not signer.ledger.authorization_state(DEV_NETWORK, USDC_BASE_SEPOLIA, authorizer, nonce)
    tx = signer.cancel_authorization(USDC_BASE_SEPOLIA, authorizer, nonce, signature)
    receipt = ChainRpc(signer).answer("eth_getTransactionReceipt", [tx])
    assert topics(receipt["logs"]) == [AUTHORIZATION_CANCELED_TOPIC]
    with pytest.raises(LedgerRevert, match="used or canceled"):
        signer.cancel_authorization(USDC_BASE_SEPOLIA, authorizer, nonce, signature)
