"""A world for the money simulation: replicas of the real gate on one database, one chain.

Each replica is the real server and gate (`server.app.Services` with `gate.gate.PaymentGate`,
the anonymous pipeline behind the real ASGI app), on one shared database (a SQLite file or a
PostgreSQL schema). What the simulation controls is everything around them:

- time: the database's clock is virtual (`clock_sql` is the simulation's number), each
  replica has its own wall clock on top of it (a skew), and nothing runs in the background:
  renewals and reconciler passes are steps the simulation takes;
- the agent: every call waits for the simulation to finish it (complete or fail), so a
  replica can "stall" mid-work (SIGSTOP) or "crash" with work in flight;
- the facilitator and the chain: an in-memory token contract (`Chain`) that knows nonces,
  transfers, cancels and front-runs, answering the gate's facilitator calls (verify,
  settle, in the mode the simulation chose) and its JSON-RPC ground-truth questions
  (`authorizationState`, logs, receipts) through httpx mock transports.

Usage-priced agents (x402 `upto`, Permit2) run beside the fixed-price ones: their tokens
authorize a ceiling (each agent has its own), the agent reports a usage the simulation draws
(`units`), the gate settles the priced usage, and the chain records the amount moved.

The invariants are checked against this world: deliveries come from what clients were
answered and what the database stores, charges from the chain.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import io
import itertools
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from eth_account import Account

from gate import chain as gate_chain
from gate.cli import build_parser
from gate.config import load_config
from gate.gate import PaymentGate
from server.agents import AgentReply, AgentRequest, Usage
from server.app import Services, create_app
from server.config import ConfigError
from tests.support import money_channels
from tests.support.money_channels import ChannelChain

NETWORK = "eip155:84532"
ASSET = "0x036cbd53842c5426634e7929541ec2318f3dcf7e"
PAY_TO = "0x209693bc6afc0c5328ba36faf03c514ef312287c"
PRICE = 1000
# usage-priced agents: their ceilings, and the price per reported unit
CEILINGS = {"metered-small": 500, "metered-large": 50_000, "metered-async": 50_000, "metered-stream": 5_000}
HELD_METERED = ("metered-small", "metered-large", "metered-async")  # priced when the simulation finishes them
UNIT_PRICE = 7
FACILITATOR_ADDRESS = "0xfb0b6d1f8b44caeac383d5ac8c0b374bb08e2619"
UPTO_PROXY = "0x4020a4f3b7b90cca423b9fabcc0ce57c6c240002"
WINDOW = 900  # seconds a token is valid for (in the database's time)
LEASE = 30.0
PASS_INTERVAL = 20.0
PASSES = 3
MAX_DELAY = 120.0


# -- the agent ------------------------------------------------------------------


@dataclass
class Call:
    """One call of the agent, waiting for the simulation to finish it."""

    task_id: str
    text: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    fail: bool = False
    units: int = 0  # the usage it reports when it completes


CALLS: dict[str, Call] = {}  # task id -> the call in progress


def answer_for(text: str) -> str:
    return f"ANSWER<{text}>"


async def held(request: AgentRequest) -> AgentReply:
    """The simulation's agent (`tests.support.money_world:held`): answers when told to."""
    call = CALLS[request.task_id] = Call(request.task_id, request.text)
    try:
        await call.done.wait()
    finally:
        CALLS.pop(request.task_id, None)
    if call.fail:
        return AgentReply.failed("the agent failed")
    return AgentReply(parts=[{"kind": "text", "text": answer_for(request.text)}], usage={"units": call.units})


async def at_once(request: AgentRequest) -> AgentReply:
    """An agent that answers at once (`tests.support.money_world:at_once`): many channels, a busy payer."""
    return AgentReply(parts=[{"kind": "text", "text": answer_for(request.text)}])


STREAMS: dict[str, list[float]] = {}  # request text -> the usage its streaming agent reports after each chunk


