"""Permit2 on the development chain: the canonical Permit2 contract and x402's two Permit2 proxies.

An x402 Permit2 payment (``exact`` with ``assetTransferMethod = "permit2"``, and ``upto``) is
settled by the facilitator calling an x402 proxy's ``settle``; the proxy calls Permit2's
``permitWitnessTransferFrom``, which checks the payer's signature, spends the payer's Permit2
nonce and moves the tokens with the token's ``transferFrom``. ``Permit2Contracts`` plays those
three contracts at the addresses the x402 package names (``PERMIT2_ADDRESS``,
``X402_EXACT_PERMIT2_PROXY_ADDRESS``, ``X402_UPTO_PERMIT2_PROXY_ADDRESS``), over the development
ledger, so the package's own facilitator schemes run unchanged against them.

The allowance rule: on the development chain every address has granted Permit2 an unlimited
ERC-20 allowance on every token (``allowance(owner, PERMIT2) == 2**256 - 1``, never spent down),
as a real wallet does once with ``approve``. A payer with a fresh key needs no approve step.

What the contracts check, in the order the deployed ones do:

- the ``upto`` proxy: the requested amount is at most ``permit.permitted.amount``
  (``AmountExceedsPermitted()``), and the caller is the witness's ``facilitator``
  (``UnauthorizedFacilitator()``); the ``exact`` proxy always requests the permitted amount;
- both proxies: a non-zero amount, owner and destination; not before ``witness.validAfter``;
- Permit2: not after ``permit.deadline`` (``SignatureExpired``), the amount within the permit,
  the nonce unspent (``InvalidNonce()``: a nonce is spent once, per owner, across every token),
  the owner's EIP-712 signature over the permit with the proxy as spender and the proxy's
  witness, in the encodings Permit2's ``SignatureVerification`` takes (65 bytes, or EIP-2098's
  64; high s accepted; ``v`` 27/28, else ``InvalidSignature()``; another signer ``InvalidSigner()``);
- the token: the owner's balance (``ERC20: transfer amount exceeds balance``).

A settlement emits what the deployed contracts emit: the token's ERC-20 ``Transfer(owner,
witness.to, amount)`` and the proxy's ``Settled()`` (``SettledWithPermit()``); Permit2 itself
emits nothing for a spent nonce, which ``nonceBitmap(owner, wordPos)`` reports. An owner may
also spend its own nonces with Permit2's ``invalidateUnorderedNonces(wordPos, mask)`` (sent as a
raw transaction, ``devnet.chain.ChainRpc``), which emits ``UnorderedNonceInvalidation``; the exact
proxy's ``settle`` may be sent by anyone, the upto proxy's only by the witness's facilitator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from eth_account.messages import encode_typed_data
from eth_utils import keccak, to_checksum_address
from sqlite_utils import Database
from x402.mechanisms.evm.constants import (
    PERMIT2_ADDRESS,
    PERMIT2_WITNESS_TYPES,
    UPTO_PERMIT2_WITNESS_TYPES,
    X402_EXACT_PERMIT2_PROXY_ABI,
    X402_EXACT_PERMIT2_PROXY_ADDRESS,
    X402_EXACT_PERMIT2_PROXY_SETTLE_WITH_PERMIT_ABI,
    X402_UPTO_PERMIT2_PROXY_ABI,
    X402_UPTO_PERMIT2_PROXY_ADDRESS,
    X402_UPTO_PERMIT2_PROXY_SETTLE_WITH_PERMIT_ABI,
)

from .chain import DEV_CHAIN_ID, DEV_NETWORK, TRANSFER_TOPIC, FunctionTable, TokenInfo, default_tokens, recover_permit2
from .chain import _address_topic as address_topic
from .chain import _log as log_entry
from .ledger import DevLedger, LedgerRevert

__all__ = [
    "EXACT_PROXY",
    "INVALIDATE_UNORDERED_NONCES_ABI",
    "MAX_UINT256",
    "NONCE_BITMAP_ABI",
    "NONCE_INVALIDATION_TOPIC",
    "PERMIT2",
    "SETTLED_TOPIC",
    "SETTLED_WITH_PERMIT_TOPIC",
    "UPTO_PROXY",
    "Permit2Contracts",
    "PermitWitnessTransfer",
]

PERMIT2: str = to_checksum_address(PERMIT2_ADDRESS)
EXACT_PROXY: str = to_checksum_address(X402_EXACT_PERMIT2_PROXY_ADDRESS)
UPTO_PROXY: str = to_checksum_address(X402_UPTO_PERMIT2_PROXY_ADDRESS)
MAX_UINT256 = 2**256 - 1
_ZERO_ADDRESS = "0x" + "00" * 20

#: ``event Settled()`` and ``event SettledWithPermit()`` of x402's Permit2 proxies.
SETTLED_TOPIC = "0x" + keccak(text="Settled()").hex()
SETTLED_WITH_PERMIT_TOPIC = "0x" + keccak(text="SettledWithPermit()").hex()

#: Permit2's ``nonceBitmap(address owner, uint256 wordPos) returns (uint256)``: bit ``nonce & 255`` of
#: word ``nonce >> 8`` is set once the owner's ``nonce`` is spent.
NONCE_BITMAP_ABI: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "nonceBitmap",
        "inputs": [{"name": "owner", "type": "address"}, {"name": "wordPos", "type": "uint256"}],
        "outputs": [{"type": "uint256"}],
        "stateMutability": "view",
    }
]
#: Permit2's ``invalidateUnorderedNonces(uint256 wordPos, uint256 mask)``: the sender spends its own
#: nonces (the set bits of ``mask`` in word ``wordPos``) without moving anything.
INVALIDATE_UNORDERED_NONCES_ABI: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "invalidateUnorderedNonces",
        "inputs": [{"name": "wordPos", "type": "uint256"}, {"name": "mask", "type": "uint256"}],
        "outputs": [],
        "stateMutability": "nonpayable",
    }
]
#: ``event UnorderedNonceInvalidation(address indexed owner, uint256 word, uint256 mask)``.
NONCE_INVALIDATION_TOPIC = "0x" + keccak(text="UnorderedNonceInvalidation(address,uint256,uint256)").hex()
_PERMIT2_ADDRESS_ABI: list[dict[str, Any]] = [
    {"type": "function", "name": "PERMIT2", "inputs": [], "outputs": [{"type": "address"}], "stateMutability": "view"}
]

_DOMAIN_FIELDS = [
    {"name": "name", "type": "string"},
    {"name": "chainId", "type": "uint256"},
    {"name": "verifyingContract", "type": "address"},
]
#: Each proxy's settle functions' ABIs and the witness its payers sign.
_PROXIES: dict[str, tuple[list[dict[str, Any]], dict[str, list[dict[str, str]]]]] = {
    EXACT_PROXY: (
        X402_EXACT_PERMIT2_PROXY_ABI + X402_EXACT_PERMIT2_PROXY_SETTLE_WITH_PERMIT_ABI,
        PERMIT2_WITNESS_TYPES,
    ),
    UPTO_PROXY: (
        X402_UPTO_PERMIT2_PROXY_ABI + X402_UPTO_PERMIT2_PROXY_SETTLE_WITH_PERMIT_ABI,
        UPTO_PERMIT2_WITNESS_TYPES,
    ),
}


def _abi_type(item: dict[str, Any]) -> str:
    """The canonical ABI type of an input, tuples spelled out (``((address,uint256),uint256,uint256)``)."""
    if item["type"] == "tuple":
        return "(" + ",".join(_abi_type(c) for c in item["components"]) + ")"
    return str(item["type"])


def _selectors(abis: list[list[dict[str, Any]]]) -> FunctionTable:
    table: FunctionTable = {}
    for abi in abis:
        for entry in abi:
            inputs = [_abi_type(item) for item in entry["inputs"]]
            outputs = [_abi_type(item) for item in entry["outputs"]]
            table[keccak(text=f"{entry['name']}({','.join(inputs)})")[:4]] = (entry["name"], inputs, outputs)
    return table


class Permit2Contracts:
    """Permit2 and x402's exact and upto Permit2 proxies, over a ``DevLedger``.

    Plugged into ``LedgerEvmSigner(contracts=[...])``: the signer sends it every call, eth_call
    and transaction addressed to one of ``addresses``, and asks it for the token's Permit2
    allowance and for the receipts of the transactions it made.
    """

    def __init__(
        self,
        ledger: DevLedger,
        *,
        network: str = DEV_NETWORK,
        chain_id: int = DEV_CHAIN_ID,
        tokens: dict[str, TokenInfo] | None = None,
        trust_signatures: bool = False,
    ) -> None:
        self.ledger = ledger
        self.network = network
        self.chain_id = chain_id
        self.tokens = {to_checksum_address(a) for a in (tokens or default_tokens(network))}
        self.trust_signatures = trust_signatures
        self.addresses: frozenset[str] = frozenset({PERMIT2, EXACT_PROXY, UPTO_PROXY})
        abis = [NONCE_BITMAP_ABI, INVALIDATE_UNORDERED_NONCES_ABI, _PERMIT2_ADDRESS_ABI]
        abis += [abi for abi, _ in _PROXIES.values()]
        self.functions = _selectors(abis)
        with ledger.contract_transaction() as db:
            db.table("permit2_nonces").create(
                {"network": str, "owner": str, "word_pos": str, "bit": int, "nonce": str, "tx_hash": str},
                pk=("network", "owner", "nonce"),
                if_not_exists=True,
            )
            db.table("permit2_settlements").create(
                {
                    "tx_hash": str,
                    "network": str,
                    "asset": str,
                    "from_address": str,
                    "to_address": str,
                    "amount": str,
                    "permitted_amount": str,
                    "nonce": str,
                    "deadline": str,
                    "valid_after": str,
                    "proxy": str,
                    "facilitator": str,
                    "with_permit": int,
                    "created_at": str,
                },
                pk="tx_hash",
                if_not_exists=True,
            )
            db.table("permit2_invalidations").create(
                {"tx_hash": str, "network": str, "owner": str, "word_pos": str, "mask": str, "created_at": str},
                pk="tx_hash",
                if_not_exists=True,
            )

    # -- what the signer asks ------------------------------------------------

    def allowance(self, owner: str, spender: str) -> int:
        """The allowance rule (see the module docstring): Permit2 may spend anything, no one else anything."""
        return MAX_UINT256 if to_checksum_address(spender) == PERMIT2 else 0

    def call(self, target: str, function_name: str, args: tuple[Any, ...], sender: str) -> Any:
        """An ``eth_call``: a view's answer, or a settle checked to the end and not applied."""
        target = to_checksum_address(target)
        if target == PERMIT2 and function_name == "nonceBitmap":
            return self.nonce_bitmap(args[0], int(args[1]))
        if target in _PROXIES and function_name == "PERMIT2":
            return PERMIT2
        if target in _PROXIES and function_name in ("settle", "settleWithPermit"):
            self._settle(target, function_name, args, sender, apply=False)
            return None
        raise LedgerRevert(f"{target} does not implement {function_name}")

    def transact(self, target: str, function_name: str, args: tuple[Any, ...], sender: str) -> str:
        """A transaction from ``sender``: a proxy's settle, applied; returns its hash or reverts."""
        target = to_checksum_address(target)
        if target == PERMIT2 and function_name == "invalidateUnorderedNonces":
            return self._invalidate(to_checksum_address(sender), int(args[0]), int(args[1]))
        if target not in _PROXIES or function_name not in ("settle", "settleWithPermit"):
            raise LedgerRevert(f"dev chain cannot execute {function_name} on {target}")
        return self._settle(target, function_name, args, sender, apply=True)

    def receipt(self, tx_hash: str) -> tuple[str, list[dict[str, Any]]] | None:
        """``(to, logs)`` of a transaction this made, or None."""
        row = self.settlement(tx_hash)
        if row is not None:
            return row["proxy"], settlement_logs(row)
        with self.ledger.contract_transaction() as db:
            rows = list(db["permit2_invalidations"].rows_where("tx_hash = ?", [tx_hash.lower()]))
        return (PERMIT2, invalidation_logs(rows[0])) if rows else None

    def logs(self) -> list[dict[str, Any]]:
        """Every log of every transaction, settlements first."""
        logs = [log for row in self.settlements() for log in settlement_logs(row)]
        with self.ledger.contract_transaction() as db:
            invalidations = list(db["permit2_invalidations"].rows_where(order_by="rowid"))
        return logs + [log for row in invalidations for log in invalidation_logs(row)]

    # -- state ---------------------------------------------------------------

    def nonce_bitmap(self, owner: str, word_pos: int) -> int:
        with self.ledger.contract_transaction() as db:
            return self._bitmap(db, to_checksum_address(owner), word_pos)

    def nonce_used(self, owner: str, nonce: int) -> bool:
        return bool(self.nonce_bitmap(owner, nonce >> 8) >> (nonce & 0xFF) & 1)

    def _invalidate(self, owner: str, word_pos: int, mask: int) -> str:
        """``invalidateUnorderedNonces``: set the bits of ``mask`` (already set ones stay set)."""
        created_at = datetime.now(UTC).isoformat()
        with self.ledger.contract_transaction() as db:
            count = db.execute("SELECT count(*) FROM permit2_invalidations").fetchone()[0]
            tx_hash = "0x" + keccak(text=f"a2a-gate-dev-permit2-invalidate|{self.network}|{owner}|{count}").hex()
            spent = self._bitmap(db, owner, word_pos)
            for bit in range(256):
                if mask >> bit & 1 and not spent >> bit & 1:
                    nonce = (word_pos << 8) | bit
                    db.execute(
                        "INSERT INTO permit2_nonces (network, owner, word_pos, bit, nonce, tx_hash)"
                        " VALUES (?, ?, ?, ?, ?, ?)",
                        [self.network, owner, str(word_pos), bit, str(nonce), tx_hash],
                    )
            db.table("permit2_invalidations").insert(
                {
                    "tx_hash": tx_hash,
                    "network": self.network,
                    "owner": owner,
                    "word_pos": str(word_pos),
                    "mask": str(mask),
                    "created_at": created_at,
                }
            )
        return tx_hash

    def _bitmap(self, db: Database, owner: str, word_pos: int) -> int:
        rows = db.execute(
            "SELECT bit FROM permit2_nonces WHERE network = ? AND owner = ? AND word_pos = ?",
            [self.network, owner, str(word_pos)],
        ).fetchall()
        return sum(1 << bit for (bit,) in rows)

    def settlement(self, tx_hash: str) -> dict[str, Any] | None:
        with self.ledger.contract_transaction() as db:
            rows = list(db["permit2_settlements"].rows_where("tx_hash = ?", [tx_hash.lower()]))
        return rows[0] if rows else None

    def settlements(self) -> list[dict[str, Any]]:
        """Every Permit2 settlement, oldest first."""
        with self.ledger.contract_transaction() as db:
            return list(db["permit2_settlements"].rows_where(order_by="rowid"))

    # -- the contracts -------------------------------------------------------

    def _settle(self, proxy: str, function_name: str, args: tuple[Any, ...], sender: str, *, apply: bool) -> str:
        """x402 proxy ``settle``/``settleWithPermit``, then Permit2's ``permitWitnessTransferFrom``.

        Returns the transaction hash, or "" for an eth_call (checked to the end, then rolled back).
        """
        s = _Settle.parse(proxy, function_name, args)
        if proxy == UPTO_PROXY:
            if s.amount > s.permitted:
                raise LedgerRevert("AmountExceedsPermitted()")
            if to_checksum_address(sender) != s.facilitator:
                raise LedgerRevert("UnauthorizedFacilitator()")
        if s.permit2612_value is not None and s.permit2612_value != s.permitted:
            # The EIP-2612 permit changes nothing else here: Permit2's allowance is already unlimited.
            raise LedgerRevert("Permit2612AmountMismatch()")
        now = int(time.time())
        if s.amount == 0:
            raise LedgerRevert("InvalidAmount()")
        if s.owner == _ZERO_ADDRESS:
            raise LedgerRevert("InvalidOwner()")
        if s.to == _ZERO_ADDRESS:
            raise LedgerRevert("InvalidDestination()")
        if now < s.valid_after:
            raise LedgerRevert("PaymentTooEarly()")
        tx_hash = "0x" + keccak(text=f"a2a-gate-dev-permit2|{self.network}|{s.owner}|{s.nonce}").hex()
        witness: dict[str, Any] = {"to": s.to, "validAfter": s.valid_after}
        if proxy == UPTO_PROXY:
            witness["facilitator"] = s.facilitator
        with self.ledger.contract_transaction(commit=apply) as db:  # an eth_call rolls back
            self.permit_witness_transfer_from(
                db,
                PermitWitnessTransfer(
                    owner=s.owner,
                    token=s.token,
                    permitted=s.permitted,
                    nonce=s.nonce,
                    deadline=s.deadline,
                    spender=proxy,
                    to=s.to,
                    amount=s.amount,
                    witness_types=_PROXIES[proxy][1],
                    witness=witness,
                    signature=s.signature,
                ),
                tx_hash,
            )
            db.table("permit2_settlements").insert(
                {
                    "tx_hash": tx_hash,
                    "network": self.network,
                    "asset": s.token,
                    "from_address": s.owner,
                    "to_address": s.to,
                    "amount": str(s.amount),
                    "permitted_amount": str(s.permitted),
                    "nonce": str(s.nonce),
                    "deadline": str(s.deadline),
                    "valid_after": str(s.valid_after),
                    "proxy": proxy,
                    "facilitator": s.facilitator,
                    "with_permit": int(s.permit2612_value is not None),
                    "created_at": datetime.now(UTC).isoformat(),
                }
            )
        return tx_hash if apply else ""

    def permit_witness_transfer_from(self, db: Database, p: PermitWitnessTransfer, tx_hash: str) -> None:
        """Permit2's ``permitWitnessTransferFrom`` as a contract calls it, inside the caller's
        ``contract_transaction`` (``db``), in Permit2's order: the deadline, the amount within the
        permit, the nonce spent once (``InvalidNonce()``), the owner's signature over the permit with
        the caller as spender (``recover_permit2``: 65 or 64 bytes, any s, v 27/28), the token's
        ``transferFrom`` to ``p.to``. x402's proxies call it, and so may any other contract the dev
        chain plays, so that one owner's nonces are spent from one bitmap whoever the spender.
        """
        if int(time.time()) > p.deadline:
            raise LedgerRevert(f"SignatureExpired({p.deadline})")
        if p.amount > p.permitted:
            raise LedgerRevert(f"InvalidAmount({p.permitted})")
        if self._bitmap(db, p.owner, p.nonce >> 8) >> (p.nonce & 0xFF) & 1:
            raise LedgerRevert("InvalidNonce()")
        if not self.trust_signatures and recover_permit2(self._digest(p), p.signature) != p.owner:
            raise LedgerRevert("InvalidSigner()")
        if p.token not in self.tokens:
            raise LedgerRevert(f"{p.token} has no contract code in the dev ledger")
        self.ledger.move(self.network, p.token, p.owner, p.to, p.amount)  # the token's transferFrom
        db.execute(
            "INSERT INTO permit2_nonces (network, owner, word_pos, bit, nonce, tx_hash) VALUES (?, ?, ?, ?, ?, ?)",
            [self.network, p.owner, str(p.nonce >> 8), p.nonce & 0xFF, str(p.nonce), tx_hash],
        )

    def _digest(self, p: PermitWitnessTransfer) -> bytes:
        """The EIP-712 digest Permit2 checks: its own domain (no version), the caller as spender, its witness."""
        signable = encode_typed_data(
            full_message={
                "types": {"EIP712Domain": _DOMAIN_FIELDS, **p.witness_types},
                "primaryType": "PermitWitnessTransferFrom",
                "domain": {"name": "Permit2", "chainId": self.chain_id, "verifyingContract": PERMIT2},
                "message": {
                    "permitted": {"token": p.token, "amount": p.permitted},
                    "spender": p.spender,
                    "nonce": p.nonce,
                    "deadline": p.deadline,
                    "witness": p.witness,
                },
            }
        )
        return keccak(b"\x19" + signable.version + signable.header + signable.body)


