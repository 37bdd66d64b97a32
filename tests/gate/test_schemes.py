"""The scheme seam: a price names its scheme, and everything scheme-specific is asked of that module.

A scheme registered in `gate.schemes.SCHEMES` is accepted by the configuration, offered by
the 402 (its `extra`), and is the only reader of its payloads: shape, window, nonce key,
chain evidence and settle refusals.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from devnet.payer import new_private_key, sign_payment
from gate import schemes, tokens
from gate.config import DEMO_PRICE, parse_config
from gate.payment_required import payment_required, requirement
from gate.schemes.base import Authorization, Rejection
from gate.schemes.exact_eip3009 import SCHEME as EXACT_EIP3009
from gate.settlement import classify
from server.config import ConfigError

RESOURCE = "http://gate.example/a2a/paid"
PRICE = {
    "network": "eip155:84532",
    "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
    "amount": "1000",
    "pay_to": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
}


class Voucher:
    """A made-up scheme: its payload is `{"voucher": "<nonce>"}`, valid for an hour from 0."""

    scheme = "exact"
    transfer_method = "voucher"
    v1_signable = False
    definitive_reasons = frozenset({"voucher_spent_forever"})
    nonce_used_reasons = frozenset({"voucher_used"})

    def extra(self) -> dict[str, Any]:
        return {"assetTransferMethod": "voucher"}

    def check(self, inner: dict[str, Any], price: Any) -> None:
        if set(inner) != {"voucher"}:
            raise Rejection("not_a_voucher")

    def window(self, inner: dict[str, Any]) -> tuple[int, int]:
        return 0, 2**40

    def nonce_key(self, inner: dict[str, Any], network: str, asset: str) -> str:
        return f"{network}|voucher|{inner.get('voucher')}"

    def named_payer(self, inner: dict[str, Any]) -> str:
        return ""

    def authorization(
        self, payload: dict[str, Any], requirements: dict[str, Any], network: str
    ) -> Authorization | None:
        return None


@pytest.fixture
def voucher(monkeypatch):
    scheme = Voucher()
    monkeypatch.setitem(schemes.SCHEMES, (scheme.scheme, scheme.transfer_method), scheme)
    return scheme


def priced(**price: Any) -> dict[str, Any]:
    return {"facilitator": {"url": "http://127.0.0.1:9"}, "agents": {"paid": {"price": {**PRICE, **price}}}}


def test_a_price_names_its_scheme_and_transfer_method():
    read = parse_config(priced(), base_dir=Path("/tmp")).anonymous.price("paid")
    assert (read.scheme, read.asset_transfer_method) == ("exact", "eip3009")
    assert schemes.for_price(read) is EXACT_EIP3009
    assert "assetTransferMethod" not in requirement(read, RESOURCE)["extra"]  # x402's default, as before


@pytest.mark.parametrize(
    ("price", "path"),
    [
        ({"scheme": "auction"}, "agents.paid.price.scheme"),
        ({"asset_transfer_method": "carrier-pigeon"}, "agents.paid.price.asset_transfer_method"),
    ],
)
def test_an_unknown_scheme_or_transfer_method_is_a_problem_with_its_key_path(price, path):
    with pytest.raises(ConfigError) as caught:
        parse_config(priced(**price), base_dir=Path("/tmp"), source="gate.toml")
    assert [p.split(": ")[1] for p in caught.value.problems] == [path]


def test_a_registered_scheme_is_configured_offered_and_alone_reads_its_payloads(voucher):
    price = parse_config(priced(asset_transfer_method="voucher"), base_dir=Path("/tmp")).anonymous.price("paid")
    assert schemes.for_price(price) is voucher
    offered = payment_required(price, RESOURCE)["accepts"]
    assert [o["extra"]["assetTransferMethod"] for o in offered] == ["voucher"]  # the 402 offers what it takes
    eip3009 = sign_payment(payment_required(DEMO_PRICE, RESOURCE), new_private_key())
    document = {**eip3009, "accepted": offered[0], "payload": {"voucher": "v1"}}
    token = tokens.from_object(document, "metadata")
    assert tokens.check_payload(token, price, RESOURCE) == offered[0]
    assert tokens.nonce_key(token, price.asset, voucher) == "eip155:84532|voucher|v1"
    # an EIP-3009 payload is not this scheme's: refused, though it would pass the other scheme
    wrong = tokens.from_object({**eip3009, "accepted": offered[0]}, "metadata")
    with pytest.raises(Rejection) as refused:
        tokens.check_payload(wrong, price, RESOURCE)
    assert refused.value.reason == "not_a_voucher"
    # and the EIP-3009 price still refuses the voucher payload, by its own module
    with pytest.raises(Rejection) as other:
        tokens.check_payload(
            tokens.from_object({**document, "accepted": eip3009["accepted"]}, "metadata"), DEMO_PRICE, RESOURCE
        )
    assert other.value.reason == "unsupported_payload"


def test_settle_refusals_read_as_the_payments_scheme_says(voucher):
    requirements = requirement(replace(DEMO_PRICE, asset_transfer_method="voucher"), RESOURCE)
    scheme = schemes.for_requirements(requirements)
    assert scheme is voucher
    assert classify("voucher_spent_forever", scheme) == "refused"
    assert classify("voucher_used", scheme) == "nonce_used"
    assert classify("invalid_exact_evm_payload_signature", scheme) == "unknown"  # another scheme's word
    eip3009 = schemes.for_requirements(requirement(DEMO_PRICE, RESOURCE))
    assert classify("invalid_exact_evm_payload_signature", eip3009) == "refused"
    assert classify("invalid_exact_evm_nonce_already_used", eip3009) == "nonce_used"
    assert classify("anything", None) == "unknown"  # a payment of no known scheme is never written off unread


def permit2_channel() -> tuple[Any, dict[str, Any]]:
    """A `batch-settlement` price taking Permit2 deposits, and a deposit payload the x402 package's
    own client code signs for it (`create_batch_settlement_permit2_deposit_payload`)."""
    from eth_account import Account
    from x402.mechanisms.evm.batch_settlement.client.permit2 import create_batch_settlement_permit2_deposit_payload
    from x402.mechanisms.evm.batch_settlement.types import ChannelConfig
    from x402.mechanisms.evm.signers import EthAccountSigner
    from x402.schemas import PaymentRequirements

    from gate.config import of

    authorizer = "0xE40b4B07d90d26934b21e6E463a286988E28deeF"
    channel = {
        **PRICE,
        "scheme": "batch-settlement",
        "asset_transfer_method": "permit2",
        "receiver_authorizer": authorizer,
        "min_deposit": "10000",
    }
    settings = parse_config({"agents": {"paid": {"price": channel}}}, base_dir=Path("."))
    price = of(settings).agent("paid").price
    assert price is not None and schemes.for_price(price).extra() == {"assetTransferMethod": "permit2"}
    account = Account.create()
    config = ChannelConfig.from_dict(
        {
            "payer": account.address,
            "payerAuthorizer": account.address,
            "receiver": PRICE["pay_to"],
            "receiverAuthorizer": authorizer,
            "token": PRICE["asset"],
            "withdrawDelay": 900,
            "salt": "0x" + "00" * 32,
        }
    )
    offer = requirement(price, RESOURCE)
    requirements = PaymentRequirements.model_validate({**offer, "amount": offer["amount"]})
    payload = create_batch_settlement_permit2_deposit_payload(
        EthAccountSigner(account), requirements, config, 10000, 1000
    ).to_dict()
    return price, payload


def test_a_permit2_deposit_is_checked_by_its_own_collectors_rules():
    price, inner = permit2_channel()
    scheme = schemes.for_price(price)
    scheme.check(inner, price)  # the package's own deposit passes
    deadline = int(inner["deposit"]["authorization"]["permit2Authorization"]["deadline"])
    assert scheme.window(inner) == (0, deadline)
    # the other collector's scheme takes no Permit2 deposit, and this one no ERC-3009 deposit
    with pytest.raises(Rejection, match="unsupported_payload"):
        schemes.named("batch-settlement", "eip3009").check(inner, replace(price, asset_transfer_method="eip3009"))

    def mangled(path: tuple[str, ...], value: Any) -> dict[str, Any]:
        import copy

        document = copy.deepcopy(inner)
        node = document["deposit"]["authorization"]["permit2Authorization"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return document

    refusals = {
        ("spender",): ("0x" + "12" * 20, "invalid_payload"),  # not the Permit2 collector
        ("permitted", "token"): ("0x" + "34" * 20, "invalid_payload"),  # another token
        ("permitted", "amount"): ("20000", "invalid_payload"),  # not the deposit's amount
        ("witness", "channelId"): ("0x" + "ab" * 32, "invalid_batch_settlement_evm_channel_id_mismatch"),
        ("nonce",): (7, "invalid_payload"),  # a number, not its decimal text
        ("deadline",): ("soon", "invalid_payload"),
        ("signature",): ("0x123", "invalid_payload"),  # not whole bytes (any length of them is the facilitator's)
        ("from",): (None, "invalid_payload"),
    }
    for path, (value, reason) in refusals.items():
        with pytest.raises(Rejection) as refused:
            scheme.check(mangled(path, value), price)
        assert refused.value.reason == reason, path
    small = mangled(("permitted", "amount"), "100")
    small["deposit"]["amount"] = "100"
    with pytest.raises(Rejection, match="deposit_below_min_deposit"):
        scheme.check(small, price)


PAYER = "0x" + "Ab" * 20
SIGNATURE = "0x" + "11" * 65


@pytest.mark.parametrize(
    ("inner", "named"),
    [
        ({"signature": SIGNATURE, "authorization": {"from": PAYER, "nonce": "0x" + "00" * 32}}, PAYER.lower()),
        ({"signature": SIGNATURE, "permit2Authorization": {"from": PAYER, "witness": {}}}, PAYER.lower()),
        ({"type": "voucher", "channelConfig": {"payer": PAYER}, "voucher": {}}, PAYER.lower()),
        ({"authorization": {"from": "not an address"}}, ""),
        ({"authorization": ["from", PAYER]}, ""),
        ({"permit2Authorization": {"from": 7}}, ""),
        ({"channelConfig": None}, ""),
        ({}, ""),
        ("a string", ""),
    ],
    ids=["eip3009", "permit2", "channel", "bad-address", "odd-shape", "number", "null", "empty", "not-a-map"],
)
def test_a_payload_names_its_payer_as_its_scheme_reads_it(inner: Any, named: str) -> None:
    """A refusal names who the payload says pays, whichever scheme's shape it is in; never raises."""
    assert schemes.named_payer(inner) == named


