"""The simulated chain behind the development facilitator.

The x402 package's exact-EVM facilitator schemes (v2 and v1) never touch a
node themselves: they talk to a ``FacilitatorEvmSigner``, calling
``balanceOf``, ``authorizationState``, ``transferWithAuthorization`` and the
like through it. ``LedgerEvmSigner`` is such a signer, but it answers from the
SQLite ledger (``devnet.ledger``) instead of an RPC node, playing a
FiatToken (USDC) contract on Base Sepolia. The HTTP side lives in
``devnet.facilitator``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_account.typed_transactions import TypedTransaction
from eth_keys import keys
from eth_utils import keccak, to_checksum_address
from hexbytes import HexBytes
from x402.mechanisms.evm.constants import (
    AUTHORIZATION_STATE_ABI,
    BALANCE_OF_ABI,
    EIP1271_MAGIC_VALUE,
    ERC20_ALLOWANCE_ABI,
    IS_VALID_SIGNATURE_ABI,
    MULTICALL3_ADDRESS,
    NAME_ABI,
    PERMIT2_ADDRESS,
    TRANSFER_WITH_AUTHORIZATION_BYTES_ABI,
    TRANSFER_WITH_AUTHORIZATION_VRS_ABI,
    TX_STATUS_SUCCESS,
    VERSION_ABI,
)
from x402.mechanisms.evm.default_assets import DEFAULT_ASSETS
from x402.mechanisms.evm.eip712 import hash_eip3009_authorization
from x402.mechanisms.evm.exact.eip3009_utils import ERC20_TRANSFER_EVENT_TOPIC
from x402.mechanisms.evm.types import (
    ExactEIP3009Authorization,
    TransactionReceipt,
    TypedDataDomain,
    TypedDataField,
)

from .ledger import REVERT_NONCE_USED, DevLedger, LedgerRevert, Transfer

__all__ = [
    "AUTHORIZATION_CANCELED_TOPIC",
    "AUTHORIZATION_USED_TOPIC",
    "DEV_CHAIN_ID",
    "DEV_NETWORK",
    "DEV_NETWORK_V1",
    "FACILITATOR_ADDRESS",
    "REVERT_INVALID_SIGNATURE",
    "TRANSFER_TOPIC",
    "ChainRpc",
    "FunctionTable",
    "JsonRpcError",
    "LedgerEvmSigner",
    "SimulatedContracts",
    "TokenInfo",
    "cancel_authorization_digest",
    "default_tokens",
]

DEV_NETWORK = "eip155:84532"  # Base Sepolia, CAIP-2 (x402 v2)
DEV_NETWORK_V1 = "base-sepolia"  # the same chain under its x402 v1 name
DEV_CHAIN_ID = 84532

#: The address the facilitator claims to send transactions from (it never signs any).
FACILITATOR_ADDRESS = to_checksum_address(keccak(text="a2a-gate dev facilitator")[-20:])

# Not in devnet.ledger: the ledger is pure state, signatures are the token's business.
REVERT_INVALID_SIGNATURE = "FiatTokenV2: invalid signature"

# Stand-in bytecode: only its non-emptiness matters to the x402 package.
_TOKEN_CODE = bytes.fromhex("6080604052")
PERMIT2 = to_checksum_address(PERMIT2_ADDRESS)
_TRUSTING_WALLET_CODE = bytes.fromhex("ef0100")


@dataclass(frozen=True)
class TokenInfo:
    """What the simulated token contract reports about itself (its EIP-712 domain)."""

    name: str
    version: str
    decimals: int = 6
    symbol: str = ""


def default_tokens(network: str = DEV_NETWORK) -> dict[str, TokenInfo]:
    """The x402 package's default assets, so token names and versions match its clients."""
    return {
        to_checksum_address(entry["asset"]): TokenInfo(
            name=entry["name"],
            version=entry["version"],
            decimals=entry["decimals"],
            symbol=entry["symbol"],
        )
        for entry in DEFAULT_ASSETS.get(network, [])
    }


#: Selector -> (name, input types, output types).
FunctionTable = dict[bytes, tuple[str, list[str], list[str]]]


