"""The operator's signing key: what the server signs with, and how a verifier names it.

One private key, read from a file (`[signing] key_file`) or from an environment variable
(`[signing] key_env`, or its `NAME_FILE` / systemd credential form: `server.secret_files`),
never from the configuration's text. Two forms are read:

- an Ethereum private key: 64 hex digits, `0x` optional (secp256k1, JWS `ES256K`); the only
  form that can also sign EIP-712 (its address is what such a signature recovers);
- a PEM private key (PKCS#8 or the traditional form): EC P-256 (`ES256`), EC secp256k1
  (`ES256K`) or Ed25519 (`EdDSA`).

Signatures are JWS compact serializations (PyJWT). The key id (`kid`) is a `did:jwk`: the
public key itself, so a verifier needs no network and no key directory to check a signature
(x402's offer-receipt verifier and any JOSE library resolve it). The private key is never
logged or shown: its repr names only its algorithm and `kid`.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from typing import Any

import coincurve
import jwt
import rfc8785
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from sha3 import keccak_256

from server.config import SigningConfig
from server.secret_files import SecretFileError, secret

HEX_KEY = re.compile(r"(?:0x)?([0-9a-fA-F]{64})")
SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


class SigningKeyError(Exception):
    """A configured signing key that cannot be used: the message names its source, never its text."""


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class Secp256k1(jwt.algorithms.Algorithm):
    """PyJWT's ES256K, signed by libsecp256k1 (coincurve): OpenSSL's generic secp256k1 takes about
    1.2 ms a signature, libsecp256k1 about 70 µs, on every paid request's receipt. Its signatures
    are deterministic (RFC 6979) and low-s, as the JWS verifiers accept. It signs, never verifies."""

    def prepare_key(self, key: Any) -> Any:
        return key

    def sign(self, msg: bytes, key: Any) -> bytes:
        return bytes(key.sign_recoverable(hashlib.sha256(msg).digest(), hasher=None)[:64])  # r || s

    def verify(self, msg: bytes, key: Any, sig: bytes) -> bool:
        raise NotImplementedError("the operator's key only signs")

    @staticmethod
    def to_jwk(key_obj: Any, as_dict: bool = False) -> Any:
        raise NotImplementedError

    @staticmethod
    def from_jwk(jwk: str | dict[str, Any]) -> Any:
        raise NotImplementedError


class SigningKey:
    """A private key, the JWS algorithm it signs with, and its public forms."""

    def __init__(self, private: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey) -> None:
        self._private = private
        if isinstance(private, ed25519.Ed25519PrivateKey):
            self.algorithm = "EdDSA"
            self.public_jwk: dict[str, Any] = jwt.algorithms.OKPAlgorithm.to_jwk(private.public_key(), as_dict=True)
        else:
            self.algorithm = "ES256K" if isinstance(private.curve, ec.SECP256K1) else "ES256"
            self.public_jwk = jwt.algorithms.ECAlgorithm.to_jwk(private.public_key(), as_dict=True)
        self.public_jwk = {k: v for k, v in self.public_jwk.items() if k in ("kty", "crv", "x", "y")}
        self._signer: Any = private
        self._jws = jwt.api_jws.PyJWS()
        if isinstance(private, ec.EllipticCurvePrivateKey) and self.algorithm == "ES256K":
            self._jws.unregister_algorithm("ES256K")
            self._jws.register_algorithm("ES256K", Secp256k1())
            self._signer = coincurve.PrivateKey(private.private_numbers().private_value.to_bytes(32, "big"))
        # did:jwk: the public JWK, canonical (RFC 8785) and base64url-encoded; `#0` is its one key
        self.kid = "did:jwk:" + b64url(rfc8785.dumps(self.public_jwk)) + "#0"

    def __repr__(self) -> str:
        return f"SigningKey({self.algorithm}, {self.kid})"

    @property
    def secp256k1_secret(self) -> bytes | None:
        """The 32-byte secret of a secp256k1 key (what EIP-712 signs with); None for another curve."""
        if not isinstance(self._private, ec.EllipticCurvePrivateKey) or self.algorithm != "ES256K":
            return None
        return self._private.private_numbers().private_value.to_bytes(32, "big")

    @property
    def address(self) -> str | None:
        """The Ethereum address of a secp256k1 key (what an EIP-712 signature recovers); None otherwise."""
        if not isinstance(self._private, ec.EllipticCurvePrivateKey) or self.algorithm != "ES256K":
            return None
        point = self._private.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        digest = keccak_256(point[1:]).digest()
        return "0x" + digest[-20:].hex()

    def jws(self, payload: bytes, typ: str | None = None) -> str:
        """A JWS compact serialization of `payload`, its protected header `{alg, kid}` (and `typ`, if
        given: x402's offer-receipt signer writes none)."""
        headers = {"kid": self.kid, "typ": typ}
        return self._jws.encode(payload, self._signer, algorithm=self.algorithm, headers=headers)


def from_text(text: str, source: str) -> SigningKey:
    """The key `text` holds (a hex Ethereum key or a PEM private key); `source` names it in errors."""
    text = text.strip()
    match = HEX_KEY.fullmatch(text)
    if match:
        value = int(match.group(1), 16)
        if not 0 < value < SECP256K1_ORDER:
            raise SigningKeyError(f"{source}: not a valid secp256k1 private key (out of range)")
        return SigningKey(ec.derive_private_key(value, ec.SECP256K1()))
    if not text.startswith("-----BEGIN"):
        raise SigningKeyError(
            f"{source}: not a signing key (expected 64 hex digits, an Ethereum private key, or a PEM private key)"
        )
    try:
        private = serialization.load_pem_private_key(text.encode("ascii", "replace"), password=None)
    except (ValueError, TypeError) as exc:
        reason = "it is encrypted (give it unencrypted)" if "password" in str(exc).lower() else "unreadable PEM"
        raise SigningKeyError(f"{source}: not a usable private key ({reason})") from None
    except Exception:  # noqa: BLE001 -- cryptography's unsupported-algorithm errors: any is a refusal
        raise SigningKeyError(f"{source}: not a usable private key (unsupported key type)") from None
    if isinstance(private, ed25519.Ed25519PrivateKey):
        return SigningKey(private)
    if isinstance(private, ec.EllipticCurvePrivateKey) and isinstance(private.curve, (ec.SECP256R1, ec.SECP256K1)):
        return SigningKey(private)
    raise SigningKeyError(f"{source}: unsupported key type (use EC P-256, EC secp256k1 or Ed25519)")


def load(config: SigningConfig) -> SigningKey | None:
    """The configured key (None: none configured, nothing is signed); `SigningKeyError` when it
    cannot be read or is no usable key."""
    if config.key_file:
        try:
            text = Path(config.key_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise SigningKeyError(f"signing.key_file: {config.key_file} cannot be read ({reason})") from None
        return from_text(text, f"signing.key_file {config.key_file}")
    if config.key_env:
        try:
            value = secret(config.key_env)
        except SecretFileError as exc:
            raise SigningKeyError(f"signing.key_env: {exc}") from None
        if not value:
            raise SigningKeyError(f"signing.key_env names {config.key_env}, which is not set (or empty)")
        return from_text(value, f"signing.key_env {config.key_env}")
    return None
