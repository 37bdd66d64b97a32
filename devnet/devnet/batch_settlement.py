"""The ``x402BatchSettlement`` payment-channel contract, simulated over the dev ledger.

The x402 package's batch-settlement facilitator (``x402.mechanisms.evm.batch_settlement``)
drives the contract through a ``FacilitatorEvmSigner``: ``read_contract`` to simulate
(``deposit``, ``claimWithSignature``, ``settle``, ``refundWithSignature``, ``multicall``) and
to read (``channels``, ``pendingWithdrawals``, ``refundNonce``, ``receivers``, through
Multicall3), ``write_contract`` to send. It is one of ``LedgerEvmSigner``'s simulated contracts
(``devnet.chain.SimulatedContracts``): the signer routes every call to its address here, and
``ChainRpc`` its ``eth_call``, ``eth_getLogs``, ``eth_getTransactionReceipt`` and
``eth_sendRawTransaction`` (a payer's own ``initiateWithdraw`` / ``finalizeWithdraw``,
``msg.sender`` recovered from the signed transaction).

What the contract does follows the binding (``specs/schemes/batch-settlement/
scheme_batch_settlement_evm.md``) and the package's ABI: a channel is the EIP-712 hash of its
``ChannelConfig``; ``balance`` is what was deposited minus refunds and withdrawals,
``totalClaimed`` only grows, the receiver's claimed-but-unsettled total is swept by ``settle``;
``refundNonce`` advances on every cooperative refund before the amount is capped. State lives
in the ledger's SQLite file (tables ``bs_*``), and every transaction is one SQLite transaction
with the token moves it makes, so a crash never leaves half a deposit. An ``eth_call`` runs the
same code and rolls back.

Only ``Settled`` is in the package's ABI; the other events are the contract's own declarations
(``EVENT_SIGNATURES``), emitted in its order. docs/development-chain.md lists every rule modelled
here beside the contract's, and where this simulation is deliberately simpler.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_account.messages import encode_typed_data
from eth_utils import keccak, to_checksum_address
from x402.mechanisms.evm.batch_settlement.abi import BATCH_SETTLEMENT_ABI
from x402.mechanisms.evm.batch_settlement.constants import (
    BATCH_PERMIT2_WITNESS_TYPES,
    BATCH_SETTLEMENT_ADDRESS,
    CLAIM_BATCH_TYPES,
    ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
    MAX_WITHDRAW_DELAY,
    MIN_WITHDRAW_DELAY,
    PERMIT2_DEPOSIT_COLLECTOR_ADDRESS,
    RECEIVE_AUTHORIZATION_TYPES,
    REFUND_TYPES,
    VOUCHER_TYPES,
)
from x402.mechanisms.evm.batch_settlement.types import ChannelConfig
from x402.mechanisms.evm.batch_settlement.utils import compute_channel_id, get_batch_settlement_eip712_domain

from .chain import (
    AUTHORIZATION_USED_TOPIC,
    DEV_CHAIN_ID,
    DEV_NETWORK,
    FACILITATOR_ADDRESS,
    REVERT_INVALID_SIGNATURE,
    TRANSFER_TOPIC,
    FunctionTable,
    TokenInfo,
    _address_topic,
    _log,
    default_tokens,
    recover_ecdsa,
    recover_fiattoken,
)
from .ledger import REVERT_EXPIRED, REVERT_NOT_YET_VALID, DevLedger, LedgerRevert
from .permit2 import Permit2Contracts, PermitWitnessTransfer

if TYPE_CHECKING:
    import sqlite_utils

__all__ = [
    "BATCH_SETTLEMENT_ADDRESS",
    "EVENT_SIGNATURES",
    "EVENT_TOPICS",
    "BatchSettlementContract",
    "ChannelRecord",
]

ZERO_ADDRESS = "0x" + "00" * 20
_CONFIG_TYPE = "(address,address,address,address,address,uint40,bytes32)"

#: The events this simulation emits, ``name -> canonical signature``.
EVENT_SIGNATURES = {
    "ChannelCreated": f"ChannelCreated(bytes32,{_CONFIG_TYPE})",
    "Deposited": "Deposited(bytes32,address,uint128,uint128)",
    "Claimed": "Claimed(bytes32,address,uint128,uint128)",
    "Settled": "Settled(address,address,address,uint128)",
    "Refunded": "Refunded(bytes32,address,uint128)",
    "WithdrawInitiated": "WithdrawInitiated(bytes32,uint128,uint40)",
    "WithdrawFinalized": "WithdrawFinalized(bytes32,address,uint128)",
    "ChannelClosed": f"ChannelClosed(bytes32,{_CONFIG_TYPE})",
}
EVENT_TOPICS = {name: "0x" + keccak(text=sig).hex() for name, sig in EVENT_SIGNATURES.items()}

_PREFIX = "x402BatchSettlement: "
REVERT_ZERO_AMOUNT = _PREFIX + "zero amount"
REVERT_CONFIG = _PREFIX + "invalid channel config"
REVERT_WITHDRAW_DELAY = _PREFIX + "withdraw delay out of range"
REVERT_UNKNOWN_COLLECTOR = _PREFIX + "unknown deposit collector"
REVERT_PERMIT2_UNAVAILABLE = "Permit2DepositCollector: Permit2 is not deployed on the dev chain"
REVERT_CHANNEL_NOT_FOUND = _PREFIX + "channel not found"
REVERT_EMPTY_CLAIMS = _PREFIX + "no claims"
REVERT_AUTHORIZER_MISMATCH = _PREFIX + "claims name different receiver authorizers"
REVERT_AUTHORIZER_SIGNATURE = _PREFIX + "invalid receiver authorizer signature"
REVERT_VOUCHER_SIGNATURE = _PREFIX + "invalid voucher signature"
REVERT_CLAIM_EXCEEDS_VOUCHER = _PREFIX + "claim exceeds voucher maxClaimableAmount"
REVERT_CLAIM_EXCEEDS_BALANCE = _PREFIX + "claim exceeds channel balance"
REVERT_UNAUTHORIZED = _PREFIX + "caller is not authorized"
REVERT_REFUND_NONCE = _PREFIX + "invalid refund nonce"
REVERT_WITHDRAW_EXCEEDS = _PREFIX + "withdrawal exceeds unclaimed balance"
REVERT_WITHDRAW_PENDING = _PREFIX + "withdrawal already pending"
REVERT_NO_WITHDRAWAL = _PREFIX + "no pending withdrawal"
REVERT_WITHDRAW_EARLY = _PREFIX + "withdraw delay has not elapsed"
REVERT_UNKNOWN_FUNCTION = _PREFIX + "unknown function"

UINT128_MAX = 2**128 - 1


def _canonical(item: dict[str, Any]) -> str:
    kind = item["type"]
    if not kind.startswith("tuple"):
        return kind
    return "(" + ",".join(_canonical(c) for c in item["components"]) + ")" + kind[len("tuple") :]


@dataclass(frozen=True)
class _Function:
    name: str
    inputs: list[str]
    outputs: list[str]
    view: bool


def _function_table() -> tuple[dict[bytes, _Function], dict[str, _Function]]:
    by_selector: dict[bytes, _Function] = {}
    by_name: dict[str, _Function] = {}
    for entry in BATCH_SETTLEMENT_ABI:
        if entry["type"] != "function":
            continue
        fn = _Function(
            name=entry["name"],
            inputs=[_canonical(i) for i in entry["inputs"]],
            outputs=[_canonical(o) for o in entry["outputs"]],
            view=entry["stateMutability"] == "view",
        )
        by_selector[keccak(text=f"{fn.name}({','.join(fn.inputs)})")[:4]] = fn
        by_name[fn.name] = fn
    return by_selector, by_name


_BY_SELECTOR, _BY_NAME = _function_table()


@dataclass
class ChannelRecord:
    """One channel's stored state (amounts are uint128, kept as Python ints)."""

    channel_id: str
    config: tuple[str, str, str, str, str, int, bytes]
    balance: int = 0
    total_claimed: int = 0
    refund_nonce: int = 0
    withdraw_amount: int = 0
    withdraw_initiated_at: int = 0

    @property
    def payer(self) -> str:
        return self.config[0]

    @property
    def payer_authorizer(self) -> str:
        return self.config[1]

    @property
    def receiver(self) -> str:
        return self.config[2]

    @property
    def receiver_authorizer(self) -> str:
        return self.config[3]

    @property
    def token(self) -> str:
        return self.config[4]

    @property
    def withdraw_delay(self) -> int:
        return self.config[5]

    @property
    def unclaimed(self) -> int:
        return self.balance - self.total_claimed


