"""``BatchSettlementContract``: the contract's entry points (an ``eth_call``, a mined transaction,
``multicall``), the dispatch to its functions (one module per operation), the reads outside any
transaction, and the steps its functions share (a token move, a channel that must exist, one that
closes)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_utils import keccak, to_checksum_address
from x402.mechanisms.evm.batch_settlement.constants import (
    BATCH_SETTLEMENT_ADDRESS,
    ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
    PERMIT2_DEPOSIT_COLLECTOR_ADDRESS,
)

from ..chain import (
    AUTHORIZATION_USED_TOPIC,
    DEV_CHAIN_ID,
    DEV_NETWORK,
    FACILITATOR_ADDRESS,
    TRANSFER_TOPIC,
    FunctionTable,
    TokenInfo,
    _address_topic,
    default_tokens,
)
from ..ledger import DevLedger, LedgerRevert
from ..permit2 import Permit2Contracts
from . import claim, deposit, refund, settle, signatures, state, views, withdraw
from .abi import (
    BY_NAME,
    BY_SELECTOR,
    CONFIG_TYPE,
    EVENT_TOPICS,
    PREFIX,
    REVERT_CHANNEL_NOT_FOUND,
    REVERT_UNKNOWN_FUNCTION,
    Config,
    Function,
    bytes32_topic,
    channel_key,
    channel_topic,
)
from .state import ChannelRecord, Execution


class BatchSettlementContract:
    """``x402BatchSettlement`` at ``BATCH_SETTLEMENT_ADDRESS`` over the ledger.

    ``clock`` is the contract's block time (tests move it forward past a withdraw delay);
    EIP-3009 windows are the token's business and keep the ledger's real time. With
    ``trust_signatures`` (the facilitator's benchmark mode) no signature is recovered.
    ``permit2`` is the chain's Permit2 (``devnet.permit2``), whose nonces the Permit2 deposit
    collector spends; without it that collector reverts.
    """

    address: str = to_checksum_address(BATCH_SETTLEMENT_ADDRESS)

    def __init__(
        self,
        ledger: DevLedger,
        *,
        network: str = DEV_NETWORK,
        chain_id: int = DEV_CHAIN_ID,
        tokens: dict[str, TokenInfo] | None = None,
        trust_signatures: bool = False,
        relayer: str = FACILITATOR_ADDRESS,
        clock: Callable[[], float] = time.time,
        permit2: Permit2Contracts | None = None,
    ) -> None:
        self.addresses: frozenset[str] = frozenset({self.address})
        self.functions: FunctionTable = {sel: (fn.name, fn.inputs, fn.outputs) for sel, fn in BY_SELECTOR.items()}
        self.ledger = ledger
        self.network = network
        self.chain_id = chain_id
        self.tokens = {to_checksum_address(a): info for a, info in (tokens or default_tokens(network)).items()}
        self.trust_signatures = trust_signatures
        self.relayer = to_checksum_address(relayer)
        self.permit2 = permit2
        self.clock = clock
        self.time_offset = 0
        with self.ledger.contract_transaction() as db:
            state.create_tables(db)
        for token in self.tokens:
            for holder in (self.address, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS):
                self.ledger.open_account(self.network, token, holder)

    # -- entry points --------------------------------------------------------

    def now(self) -> int:
        return int(self.clock()) + self.time_offset

    def call(self, target: str, function_name: str, args: tuple[Any, ...], sender: str | None = None) -> Any:
        """``eth_call``: run the function against current state, then roll everything back."""
        fn = self._function(function_name)
        with self.ledger.contract_transaction(commit=False) as db:
            ex = Execution(db, self._sender(sender), self.now(), "0x" + "00" * 32)
            return self._run(ex, fn, args)

    def transact(self, target: str, function_name: str, args: tuple[Any, ...], sender: str | None = None) -> str:
        """A mined transaction: apply the function and its token moves atomically; return its hash."""
        fn = self._function(function_name)
        tx_hash = "0x" + keccak(b"a2a-gate dev batch settlement|" + uuid.uuid4().bytes).hex()
        return self._mine(fn, args, self._sender(sender), tx_hash)

    def allowance(self, owner: str, spender: str) -> int:
        return 0  # the contract takes deposits through collectors, never by an allowance of its own

    def _mine(self, fn: Function, args: tuple[Any, ...], sender: str, tx_hash: str) -> str:
        with self.ledger.contract_transaction() as db:
            ex = Execution(db, sender, self.now(), tx_hash)
            self._run(ex, fn, args)
            state.store_transaction(db, ex, fn.name)
        return tx_hash

    def _sender(self, sender: str | None) -> str:
        return to_checksum_address(sender) if sender else self.relayer

    def _function(self, name: str) -> Function:
        fn = BY_NAME.get(name)
        if fn is None:
            raise LedgerRevert(REVERT_UNKNOWN_FUNCTION)
        return fn

    def _decode(self, data: bytes) -> tuple[Function, tuple[Any, ...]]:
        fn = BY_SELECTOR.get(bytes(data[:4]))
        if fn is None:
            raise LedgerRevert(REVERT_UNKNOWN_FUNCTION)
        try:
            return fn, tuple(abi_decode(fn.inputs, bytes(data[4:])))
        except Exception:  # noqa: BLE001 -- calldata that does not decode reverts, as on chain
            raise LedgerRevert(PREFIX + f"bad calldata for {fn.name}") from None

    @staticmethod
    def _encode_result(fn: Function, value: Any) -> bytes:
        if not fn.outputs:
            return b""
        return abi_encode(fn.outputs, list(value) if len(fn.outputs) > 1 else [value])

    def _run(self, ex: Execution, fn: Function, args: tuple[Any, ...]) -> Any:
        handler = FUNCTIONS[fn.name]
        if len(args) != len(fn.inputs):
            raise LedgerRevert(PREFIX + f"{fn.name} takes {len(fn.inputs)} arguments")
        return handler(self, ex, *args)

    def multicall(self, ex: Execution, calls: list[bytes]) -> list[bytes]:
        """``multicall``: every call in order, in one transaction: one revert reverts them all."""
        results = []
        for data in calls:
            fn, args = self._decode(bytes(data))
            if fn.name == "multicall":
                raise LedgerRevert(PREFIX + "nested multicall")
            results.append(self._encode_result(fn, self._run(ex, fn, args)))
        return results

    # -- reads (outside any transaction) ---------------------------------------

    def channel(self, channel_id: str | bytes) -> ChannelRecord | None:
        """A channel's state, or None if it was never funded."""
        with self.ledger.contract_transaction(commit=False) as db:
            return state.load_channel(db, channel_key(channel_id))

    def receiver_totals(self, receiver: str, token: str) -> tuple[int, int]:
        """``receivers(receiver, token)``: (totalClaimed, totalSettled)."""
        with self.ledger.contract_transaction(commit=False) as db:
            return state.load_receiver(db, to_checksum_address(receiver), to_checksum_address(token))

    def snapshot(self) -> dict[str, Any]:
        """Every channel and every receiver's totals, amounts as decimal strings."""
        with self.ledger.contract_transaction(commit=False) as db:
            ids = [row[0] for row in db.execute("SELECT channel_id FROM bs_channels ORDER BY rowid").fetchall()]
            records = [state.load_channel(db, channel_id) for channel_id in ids]
            receivers = db.execute("SELECT receiver, token, total_claimed, total_settled FROM bs_receivers").fetchall()
        return {
            "contract": self.address,
            "now": self.now(),
            "channels": [
                {
                    "channelId": r.channel_id,
                    "payer": r.payer,
                    "payerAuthorizer": r.payer_authorizer,
                    "receiver": r.receiver,
                    "receiverAuthorizer": r.receiver_authorizer,
                    "token": r.token,
                    "withdrawDelay": r.withdraw_delay,
                    "balance": str(r.balance),
                    "totalClaimed": str(r.total_claimed),
                    "refundNonce": str(r.refund_nonce),
                    "withdrawAmount": str(r.withdraw_amount),
                    "withdrawRequestedAt": r.withdraw_initiated_at,
                }
                for r in records
                if r is not None
            ],
            "receivers": [
                {"receiver": row[0], "token": row[1], "totalClaimed": row[2], "totalSettled": row[3]}
                for row in receivers
            ],
        }

    def receipt(self, tx_hash: str) -> tuple[str, list[dict[str, Any]]] | None:
        """``(to, logs)`` of a transaction this contract mined, or None."""
        tx_hash = tx_hash.lower()
        with self.ledger.contract_transaction(commit=False) as db:
            if db.execute("SELECT 1 FROM bs_transactions WHERE tx_hash = ?", [tx_hash]).fetchone() is None:
                return None
            return self.address, state.log_rows(db, "tx_hash = ?", [tx_hash])

    def logs(self) -> list[dict[str, Any]]:
        """Everything this contract's transactions emitted (its own events and the token's
        ``Transfer`` / ``AuthorizationUsed`` logs of its deposits), oldest first."""
        with self.ledger.contract_transaction(commit=False) as db:
            return state.log_rows(db, "1 = 1", [])

    # -- what the functions share ------------------------------------------------

    def channel_id(self, config: Config) -> str:
        return signatures.channel_id(config, self.chain_id)

    def existing(self, ex: Execution, config: Config) -> ChannelRecord:
        """The channel ``config`` names, which must have been funded."""
        record = state.load_channel(ex.db, self.channel_id(config))
        if record is None:
            raise LedgerRevert(REVERT_CHANNEL_NOT_FOUND)
        return record

    def signed_by(self, digest: bytes, signature: bytes, address: str) -> bool:
        return signatures.signed_by(digest, signature, address, trust_signatures=self.trust_signatures)

    def transfer(
        self, ex: Execution, token: str, source: str, target: str, amount: int, *, nonce: bytes | None = None
    ) -> None:
        """A token move in this transaction, with the token's logs (``AuthorizationUsed`` for an
        EIP-3009 ``nonce``, then ``Transfer``)."""
        self.ledger.move(self.network, token, source, target, amount)
        if nonce is not None:
            ex.emit(token, [AUTHORIZATION_USED_TOPIC, _address_topic(source), bytes32_topic(nonce)])
        ex.emit(token, [TRANSFER_TOPIC, _address_topic(source), _address_topic(target)], amount.to_bytes(32, "big"))

    def maybe_closed(self, ex: Execution, record: ChannelRecord) -> None:
        """``ChannelClosed`` once nothing is left in the channel and nothing was ever claimed from it."""
        if record.balance == 0 and record.total_claimed == 0:
            topic = channel_topic(record.channel_id)
            ex.emit(self.address, [EVENT_TOPICS["ChannelClosed"], topic], abi_encode([CONFIG_TYPE], [record.config]))


#: Every function of the ABI, by name: ``handler(contract, execution, *arguments)``.
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "deposit": deposit.deposit,
    "claim": claim.claim,
    "claimWithSignature": claim.claim_with_signature,
    "settle": settle.settle,
    "refund": refund.refund,
    "refundWithSignature": refund.refund_with_signature,
    "initiateWithdraw": withdraw.initiate_withdraw,
    "finalizeWithdraw": withdraw.finalize_withdraw,
    "multicall": BatchSettlementContract.multicall,
    "channels": views.channels,
    "pendingWithdrawals": views.pending_withdrawals,
    "refundNonce": views.refund_nonce,
    "receivers": views.receivers,
    "getChannelId": views.get_channel_id,
    "getVoucherDigest": views.get_voucher_digest,
    "getRefundDigest": views.get_refund_digest,
    "getClaimBatchDigest": views.get_claim_batch_digest,
}