class SimulatedContracts(Protocol):
    """Contracts the dev chain plays beside its tokens (``devnet.permit2``: Permit2 and x402's proxies;
    ``devnet.batch_settlement``: the payment-channel contract).

    ``LedgerEvmSigner`` sends them the calls and transactions addressed to one of ``addresses``,
    asks them for the token allowances they hold, and for the receipts of what they did.
    """

    addresses: frozenset[str]
    functions: FunctionTable  # the selectors eth_call may name

    def call(self, target: str, function_name: str, args: tuple[Any, ...], sender: str) -> Any: ...

    def transact(self, target: str, function_name: str, args: tuple[Any, ...], sender: str) -> str: ...

    def allowance(self, owner: str, spender: str) -> int: ...

    def receipt(self, tx_hash: str) -> tuple[str, list[dict[str, Any]]] | None: ...

    def logs(self) -> list[dict[str, Any]]: ...


def _function_table() -> FunctionTable:
    """Selector -> (name, input types, output types) for the calls multicall may batch."""
    abis: list[list[dict[str, Any]]] = [
        BALANCE_OF_ABI,
        NAME_ABI,
        VERSION_ABI,
        AUTHORIZATION_STATE_ABI,
        ERC20_ALLOWANCE_ABI,
        IS_VALID_SIGNATURE_ABI,
        TRANSFER_WITH_AUTHORIZATION_VRS_ABI,
        TRANSFER_WITH_AUTHORIZATION_BYTES_ABI,
    ]
    table: dict[bytes, tuple[str, list[str], list[str]]] = {}
    for abi in abis:
        for entry in abi:
            inputs = [item["type"] for item in entry["inputs"]]
            outputs = [item["type"] for item in entry["outputs"]]
            selector = keccak(text=f"{entry['name']}({','.join(inputs)})")[:4]
            table[selector] = (entry["name"], inputs, outputs)
    return table


_FUNCTIONS = _function_table()
_ERROR_STRING_SELECTOR = keccak(text="Error(string)")[:4]


#: secp256k1's group order; OpenZeppelin's ECDSA and Circle's ECRecover take ``s`` up to half of it.
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
HALF_N = SECP256K1_N // 2
_LOW_255_BITS = (1 << 255) - 1

# Circle's ECRecover (FiatToken's SignatureChecker, EOA path): each non-canonical form reverts with its reason.
REVERT_ECRECOVER_LENGTH = "ECRecover: invalid signature length"
REVERT_ECRECOVER_S = "ECRecover: invalid signature 's' value"
REVERT_ECRECOVER_V = "ECRecover: invalid signature 'v' value"
REVERT_ECRECOVER_NOBODY = "ECRecover: invalid signature"
# Uniswap Permit2's SignatureVerification (EOA path).
REVERT_PERMIT2_LENGTH = "InvalidSignatureLength()"
REVERT_PERMIT2_NOBODY = "InvalidSignature()"


@functools.lru_cache(maxsize=4096)
def ecrecover(digest: bytes, v: int, r: int, s: int) -> str | None:
    """The EVM's ecrecover precompile: the signer's checksummed address, or None where the precompile
    gives ``address(0)``: ``v`` not 27 or 28, ``r`` or ``s`` zero or not below n, no point for ``r``.
    Any ``s`` in (0, n) recovers, the high half too: the precompile leaves malleability to its callers.

    Cached because verify and settle recover the same signature, and the pure-Python secp256k1
    backend costs milliseconds per recovery.
    """
    if v not in (27, 28) or not (0 < r < SECP256K1_N and 0 < s < SECP256K1_N):
        return None
    try:
        return keys.Signature(vrs=(v - 27, r, s)).recover_public_key_from_msg_hash(digest).to_checksum_address()
    except Exception:  # noqa: BLE001 -- no point has this r: the precompile returns zero
        return None


def _rsv(signature: bytes) -> tuple[int, int, int]:
    """A 65-byte ``r || s || v`` signature's parts, as Solidity reads them."""
    return int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:64], "big"), signature[64]


def recover_ecdsa(digest: bytes, signature: bytes) -> tuple[str | None, str]:
    """OpenZeppelin's ``ECDSA.tryRecover`` / ``tryRecoverCalldata`` (v5.5, as x402BatchSettlement
    builds it): ``(signer, "")``, or ``(None, error)`` with the error ``recover`` / ``recoverCalldata``
    revert with. Exactly 65 bytes (no EIP-2098 compact form), ``s <= n/2``, then ecrecover (so ``v``
    27 or 28, a signer that is not ``address(0)``)."""
    if len(signature) != 65:
        return None, f"ECDSAInvalidSignatureLength({len(signature)})"
    r, s, v = _rsv(signature)
    if s > HALF_N:
        return None, f"ECDSAInvalidSignatureS(0x{s:064x})"
    signer = ecrecover(digest, v, r, s)
    return (signer, "") if signer is not None else (None, "ECDSAInvalidSignature()")