def test_only_exact_by_eip3009_is_offered_to_x402_v1_clients() -> None:
    signable = {kind for kind, scheme in schemes.SCHEMES.items() if scheme.v1_signable}
    assert signable == {("exact", "eip3009")}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("salt", [1]),  # unhashable: refused, not a TypeError from the check's cache
        ("salt", "0x12"),
        ("payer", {"a": 1}),
        ("payerAuthorizer", 7),
        ("token", None),
        ("receiver", "0x" + "zz" * 20),
        ("withdrawDelay", True),  # True == 1 == hash(1): the valid 900 was checked first, then this
        ("withdrawDelay", 900.0),
        ("withdrawDelay", "900"),
    ],
)
def test_a_channel_configuration_of_the_wrong_shape_is_refused_after_a_valid_one(field: str, value: Any) -> None:
    """The configuration's shape is checked once per distinct configuration (`config_valid`, cached):
    whatever came first, a field of another type or shape is refused, never raised past the check."""
    import copy

    price, inner = permit2_channel()
    scheme = schemes.for_price(price)
    scheme.check(inner, price)  # the valid one, now cached
    mangled = copy.deepcopy(inner)
    mangled["channelConfig"][field] = value
    with pytest.raises(Rejection) as refused:
        scheme.check(mangled, price)
    assert refused.value.reason == "invalid_payload"


def test_a_cached_shape_check_tells_a_bool_from_an_integer() -> None:
    from gate.schemes.batch_settlement import CONFIG_FIELDS, config_valid

    address, salt = "0x" + "ab" * 20, "0x" + "00" * 32
    fields = [(str, address)] * (len(CONFIG_FIELDS) - 2)
    assert config_valid((*fields, (int, 1), (str, salt)))
    assert not config_valid((*fields, (bool, True), (str, salt)))
