"""A simulated EIP-3009 (``transferWithAuthorization``) token ledger kept in SQLite.

The development facilitator needs somewhere to keep the state a real token
contract keeps on chain: balances and which authorization nonces are spent.
This module is that state and nothing else. It knows nothing about signatures,
EIP-712 or x402; the facilitator's signer adapter decides whether a call is
authorized and then asks the ledger to apply it.

Every write is a single ``BEGIN IMMEDIATE`` transaction, so the "is the nonce
unused and is the balance sufficient?" check and the transfer it guards cannot
interleave with another writer, whether that writer is another thread of this
process or another facilitator process using the same database file.

Besides transfers, the ledger keeps what else spends a nonce on a FiatToken:
``cancelAuthorization`` (the authorizer gives the authorization up; no funds move),
so that "the nonce is used" and "the payment was made" stay two different facts.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlite_utils
from eth_utils import keccak, to_checksum_address

__all__ = [
    "DEFAULT_INITIAL_BALANCE",
    "REVERT_EXPIRED",
    "REVERT_INSUFFICIENT_BALANCE",
    "REVERT_NONCE_USED",
    "REVERT_NOT_YET_VALID",
    "REVERT_TRANSFER_TO_ZERO",
    "DevLedger",
    "LedgerRevert",
    "Transfer",
]

#: 1000 USDC at 6 decimals. Every address holds this much the first time it is seen.
DEFAULT_INITIAL_BALANCE = 1_000_000_000

# Revert reasons worded like Circle's FiatToken so that the x402 package's own
# revert classifier (``parse_eip3009_transfer_error``) maps them to its codes.
REVERT_NOT_YET_VALID = "FiatTokenV2: authorization is not yet valid"
REVERT_EXPIRED = "FiatTokenV2: authorization is expired"
REVERT_NONCE_USED = "FiatTokenV2: authorization is used or canceled"
REVERT_INSUFFICIENT_BALANCE = "ERC20: transfer amount exceeds balance"
REVERT_TRANSFER_TO_ZERO = "ERC20: transfer to the zero address"
_ZERO_ADDRESS = "0x" + "00" * 20


class LedgerRevert(Exception):
    """A simulated contract revert.

    ``str()`` starts with ``execution reverted:`` because that is what the x402
    package looks for to tell a revert from a transport failure.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"execution reverted: {reason}")


@dataclass(frozen=True)
class Transfer:
    """One ``transferWithAuthorization`` call, already parsed and normalized."""

    network: str
    asset: str
    from_address: str
    to_address: str
    value: int
    valid_after: int
    valid_before: int
    nonce: str  # 0x-prefixed, 32 bytes, lowercase hex

    @classmethod
    def create(
        cls,
        *,
        network: str,
        asset: str,
        from_address: str,
        to_address: str,
        value: int,
        valid_after: int,
        valid_before: int,
        nonce: bytes | str,
    ) -> Transfer:
        """Build a transfer with checksummed addresses and a canonical nonce."""
        return cls(
            network=network,
            asset=to_checksum_address(asset),
            from_address=to_checksum_address(from_address),
            to_address=to_checksum_address(to_address),
            value=int(value),
            valid_after=int(valid_after),
            valid_before=int(valid_before),
            nonce=_canonical_nonce(nonce),
        )

    @property
    def tx_hash(self) -> str:
        """A deterministic fake transaction hash.

        A nonce can be spent once per (network, asset, authorizer), so hashing
        exactly those makes the hash unique without any counter.
        """
        seed = "|".join((self.network, self.asset, self.from_address, self.nonce))
        return "0x" + keccak(text="a2a-gate-dev-ledger|" + seed).hex()