def recover_fiattoken(digest: bytes, signature: bytes) -> str:
    """Circle's ``ECRecover.recover`` (FiatToken's EIP-3009 functions, an EOA signer): the signer, or
    ``LedgerRevert`` with ECRecover's own reason: 65 bytes, ``s <= n/2``, ``v`` 27 or 28, a signer."""
    if len(signature) != 65:
        raise LedgerRevert(REVERT_ECRECOVER_LENGTH)
    r, s, v = _rsv(signature)
    if s > HALF_N:
        raise LedgerRevert(REVERT_ECRECOVER_S)
    if v not in (27, 28):
        raise LedgerRevert(REVERT_ECRECOVER_V)
    signer = ecrecover(digest, v, r, s)
    if signer is None:
        raise LedgerRevert(REVERT_ECRECOVER_NOBODY)
    return signer


def recover_permit2(digest: bytes, signature: bytes) -> str:
    """Uniswap Permit2's ``SignatureVerification.verify`` for an EOA: the signer, or ``LedgerRevert``.

    65 bytes ``r || s || v`` or EIP-2098's 64 bytes ``r || vs``; anything else is
    ``InvalidSignatureLength()``. No bound on ``s`` (Permit2 takes the high-s twin, as ecrecover does);
    ``v`` other than 27/28 recovers nobody: ``InvalidSignature()``. The caller compares the signer
    with the owner (``InvalidSigner()``).
    """
    if len(signature) == 65:
        r, s, v = _rsv(signature)
    elif len(signature) == 64:
        r, vs = int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
        s, v = vs & _LOW_255_BITS, (vs >> 255) + 27
    else:
        raise LedgerRevert(REVERT_PERMIT2_LENGTH)
    signer = ecrecover(digest, v, r, s)
    if signer is None:
        raise LedgerRevert(REVERT_PERMIT2_NOBODY)
    return signer


