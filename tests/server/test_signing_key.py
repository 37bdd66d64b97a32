"""The operator's signing key (server/signing_key.py) and the cards it signs (server/card_signing.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import jwt
import pytest
import rfc8785
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from eth_account import Account

from server.card_signing import CardSigner, canonical, signed
from server.config import SigningConfig
from server.signing_key import SigningKeyError, from_text, load

HEX = "0x" + "5e" * 32


def pem(private: object, password: bytes | None = None) -> str:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return private.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    ).decode()


@pytest.mark.parametrize(
    ("text", "algorithm"),
    [
        (HEX, "ES256K"),
        (HEX[2:], "ES256K"),
        (pem(ec.generate_private_key(ec.SECP256K1())), "ES256K"),
        (pem(ec.generate_private_key(ec.SECP256R1())), "ES256"),
        (pem(ed25519.Ed25519PrivateKey.generate()), "EdDSA"),
    ],
)
def test_each_key_form_signs_a_jws_its_kid_verifies(text: str, algorithm: str) -> None:
    key = from_text(text + "\n", "test")
    assert key.algorithm == algorithm
    token = key.jws(b'{"a":1}')
    header = jwt.get_unverified_header(token)
    assert header == {"alg": algorithm, "kid": key.kid}  # no typ, as x402's offer-receipt signer writes
    # the kid is the public key itself: did:jwk, base64url of the canonical JWK
    encoded = key.kid.removeprefix("did:jwk:").removesuffix("#0")
    jwk = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    assert jwk == key.public_jwk
    assert jwt.api_jws.decode(token, jwt.PyJWK(jwk).key, algorithms=[algorithm]) == b'{"a":1}'


def test_a_secp256k1_key_has_the_address_eth_account_gives_it() -> None:
    assert from_text(HEX, "t").address == Account.from_key(HEX).address.lower()
    assert from_text(pem(ed25519.Ed25519PrivateKey.generate()), "t").address is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("s3cr3t", "not a signing key"),
        ("0x" + "00" * 32, "out of range"),
        ("0x" + "ff" * 32, "out of range"),
        ("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----", "unreadable PEM"),
        (pem(ed25519.Ed25519PrivateKey.generate(), b"pw"), "encrypted"),
        (pem(rsa.generate_private_key(65537, 2048)), "unsupported key type"),
        (pem(ec.generate_private_key(ec.SECP384R1())), "unsupported key type"),
    ],
)
def test_a_key_it_cannot_use_is_refused_by_its_source_never_its_text(text: str, says: str) -> None:
    with pytest.raises(SigningKeyError) as refused:
        from_text(text, "signing.key_env K")
    assert says in str(refused.value) and str(refused.value).startswith("signing.key_env K:")
    assert text.strip()[:40] not in str(refused.value) or text.startswith("-----")


def test_the_key_is_never_in_its_repr() -> None:
    key = from_text(HEX, "t")
    assert "5e5e" not in repr(key) and "5e5e" not in str(key)


def test_it_loads_from_a_file_or_a_variable_and_none_is_no_key(tmp_path, monkeypatch) -> None:
    (tmp_path / "k").write_text(HEX + "\n")
    assert load(SigningConfig(key_file=str(tmp_path / "k"))).kid == from_text(HEX, "t").kid  # type: ignore[union-attr]
    monkeypatch.setenv("SIGNING_KEY_TEST_FILE", str(tmp_path / "k"))  # the variable's file form
    assert load(SigningConfig(key_env="SIGNING_KEY_TEST")).kid == from_text(HEX, "t").kid  # type: ignore[union-attr]
    assert load(SigningConfig()) is None
    with pytest.raises(SigningKeyError, match="cannot be read"):
        load(SigningConfig(key_file=str(tmp_path / "missing")))
    with pytest.raises(SigningKeyError, match="not set"):
        load(SigningConfig(key_env="NO_SUCH_SIGNING_KEY"))


CARD = {"name": "paid", "description": "Ünïcode €", "capabilities": {"streaming": True}, "skills": [], "n": 1.5}


def test_a_signed_card_is_a_detached_jws_over_its_canonical_form() -> None:
    key = from_text(HEX, "t")
    card = signed({**CARD, "signatures": [{"protected": "old", "signature": "old"}]}, key)
    [signature] = card["signatures"]  # the upstream's (or any earlier) signature replaced
    assert canonical(card) == rfc8785.dumps(CARD)
    payload = base64.urlsafe_b64encode(rfc8785.dumps(CARD)).rstrip(b"=").decode()
    compact = f"{signature['protected']}.{payload}.{signature['signature']}"
    assert jwt.get_unverified_header(compact)["typ"] == "JOSE"
    jwt.api_jws.decode(compact, jwt.PyJWK(key.public_jwk).key, algorithms=["ES256K"])
    changed = base64.urlsafe_b64encode(rfc8785.dumps({**CARD, "n": 2})).rstrip(b"=").decode()
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.api_jws.decode(
            f"{signature['protected']}.{changed}.{signature['signature']}",
            jwt.PyJWK(key.public_jwk).key,
            algorithms=["ES256K"],
        )


def test_the_card_signer_signs_each_card_once_and_nothing_without_a_key() -> None:
    sign = CardSigner(from_text(HEX, "t"))
    first = sign(dict(CARD))
    assert sign(dict(CARD)) == first  # the same card keeps its signature (its ETag holds)
    assert sign({**CARD, "n": 2})["signatures"] != first["signatures"]
    assert CardSigner(None)(dict(CARD)) == CARD


def test_a_relative_key_file_is_beside_the_configuration() -> None:
    from server.config import parse_config

    settings = parse_config({"signing": {"key_file": "signing.key"}}, base_dir=Path("/etc/a2a-gate"))
    assert settings.signing.key_file == "/etc/a2a-gate/signing.key"
    absolute = parse_config({"signing": {"key_file": "/run/secrets/k"}}, base_dir=Path("/etc/a2a-gate"))
    assert absolute.signing.key_file == "/run/secrets/k"