async def streamed(request: AgentRequest) -> Any:
    """The simulation's streaming agent (`tests.support.money_world:streamed`): chunk by chunk, each
    followed by what it used for it (odd values included: the agent reports what it likes)."""
    for index, used in enumerate(STREAMS[request.text]):
        yield streamed_chunk(request.text, index)
        yield Usage({"units": used})


def streamed_chunk(text: str, index: int) -> str:
    return f"<chunk {index} of {text}>"


def price_units(used: dict[str, Any]) -> int:
    """What the usage-priced agents' rule prices `used` at (the world's pricing callable, synchronous)."""
    return UNIT_PRICE * int(used.get("units", 0))


async def async_price(used: dict[str, Any]) -> int:
    """The same rule, as an operator might write it: `async def` (`tests.support.money_world:async_price`)."""
    return price_units(used)


def priced(agent: str, units: int) -> int:
    """What a usage-priced agent charges for `units`: the unit price, capped at its ceiling."""
    return min(UNIT_PRICE * units, CEILINGS[agent])


# -- the chain and the facilitator ------------------------------------------------


def word(n: int) -> str:
    return "0x" + format(n, "064x")


def address_word(address: str) -> str:
    return "0x" + "00" * 12 + address.lower().removeprefix("0x")


@dataclass
class Spend:
    """How a nonce was spent: a transfer (to, value) or a cancel."""

    kind: str  # transfer | cancel
    tx: str
    to: str = ""
    value: int = 0