class LedgerEvmSigner:
    """``FacilitatorEvmSigner`` that plays the token contract over a ``DevLedger``.

    The x402 schemes call it exactly as they would call a web3 signer; it
    answers like a FiatToken (USDC) contract on ``chain_id``. Code paths the
    dev ledger cannot honour (ERC-6492 wallet deployment, Permit2 settlement,
    arbitrary contracts) revert, which the schemes report as an ordinary
    invalid payment or failed settlement.

    With ``trust_signatures`` every non-token address looks like a smart
    wallet whose EIP-1271 ``isValidSignature`` accepts anything, and the token
    skips its own signature check. That is how the mode skips recovery without
    touching the package's verification logic.
    """

    def __init__(
        self,
        ledger: DevLedger,
        *,
        network: str = DEV_NETWORK,
        chain_id: int = DEV_CHAIN_ID,
        tokens: dict[str, TokenInfo] | None = None,
        trust_signatures: bool = False,
        address: str = FACILITATOR_ADDRESS,
        contracts: Sequence[SimulatedContracts] = (),
    ) -> None:
        self.ledger = ledger
        self.network = network
        self.chain_id = chain_id
        self.tokens = {to_checksum_address(a): info for a, info in (tokens or default_tokens(network)).items()}
        self.trust_signatures = trust_signatures
        self.address = to_checksum_address(address)
        self.contracts = {a: c for c in contracts for a in c.addresses}
        self.functions: FunctionTable = {**_FUNCTIONS}
        for c in contracts:
            self.functions.update(c.functions)

    # -- FacilitatorEvmSigner ------------------------------------------------

    def get_addresses(self) -> list[str]:
        return [self.address]

    def get_chain_id(self) -> int:
        return self.chain_id

    def get_code(self, address: str) -> bytes:
        if to_checksum_address(address) in self.tokens or to_checksum_address(address) in self.contracts:
            return _TOKEN_CODE
        return _TRUSTING_WALLET_CODE if self.trust_signatures else b""

    def get_balance(self, address: str, token_address: str) -> int:
        return self.ledger.balance_of(self.network, token_address, address)

    def read_contract(self, address: str, abi: list[dict[str, Any]], function_name: str, *args: Any) -> Any:
        return self._call(address, function_name, args)

    def write_contract(
        self,
        address: str,
        abi: list[dict[str, Any]],
        function_name: str,
        *args: Any,
        data_suffix: str | None = None,
    ) -> str:
        contract = self.contracts.get(to_checksum_address(address))
        if contract is not None:
            return contract.transact(address, function_name, args, self.address)
        token = self.tokens.get(to_checksum_address(address))
        if token is None or function_name != "transferWithAuthorization":
            raise LedgerRevert(f"dev ledger cannot execute {function_name} on {address}")
        transfer, signature = self._transfer_from_args(address, args)
        self._authorize(token, transfer, signature)
        return self.ledger.transfer_with_authorization(transfer)

    def send_transaction(self, to: str, data: bytes) -> str:
        # Only ERC-6492 factory deployments get here.
        raise LedgerRevert("dev ledger cannot deploy smart wallets (ERC-6492)")

    def wait_for_transaction_receipt(self, tx_hash: str) -> TransactionReceipt:
        row = self.ledger.settlement(tx_hash)
        if row is None:
            found = self.contract_receipt(tx_hash)
            if found is not None:
                return TransactionReceipt(status=TX_STATUS_SUCCESS, block_number=1, tx_hash=tx_hash, logs=found[1])
            raise RuntimeError(f"transaction {tx_hash} not found in the dev ledger")
        return TransactionReceipt(
            status=TX_STATUS_SUCCESS, block_number=1, tx_hash=tx_hash, logs=transfer_logs(row, row["tx_hash"])
        )

    def verify_typed_data(
        self,
        address: str,
        domain: TypedDataDomain,
        types: dict[str, list[TypedDataField]],
        primary_type: str,
        message: dict[str, Any],
        signature: bytes,
    ) -> bool:
        """EOA-only EIP-712 check, in the form the verifying contract takes: Permit2's rules for Permit2's
        domain (``recover_permit2``), OpenZeppelin's ``SignatureChecker`` (``recover_ecdsa``: 65 bytes,
        low s, v 27/28) for any other. The x402 schemes do their own checks; this is for callers of the
        signer interface."""
        if self.trust_signatures:
            return True
        domain_data: dict[str, Any]
        if isinstance(domain, dict):
            domain_data = domain
        else:
            domain_data = {
                "name": domain.name,
                "version": domain.version,
                "chainId": domain.chain_id,
                "verifyingContract": domain.verifying_contract,
            }
        message_types = {
            name: [{"name": f.name, "type": f.type} if isinstance(f, TypedDataField) else f for f in fields]
            for name, fields in types.items()
            if name != "EIP712Domain"
        }
        data = {key: "0x" + value.hex() if isinstance(value, bytes) else value for key, value in message.items()}
        try:
            signable = encode_typed_data(domain_data=domain_data, message_types=message_types, message_data=data)
            digest = keccak(b"\x19" + signable.version + signable.header + signable.body)
            if to_checksum_address(str(domain_data.get("verifyingContract", ""))) == PERMIT2:
                recovered: str | None = recover_permit2(digest, bytes(signature))
            else:
                recovered, _ = recover_ecdsa(digest, bytes(signature))
        except Exception:  # noqa: BLE001 -- any malformed typed data or signature is not a valid one
            return False
        return recovered is not None and recovered.lower() == address.lower()

    # -- transactions sent to the token directly, not through the facilitator --

    def cancel_authorization(self, asset: str, authorizer: str, nonce: bytes | str, signature: bytes) -> str:
        """EIP-3009 ``cancelAuthorization``: the authorizer's signed CancelAuthorization spends the
        nonce, and no funds move. Returns the transaction hash; reverts like the token."""
        token = self.tokens.get(to_checksum_address(asset))
        if token is None:
            raise LedgerRevert(f"{asset} has no contract code in the dev ledger")
        if self.ledger.authorization_state(self.network, asset, authorizer, nonce):
            raise LedgerRevert(REVERT_NONCE_USED)
        if not self.trust_signatures:
            digest = cancel_authorization_digest(token, self.chain_id, asset, authorizer, nonce)
            if recover_fiattoken(digest, bytes(signature)) != to_checksum_address(authorizer):
                raise LedgerRevert(REVERT_INVALID_SIGNATURE)
        return self.ledger.cancel_authorization(self.network, asset, authorizer, nonce)

    def submit_transfer(self, transfer: Transfer, signature: bytes) -> str:
        """``transferWithAuthorization`` sent by anyone holding the signed authorization (the
        facilitator is not the only one who can): the same checks, the same transfer."""
        token = self.tokens.get(to_checksum_address(transfer.asset))
        if token is None:
            raise LedgerRevert(f"{transfer.asset} has no contract code in the dev ledger")
        self._authorize(token, transfer, signature)
        return self.ledger.transfer_with_authorization(transfer)

    def contract_receipt(self, tx_hash: str) -> tuple[str, list[dict[str, Any]]] | None:
        """``(to, logs)`` of a transaction one of the simulated contracts made, or None."""
        for contract in set(self.contracts.values()):
            found = contract.receipt(tx_hash)
            if found is not None:
                return found
        return None

    # -- the simulated contracts ---------------------------------------------

    def _call(self, address: str, function_name: str, args: tuple[Any, ...], sender: str | None = None) -> Any:
        target = to_checksum_address(address)
        if target == MULTICALL3_ADDRESS and function_name == "tryAggregate":
            return self._try_aggregate(args[1])
        if target in self.contracts:
            return self.contracts[target].call(target, function_name, args, sender or self.address)
        token = self.tokens.get(target)
        if token is not None:
            return self._token_call(target, token, function_name, args)
        if self.trust_signatures and function_name == "isValidSignature":
            return EIP1271_MAGIC_VALUE
        raise LedgerRevert(f"{target} has no contract code in the dev ledger")

    def _token_call(self, asset: str, token: TokenInfo, function_name: str, args: tuple[Any, ...]) -> Any:
        if function_name == "balanceOf":
            return self.ledger.balance_of(self.network, asset, args[0])
        if function_name == "authorizationState":
            return self.ledger.authorization_state(self.network, asset, args[0], args[1])
        if function_name == "transferWithAuthorization":  # eth_call: check, do not apply
            transfer, signature = self._transfer_from_args(asset, args)
            self._authorize(token, transfer, signature)
            self.ledger.check_transfer(transfer)
            return None
        if function_name == "name":
            return token.name
        if function_name == "version":
            return token.version
        if function_name == "symbol":
            return token.symbol
        if function_name == "decimals":
            return token.decimals
        if function_name == "allowance":  # no approvals but those the simulated contracts hold
            return max((c.allowance(args[0], args[1]) for c in self.contracts.values()), default=0)
        raise LedgerRevert(f"dev token does not implement {function_name}")

    def _transfer_from_args(self, asset: str, args: tuple[Any, ...]) -> tuple[Transfer, bytes]:
        if len(args) == 9:  # (from, to, value, validAfter, validBefore, nonce, v, r, s)
            v, r, s = args[6], args[7], args[8]
            signature = bytes(r) + bytes(s) + bytes([int(v)])
        elif len(args) == 7:  # (from, to, value, validAfter, validBefore, nonce, signature)
            signature = bytes(args[6])
        else:
            raise LedgerRevert("transferWithAuthorization: wrong number of arguments")
        transfer = Transfer.create(
            network=self.network,
            asset=asset,
            from_address=args[0],
            to_address=args[1],
            value=args[2],
            valid_after=args[3],
            valid_before=args[4],
            nonce=bytes(args[5]),
        )
        return transfer, signature

    def _authorize(self, token: TokenInfo, transfer: Transfer, signature: bytes) -> None:
        """FiatToken's checks before the transfer, in its order: the window and the nonce
        (``DevLedger.check_authorization``), then the signature against its real EIP-712 domain, an EOA's
        through Circle's ``ECRecover`` (``recover_fiattoken``: 65 bytes, low s, v 27/28)."""
        self.ledger.check_authorization(transfer)
        if self.trust_signatures:
            return
        authorization = ExactEIP3009Authorization(
            from_address=transfer.from_address,
            to=transfer.to_address,
            value=str(transfer.value),
            valid_after=str(transfer.valid_after),
            valid_before=str(transfer.valid_before),
            nonce=transfer.nonce,
        )
        digest = hash_eip3009_authorization(authorization, self.chain_id, transfer.asset, token.name, token.version)
        if recover_fiattoken(digest, signature) != transfer.from_address:
            raise LedgerRevert(REVERT_INVALID_SIGNATURE)

    def _try_aggregate(self, calls: list[tuple[str, bytes]]) -> list[tuple[bool, bytes]]:
        """Multicall3 ``tryAggregate(false, calls)``: each call succeeds or reverts alone."""
        results = []
        for target, call_data in calls:
            entry = self.functions.get(bytes(call_data[:4]))
            if entry is None:
                results.append((False, _encode_revert("unknown function selector")))
                continue
            name, input_types, output_types = entry
            try:
                args = tuple(abi_decode(input_types, bytes(call_data[4:])))
                value = self._call(target, name, args)
                encoded = _encode_outputs(output_types, value)
                results.append((True, encoded))
            except LedgerRevert as exc:
                results.append((False, _encode_revert(exc.reason)))
            except Exception as exc:  # noqa: BLE001 -- a failing call reverts, as on chain
                results.append((False, _encode_revert(str(exc))))
        return results


