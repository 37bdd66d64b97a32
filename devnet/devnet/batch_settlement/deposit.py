"""``deposit``: a channel funded (opened by its first deposit) through one of the contract's two
deposit collectors, ``ERC3009DepositCollector`` (``receiveWithAuthorization``) and
``Permit2DepositCollector`` (Permit2's ``permitWitnessTransferFrom``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_utils import keccak, to_checksum_address
from x402.mechanisms.evm.batch_settlement.constants import (
    BATCH_PERMIT2_WITNESS_TYPES,
    ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
    MAX_WITHDRAW_DELAY,
    MIN_WITHDRAW_DELAY,
    PERMIT2_DEPOSIT_COLLECTOR_ADDRESS,
    RECEIVE_AUTHORIZATION_TYPES,
)

from ..chain import REVERT_INVALID_SIGNATURE, TRANSFER_TOPIC, _address_topic, recover_fiattoken
from ..ledger import REVERT_EXPIRED, REVERT_NOT_YET_VALID, LedgerRevert
from ..permit2 import PermitWitnessTransfer
from . import signatures, state
from .abi import (
    CONFIG_TYPE,
    EVENT_TOPICS,
    PREFIX,
    REVERT_CONFIG,
    REVERT_PERMIT2_UNAVAILABLE,
    REVERT_UNKNOWN_COLLECTOR,
    REVERT_WITHDRAW_DELAY,
    REVERT_ZERO_AMOUNT,
    UINT128_MAX,
    ZERO_ADDRESS,
    Config,
    channel_topic,
    config_tuple,
)
from .state import ChannelRecord, Execution

if TYPE_CHECKING:
    from .contract import BatchSettlementContract


def deposit(
    c: BatchSettlementContract, ex: Execution, raw_config: Any, amount: int, collector: str, data: bytes
) -> None:
    """In the contract's order: the configuration (``InvalidChannel``), the delay's range, a non-zero
    amount, a known collector, the balance's uint128 bound, then the collector's pull."""
    config = config_tuple(raw_config)
    amount = int(amount)
    if ZERO_ADDRESS in (config[0], config[2], config[3]) or config[4] not in c.tokens:
        raise LedgerRevert(REVERT_CONFIG)
    if not MIN_WITHDRAW_DELAY <= config[5] <= MAX_WITHDRAW_DELAY:
        raise LedgerRevert(REVERT_WITHDRAW_DELAY)
    if amount == 0:
        raise LedgerRevert(REVERT_ZERO_AMOUNT)
    collector = to_checksum_address(collector)
    if collector not in (ERC3009_DEPOSIT_COLLECTOR_ADDRESS, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS):
        raise LedgerRevert(REVERT_UNKNOWN_COLLECTOR)
    channel_id = c.channel_id(config)
    record = state.load_channel(ex.db, channel_id) or ChannelRecord(channel_id, config)
    if record.balance + amount > UINT128_MAX:
        raise LedgerRevert(PREFIX + "balance overflow")
    if collector == ERC3009_DEPOSIT_COLLECTOR_ADDRESS:
        collect_erc3009(c, ex, config, channel_id, amount, bytes(data))
    else:
        collect_permit2(c, ex, config, channel_id, amount, bytes(data))
    topic = channel_topic(channel_id)
    if record.balance == 0 and record.total_claimed == 0:
        ex.emit(c.address, [EVENT_TOPICS["ChannelCreated"], topic], abi_encode([CONFIG_TYPE], [config]))
    record.balance += amount
    state.store_channel(ex.db, record)
    ex.emit(
        c.address,
        [EVENT_TOPICS["Deposited"], topic, _address_topic(ex.sender)],
        abi_encode(["uint128", "uint128"], [amount, record.balance]),
    )


def collect_erc3009(
    c: BatchSettlementContract, ex: Execution, config: Config, channel_id: str, amount: int, data: bytes
) -> None:
    """``ERC3009DepositCollector.collect``: ``receiveWithAuthorization`` from the payer to the
    collector (the token checks window, nonce, signature, balance), then on to this contract."""
    try:
        valid_after, valid_before, salt, signature = abi_decode(["uint256", "uint256", "uint256", "bytes"], data)
    except Exception:  # noqa: BLE001 -- collector data that does not decode reverts
        raise LedgerRevert("ERC3009DepositCollector: bad collector data") from None
    payer, token = config[0], config[4]
    nonce = keccak(abi_encode(["bytes32", "uint256"], [bytes.fromhex(channel_id[2:]), salt]))
    now = int(time.time())  # the token's clock, as for every EIP-3009 window on the dev chain
    if now <= valid_after:
        raise LedgerRevert(REVERT_NOT_YET_VALID)
    if now >= valid_before:
        raise LedgerRevert(REVERT_EXPIRED)
    c.ledger.spend_nonce(c.network, token, payer, nonce, ex.tx_hash)
    info = c.tokens[to_checksum_address(token)]
    domain = {"name": info.name, "version": info.version, "chainId": c.chain_id, "verifyingContract": token}
    message = {
        "from": payer,
        "to": ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
        "value": amount,
        "validAfter": valid_after,
        "validBefore": valid_before,
        "nonce": nonce,
    }
    digest = signatures.digest(domain, RECEIVE_AUTHORIZATION_TYPES, message)
    if not c.trust_signatures and recover_fiattoken(digest, bytes(signature)) != payer:
        raise LedgerRevert(REVERT_INVALID_SIGNATURE)
    c.transfer(ex, token, payer, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, amount, nonce=nonce)
    c.transfer(ex, token, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, c.address, amount)


def collect_permit2(
    c: BatchSettlementContract, ex: Execution, config: Config, channel_id: str, amount: int, data: bytes
) -> None:
    """``Permit2DepositCollector.collect``: Permit2's ``permitWitnessTransferFrom`` with the
    collector as spender and ``DepositWitness(channelId)`` as witness, straight into this contract.

    It is the chain's own Permit2 (``Permit2Contracts.permit_witness_transfer_from``) that checks
    the deadline, the payer's signature and the nonce, so a deposit spends a nonce of the same
    bitmap as x402's exact and upto proxies and the payer's ``invalidateUnorderedNonces``.

    An EIP-2612 permit segment changes nothing: on the dev chain every address has already
    granted Permit2 an unlimited allowance (``devnet.permit2``).
    """
    if c.permit2 is None:
        raise LedgerRevert(REVERT_PERMIT2_UNAVAILABLE)
    try:
        nonce, deadline, signature, _permit = abi_decode(["uint256", "uint256", "bytes", "bytes"], data)
    except Exception:  # noqa: BLE001 -- collector data that does not decode reverts
        raise LedgerRevert("Permit2DepositCollector: bad collector data") from None
    payer, token = config[0], config[4]
    permit = PermitWitnessTransfer(
        owner=payer,
        token=token,
        permitted=amount,
        nonce=int(nonce),
        deadline=int(deadline),
        spender=to_checksum_address(PERMIT2_DEPOSIT_COLLECTOR_ADDRESS),
        to=c.address,
        amount=amount,
        witness_types=BATCH_PERMIT2_WITNESS_TYPES,
        witness={"channelId": bytes.fromhex(channel_id[2:])},
        signature=bytes(signature),
    )
    c.permit2.permit_witness_transfer_from(ex.db, permit, ex.tx_hash)  # moves payer -> this contract
    ex.emit(token, [TRANSFER_TOPIC, _address_topic(payer), _address_topic(c.address)], amount.to_bytes(32, "big"))