@dataclass(frozen=True)
class PermitWitnessTransfer:
    """One ``permitWitnessTransferFrom``: the signed permit, the caller (spender) and where the tokens go."""

    owner: str
    token: str
    permitted: int
    nonce: int
    deadline: int
    spender: str
    to: str
    amount: int
    witness_types: dict[str, list[dict[str, str]]]
    witness: dict[str, Any]
    signature: bytes


@dataclass(frozen=True)
class _Settle:
    """One settle call's arguments, decoded: the same for both proxies and both functions."""

    proxy: str
    token: str
    permitted: int
    nonce: int
    deadline: int
    amount: int  # what the proxy asks Permit2 to move: the upto caller's choice, exact's permitted amount
    owner: str
    to: str
    facilitator: str  # upto's witness names who may settle; exact's has no such field
    valid_after: int
    signature: bytes
    permit2612_value: int | None  # settleWithPermit's EIP-2612 permit value

    @classmethod
    def parse(cls, proxy: str, function_name: str, args: tuple[Any, ...]) -> _Settle:
        permit2612_value = None
        if function_name == "settleWithPermit":
            permit2612_value, args = int(args[0][0]), args[1:]
        if proxy == UPTO_PROXY:  # (permit, amount, owner, witness(to, facilitator, validAfter), signature)
            permit, amount, owner, (to, facilitator, valid_after), signature = args
        else:  # (permit, owner, witness(to, validAfter), signature)
            permit, owner, (to, valid_after), signature = args
            amount, facilitator = permit[0][1], _ZERO_ADDRESS
        (token, permitted), nonce, deadline = permit
        return cls(
            proxy=proxy,
            token=to_checksum_address(token),
            permitted=int(permitted),
            nonce=int(nonce),
            deadline=int(deadline),
            amount=int(amount),
            owner=to_checksum_address(owner),
            to=to_checksum_address(to),
            facilitator=to_checksum_address(facilitator),
            valid_after=int(valid_after),
            signature=bytes(signature),
            permit2612_value=permit2612_value,
        )


def invalidation_logs(row: dict[str, Any]) -> list[dict[str, Any]]:
    """What ``invalidateUnorderedNonces`` emits: ``UnorderedNonceInvalidation(owner, word, mask)``."""
    data = "0x" + int(row["word_pos"]).to_bytes(32, "big").hex() + int(row["mask"]).to_bytes(32, "big").hex()
    topics = [NONCE_INVALIDATION_TOPIC, address_topic(row["owner"])]
    return [log_entry(PERMIT2, topics, data, row["tx_hash"], 0)]


def settlement_logs(row: dict[str, Any]) -> list[dict[str, Any]]:
    """What a proxy settle emits, in order: the token's ``Transfer``, then the proxy's ``Settled()``."""
    tx_hash, value = row["tx_hash"], "0x" + int(row["amount"]).to_bytes(32, "big").hex()
    moved = [TRANSFER_TOPIC, address_topic(row["from_address"]), address_topic(row["to_address"])]
    settled = SETTLED_WITH_PERMIT_TOPIC if row.get("with_permit") else SETTLED_TOPIC
    return [log_entry(row["asset"], moved, value, tx_hash, 0), log_entry(row["proxy"], [settled], "0x", tx_hash, 1)]