#: ``AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce)``, emitted by EIP-3009 tokens.
AUTHORIZATION_USED_TOPIC = "0x" + keccak(text="AuthorizationUsed(address,bytes32)").hex()
#: ``AuthorizationCanceled(address indexed authorizer, bytes32 indexed nonce)``, emitted by ``cancelAuthorization``.
AUTHORIZATION_CANCELED_TOPIC = "0x" + keccak(text="AuthorizationCanceled(address,bytes32)").hex()
#: ERC-20 ``Transfer(address indexed from, address indexed to, uint256 value)``.
TRANSFER_TOPIC = ERC20_TRANSFER_EVENT_TOPIC

_DOMAIN_TYPE = keccak(text="EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)")
_CANCEL_TYPE = keccak(text="CancelAuthorization(address authorizer,bytes32 nonce)")

#: Every transaction of the dev chain is in this one block.
BLOCK_NUMBER = "0x1"
BLOCK_HASH = "0x" + keccak(text="a2a-gate dev chain block 1").hex()


def cancel_authorization_digest(
    token: TokenInfo, chain_id: int, asset: str, authorizer: str, nonce: bytes | str
) -> bytes:
    """The EIP-712 digest a FiatToken checks a ``cancelAuthorization`` signature against."""
    raw_nonce = nonce if isinstance(nonce, bytes) else bytes.fromhex(nonce.removeprefix("0x"))
    domain = keccak(
        abi_encode(
            ["bytes32", "bytes32", "bytes32", "uint256", "address"],
            [_DOMAIN_TYPE, keccak(text=token.name), keccak(text=token.version), chain_id, to_checksum_address(asset)],
        )
    )
    struct = keccak(abi_encode(["bytes32", "address", "bytes32"], [_CANCEL_TYPE, authorizer, raw_nonce]))
    return keccak(b"\x19\x01" + domain + struct)


class JsonRpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class ChainRpc:
    """The little Ethereum JSON-RPC a settlement checker needs, answered from the ledger.

    ``eth_call`` runs any view function the simulated contracts know (among them
    ``authorizationState``, and Permit2's ``nonceBitmap``); ``eth_getLogs`` returns the
    ``AuthorizationUsed`` log of a transfer's authorization, or the ``AuthorizationCanceled``
    log of a canceled one, and any other filter (an ERC-20 ``Transfer(from, to)``) by a scan;
    ``eth_getTransactionReceipt`` returns a transaction's receipt in the standard shape: a
    transfer's carries its ``AuthorizationUsed`` and ERC-20 ``Transfer`` logs, a cancel's its
    ``AuthorizationCanceled`` log, a Permit2 proxy settle's the ``Transfer`` and the proxy's
    ``Settled()``; an unknown hash is null.
    """

    def __init__(self, signer: LedgerEvmSigner) -> None:
        self.signer = signer

    def answer(self, method: Any, params: list[Any]) -> Any:
        if method == "eth_chainId":
            return hex(self.signer.chain_id)
        if method == "eth_blockNumber":
            return BLOCK_NUMBER
        if method == "eth_call":
            return self._call(params[0] if params else None)
        if method == "eth_getLogs":
            return self._logs(params[0] if params else None)
        if method == "eth_getTransactionReceipt":
            return self._receipt(params[0] if params else None)
        if method == "eth_sendRawTransaction":
            return self._send_raw(params[0] if params else None)
        raise JsonRpcError(-32601, "method not found")

    def _send_raw(self, raw_hex: Any) -> str:
        """A typed (EIP-1559 or EIP-2930) transaction signed by its sender (a payer invalidating its
        Permit2 nonces, anyone calling x402's exact Permit2 proxy, a channel's payer withdrawing): run
        as from the recovered sender by the simulated contract at its ``to`` (else the token); its hash
        is the chain's own for what it did.

        Account nonces, gas and value mean nothing here; a sender signature in its high-s form is
        refused, as a node refuses it (EIP-2). A transaction that would revert is refused
        with its revert reason (as a node's gas estimate refuses it); nothing is mined for it.
        """
        try:
            raw = HexBytes(bytes.fromhex(str(raw_hex).removeprefix("0x")))
            sender = Account.recover_transaction(raw)
            fields = TypedTransaction.from_bytes(raw).as_dict()
            chain_id, to, data = fields.get("chainId"), fields.get("to"), bytes(fields.get("data", b""))
            high_s = int(fields["s"]) > HALF_N
            name, input_types, _ = self.signer.functions[data[:4]]
            args = tuple(abi_decode(input_types, data[4:]))
            target = to_checksum_address(to)
        except Exception:  # noqa: BLE001 -- anything undecodable is one invalid-params answer
            message = "eth_sendRawTransaction needs a signed typed transaction calling a known function"
            raise JsonRpcError(-32602, message) from None
        if chain_id != self.signer.chain_id:
            raise JsonRpcError(-32000, "invalid chain id")
        if high_s:  # a node takes a transaction's signature in its low-s form only (EIP-2)
            raise JsonRpcError(-32000, "invalid transaction v, r, s values")
        try:
            contract = self.signer.contracts.get(target)
            if contract is not None:
                return contract.transact(target, name, args, sender)
            return self.signer.write_contract(target, [], name, *args)  # a token's, sender-blind
        except LedgerRevert as exc:
            raise JsonRpcError(3, str(exc)) from None

    def _call(self, tx: Any) -> str:
        if not isinstance(tx, dict) or not isinstance(tx.get("to"), str) or not isinstance(tx.get("data"), str):
            raise JsonRpcError(-32602, "eth_call needs {to, data}")
        try:
            data = bytes.fromhex(tx["data"].removeprefix("0x"))
            name, input_types, output_types = self.signer.functions[data[:4]]
            args = tuple(abi_decode(input_types, data[4:]))
            value = self.signer._call(tx["to"], name, args, tx.get("from"))
        except LedgerRevert as exc:
            raise JsonRpcError(3, str(exc)) from None
        except (KeyError, ValueError, TypeError) as exc:
            raise JsonRpcError(-32602, f"cannot call: {type(exc).__name__}") from None
        return "0x" + _encode_outputs(output_types, value).hex()

    def _logs(self, query: Any) -> list[dict[str, Any]]:
        if not isinstance(query, dict) or not isinstance(query.get("topics"), list):
            raise JsonRpcError(-32602, "eth_getLogs needs a filter with topics")
        topics = query["topics"]
        if len(topics) != 3 or topics[0] not in (AUTHORIZATION_USED_TOPIC, AUTHORIZATION_CANCELED_TOPIC):
            return self._scan_logs(query.get("address"), topics)
        ledger, network = self.signer.ledger, self.signer.network
        try:
            asset = to_checksum_address(query.get("address"))
            authorizer = to_checksum_address("0x" + str(topics[1])[-40:])
            nonce = str(topics[2])
            if topics[0] == AUTHORIZATION_USED_TOPIC:
                tx_hash = ledger.authorization_tx(network, asset, authorizer, nonce)
            else:
                tx_hash = ledger.cancellation_tx(network, asset, authorizer, nonce)
        except (ValueError, TypeError):
            raise JsonRpcError(-32602, "bad address or topic") from None
        if tx_hash is None:  # not a token transfer's: maybe a contract's (a channel deposit's receiveWithAuthorization)
            return self._scan_logs(query.get("address"), topics)
        receipt = self._receipt(tx_hash)
        return [log for log in receipt["logs"] if log["topics"][0] == topics[0]] if receipt else []

    def _receipt(self, tx_hash: Any) -> dict[str, Any] | None:
        if not isinstance(tx_hash, str) or not _HASH.fullmatch(tx_hash):
            raise JsonRpcError(-32602, "eth_getTransactionReceipt needs a 32-byte transaction hash")
        tx_hash = tx_hash.lower()
        ledger = self.signer.ledger
        transfer = ledger.settlement(tx_hash)
        found = None if transfer is not None else self.signer.contract_receipt(tx_hash)
        if transfer is not None:
            asset = transfer["asset"]
            logs = transfer_logs(transfer, tx_hash)
        elif found is not None:
            asset, logs = found
        else:
            cancel = ledger.cancellation(tx_hash)
            if cancel is None:
                return None
            asset, authorizer = cancel["asset"], cancel["authorizer"]
            topics = [AUTHORIZATION_CANCELED_TOPIC, _address_topic(authorizer), cancel["nonce"]]
            logs = [_log(asset, topics, "0x", tx_hash, 0)]
        return {
            "transactionHash": tx_hash,
            "transactionIndex": "0x0",
            "blockHash": BLOCK_HASH,
            "blockNumber": BLOCK_NUMBER,
            "from": self.signer.address.lower(),
            "to": asset.lower(),
            "contractAddress": None,
            "cumulativeGasUsed": "0x0",
            "gasUsed": "0x0",
            "type": "0x2",
            "status": "0x1",
            "logs": logs,
        }

    def _scan_logs(self, address: Any, topics: list[Any]) -> list[dict[str, Any]]:
        """Any other filter (an ERC-20 ``Transfer(from, to)``, say): every log of every transaction, filtered.

        Indexed lookups are for the ``AuthorizationUsed``/``AuthorizationCanceled`` queries; this is a
        scan, fine for a development chain. A topic or address is a value, a list of values, or null.
        """

        def matches(wanted: Any, value: str) -> bool:
            if wanted is None:
                return True
            options = wanted if isinstance(wanted, list) else [wanted]
            return any(isinstance(o, str) and o.lower() == value.lower() for o in options)

        ledger, logs = self.signer.ledger, []
        for transfer in ledger.settlements():
            logs += transfer_logs(transfer, transfer["tx_hash"])
        for contract in set(self.signer.contracts.values()):
            logs += contract.logs()
        return [
            log
            for log in logs
            if matches(address, log["address"])
            and len(topics) <= len(log["topics"])
            and all(matches(t, v) for t, v in zip(topics, log["topics"], strict=False))
        ]