class DevLedger:
    """Balances, spent nonces and settlements for simulated EIP-3009 tokens.

    Addresses are stored checksummed and amounts as decimal strings (token
    amounts are uint256 and do not fit SQLite's 64-bit integers).
    """

    def __init__(
        self,
        path: str,
        *,
        initial_balance: int = DEFAULT_INITIAL_BALANCE,
        busy_timeout: float = 30.0,
    ) -> None:
        self.path = path
        self.initial_balance = int(initial_balance)
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=busy_timeout)
        self.db = sqlite_utils.Database(conn)
        # One connection is shared by the threadpool, and a connection can only
        # hold one transaction at a time: the lock serializes this process's use
        # of it, BEGIN IMMEDIATE serializes processes against each other.
        self._lock = threading.RLock()
        with self._lock:
            self.db.enable_wal()
            self._create_tables()

    def _create_tables(self) -> None:
        self.db.table("balances").create(
            {"network": str, "asset": str, "address": str, "amount": str},
            pk=("network", "asset", "address"),
            if_not_exists=True,
        )
        self.db.table("nonces").create(
            {
                "network": str,
                "asset": str,
                "authorizer": str,
                "nonce": str,
                "tx_hash": str,
                "created_at": str,
            },
            pk=("network", "asset", "authorizer", "nonce"),
            if_not_exists=True,
        )
        self.db.table("settlements").create(
            {
                "tx_hash": str,
                "network": str,
                "asset": str,
                "from_address": str,
                "to_address": str,
                "amount": str,
                "nonce": str,
                "valid_after": str,
                "valid_before": str,
                "created_at": str,
            },
            pk="tx_hash",
            if_not_exists=True,
        )
        self.db.table("cancellations").create(
            {"tx_hash": str, "network": str, "asset": str, "authorizer": str, "nonce": str, "created_at": str},
            pk="tx_hash",
            if_not_exists=True,
        )

    def close(self) -> None:
        with self._lock:
            self.db.close()

    @contextmanager
    def _immediate(self) -> Iterator[None]:
        """Run the block as one ``BEGIN IMMEDIATE`` transaction.

        IMMEDIATE takes SQLite's write lock up front, so the reads inside the
        block see state no other connection can change before we commit.
        """
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self.db.rollback()
                raise
            else:
                self.db.execute("COMMIT")

    # -- reads ---------------------------------------------------------------

    def balance_of(self, network: str, asset: str, address: str) -> int:
        """Return the balance, counting an unseen address as holding the initial balance."""
        with self._lock:
            return self._balance(network, to_checksum_address(asset), to_checksum_address(address))

    def authorization_state(self, network: str, asset: str, authorizer: str, nonce: bytes | str) -> bool:
        """Return True when the nonce is spent, like EIP-3009 ``authorizationState``."""
        with self._lock:
            return self._nonce_used(
                network,
                to_checksum_address(asset),
                to_checksum_address(authorizer),
                _canonical_nonce(nonce),
            )

    def authorization_tx(self, network: str, asset: str, authorizer: str, nonce: bytes | str) -> str | None:
        """The transfer that used an authorization (its ``AuthorizationUsed`` log), or None.

        A canceled authorization is spent too, but no transfer used it: None.
        """
        with self._lock:
            row = self.db.execute(
                "SELECT tx_hash FROM settlements WHERE network = ? AND asset = ? AND from_address = ? AND nonce = ?",
                [network, to_checksum_address(asset), to_checksum_address(authorizer), _canonical_nonce(nonce)],
            ).fetchone()
        return None if row is None else row[0]

    def cancellation_tx(self, network: str, asset: str, authorizer: str, nonce: bytes | str) -> str | None:
        """The ``cancelAuthorization`` that spent an authorization (its ``AuthorizationCanceled`` log), or None."""
        with self._lock:
            row = self.db.execute(
                "SELECT tx_hash FROM cancellations WHERE network = ? AND asset = ? AND authorizer = ? AND nonce = ?",
                [network, to_checksum_address(asset), to_checksum_address(authorizer), _canonical_nonce(nonce)],
            ).fetchone()
        return None if row is None else row[0]

    def check_authorization(self, transfer: Transfer, now: int | None = None) -> None:
        """FiatToken's ``_requireValidAuthorization``, the checks before its signature check: the window
        (``now > validAfter``, ``now < validBefore``), then the nonce unused. Raises ``LedgerRevert``."""
        with self._lock:
            self._check_window_and_nonce(transfer, _now(now))

    def check_transfer(self, transfer: Transfer, now: int | None = None) -> None:
        """Raise ``LedgerRevert`` if the transfer would revert; change nothing (``eth_call``)."""
        with self._lock:
            self._check(transfer, _now(now))

    def settlement(self, tx_hash: str) -> dict[str, Any] | None:
        with self._lock:
            rows = list(self.db["settlements"].rows_where("tx_hash = ?", [tx_hash.lower()]))
        return rows[0] if rows else None

    def settlements(self) -> list[dict[str, Any]]:
        """All settlements, oldest first."""
        with self._lock:
            return list(self.db["settlements"].rows_where(order_by="rowid"))

    def cancellation(self, tx_hash: str) -> dict[str, Any] | None:
        with self._lock:
            rows = list(self.db["cancellations"].rows_where("tx_hash = ?", [tx_hash.lower()]))
        return rows[0] if rows else None

    def cancellations(self) -> list[dict[str, Any]]:
        """All canceled authorizations, oldest first."""
        with self._lock:
            return list(self.db["cancellations"].rows_where(order_by="rowid"))

    # -- writes --------------------------------------------------------------

    def transfer_with_authorization(self, transfer: Transfer, now: int | None = None) -> str:
        """Spend the nonce and move the funds atomically; return the tx hash.

        Raises ``LedgerRevert`` (and changes nothing) when the time window is
        wrong, the nonce is already spent or the balance is too low.
        """
        timestamp = _now(now)
        created_at = datetime.now(UTC).isoformat()
        tx_hash = transfer.tx_hash
        with self._immediate():
            self._check(transfer, timestamp)
            t = transfer
            self.db.execute(
                "INSERT INTO nonces (network, asset, authorizer, nonce, tx_hash, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                [t.network, t.asset, t.from_address, t.nonce, tx_hash, created_at],
            )
            payer_balance = self._balance(t.network, t.asset, t.from_address)
            self._write_balance(t.network, t.asset, t.from_address, payer_balance - t.value)
            payee_balance = self._balance(t.network, t.asset, t.to_address)
            self._write_balance(t.network, t.asset, t.to_address, payee_balance + t.value)
            self.db.execute(
                "INSERT INTO settlements (tx_hash, network, asset, from_address, to_address,"
                " amount, nonce, valid_after, valid_before, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    tx_hash,
                    t.network,
                    t.asset,
                    t.from_address,
                    t.to_address,
                    str(t.value),
                    t.nonce,
                    str(t.valid_after),
                    str(t.valid_before),
                    created_at,
                ],
            )
        return tx_hash

    def cancel_authorization(self, network: str, asset: str, authorizer: str, nonce: bytes | str) -> str:
        """Spend the nonce without moving funds, like EIP-3009 ``cancelAuthorization``; return the tx hash.

        Raises ``LedgerRevert`` (and changes nothing) when the nonce is already spent.
        The time window does not matter: FiatToken lets an authorizer cancel at any time.
        """
        asset, authorizer, nonce = to_checksum_address(asset), to_checksum_address(authorizer), _canonical_nonce(nonce)
        seed = "|".join((network, asset, authorizer, nonce))
        tx_hash = "0x" + keccak(text="a2a-gate-dev-ledger-cancel|" + seed).hex()
        created_at = datetime.now(UTC).isoformat()
        with self._immediate():
            if self._nonce_used(network, asset, authorizer, nonce):
                raise LedgerRevert(REVERT_NONCE_USED)
            self.db.execute(
                "INSERT INTO nonces (network, asset, authorizer, nonce, tx_hash, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                [network, asset, authorizer, nonce, tx_hash, created_at],
            )
            self.db.execute(
                "INSERT INTO cancellations (tx_hash, network, asset, authorizer, nonce, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [tx_hash, network, asset, authorizer, nonce, created_at],
            )
        return tx_hash

    def set_balance(self, network: str, asset: str, address: str, amount: int) -> None:
        """Overwrite a balance (tests use it to make a payer poor)."""
        with self._immediate():
            self._write_balance(network, to_checksum_address(asset), to_checksum_address(address), int(amount))

    # -- for contracts whose state lives beside the token's (devnet.permit2, devnet.batch_settlement) --

    @contextmanager
    def contract_transaction(self, *, commit: bool = True) -> Iterator[sqlite_utils.Database]:
        """One ``BEGIN IMMEDIATE`` transaction for a contract whose state lives beside the token's.

        The block reads and writes the contract's own tables through the yielded database and moves
        tokens with ``move`` / ``spend_nonce``; all of it commits together, or, with ``commit=False``
        (an ``eth_call``: checked to the end, changing nothing), is rolled back.
        """
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.rollback()
                raise
            else:
                self.db.execute("COMMIT" if commit else "ROLLBACK")

    def move(self, network: str, asset: str, from_address: str, to_address: str, value: int) -> None:
        """ERC-20 ``transferFrom``'s balance update, inside ``contract_transaction``; reverts on a short balance."""
        asset, source, target = (to_checksum_address(a) for a in (asset, from_address, to_address))
        with self._lock:
            balance = self._balance(network, asset, source)
            if value < 0 or balance < value:
                raise LedgerRevert(REVERT_INSUFFICIENT_BALANCE)
            self._write_balance(network, asset, source, balance - value)
            self._write_balance(network, asset, target, self._balance(network, asset, target) + value)

    def spend_nonce(self, network: str, asset: str, authorizer: str, nonce: bytes | str, tx_hash: str) -> None:
        """Spend an EIP-3009 nonce inside ``contract_transaction`` (``receiveWithAuthorization``)."""
        asset, authorizer, canonical = (
            to_checksum_address(asset),
            to_checksum_address(authorizer),
            _canonical_nonce(nonce),
        )
        if self._nonce_used(network, asset, authorizer, canonical):
            raise LedgerRevert(REVERT_NONCE_USED)
        self.db.execute(
            "INSERT INTO nonces (network, asset, authorizer, nonce, tx_hash, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            [network, asset, authorizer, canonical, tx_hash, datetime.now(UTC).isoformat()],
        )

    def open_account(self, network: str, asset: str, address: str) -> None:
        """Give a contract address an explicit zero balance (it is not a funded newcomer)."""
        with self._lock:
            self.db.execute(
                "INSERT OR IGNORE INTO balances (network, asset, address, amount) VALUES (?, ?, ?, '0')",
                [network, to_checksum_address(asset), to_checksum_address(address)],
            )

    # -- internals (caller holds the lock) ------------------------------------

    def _check(self, t: Transfer, now: int) -> None:
        # Same order as FiatToken: time window, then nonce (its signature check comes between these
        # and the transfer: devnet.chain), then the transfer's own: a destination, the balance.
        self._check_window_and_nonce(t, now)
        if t.to_address == _ZERO_ADDRESS:
            raise LedgerRevert(REVERT_TRANSFER_TO_ZERO)
        if t.value < 0 or self._balance(t.network, t.asset, t.from_address) < t.value:
            raise LedgerRevert(REVERT_INSUFFICIENT_BALANCE)

    def _check_window_and_nonce(self, t: Transfer, now: int) -> None:
        if now <= t.valid_after:
            raise LedgerRevert(REVERT_NOT_YET_VALID)
        if now >= t.valid_before:
            raise LedgerRevert(REVERT_EXPIRED)
        if self._nonce_used(t.network, t.asset, t.from_address, t.nonce):
            raise LedgerRevert(REVERT_NONCE_USED)

    def _balance(self, network: str, asset: str, address: str) -> int:
        row = self.db.execute(
            "SELECT amount FROM balances WHERE network = ? AND asset = ? AND address = ?",
            [network, asset, address],
        ).fetchone()
        return self.initial_balance if row is None else int(row[0])

    def _nonce_used(self, network: str, asset: str, authorizer: str, nonce: str) -> bool:
        row = self.db.execute(
            "SELECT 1 FROM nonces WHERE network = ? AND asset = ? AND authorizer = ? AND nonce = ?",
            [network, asset, authorizer, nonce],
        ).fetchone()
        return row is not None

    def _write_balance(self, network: str, asset: str, address: str, amount: int) -> None:
        self.db.execute(
            "INSERT INTO balances (network, asset, address, amount) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (network, asset, address) DO UPDATE SET amount = excluded.amount",
            [network, asset, address, str(amount)],
        )


def _canonical_nonce(nonce: bytes | str) -> str:
    raw = nonce if isinstance(nonce, bytes) else bytes.fromhex(nonce.removeprefix("0x"))
    if len(raw) != 32:
        raise ValueError(f"nonce must be 32 bytes, got {len(raw)}")
    return "0x" + raw.hex()


def _now(now: int | None) -> int:
    return int(time.time()) if now is None else int(now)
