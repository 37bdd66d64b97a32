"""The simulated chain's pieces on their own: the SQLite ledger and the signer."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from eth_account import Account
from x402.mechanisms.evm.types import TypedDataDomain, TypedDataField

from devnet.chain import DEV_NETWORK, LedgerEvmSigner
from devnet.ledger import DevLedger, LedgerRevert, Transfer
from tests.support import dev_facilitator_helpers as helpers
from tests.support.dev_facilitator_helpers import OTHER_ADDRESS, PAY_TO, TX_HASH, USDC_BASE_SEPOLIA

# Shared fixtures, bound by assignment rather than imported by name: pytest finds
# fixtures among a module's attributes, and pyflakes would read every test
# parameter that names an imported fixture as a redefinition of an unused import.
key, payer = helpers.key, helpers.payer


# -- the signer ----------------------------------------------------------------------


def test_signer_verify_typed_data_recovers_with_eth_account(tmp_path, key, payer):
    domain = TypedDataDomain(name="USDC", version="2", chain_id=84532, verifying_contract=USDC_BASE_SEPOLIA)
    fields = [("from", "address"), ("to", "address"), ("value", "uint256")]
    types = {"Transfer": [TypedDataField(name=n, type=t) for n, t in fields]}
    message = {"from": payer, "to": PAY_TO, "value": 1000}
    signature = bytes(
        Account.from_key(key)
        .sign_typed_data(
            domain_data={
                "name": "USDC",
                "version": "2",
                "chainId": 84532,
                "verifyingContract": USDC_BASE_SEPOLIA,
            },
            message_types={"Transfer": [{"name": n, "type": t} for n, t in fields]},
            message_data=message,
        )
        .signature
    )
    ledger = DevLedger(str(tmp_path / "l.db"))
    strict = LedgerEvmSigner(ledger)
    assert strict.verify_typed_data(payer, domain, types, "Transfer", message, signature)
    assert not strict.verify_typed_data(PAY_TO, domain, types, "Transfer", message, signature)
    assert not strict.verify_typed_data(payer, domain, types, "Transfer", {**message, "value": 1001}, signature)
    assert not strict.verify_typed_data(payer, domain, types, "Transfer", message, b"\x00" * 65)
    trusting = LedgerEvmSigner(ledger, trust_signatures=True)
    assert trusting.verify_typed_data(PAY_TO, domain, types, "Transfer", message, b"")
    assert strict.get_chain_id() == 84532
    assert strict.get_code(payer) == b""
    assert strict.get_code(USDC_BASE_SEPOLIA) != b""
    ledger.close()


# -- the ledger on its own -----------------------------------------------------------


def _transfer(nonce: int = 1, value: int = 1000, **overrides: Any) -> Transfer:
    fields = {
        "network": DEV_NETWORK,
        "asset": USDC_BASE_SEPOLIA,
        "from_address": OTHER_ADDRESS,
        "to_address": PAY_TO,
        "value": value,
        "valid_after": 0,
        "valid_before": int(time.time()) + 60,
        "nonce": nonce.to_bytes(32, "big"),
        **overrides,
    }
    return Transfer.create(**fields)


def test_ledger_transfer_is_all_or_nothing(tmp_path):
    ledger = DevLedger(str(tmp_path / "l.db"), initial_balance=1500)
    tx = ledger.transfer_with_authorization(_transfer(1))
    assert TX_HASH.match(tx)
    assert ledger.settlement(tx)["amount"] == "1000"
    assert ledger.balance_of(DEV_NETWORK, USDC_BASE_SEPOLIA, OTHER_ADDRESS) == 500

    for transfer, reason in [
        (_transfer(1, value=1), "authorization is used"),
        (_transfer(2), "exceeds balance"),
        (_transfer(3, value=1, valid_before=int(time.time()) - 1), "expired"),
        (_transfer(4, value=1, valid_after=int(time.time()) + 60), "not yet valid"),
    ]:
        with pytest.raises(LedgerRevert, match=reason):
            ledger.transfer_with_authorization(transfer)
        assert ledger.authorization_state(DEV_NETWORK, USDC_BASE_SEPOLIA, OTHER_ADDRESS, transfer.nonce) == (
            transfer.nonce == _transfer(1).nonce
        )

    assert ledger.balance_of(DEV_NETWORK, USDC_BASE_SEPOLIA, OTHER_ADDRESS) == 500
    assert ledger.balance_of(DEV_NETWORK, USDC_BASE_SEPOLIA, PAY_TO) == 2500
    assert len(ledger.settlements()) == 1
    ledger.close()


def test_ledger_connections_race_for_one_nonce(tmp_path):
    path = str(tmp_path / "race.db")
    ledgers = [DevLedger(path) for _ in range(4)]

    def attempt(i: int) -> bool:
        try:
            ledgers[i % 4].transfer_with_authorization(_transfer(7))
            return True
        except LedgerRevert:
            return False

    with ThreadPoolExecutor(max_workers=20) as pool:
        outcomes = list(pool.map(attempt, range(40)))
    assert outcomes.count(True) == 1
    assert len(ledgers[0].settlements()) == 1
    for ledger in ledgers:
        ledger.close()