_HASH = re.compile(r"0x[0-9a-fA-F]{64}")


def transfer_logs(transfer: dict[str, Any], tx_hash: str) -> list[dict[str, Any]]:
    """What a ``transferWithAuthorization`` emits, in order: ``AuthorizationUsed``, then ``Transfer``."""
    asset, authorizer = transfer["asset"], transfer["from_address"]
    used = [AUTHORIZATION_USED_TOPIC, _address_topic(authorizer), transfer["nonce"]]
    moved = [TRANSFER_TOPIC, _address_topic(authorizer), _address_topic(transfer["to_address"])]
    value = "0x" + int(transfer["amount"]).to_bytes(32, "big").hex()
    return [_log(asset, used, "0x", tx_hash, 0), _log(asset, moved, value, tx_hash, 1)]


def _log(address: str, topics: list[str], data: str, tx_hash: str, index: int) -> dict[str, Any]:
    return {
        "address": address.lower(),
        "topics": topics,
        "data": data,
        "blockNumber": BLOCK_NUMBER,
        "blockHash": BLOCK_HASH,
        "transactionHash": tx_hash,
        "transactionIndex": "0x0",
        "logIndex": hex(index),
        "removed": False,
    }


def _address_topic(address: str) -> str:
    return "0x" + "00" * 12 + address.lower().removeprefix("0x")


def _encode_outputs(output_types: list[str], value: Any) -> bytes:
    """A function's return data: one value, or the tuple of a function that returns several."""
    if not output_types:
        return b""
    return abi_encode(output_types, list(value) if len(output_types) > 1 else [value])


def _encode_revert(reason: str) -> bytes:
    return _ERROR_STRING_SELECTOR + abi_encode(["string"], [reason])