class Chain:
    """The token contract: one spend per (authorizer, nonce), and who was paid by it. (The payment
    channels' settlement contract is the development chain's: `money_channels.ChannelChain`.)"""

    def __init__(self, world: World) -> None:
        self.world = world
        self.spends: dict[tuple[str, str], Spend] = {}
        self.receipts: dict[str, dict[str, Any]] = {}

    def spend(self, authorizer: str, nonce: str, kind: str, to: str = "", value: int = 0) -> Spend | None:
        key = (authorizer.lower(), nonce.lower())
        if key in self.spends:
            return None
        spend = self.spends[key] = Spend(kind, "0x" + secrets.token_hex(32), to.lower(), value)
        topic = gate_chain.AUTHORIZATION_USED_TOPIC if kind == "transfer" else gate_chain.AUTHORIZATION_CANCELED_TOPIC
        logs = [{"address": ASSET, "topics": [topic, address_word(authorizer), nonce.lower()], "data": "0x"}]
        if kind == "transfer":
            logs.append(
                {
                    "address": ASSET,
                    "topics": [gate_chain.TRANSFER_TOPIC, address_word(authorizer), address_word(to)],
                    "data": word(value),
                }
            )
        self.receipts[spend.tx] = {"transactionHash": spend.tx, "status": "0x1", "logs": logs}
        return spend

    def paid_to_us(self, authorizer: str, nonce: str, least: int = PRICE) -> bool:
        spend = self.spends.get((authorizer.lower(), nonce.lower()))
        return spend is not None and spend.kind == "transfer" and spend.to == PAY_TO and spend.value >= least

    def moved(self, authorizer: str, nonce: str) -> int:
        """What the nonce's spend paid to payTo (0: nothing, or not to us)."""
        spend = self.spends.get((authorizer.lower(), nonce.lower()))
        return spend.value if spend is not None and spend.kind == "transfer" and spend.to == PAY_TO else 0

    # JSON-RPC, as gate/chain.py asks it
    def rpc(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        method, params = body["method"], body["params"]
        result: Any = None
        if method == "eth_call" and params[0]["to"].lower() == SETTLEMENT_CONTRACT:
            result = self.world.channel_chain.rpc.answer(method, params)  # the development chain's contract
        elif method == "eth_call":
            data = params[0]["data"]
            authorizer, nonce = "0x" + data[10 + 24 : 10 + 64], "0x" + data[10 + 64 :]
            result = word(1 if (authorizer, nonce) in self.spends else 0)
        elif method == "eth_getLogs":
            topic, authorizer_topic, nonce = params[0]["topics"]
            spend = self.spends.get(("0x" + authorizer_topic[-40:], nonce))
            wanted = "transfer" if topic == gate_chain.AUTHORIZATION_USED_TOPIC else "cancel"
            result = [{"transactionHash": spend.tx}] if spend is not None and spend.kind == wanted else []
        elif method == "eth_getTransactionReceipt":
            result = self.receipts.get(params[0])
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": result})


class Facilitator:
    """verify and settle over the chain; `mode` says how settle answers now."""

    MODES = ("ok", "refused", "unknown_landed", "unknown_lost")

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.mode = "ok"
        self.settles = 0
        self.asked: list[tuple[str, int, int]] = []  # upto settles: (nonce, amount asked, ceiling authorized)

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if "permit2Authorization" in body["paymentPayload"]["payload"]:
            return self.handle_upto(request, body)
        if "type" in body["paymentPayload"]["payload"]:
            return self.handle_channel(request, body)
        auth = body["paymentPayload"]["payload"]["authorization"]
        authorizer, nonce = auth["from"], auth["nonce"]
        spent = (authorizer.lower(), nonce.lower()) in self.chain.spends
        expired = int(auth["validBefore"]) <= self.chain.world.now
        if request.url.path.endswith("/verify"):
            if spent or expired:
                reason = "invalid_exact_evm_nonce_already_used" if spent else "authorization_expired"
                return httpx.Response(200, json={"isValid": False, "invalidReason": reason, "payer": authorizer})
            return httpx.Response(200, json={"isValid": True, "payer": authorizer})
        self.settles += 1
        if self.mode == "refused":
            return httpx.Response(200, json={"success": False, "errorReason": "insufficient_funds"})
        if self.mode == "unknown_lost":
            return httpx.Response(503, text="down")
        if spent:
            return httpx.Response(200, json={"success": False, "errorReason": "invalid_exact_evm_nonce_already_used"})
        if expired:
            return httpx.Response(200, json={"success": False, "errorReason": "authorization_expired"})
        spend = self.chain.spend(authorizer, nonce, "transfer", auth["to"], int(auth["value"]))
        assert spend is not None
        if self.mode == "unknown_landed":  # the money moved, the answer is lost
            return httpx.Response(504, text="timeout")
        return httpx.Response(
            200, json={"success": True, "transaction": spend.tx, "network": NETWORK, "payer": authorizer}
        )

    def handle_upto(self, request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        """x402's upto over Permit2: verify the ceiling; settle `requirements.amount`, at most the ceiling."""
        auth = body["paymentPayload"]["payload"]["permit2Authorization"]
        owner, nonce, ceiling = auth["from"], auth["nonce"], int(auth["permitted"]["amount"])
        spent = (owner.lower(), nonce.lower()) in self.chain.spends
        expired = int(auth["deadline"]) <= self.chain.world.now
        if request.url.path.endswith("/verify"):
            if spent or expired:
                reason = "permit2_invalid_nonce" if spent else "permit2_deadline_expired"
                return httpx.Response(200, json={"isValid": False, "invalidReason": reason, "payer": owner})
            return httpx.Response(200, json={"isValid": True, "payer": owner})
        self.settles += 1
        amount = int(body["paymentRequirements"]["amount"])
        self.asked.append((nonce, amount, ceiling))
        if self.mode == "refused":
            return httpx.Response(200, json={"success": False, "errorReason": "insufficient_funds"})
        if self.mode == "unknown_lost":
            return httpx.Response(503, text="down")
        if spent:
            return httpx.Response(200, json={"success": False, "errorReason": "permit2_invalid_nonce"})
        if expired:
            return httpx.Response(200, json={"success": False, "errorReason": "permit2_deadline_expired"})
        if amount > ceiling:
            return httpx.Response(
                200, json={"success": False, "errorReason": "invalid_upto_evm_payload_settlement_exceeds_amount"}
            )
        spend = self.chain.spend(owner, nonce, "transfer", auth["witness"]["to"], amount)
        assert spend is not None
        if self.mode == "unknown_landed":
            return httpx.Response(504, text="timeout")
        answer = {"success": True, "transaction": spend.tx, "network": NETWORK, "payer": owner, "amount": str(amount)}
        return httpx.Response(200, json=answer)

    def handle_channel(self, request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        """batch-settlement, decided by the development facilitator's scheme over the development
        chain's settlement contract (`money_channels.ChannelChain`), in the mode the simulation chose
        for settles (a deposit settled again answers as the first time: the package's facilitator
        caches deposit settlements)."""
        chain = self.chain.world.channel_chain
        if request.url.path.endswith("/verify"):
            return httpx.Response(200, json=chain.decide("verify", body))
        self.settles += 1
        if self.mode == "refused":
            return httpx.Response(200, json={"success": False, "errorReason": "insufficient_funds"})
        if self.mode == "unknown_lost":
            return httpx.Response(503, text="down")
        answer = chain.decide("settle", body)
        if self.mode == "unknown_landed":
            return httpx.Response(504, text="timeout")
        return httpx.Response(200, json=answer)


# -- tokens ------------------------------------------------------------------------


@dataclass
class Token:
    """One payment signature: its authorization, the agent it pays, the message it pays for."""

    index: int
    agent: str
    authorizer: str
    nonce: str
    valid_before: int

    @property
    def text(self) -> str:
        return f"request {self.index}"

    @property
    def metered(self) -> bool:
        return self.agent in CEILINGS

    def header(self, resource: str) -> str:
        if self.metered:
            return self.upto_header(resource)
        accepted = {
            "scheme": "exact",
            "network": NETWORK,
            "asset": ASSET,
            "amount": str(PRICE),
            "payTo": PAY_TO,
            "maxTimeoutSeconds": WINDOW,
            "extra": {"name": "USDC", "version": "2"},
        }
        payload = {
            "x402Version": 2,
            "resource": {"url": resource},
            "accepted": accepted,
            "payload": {
                "signature": "0x" + "11" * 65,
                "authorization": {
                    "from": self.authorizer,
                    "to": PAY_TO,
                    "value": str(PRICE),
                    "validAfter": "0",
                    "validBefore": str(self.valid_before),
                    "nonce": self.nonce,
                },
            },
        }
        return base64.b64encode(json.dumps(payload).encode()).decode()

    def upto_header(self, resource: str) -> str:
        """An x402 upto payment: a Permit2 authorization of the agent's ceiling (its nonce a uint)."""
        ceiling = str(CEILINGS[self.agent])
        extra = {"name": "USDC", "version": "2", "facilitatorAddress": FACILITATOR_ADDRESS}
        accepted = {
            "scheme": "upto",
            "network": NETWORK,
            "asset": ASSET,
            "amount": ceiling,
            "payTo": PAY_TO,
            "maxTimeoutSeconds": WINDOW,
            "extra": {**extra, "assetTransferMethod": "permit2"},
        }
        authorization = {
            "from": self.authorizer,
            "permitted": {"token": ASSET, "amount": ceiling},
            "spender": UPTO_PROXY,
            "nonce": self.nonce,
            "deadline": str(self.valid_before),
            "witness": {"to": PAY_TO, "facilitator": FACILITATOR_ADDRESS, "validAfter": "0"},
        }
        payload = {
            "x402Version": 2,
            "resource": {"url": resource},
            "accepted": accepted,
            "payload": {"permit2Authorization": authorization, "signature": "0x" + "11" * 65},
        }
        return base64.b64encode(json.dumps(payload).encode()).decode()


CHANNEL_AUTHORIZER = money_channels.RECEIVER_AUTHORIZER
SETTLEMENT_CONTRACT = "0x4020074e9df2ce1dee5a9c1b5c3f541d02a10003"
DEPOSIT = 20 * PRICE


@dataclass
class ChannelToken:
    """One channel payment the payer signed: a deposit (with its voucher) or a voucher, for `cap`."""

    index: int
    kind: str
    cap: int
    payload: dict[str, Any]
    agent: str = "channel"
    method: str = "eip3009"  # the offer it pays: the channel's ERC-3009 or Permit2 deposits
    decoy: bool = False  # one of many channels' (`World.decoy_tokens`), not the payer's
    channel: str = ""  # the payer's channel it pays

    @property
    def text(self) -> str:
        return f"voucher {self.index}"

    def header(self, resource: str) -> str:
        accepted = {
            "scheme": "batch-settlement",
            "network": NETWORK,
            "asset": ASSET,
            "amount": str(PRICE),
            "payTo": PAY_TO,
            "maxTimeoutSeconds": WINDOW,
            "extra": {"name": "USDC", "version": "2", "receiverAuthorizer": CHANNEL_AUTHORIZER, "withdrawDelay": 900},
        }
        if self.method == "permit2":
            accepted["extra"]["assetTransferMethod"] = "permit2"
        document = {"x402Version": 2, "resource": {"url": resource}, "accepted": accepted, "payload": self.payload}
        return base64.b64encode(json.dumps(document).encode()).decode()


class ChannelPayer:
    """One payer with one channel, and what it believes the channel has charged (from its answers).
    Its deposits and vouchers are signed by the x402 package's client code, for the development chain."""

    def __init__(self) -> None:
        self.account = Account.create()
        self.salt = 0
        self.open_channel()

    def open_channel(self) -> None:
        """A channel of its own (another salt: the one before is left as it stands)."""
        self.config = money_channels.channel_config(self.account.address, self.salt)
        self.channel_id = money_channels.channel_id_of(self.config)
        self.salt += 1
        self.charged = 0  # what the payer believes
        self.balance = 0  # what it believes it deposited

    def sign(self, index: int, now: float, agent: str = "channel", form: str = "") -> ChannelToken:
        """Its next voucher (a deposit first, and again when it runs out), through either collector;
        with `form`, its signature in a form the contract refuses (`money_channels.non_canonical`)."""
        cap = self.charged + PRICE
        kind, method = "voucher", "permit2" if index % 2 else "eip3009"  # either offer takes a voucher
        if cap > self.balance:
            kind = "deposit"
            payload = money_channels.deposit_payload(self.account, self.config, DEPOSIT, cap, now + WINDOW, method)
        else:
            voucher = money_channels.voucher(self.account, self.channel_id, cap)
            payload = {"type": "voucher", "channelConfig": self.config, "voucher": voucher}
        if form:
            payload["voucher"]["signature"] = money_channels.non_canonical(payload["voucher"]["signature"], form)
        return ChannelToken(index, kind, cap, payload, agent=agent, method=method, channel=self.channel_id)

    def heard(self, token: ChannelToken, response: httpx.Response) -> None:
        """What the answer tells the payer: a receipt (charged, and its deposit counted), or a
        corrective 402 (where the channel stands)."""
        if "PAYMENT-RESPONSE" in response.headers:
            receipt = json.loads(base64.b64decode(response.headers["PAYMENT-RESPONSE"]))
            self.charged = int(receipt["extra"]["channelState"]["chargedCumulativeAmount"])
            if token.kind == "deposit":
                self.balance += DEPOSIT
        elif response.status_code == 402 and "PAYMENT-REQUIRED" in response.headers:
            document = json.loads(base64.b64decode(response.headers["PAYMENT-REQUIRED"]))
            offer = next((a for a in document["accepts"] if a["scheme"] == "batch-settlement"), {})
            state = offer.get("extra", {}).get("channelState")
            if state is not None:
                self.charged = int(state["chargedCumulativeAmount"])
                self.balance = max(self.balance, int(state["balance"]))


# -- replicas ------------------------------------------------------------------------


CONFIG = """
public_url = "http://gate.test"
database = "{database}"
reconcile_interval_seconds = {pass_interval}
claim_lease_seconds = {lease}
task_deadline_seconds = 100000

[limits]
per_ip_per_minute = 1000000
per_agent_per_minute = 1000000

[facilitator]
url = "http://facilitator.test"
timeout_seconds = 5
settle_attempts = 2
settle_backoff_seconds = 0.001
settle_passes = {passes}
settle_max_delay_seconds = {max_delay}
breaker_failures = 1000000

[channels]
claim_interval_seconds = {claim_interval}
claim_after_seconds = {claim_after}
{networks}
[agents.paid]
backend = "python"
callable = "tests.support.money_world:held"
deadline_seconds = 60
price = {{ network = "{network}", asset = "{asset}", amount = "{price}", pay_to = "{pay_to}" }}

[agents.metered-small]
backend = "python"
callable = "tests.support.money_world:held"
deadline_seconds = 60
price = {{ scheme = "upto", network = "{network}", asset = "{asset}", ceiling = "{small}", pay_to = "{pay_to}", facilitator_address = "{facilitator}", usage = {{ unit = "units", unit_price = "{unit_price}" }} }}

[agents.metered-large]
backend = "python"
callable = "tests.support.money_world:held"
deadline_seconds = 60
price = {{ scheme = "upto", network = "{network}", asset = "{asset}", ceiling = "{large}", pay_to = "{pay_to}", facilitator_address = "{facilitator}", usage = {{ unit = "units", unit_price = "{unit_price}" }} }}

[agents.channel]
backend = "python"
callable = "tests.support.money_world:held"
deadline_seconds = 60
price = {{ network = "{network}", asset = "{asset}", amount = "{price}", pay_to = "{pay_to}", scheme = "batch-settlement", receiver_authorizer = "{authorizer}", accepts = [{{}}, {{ asset_transfer_method = "permit2" }}] }}

[agents.channel-now]
backend = "python"
callable = "tests.support.money_world:at_once"
deadline_seconds = 60
price = {{ network = "{network}", asset = "{asset}", amount = "{price}", pay_to = "{pay_to}", scheme = "batch-settlement", receiver_authorizer = "{authorizer}", accepts = [{{}}, {{ asset_transfer_method = "permit2" }}] }}

[agents.metered-stream]
backend = "python"
callable = "tests.support.money_world:streamed"
deadline_seconds = 60
price = {{ scheme = "upto", network = "{network}", asset = "{asset}", ceiling = "{stream}", pay_to = "{pay_to}", facilitator_address = "{facilitator}", usage = {{ unit = "units", unit_price = "{unit_price}" }} }}
{async_agent}
[agents.withheld]
backend = "python"
callable = "tests.support.money_world:held"
deadline_seconds = 60
on_settle_failure = "withhold"
price = {{ network = "{network}", asset = "{asset}", amount = "{price}", pay_to = "{pay_to}" }}
"""


ASYNC_PRICED = """
[agents.metered-async]
backend = "python"
callable = "tests.support.money_world:held"
deadline_seconds = 60
price = {{ scheme = "upto", network = "{network}", asset = "{asset}", ceiling = "{large}", pay_to = "{pay_to}", facilitator_address = "{facilitator}", usage = {{ callable = "tests.support.money_world:async_price" }} }}
"""
WATCHED = """
[networks."{network}"]
rpc_url = "http://chain.test/rpc"
"""


@dataclass(frozen=True)
class Operator:
    """What the operator set that decides when channels are claimed: whether the gate can ask the
    chain (`[networks] rpc_url`: the withdrawal watch, and an exact settle's ground truth), and the
    claim schedule (`[channels]`)."""

    watched: bool = True
    claim_after_seconds: float = 120.0
    claim_interval_seconds: float = 120.0

    def __str__(self) -> str:
        watch = "[networks] rpc_url set" if self.watched else "no [networks] rpc_url"
        return f"{watch}, [channels] claim_after_seconds = {self.claim_after_seconds:g}"


OPERATORS = [
    Operator(),
    Operator(watched=False),
    Operator(claim_after_seconds=3600.0),  # the schedule's old default
    Operator(watched=False, claim_after_seconds=3600.0),
]


class Replica:
    """One process of the gate: its services, its app, a client, its own wall clock."""

    def __init__(self, world: World, name: str, skew: float = 0.0) -> None:
        self.world, self.name, self.skew = world, name, skew
        self.services = Services(world.settings, PaymentGate.from_parts)
        gate = self.services.anonymous
        assert isinstance(gate, PaymentGate)
        self.gate = gate
        self.alive = True
        self.stalled = False
        self.requests: list[asyncio.Task[None]] = []
        db = self.services.db
        db.__class__ = type(f"Sim{type(db).__name__}", (type(db),), {"clock_sql": world.clock_property()})
        self.gate.claims.local_clock = lambda: world.now + self.skew  # type: ignore[attr-defined]
        gate.facilitator.client = httpx.AsyncClient(
            base_url="http://facilitator.test", transport=httpx.MockTransport(world.facilitator.handle)
        )
        gate.chain.clients[NETWORK] = httpx.AsyncClient(transport=httpx.MockTransport(world.chain.rpc))
        app = create_app(world.settings, PaymentGate.from_parts)
        app.state.services = self.services
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, client=("203.0.113.7", 4000)), base_url="http://gate.test"
        )

    async def open(self) -> None:
        await self.services.open_store()


WORLDS = itertools.count()


def quicker(monkeypatch: Any) -> None:
    """What the simulation's replicas and chain spend nothing on, spent once: the TLS context a
    replica's facilitator client builds (its transport is replaced by the simulation's; loading the
    CA bundle was a tenth of a run), and the checksummed addresses of the development chain."""
    shared = functools.cache(httpx.create_ssl_context)
    monkeypatch.setattr(httpx, "create_ssl_context", lambda *args, **kwargs: shared(*args, **kwargs))
    money_channels.checksums_remembered(monkeypatch)


def check_config(path: Path) -> list[str]:
    """What `a2a-gate check-config` says is wrong with the file (nothing: it passes); the file alone
    (`--file-only`, where the command has it: the simulation's database and key are its own)."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
            try:
                args = build_parser().parse_args(["check-config", "--file-only", str(path)])
            except SystemExit:
                args = build_parser().parse_args(["check-config", str(path)])
            status = args.func(args)
    except ConfigError as refused:
        return refused.problems
    return [] if status == 0 else said.getvalue().splitlines() or [f"check-config exited {status}"]


class World:
    """The database, the chains, the facilitator, the replicas and the virtual clock."""

    def __init__(self, database: str, workdir: Path) -> None:
        self.now = 1_900_000_000.0  # the database's clock
        self.database, self.workdir = database, workdir
        self.operator = Operator()
        # what check-config refused when the simulation asked for it: (the setting, its problems)
        self.refused: list[tuple[str, list[str]]] = []
        self.async_pricing = True  # an `async def` pricing callable is configured (not refused)
        self.settings = self.configure(Operator())
        self.chain = Chain(self)
        self.channel_chain = ChannelChain(workdir / f"chain-{next(WORLDS)}.db", lambda: self.now)
        self.facilitator = Facilitator(self.chain)
        self.replicas: list[Replica] = []
        self.tokens: list[Token] = []
        self.indexes = itertools.count()
        self.priced: dict[str, int | None] = {}  # task id -> its usage's price when its agent completed (None: odd)
        self.answers: list[tuple[Token | ChannelToken, dict[str, Any]]] = []  # every Task a client was answered
        self.payer = ChannelPayer()
        self.channel_tokens: list[ChannelToken] = []
        self.decoys: list[ChannelToken] = []  # another payer's channels' first payments
        self.many_opened = False  # the many channels (`money_channels.DECOYS`) are open
        self.others = 0  # how many of its other channels (`money_channels.OTHERS`) are open
        self.streams: dict[str, list[float]] = {}  # a streamed request's text -> the usage after each chunk
        # channels whose payer took its unclaimed balance back while the gate was down (no setting helps)
        self.withdrawn_in_outage: set[str] = set()
        self.charge_times: dict[str, list[tuple[int, float]]] = {}  # channel -> (charged total, when first seen)

    def config_text(self, operator: Operator, async_pricing: bool) -> str:
        return CONFIG.format(
            database=self.database,
            pass_interval=PASS_INTERVAL,
            lease=LEASE,
            passes=PASSES,
            max_delay=MAX_DELAY,
            network=NETWORK,
            asset=ASSET,
            price=PRICE,
            pay_to=PAY_TO,
            small=CEILINGS["metered-small"],
            large=CEILINGS["metered-large"],
            stream=CEILINGS["metered-stream"],
            facilitator=FACILITATOR_ADDRESS,
            unit_price=UNIT_PRICE,
            authorizer=CHANNEL_AUTHORIZER,
            claim_interval=operator.claim_interval_seconds,
            claim_after=operator.claim_after_seconds,
            networks=WATCHED.format(network=NETWORK) if operator.watched else "",
            async_agent=ASYNC_PRICED.format(
                network=NETWORK,
                asset=ASSET,
                large=CEILINGS["metered-async"],
                pay_to=PAY_TO,
                facilitator=FACILITATOR_ADDRESS,
            )
            if async_pricing
            else "",
        )

    def configure(self, operator: Operator) -> Any:
        """The settings for `operator`, as check-config reads them. A setting it refuses is recorded
        (`refused`) and left out: the operator's own (then the default schedule, watched), or the
        agent priced by an `async def` callable."""
        config = self.workdir / "gate.toml"
        for async_pricing in (True, False):
            for candidate in (operator, Operator()):
                config.write_text(self.config_text(candidate, async_pricing))
                problems = check_config(config)
                if problems:
                    pricing = ", and an agent priced by an `async def` callable" if async_pricing else ""
                    self.refused.append((f"{candidate}{pricing}", problems))
                    continue
                self.operator, self.async_pricing = candidate, async_pricing
                return load_config(str(config))
        raise AssertionError(f"check-config refuses every setting the simulation tried: {self.refused}")

    def new_channel_token(self, agent: str = "channel", form: str = "") -> ChannelToken:
        token = self.payer.sign(next(self.indexes), self.now, agent, form)
        self.channel_tokens.append(token)
        return token

    def decoy_tokens(self) -> list[ChannelToken]:
        """Many channels of another payer, deposited into on chain (its own transaction), then a first
        voucher for each: more channels than a page of any listing the gate reads."""
        self.many_opened = True
        return self.other_channels(0, money_channels.DECOYS)

    def other_channels(self, first: int, count: int) -> list[ChannelToken]:
        """Another payer's channels `first` to `first + count` (deposited on chain by its own
        transaction), and a first voucher for each."""
        self.channel_chain.deposit_decoys(first, count)
        tokens = [
            ChannelToken(next(self.indexes), "voucher", PRICE, json.loads(payload), agent="channel-now", decoy=True)
            for payload, _ in money_channels.decoys()[first:][:count]
        ]
        self.decoys.extend(tokens)
        return tokens

    def clock_property(self) -> property:
        return property(lambda db: repr(float(self.now)))

    def new_token(self, agent: str) -> Token:
        index = next(self.indexes)
        nonce = str(secrets.randbits(128)) if agent in CEILINGS else "0x" + secrets.token_hex(32)  # Permit2: a uint
        token = Token(index, agent, "0x" + format(index + 1, "040x"), nonce, int(self.now) + WINDOW)
        self.tokens.append(token)
        return token

    async def add_replica(self, skew: float = 0.0) -> Replica:
        replica = Replica(self, f"r{len(self.replicas)}", skew)
        await replica.open()
        await replica.gate.check_sealing_key()  # what `serve` does first: the key is the database's
        self.replicas.append(replica)
        return replica
