"""Payment identifiers: the x402 `payment-identifier` extension, a payer's idempotency key.

A payer names one logical request with an id it chooses (`extensions["payment-identifier"]
.info.id` of its PaymentPayload) and keeps it across retries. A retry may be signed anew (a new
nonce: the first answer was lost, the client restarted); under the same id it is answered from
the first payment (`gate.claims` keeps the id on the first payment's claim, unique in the
database) and never charged or delivered again. The id is bound to the payer and the request it
first paid for: anyone else, or another request, under that id is refused with one answer that
says nothing of the first.

The 402 declares the extension (`declaration`); an agent may require it. Reading the id from a
payload costs a payment without one a single dictionary lookup.
"""

from __future__ import annotations

import re
from typing import Any

KEY = "payment-identifier"  # the extension's name in `extensions`
MIN_LENGTH, MAX_LENGTH = 16, 128
PATTERN = re.compile(r"[A-Za-z0-9_-]+")

# The answers of this extension (docs/money.md, "Payment identifiers").
REQUIRED = "payment_identifier_required"  # HTTP 400: the agent requires an id, the payment has none
INVALID = "invalid_payment_identifier"  # HTTP 400: the extension is there, its id is not one
CONFLICT = "payment_identifier_conflict"  # HTTP 409: the id paid for another request, or another payer's

# The JSON Schema x402 declares the extension with (its spec, and the x402 packages' helpers)
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "required": {"type": "boolean"},
        "id": {"type": "string", "minLength": MIN_LENGTH, "maxLength": MAX_LENGTH, "pattern": "^[a-zA-Z0-9_-]+$"},
    },
    "required": ["required"],
}


class Invalid(Exception):
    """The payload carries the extension, but no id the extension allows."""


def declaration(required: bool) -> dict[str, Any]:
    """The extension as a 402 declares it: whether an id is required, and the schema of its info."""
    return {"info": {"required": required}, "schema": SCHEMA}


def of(payload: dict[str, Any]) -> str | None:
    """The id a PaymentPayload carries; None when it carries none (the extension absent, or echoed
    as declared, without an id). Anything else under the extension's name is `Invalid`."""
    extensions = payload.get("extensions")
    if not extensions:
        return None
    if not isinstance(extensions, dict):
        raise Invalid("extensions is not an object")
    extension = extensions.get(KEY)
    if extension is None:
        return None
    info = extension.get("info") if isinstance(extension, dict) else None
    if not isinstance(info, dict):
        raise Invalid("the extension has no info object")
    found = info.get("id")
    if found is None:
        return None
    if not isinstance(found, str) or not MIN_LENGTH <= len(found) <= MAX_LENGTH or not PATTERN.fullmatch(found):
        raise Invalid("the id is not 16 to 128 letters, digits, '-' or '_'")
    return found
