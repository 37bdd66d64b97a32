"""``a2a-gate-devnet``: run the development facilitator, or pay a priced agent.

The x402 package and eth-account are the distribution's own dependencies; where they cannot be
imported (the package run from a checkout without ``pip install ./devnet``), the command says how
to install them instead of failing with a traceback. The facilitator checks at its
start what its Permit2 schemes import on their first verify (x402's extensions), so a missing
piece is one line and a refusal to start, not a 500 to every Permit2 payment.

``pay`` exits 0 only for a paid answer (every request answered, settled, with its receipt);
a refusal (any HTTP status but 200, a JSON-RPC error, a task that did not complete, a payment
not completed) or an error (the gate unreachable, an offer the client cannot sign) is one line
on stderr and exit status 1, after the answer it got, if any, on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
from typing import Any

#: What the distribution's own dependencies add; ``main`` checks for them before anything else.
EXTRA_MODULES = ("x402", "eth_account")
MISSING_EXTRA_STATUS = 3
#: ``pay``: the payment was refused, or could not be made.
NOT_PAID_STATUS = 1
#: What the facilitator's Permit2 schemes (exact by Permit2, upto) import when first used.
PERMIT2_MODULES = ("x402.extensions",)
INSTALL_HINT = "pip install ./devnet in a2a-gate's repository (the a2a-gate-devnet distribution and its dependencies)"


def missing_modules() -> list[str]:
    """The modules of the distribution's dependencies that cannot be imported."""
    missing = []
    for name in EXTRA_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def unimportable(modules: tuple[str, ...]) -> str:
    """The first of `modules` that cannot be imported, with why; empty when all can."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return f"{name} ({exc})"
    return ""


def cmd_facilitator(args: argparse.Namespace) -> int:
    from devnet.facilitator import run

    broken = unimportable(PERMIT2_MODULES) if args.permit2 else ""
    if broken:
        print(
            f"error: the development facilitator's Permit2 schemes (exact by Permit2, upto) need {broken}: "
            f"{INSTALL_HINT}, or run it with --no-permit2",
            file=sys.stderr,
        )
        return MISSING_EXTRA_STATUS
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(
        args.host,
        args.port,
        args.db,
        args.trust_signatures,
        initial_balance=args.initial_balance,
        auth_token=args.auth_token,
        receiver_authorizer_key=args.receiver_authorizer_key,
        log_level=args.log_level,
        permit2=args.permit2,
    )
    return 0


def cmd_pay(args: argparse.Namespace) -> int:
    from devnet.client import pay

    try:
        result = asyncio.run(
            pay(args.url, args.text, private_key=args.key, scheme=args.scheme, rpc_url=args.rpc_url, count=args.count)
        )
    except Exception as exc:  # noqa: BLE001 -- unreachable, refused by the client's own checks: one line, not a traceback
        print(f"error: no payment made: {one_line(exc)}", file=sys.stderr)
        return NOT_PAID_STATUS
    print(json.dumps(result, indent=2))
    problem = not_paid(result, args.count)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return NOT_PAID_STATUS
    return 0


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def not_paid(result: dict[str, Any], count: int = 1) -> str:
    """Why `pay`'s outcome is not a paid answer; empty when it is (the last answer, and one receipt
    for each of the `count` requests)."""
    status, answer = result.get("http_status"), result.get("answer")
    if status != 200:
        detail = answer if not isinstance(answer, dict) else answer.get("error") or answer.get("detail") or ""
        return f"HTTP {status}: {' '.join(str(detail).split())[:200] or 'no detail'}"
    if not isinstance(answer, dict):
        return "the answer is not JSON"
    if "error" in answer:
        error = answer["error"] if isinstance(answer["error"], dict) else {}
        data = error.get("data")
        code = f" ({data['code']})" if isinstance(data, dict) and "code" in data else ""
        return f"JSON-RPC error {error.get('code')}{code}: {error.get('message', '')}"
    task = answer.get("result")
    if not isinstance(task, dict):
        return "the answer has no result"
    state = (task.get("status") or {}).get("state")
    metadata = task.get("metadata") or {}
    payment = metadata.get("x402.payment.status")
    if state is not None and state != "completed":
        return f"the task ended {state}" + (f" ({payment})" if payment else "")
    a2a_task = state is not None or payment is not None
    if a2a_task and payment != "payment-completed":
        error = metadata.get("x402.payment.error", "")
        return f"not paid: {payment or 'no payment status'}" + (f": {error}" if error else "")
    receipts = len(result.get("payment_responses", [])) if count > 1 else int("payment_response" in result)
    if receipts != count:
        return f"{receipts} of {count} requests carry a payment receipt"
    if not a2a_task and (result.get("payment_response") or {}).get("success") is not True:
        return "not paid: the receipt does not say success"  # a plain x402 resource: its receipt decides
    return ""


def build_parser() -> argparse.ArgumentParser:
    from devnet.ledger import DEFAULT_INITIAL_BALANCE

    parser = argparse.ArgumentParser(
        prog="a2a-gate-devnet", description="The development network: an x402 facilitator and a payer."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    facilitator = sub.add_parser("facilitator", help="run the development x402 facilitator (simulated ledger)")
    facilitator.add_argument("--host", default="127.0.0.1")
    facilitator.add_argument("--port", type=int, default=8402)
    facilitator.add_argument("--db", default="dev-ledger.db", help="SQLite ledger file")
    facilitator.add_argument(
        "--trust-signatures",
        action="store_true",
        help="DEVELOPMENT/BENCHMARK ONLY: skip signature recovery (nonces still tracked)",
    )
    facilitator.add_argument("--initial-balance", type=int, default=DEFAULT_INITIAL_BALANCE)
    facilitator.add_argument(
        "--auth-token",
        default=os.environ.get("A2A_GATE_FACILITATOR_TOKEN"),
        help="require this bearer token (default: $A2A_GATE_FACILITATOR_TOKEN)",
    )
    facilitator.add_argument(
        "--receiver-authorizer-key",
        default=os.environ.get("A2A_GATE_DEVNET_RECEIVER_AUTHORIZER_KEY"),
        help="the key batch-settlement claims and refunds are signed with when a channel names the facilitator"
        " (default: $A2A_GATE_DEVNET_RECEIVER_AUTHORIZER_KEY, else the public development key)",
    )
    facilitator.add_argument(
        "--no-permit2",
        dest="permit2",
        action="store_false",
        help="no Permit2 on the chain: refuse exact-by-Permit2 and upto (served by default)",
    )
    facilitator.add_argument("--log-level", default="info")
    facilitator.set_defaults(func=cmd_facilitator)

    pay = sub.add_parser("pay", help="send a message to a priced agent, paying with a throwaway key")
    pay.add_argument("url", help="the agent's endpoint, e.g. http://127.0.0.1:8000/a2a/paid-echo")
    pay.add_argument("text")
    pay.add_argument("--key", help="payer private key (default: a new throwaway key)")
    pay.add_argument(
        "--scheme",
        choices=("exact", "upto", "batch-settlement"),
        help="pay only with this scheme (default: the first offered)",
    )
    pay.add_argument(
        "--rpc-url",
        default=os.environ.get("A2A_GATE_DEVNET_RPC_URL"),
        help="the development chain's JSON-RPC (the facilitator's /rpc), read for an existing channel's state"
        " (default: $A2A_GATE_DEVNET_RPC_URL)",
    )
    pay.add_argument("--count", type=int, default=1, help="send the message this many times on one client")
    pay.set_defaults(func=cmd_pay)
    return parser


def main(argv: list[str] | None = None) -> int:
    missing = missing_modules()
    if missing:
        print(
            f"error: the development network needs {', '.join(missing)}: {INSTALL_HINT}",
            file=sys.stderr,
        )
        return MISSING_EXTRA_STATUS
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