@dataclass
class _Execution:
    """One transaction (or simulation) in flight: its sender, its clock, the logs it emits."""

    db: sqlite_utils.Database
    sender: str
    now: int
    tx_hash: str
    logs: list[tuple[str, list[str], str]] = field(default_factory=list)

    def emit(self, address: str, topics: list[str], data: bytes = b"") -> None:
        self.logs.append((to_checksum_address(address), topics, "0x" + data.hex()))


def _bytes32_topic(value: bytes) -> str:
    return "0x" + value.hex()


def _config_tuple(raw: Any) -> tuple[str, str, str, str, str, int, bytes]:
    """The contract's view of a ``ChannelConfig`` argument: checksummed, typed, validated."""
    try:
        payer, payer_auth, receiver, receiver_auth, token, delay, salt = raw
        config = (
            to_checksum_address(payer),
            to_checksum_address(payer_auth),
            to_checksum_address(receiver),
            to_checksum_address(receiver_auth),
            to_checksum_address(token),
            int(delay),
            bytes(salt) if not isinstance(salt, str) else bytes.fromhex(salt.removeprefix("0x")),
        )
    except (TypeError, ValueError):
        raise LedgerRevert(REVERT_CONFIG) from None
    if len(config[6]) != 32 or not 0 <= config[5] < 2**40:
        raise LedgerRevert(REVERT_CONFIG)
    return config


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
        self.functions: FunctionTable = {sel: (fn.name, fn.inputs, fn.outputs) for sel, fn in _BY_SELECTOR.items()}
        self.ledger = ledger
        self.network = network
        self.chain_id = chain_id
        self.tokens = {to_checksum_address(a): info for a, info in (tokens or default_tokens(network)).items()}
        self.trust_signatures = trust_signatures
        self.relayer = to_checksum_address(relayer)
        self.permit2 = permit2
        self.clock = clock
        self.time_offset = 0
        self._create_tables()
        for token in self.tokens:
            for holder in (self.address, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS):
                self.ledger.open_account(self.network, token, holder)

    def _create_tables(self) -> None:
        with self.ledger.contract_transaction() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS bs_channels (channel_id TEXT PRIMARY KEY, config TEXT NOT NULL,"
                " balance TEXT NOT NULL, total_claimed TEXT NOT NULL, refund_nonce TEXT NOT NULL,"
                " withdraw_amount TEXT NOT NULL, withdraw_initiated_at INTEGER NOT NULL)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS bs_receivers (receiver TEXT NOT NULL, token TEXT NOT NULL,"
                " total_claimed TEXT NOT NULL, total_settled TEXT NOT NULL, PRIMARY KEY (receiver, token))"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS bs_transactions (tx_hash TEXT PRIMARY KEY, function TEXT NOT NULL,"
                " sender TEXT NOT NULL, created_at TEXT NOT NULL)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS bs_logs (tx_hash TEXT NOT NULL, log_index INTEGER NOT NULL,"
                " address TEXT NOT NULL, topic0 TEXT, topic1 TEXT, topic2 TEXT, topic3 TEXT, data TEXT NOT NULL,"
                " PRIMARY KEY (tx_hash, log_index))"
            )
            db.execute("CREATE INDEX IF NOT EXISTS bs_logs_topic0 ON bs_logs (topic0, topic1)")

    # -- entry points --------------------------------------------------------

    def now(self) -> int:
        return int(self.clock()) + self.time_offset

    def call(self, target: str, function_name: str, args: tuple[Any, ...], sender: str | None = None) -> Any:
        """``eth_call``: run the function against current state, then roll everything back."""
        fn = self._function(function_name)
        with self.ledger.contract_transaction(commit=False) as db:
            ex = _Execution(db, self._sender(sender), self.now(), "0x" + "00" * 32)
            return self._run(ex, fn, args)

    def transact(self, target: str, function_name: str, args: tuple[Any, ...], sender: str | None = None) -> str:
        """A mined transaction: apply the function and its token moves atomically; return its hash."""
        fn = self._function(function_name)
        tx_hash = "0x" + keccak(b"a2a-gate dev batch settlement|" + uuid.uuid4().bytes).hex()
        return self._mine(fn, args, self._sender(sender), tx_hash)

    def allowance(self, owner: str, spender: str) -> int:
        return 0  # the contract takes deposits through collectors, never by an allowance of its own

    def _mine(self, fn: _Function, args: tuple[Any, ...], sender: str, tx_hash: str) -> str:
        with self.ledger.contract_transaction() as db:
            ex = _Execution(db, sender, self.now(), tx_hash)
            self._run(ex, fn, args)
            db.execute(
                "INSERT INTO bs_transactions (tx_hash, function, sender, created_at) VALUES (?, ?, ?, ?)",
                [tx_hash, fn.name, sender, datetime.now(UTC).isoformat()],
            )
            for index, (address, topics, data) in enumerate(ex.logs):
                padded = [*topics, None, None, None, None][:4]
                db.execute(
                    "INSERT INTO bs_logs (tx_hash, log_index, address, topic0, topic1, topic2, topic3, data)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [tx_hash, index, address.lower(), *padded, data],
                )
        return tx_hash

    def _sender(self, sender: str | None) -> str:
        return to_checksum_address(sender) if sender else self.relayer

    def _function(self, name: str) -> _Function:
        fn = _BY_NAME.get(name)
        if fn is None:
            raise LedgerRevert(REVERT_UNKNOWN_FUNCTION)
        return fn

    def _decode(self, data: bytes) -> tuple[_Function, tuple[Any, ...]]:
        fn = _BY_SELECTOR.get(bytes(data[:4]))
        if fn is None:
            raise LedgerRevert(REVERT_UNKNOWN_FUNCTION)
        try:
            return fn, tuple(abi_decode(fn.inputs, bytes(data[4:])))
        except Exception:  # noqa: BLE001 -- calldata that does not decode reverts, as on chain
            raise LedgerRevert(_PREFIX + f"bad calldata for {fn.name}") from None

    @staticmethod
    def _encode_result(fn: _Function, value: Any) -> bytes:
        if not fn.outputs:
            return b""
        return abi_encode(fn.outputs, list(value) if len(fn.outputs) > 1 else [value])

    def _run(self, ex: _Execution, fn: _Function, args: tuple[Any, ...]) -> Any:
        handler = getattr(self, "_fn_" + fn.name)
        if len(args) != len(fn.inputs):
            raise LedgerRevert(_PREFIX + f"{fn.name} takes {len(fn.inputs)} arguments")
        return handler(ex, *args)

    # -- reads (outside any transaction) ---------------------------------------

    def channel(self, channel_id: str | bytes) -> ChannelRecord | None:
        """A channel's state, or None if it was never funded."""
        with self.ledger.contract_transaction(commit=False) as db:
            return self._load(db, _channel_key(channel_id))

    def receiver_totals(self, receiver: str, token: str) -> tuple[int, int]:
        """``receivers(receiver, token)``: (totalClaimed, totalSettled)."""
        with self.ledger.contract_transaction(commit=False) as db:
            return self._receiver(db, to_checksum_address(receiver), to_checksum_address(token))

    def snapshot(self) -> dict[str, Any]:
        """Every channel and every receiver's totals, amounts as decimal strings."""
        with self.ledger.contract_transaction(commit=False) as db:
            ids = [row[0] for row in db.execute("SELECT channel_id FROM bs_channels ORDER BY rowid").fetchall()]
            records = [self._load(db, channel_id) for channel_id in ids]
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
            return self.address, self._log_rows(db, "tx_hash = ?", [tx_hash])

    def logs(self) -> list[dict[str, Any]]:
        """Everything this contract's transactions emitted (its own events and the token's
        ``Transfer`` / ``AuthorizationUsed`` logs of its deposits), oldest first."""
        with self.ledger.contract_transaction(commit=False) as db:
            return self._log_rows(db, "1 = 1", [])

    @staticmethod
    def _log_rows(db: sqlite_utils.Database, where: str, params: list[Any]) -> list[dict[str, Any]]:
        rows = db.execute(
            "SELECT tx_hash, log_index, address, topic0, topic1, topic2, topic3, data FROM bs_logs"
            f" WHERE {where} ORDER BY rowid",
            params,
        ).fetchall()
        return [_log(r[2], [t for t in r[3:7] if t is not None], r[7], r[0], r[1]) for r in rows]

    # -- storage ---------------------------------------------------------------

    @staticmethod
    def _load(db: sqlite_utils.Database, channel_id: str) -> ChannelRecord | None:
        row = db.execute(
            "SELECT config, balance, total_claimed, refund_nonce, withdraw_amount, withdraw_initiated_at"
            " FROM bs_channels WHERE channel_id = ?",
            [channel_id],
        ).fetchone()
        if row is None:
            return None
        stored = json.loads(row[0])
        config = (*stored[:5], int(stored[5]), bytes.fromhex(stored[6]))
        return ChannelRecord(
            channel_id=channel_id,
            config=config,
            balance=int(row[1]),
            total_claimed=int(row[2]),
            refund_nonce=int(row[3]),
            withdraw_amount=int(row[4]),
            withdraw_initiated_at=int(row[5]),
        )

    @staticmethod
    def _store(db: sqlite_utils.Database, record: ChannelRecord) -> None:
        config = json.dumps([*record.config[:6], record.config[6].hex()])
        db.execute(
            "INSERT INTO bs_channels (channel_id, config, balance, total_claimed, refund_nonce, withdraw_amount,"
            " withdraw_initiated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (channel_id) DO UPDATE SET"
            " balance = excluded.balance, total_claimed = excluded.total_claimed,"
            " refund_nonce = excluded.refund_nonce, withdraw_amount = excluded.withdraw_amount,"
            " withdraw_initiated_at = excluded.withdraw_initiated_at",
            [
                record.channel_id,
                config,
                str(record.balance),
                str(record.total_claimed),
                str(record.refund_nonce),
                str(record.withdraw_amount),
                record.withdraw_initiated_at,
            ],
        )

    @staticmethod
    def _receiver(db: sqlite_utils.Database, receiver: str, token: str) -> tuple[int, int]:
        row = db.execute(
            "SELECT total_claimed, total_settled FROM bs_receivers WHERE receiver = ? AND token = ?",
            [receiver, token],
        ).fetchone()
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    @staticmethod
    def _store_receiver(db: sqlite_utils.Database, receiver: str, token: str, claimed: int, settled: int) -> None:
        db.execute(
            "INSERT INTO bs_receivers (receiver, token, total_claimed, total_settled) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (receiver, token) DO UPDATE SET total_claimed = excluded.total_claimed,"
            " total_settled = excluded.total_settled",
            [receiver, token, str(claimed), str(settled)],
        )

    def _existing(self, ex: _Execution, config: tuple[str, str, str, str, str, int, bytes]) -> ChannelRecord:
        record = self._load(ex.db, self._channel_id(config))
        if record is None:
            raise LedgerRevert(REVERT_CHANNEL_NOT_FOUND)
        return record

    # -- EIP-712 ---------------------------------------------------------------

    def _channel_id(self, config: tuple[str, str, str, str, str, int, bytes]) -> str:
        return compute_channel_id(
            ChannelConfig(
                payer=config[0],
                payer_authorizer=config[1],
                receiver=config[2],
                receiver_authorizer=config[3],
                token=config[4],
                withdraw_delay=config[5],
                salt="0x" + config[6].hex(),
            ),
            self.chain_id,
        ).lower()

    def _digest(self, domain: dict[str, Any], types: dict[str, Any], message: dict[str, Any]) -> bytes:
        signable = encode_typed_data(domain_data=domain, message_types=types, message_data=message)
        return keccak(b"\x19" + signable.version + signable.header + signable.body)

    def _contract_digest(self, types: dict[str, Any], message: dict[str, Any]) -> bytes:
        return self._digest(get_batch_settlement_eip712_domain(self.chain_id), types, message)

    def _voucher_digest(self, channel_id: str, max_claimable: int) -> bytes:
        return self._contract_digest(
            VOUCHER_TYPES, {"channelId": bytes.fromhex(channel_id[2:]), "maxClaimableAmount": max_claimable}
        )

    def _refund_digest(self, channel_id: str, nonce: int, amount: int) -> bytes:
        return self._contract_digest(
            REFUND_TYPES, {"channelId": bytes.fromhex(channel_id[2:]), "nonce": nonce, "amount": amount}
        )

    def _claim_batch_digest(self, claims: list[_Claim]) -> bytes:
        entries = [
            {
                "channelId": bytes.fromhex(c.channel_id[2:]),
                "maxClaimableAmount": c.max_claimable,
                "totalClaimed": c.total_claimed,
            }
            for c in claims
        ]
        return self._contract_digest(CLAIM_BATCH_TYPES, {"claims": entries})

    def _signed_by(self, digest: bytes, signature: bytes, address: str) -> bool:
        """OpenZeppelin's ``SignatureChecker.isValidSignatureNow``: ``ECDSA.tryRecover`` for an EOA (no
        dev-chain address has code: 65 bytes, low s, v 27/28, else false), or the trusting mode's
        accept-everything wallet."""
        if self.trust_signatures:
            return True
        signer, _ = recover_ecdsa(digest, bytes(signature))
        return signer is not None and signer == to_checksum_address(address)

    # -- functions: deposits ---------------------------------------------------

    def _fn_deposit(self, ex: _Execution, raw_config: Any, amount: int, collector: str, data: bytes) -> None:
        """In the contract's order: the configuration (``InvalidChannel``), the delay's range, a non-zero
        amount, a known collector, the balance's uint128 bound, then the collector's pull."""
        config = _config_tuple(raw_config)
        amount = int(amount)
        if ZERO_ADDRESS in (config[0], config[2], config[3]) or config[4] not in self.tokens:
            raise LedgerRevert(REVERT_CONFIG)
        if not MIN_WITHDRAW_DELAY <= config[5] <= MAX_WITHDRAW_DELAY:
            raise LedgerRevert(REVERT_WITHDRAW_DELAY)
        if amount == 0:
            raise LedgerRevert(REVERT_ZERO_AMOUNT)
        collector = to_checksum_address(collector)
        if collector not in (ERC3009_DEPOSIT_COLLECTOR_ADDRESS, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS):
            raise LedgerRevert(REVERT_UNKNOWN_COLLECTOR)
        channel_id = self._channel_id(config)
        record = self._load(ex.db, channel_id) or ChannelRecord(channel_id, config)
        if record.balance + amount > UINT128_MAX:
            raise LedgerRevert(_PREFIX + "balance overflow")
        if collector == ERC3009_DEPOSIT_COLLECTOR_ADDRESS:
            self._collect_erc3009(ex, config, channel_id, amount, bytes(data))
        else:
            self._collect_permit2(ex, config, channel_id, amount, bytes(data))
        topic = _bytes32_topic(bytes.fromhex(channel_id[2:]))
        if record.balance == 0 and record.total_claimed == 0:
            ex.emit(self.address, [EVENT_TOPICS["ChannelCreated"], topic], abi_encode([_CONFIG_TYPE], [config]))
        record.balance += amount
        self._store(ex.db, record)
        ex.emit(
            self.address,
            [EVENT_TOPICS["Deposited"], topic, _address_topic(ex.sender)],
            abi_encode(["uint128", "uint128"], [amount, record.balance]),
        )

    def _collect_erc3009(
        self,
        ex: _Execution,
        config: tuple[str, str, str, str, str, int, bytes],
        channel_id: str,
        amount: int,
        data: bytes,
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
        self.ledger.spend_nonce(self.network, token, payer, nonce, ex.tx_hash)
        info = self.tokens[to_checksum_address(token)]
        domain = {"name": info.name, "version": info.version, "chainId": self.chain_id, "verifyingContract": token}
        message = {
            "from": payer,
            "to": ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
            "value": amount,
            "validAfter": valid_after,
            "validBefore": valid_before,
            "nonce": nonce,
        }
        digest = self._digest(domain, RECEIVE_AUTHORIZATION_TYPES, message)
        if not self.trust_signatures and recover_fiattoken(digest, bytes(signature)) != payer:
            raise LedgerRevert(REVERT_INVALID_SIGNATURE)
        self._transfer(ex, token, payer, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, amount, nonce=nonce)
        self._transfer(ex, token, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, self.address, amount)

    def _collect_permit2(
        self,
        ex: _Execution,
        config: tuple[str, str, str, str, str, int, bytes],
        channel_id: str,
        amount: int,
        data: bytes,
    ) -> None:
        """``Permit2DepositCollector.collect``: Permit2's ``permitWitnessTransferFrom`` with the
        collector as spender and ``DepositWitness(channelId)`` as witness, straight into this contract.

        It is the chain's own Permit2 (``Permit2Contracts.permit_witness_transfer_from``) that checks
        the deadline, the payer's signature and the nonce, so a deposit spends a nonce of the same
        bitmap as x402's exact and upto proxies and the payer's ``invalidateUnorderedNonces``.

        An EIP-2612 permit segment changes nothing: on the dev chain every address has already
        granted Permit2 an unlimited allowance (``devnet.permit2``).
        """
        if self.permit2 is None:
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
            to=self.address,
            amount=amount,
            witness_types=BATCH_PERMIT2_WITNESS_TYPES,
            witness={"channelId": bytes.fromhex(channel_id[2:])},
            signature=bytes(signature),
        )
        self.permit2.permit_witness_transfer_from(ex.db, permit, ex.tx_hash)  # moves payer -> this contract
        ex.emit(
            token, [TRANSFER_TOPIC, _address_topic(payer), _address_topic(self.address)], amount.to_bytes(32, "big")
        )

    def _transfer(
        self, ex: _Execution, token: str, source: str, target: str, amount: int, *, nonce: bytes | None = None
    ) -> None:
        self.ledger.move(self.network, token, source, target, amount)
        if nonce is not None:
            ex.emit(token, [AUTHORIZATION_USED_TOPIC, _address_topic(source), _bytes32_topic(nonce)])
        ex.emit(token, [TRANSFER_TOPIC, _address_topic(source), _address_topic(target)], amount.to_bytes(32, "big"))

    # -- functions: claims and settlement ----------------------------------------

    def _fn_claimWithSignature(self, ex: _Execution, raw_claims: Any, signature: bytes) -> None:
        claims = self._claims(raw_claims)
        authorizer = claims[0].config[3]
        if any(c.config[3] != authorizer for c in claims):
            raise LedgerRevert(REVERT_AUTHORIZER_MISMATCH)
        if not self._signed_by(self._claim_batch_digest(claims), signature, authorizer):
            raise LedgerRevert(REVERT_AUTHORIZER_SIGNATURE)
        self._apply_claims(ex, claims)

    def _fn_claim(self, ex: _Execution, raw_claims: Any) -> None:
        claims = self._claims(raw_claims)
        if any(ex.sender not in (c.config[2], c.config[3]) for c in claims):
            raise LedgerRevert(REVERT_UNAUTHORIZED)
        self._apply_claims(ex, claims)

    def _claims(self, raw_claims: Any) -> list[_Claim]:
        claims = []
        try:
            for (raw_config, max_claimable), signature, total_claimed in raw_claims:
                config = _config_tuple(raw_config)
                claims.append(
                    _Claim(config, self._channel_id(config), int(max_claimable), bytes(signature), int(total_claimed))
                )
        except (TypeError, ValueError):
            raise LedgerRevert(_PREFIX + "malformed claims") from None
        if not claims:
            raise LedgerRevert(REVERT_EMPTY_CLAIMS)
        return claims

    def _apply_claims(self, ex: _Execution, claims: list[_Claim]) -> None:
        """Each row in the contract's order (``_processVoucherClaim``): a row at or below the channel's
        ``totalClaimed`` is a no-op, checked no further (a replayed claim changes nothing); otherwise the
        payer's voucher must cover it, the channel's balance must back it, and the voucher's signature
        must be the payer authorizer's (``_voucher_signed``); ``totalClaimed`` moves up to the row's value."""
        for claim in claims:
            record = self._load(ex.db, claim.channel_id) or ChannelRecord(claim.channel_id, claim.config)
            if claim.total_claimed <= record.total_claimed:
                continue
            if claim.total_claimed > claim.max_claimable:
                raise LedgerRevert(REVERT_CLAIM_EXCEEDS_VOUCHER)
            if claim.total_claimed > record.balance:
                raise LedgerRevert(REVERT_CLAIM_EXCEEDS_BALANCE)
            self._voucher_signed(claim)
            delta = claim.total_claimed - record.total_claimed
            record.total_claimed = claim.total_claimed
            self._store(ex.db, record)
            claimed, settled = self._receiver(ex.db, record.receiver, record.token)
            self._store_receiver(ex.db, record.receiver, record.token, claimed + delta, settled)
            ex.emit(
                self.address,
                [
                    EVENT_TOPICS["Claimed"],
                    _bytes32_topic(bytes.fromhex(claim.channel_id[2:])),
                    _address_topic(ex.sender),
                ],
                abi_encode(["uint128", "uint128"], [delta, record.total_claimed]),
            )

    def _voucher_signed(self, claim: _Claim) -> None:
        """The voucher's signature, as the contract checks it: a non-zero payer authorizer's with
        OpenZeppelin's ``ECDSA.recoverCalldata`` (65 bytes, low s, v 27/28: its own error otherwise; no
        ERC-1271), a zero one's by the payer through ``SignatureChecker`` (``_signed_by``)."""
        if self.trust_signatures:
            return
        digest = self._voucher_digest(claim.channel_id, claim.max_claimable)
        payer, payer_authorizer = claim.config[0], claim.config[1]
        if payer_authorizer == ZERO_ADDRESS:
            if not self._signed_by(digest, claim.signature, payer):
                raise LedgerRevert(REVERT_VOUCHER_SIGNATURE)
            return
        signer, error = recover_ecdsa(digest, claim.signature)
        if error:
            raise LedgerRevert(error)
        if signer != payer_authorizer:
            raise LedgerRevert(REVERT_VOUCHER_SIGNATURE)

    def _fn_settle(self, ex: _Execution, receiver: str, token: str) -> None:
        receiver, token = to_checksum_address(receiver), to_checksum_address(token)
        claimed, settled = self._receiver(ex.db, receiver, token)
        amount = claimed - settled
        if amount == 0:
            return
        self._store_receiver(ex.db, receiver, token, claimed, claimed)
        self._transfer(ex, token, self.address, receiver, amount)
        ex.emit(
            self.address,
            [EVENT_TOPICS["Settled"], _address_topic(receiver), _address_topic(token), _address_topic(ex.sender)],
            abi_encode(["uint128"], [amount]),
        )

    # -- functions: refunds and withdrawals ------------------------------------

    def _fn_refundWithSignature(
        self, ex: _Execution, raw_config: Any, amount: int, nonce: int, signature: bytes
    ) -> None:
        record = self._existing(ex, _config_tuple(raw_config))
        if int(nonce) != record.refund_nonce:
            raise LedgerRevert(REVERT_REFUND_NONCE)
        digest = self._refund_digest(record.channel_id, int(nonce), int(amount))
        if not self._signed_by(digest, signature, record.receiver_authorizer):
            raise LedgerRevert(REVERT_AUTHORIZER_SIGNATURE)
        self._refund(ex, record, int(amount))

    def _fn_refund(self, ex: _Execution, raw_config: Any, amount: int) -> None:
        record = self._existing(ex, _config_tuple(raw_config))
        if ex.sender not in (record.receiver, record.receiver_authorizer):
            raise LedgerRevert(REVERT_UNAUTHORIZED)
        self._refund(ex, record, int(amount))

    def _refund(self, ex: _Execution, record: ChannelRecord, amount: int) -> None:
        """The nonce advances first; then up to ``balance - totalClaimed`` goes back to the payer,
        and a pending withdrawal shrinks by what was refunded (gone once the refund covers it)."""
        if amount == 0:
            raise LedgerRevert(REVERT_ZERO_AMOUNT)
        record.refund_nonce += 1
        actual = min(amount, record.unclaimed)
        if actual > 0:
            record.balance -= actual
            if record.withdraw_initiated_at:
                if actual >= record.withdraw_amount:
                    record.withdraw_amount, record.withdraw_initiated_at = 0, 0
                else:
                    record.withdraw_amount -= actual
        self._store(ex.db, record)
        if actual == 0:
            return
        ex.emit(
            self.address,
            [EVENT_TOPICS["Refunded"], _bytes32_topic(bytes.fromhex(record.channel_id[2:])), _address_topic(ex.sender)],
            abi_encode(["uint128"], [actual]),
        )
        self._maybe_closed(ex, record)
        self._transfer(ex, record.token, self.address, record.payer, actual)  # the contract's last step

    def _payer_side(self, ex: _Execution, record: ChannelRecord) -> None:
        allowed = {record.payer} | ({record.payer_authorizer} - {ZERO_ADDRESS})
        if ex.sender not in allowed:
            raise LedgerRevert(REVERT_UNAUTHORIZED)

    def _fn_initiateWithdraw(self, ex: _Execution, raw_config: Any, amount: int) -> None:
        record = self._existing(ex, _config_tuple(raw_config))
        self._payer_side(ex, record)
        amount = int(amount)
        if amount == 0:
            raise LedgerRevert(REVERT_ZERO_AMOUNT)
        if record.withdraw_initiated_at:
            raise LedgerRevert(REVERT_WITHDRAW_PENDING)
        if amount > record.unclaimed:
            raise LedgerRevert(REVERT_WITHDRAW_EXCEEDS)
        record.withdraw_amount, record.withdraw_initiated_at = amount, ex.now
        self._store(ex.db, record)
        ex.emit(
            self.address,
            [EVENT_TOPICS["WithdrawInitiated"], _bytes32_topic(bytes.fromhex(record.channel_id[2:]))],
            abi_encode(["uint128", "uint40"], [amount, ex.now + record.withdraw_delay]),
        )

    def _fn_finalizeWithdraw(self, ex: _Execution, raw_config: Any) -> None:
        record = self._existing(ex, _config_tuple(raw_config))
        self._payer_side(ex, record)
        if not record.withdraw_initiated_at:
            raise LedgerRevert(REVERT_NO_WITHDRAWAL)
        if ex.now < record.withdraw_initiated_at + record.withdraw_delay:
            raise LedgerRevert(REVERT_WITHDRAW_EARLY)
        actual = min(record.withdraw_amount, record.unclaimed)
        record.balance -= actual
        record.withdraw_amount, record.withdraw_initiated_at = 0, 0
        self._store(ex.db, record)
        ex.emit(
            self.address,
            [
                EVENT_TOPICS["WithdrawFinalized"],
                _bytes32_topic(bytes.fromhex(record.channel_id[2:])),
                _address_topic(ex.sender),
            ],
            abi_encode(["uint128"], [actual]),
        )
        self._maybe_closed(ex, record)
        if actual > 0:  # the contract's last step
            self._transfer(ex, record.token, self.address, record.payer, actual)

    def _maybe_closed(self, ex: _Execution, record: ChannelRecord) -> None:
        if record.balance == 0 and record.total_claimed == 0:
            topic = _bytes32_topic(bytes.fromhex(record.channel_id[2:]))
            ex.emit(self.address, [EVENT_TOPICS["ChannelClosed"], topic], abi_encode([_CONFIG_TYPE], [record.config]))

    # -- functions: batching and views ----------------------------------------------

    def _fn_multicall(self, ex: _Execution, calls: list[bytes]) -> list[bytes]:
        """Every call in order, in one transaction: one revert reverts them all."""
        results = []
        for data in calls:
            fn, args = self._decode(bytes(data))
            if fn.name == "multicall":
                raise LedgerRevert(_PREFIX + "nested multicall")
            results.append(self._encode_result(fn, self._run(ex, fn, args)))
        return results

    def _fn_channels(self, ex: _Execution, channel_id: bytes) -> tuple[int, int]:
        record = self._load(ex.db, _channel_key(channel_id))
        return (0, 0) if record is None else (record.balance, record.total_claimed)

    def _fn_pendingWithdrawals(self, ex: _Execution, channel_id: bytes) -> tuple[int, int]:
        record = self._load(ex.db, _channel_key(channel_id))
        return (0, 0) if record is None else (record.withdraw_amount, record.withdraw_initiated_at)

    def _fn_refundNonce(self, ex: _Execution, channel_id: bytes) -> int:
        record = self._load(ex.db, _channel_key(channel_id))
        return 0 if record is None else record.refund_nonce

    def _fn_receivers(self, ex: _Execution, receiver: str, token: str) -> tuple[int, int]:
        return self._receiver(ex.db, to_checksum_address(receiver), to_checksum_address(token))

    def _fn_getChannelId(self, ex: _Execution, raw_config: Any) -> bytes:
        return bytes.fromhex(self._channel_id(_config_tuple(raw_config))[2:])

    def _fn_getVoucherDigest(self, ex: _Execution, channel_id: bytes, max_claimable: int) -> bytes:
        return self._voucher_digest(_channel_key(channel_id), int(max_claimable))

    def _fn_getRefundDigest(self, ex: _Execution, channel_id: bytes, nonce: int, amount: int) -> bytes:
        return self._refund_digest(_channel_key(channel_id), int(nonce), int(amount))

    def _fn_getClaimBatchDigest(self, ex: _Execution, raw_claims: Any) -> bytes:
        return self._claim_batch_digest(self._claims(raw_claims))


@dataclass(frozen=True)
class _Claim:
    config: tuple[str, str, str, str, str, int, bytes]
    channel_id: str
    max_claimable: int
    signature: bytes
    total_claimed: int


def _channel_key(channel_id: str | bytes) -> str:
    raw = channel_id if isinstance(channel_id, bytes) else bytes.fromhex(channel_id.removeprefix("0x"))
    if len(raw) != 32:
        raise LedgerRevert(_PREFIX + "channel id must be 32 bytes")
    return "0x" + raw.hex()
