"""The `a2a-gate` command: serve, check a configuration, manage keys, see payments.

Its parser and subcommands; the app they serve is composed in `gate/app.py`, and the
processes `serve` runs beside it (workers, the development facilitator) are `gate/processes.py`'s.

Every subcommand finds its configuration the same way: `--config FILE`, before or after
the subcommand, else the file A2A_GATE_CONFIG names, else the embedded defaults (the
database `a2a-gate.db` in the working directory, which the command names on stderr). A
command that only reads never creates a database it did not find: run from the wrong
directory it says so instead of answering from an empty one. A bad configuration stops
with one line per problem and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gate import config as gate_config
from gate import payment_filters, processes
from gate.app import CONFIG_ENV, apply_overrides, build_app, configured, load_settings
from gate.config import load_config
from gate.payment_filters import BadFilter
from gate.payment_log import ACTIONS
from gate.sealing import SealingKeyMismatch, SealingKeyMissing, load_key
from server import secret_files, signing_key, tracing
from server.config import ConfigError, Settings, is_database_url, trusted_proxy_problem
from server.database import DatabaseRefused, DatabaseUnavailable
from server.reload import hold_sighup
from server.signing_key import SigningKeyError

if TYPE_CHECKING:
    from server.app import Services
    from server.database import Database

CONFIG_HELP = (
    f"TOML configuration file, before or after the subcommand (default: the file ${CONFIG_ENV} names, "
    "else the embedded defaults: a2a-gate.db in the working directory)"
)
DATABASE_HELP = "SQLite file or postgresql:// URL (overrides the configuration)"
T = TypeVar("T")


class NoDatabase(Exception):
    """A command that needs an existing database found none where its configuration points."""


def cmd_serve(args: argparse.Namespace) -> int:
    hold_sighup()  # a SIGHUP from here on waits for the server to reload, in this process and its workers

    from server import request_log
    from server.deadlines import server_config

    request_log.configure(json_lines=args.log_json, level=args.log_level)
    settings = load_settings(args.config)
    for warning in settings.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    checked = settings
    if args.dev_facilitator:  # as it will run: the development facilitator and its chain
        dev = f"http://127.0.0.1:{args.dev_facilitator}"
        checked = gate_config.with_dev_chain(gate_config.with_facilitator_url(settings, dev), dev)
    problems = [
        f"--trusted-proxy {value!r}: {problem}"
        for value in args.trusted_proxy or ()
        if (problem := trusted_proxy_problem(value))
    ]
    problems += preflight(checked, args.database or settings.database)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    database = args.database or settings.database
    _check_sealing_key(database)
    overrides: dict[str, Any] = {}
    if args.trusted_proxy:
        overrides["trusted_proxies"] = args.trusted_proxy
    if args.database:
        overrides["database"] = args.database
    processes.unwind_on_sigterm()
    with contextlib.ExitStack() as stack:
        if args.dev_facilitator:  # its chain is where the channels it opens live: the gate watches it there
            ledger = settings.database + ".ledger"
            overrides["facilitator_url"] = stack.enter_context(processes.dev_facilitator(args.dev_facilitator, ledger))
            overrides["dev_chain"] = True
        settings = apply_overrides(settings, overrides)
        if args.workers > 1:
            if args.config:
                os.environ[CONFIG_ENV] = os.path.abspath(args.config)
            os.environ["A2A_GATE_OVERRIDES"] = json.dumps(overrides)
            os.environ["A2A_GATE_LOG_JSON"] = "1" if args.log_json else "0"
            os.environ["A2A_GATE_LOG_LEVEL"] = args.log_level
            processes.run_workers(
                server_config(
                    "gate.app:app_from_env",
                    settings.http,
                    factory=True,
                    host=args.host,
                    port=args.port,
                    workers=args.workers,
                    proxy_headers=False,
                    access_log=False,
                    log_level=args.log_level,
                    log_config=None,  # uvicorn logs through our handler (request_log.configure)
                ),
                settings.http.metrics_listen,
            )
        else:
            server = processes.Serving(
                server_config(
                    build_app(settings, lambda: configured(args.config, overrides)),
                    settings.http,
                    host=args.host,
                    port=args.port,
                    proxy_headers=False,
                    access_log=False,
                    log_level=args.log_level,
                    log_config=None,  # uvicorn logs through our handler (request_log.configure)
                )
            )
            if settings.http.metrics_listen:  # two listeners, one process: the A2A port and the metrics one
                server.run(
                    sockets=[processes.tcp(server.config.bind_socket()), processes.listen(settings.http.metrics_listen)]
                )
            else:
                server.run()
            if not server.started:
                return 3  # uvicorn's own exit status for a server that could not start
    return 0


def _database_failure(location: str) -> str | None:
    """Why the database cannot be opened, or None: checked before the server starts, so a
    wrong URL is one line of error (a refusal at once, an unreachable server after the start's
    patience) rather than a traceback from the server's start-up."""
    from server.app import DATABASE_START_SECONDS, open_until_ready
    from server.engines import open_database

    async def check() -> None:
        db = open_database(location)
        try:
            await open_until_ready(db, DATABASE_START_SECONDS)
        finally:
            await db.close()

    try:
        asyncio.run(check())
    except (DatabaseRefused, DatabaseUnavailable) as exc:
        return f"the database cannot be opened: {exc}"
    return None


def _check_sealing_key(database: str) -> None:
    """Before serving: a key other than the one the database was sealed with stops here, in one line."""
    from gate.sealing import Sealer
    from server.engines import open_database

    async def run() -> None:
        db = open_database(database)
        await db.open()
        try:
            await Sealer(load_key(database)).check(db)
        finally:
            await db.close()

    asyncio.run(run())


def cmd_check_config(args: argparse.Namespace) -> int:
    path = args.file or args.config or os.environ.get(CONFIG_ENV)
    if not path:
        print(f"error: no configuration file: give FILE or --config FILE, or set {CONFIG_ENV}", file=sys.stderr)
        return 2
    settings = load_config(path)
    for warning in settings.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    problems = (
        [f"{settings.source}: {p}" for p in gate_config.claim_obligation_problems(gate_config.of(settings))]
        if args.file_only
        else preflight(settings, settings.database, opening=False)
    )
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 2
    payments = gate_config.of(settings)
    priced = [name for name in settings.agents if payments.price(name)]
    print(f"{path}: OK ({len(settings.agents)} agents, {len(priced)} priced, database {settings.database})")
    return 0


def preflight(settings: Settings, database: str, *, opening: bool = True) -> list[str]:
    """Every check `serve` makes before it listens, each problem one line naming its key or variable;
    `check-config` makes the same ones (`opening=False`: it creates no database file, and reads the
    sealing fingerprints only of a database that exists)."""
    problems = [f"{settings.source}: {p}" for p in gate_config.claim_obligation_problems(gate_config.of(settings))]
    problems += [f"{settings.source}: {p}" for p in tracing.problems(settings.tracing)]  # the `otel` extra
    named = [("http.metrics_token_env", settings.http.metrics_token_env)]
    named.append(("facilitator.auth_header_env", gate_config.of(settings).facilitator.auth_header_env))
    named += [(f"agents.{n}.upstream_auth_env", a.upstream_auth_env) for n, a in settings.agents.items()]
    endpoints = gate_config.of(settings).webhooks.endpoints
    named += [(f"webhooks.endpoints[{i}].secret_env", e.secret_env) for i, e in enumerate(endpoints)]
    for key, variable in named:
        try:
            if variable and not secret_files.secret(variable):
                problems.append(f"{key} names {variable}, which is not set (or empty)")
        except secret_files.SecretFileError as exc:
            problems.append(f"{key}: {exc}")
    problems += _sealing_key_problems(database)
    problems += _signing_key_problems(settings)
    local = not is_database_url(database) and database != ":memory:"
    if local and not os.path.exists(database):
        if not os.access(os.path.dirname(os.path.abspath(database)), os.W_OK | os.X_OK):
            problems.append(f"database {database}: its directory is missing or not writable by this user")
        elif not opening:
            return problems  # check-config makes no file; serve would make it here
    if not problems:  # opened last: a refused configuration leaves no database file behind
        failure = _database_failure(database)
        if failure:
            problems.append(failure)
    return problems


def _signing_key_problems(settings: Settings) -> list[str]:
    """The operator's signing key as `serve` would load it ([signing]), and whether it can sign the
    offers and receipts in the configured form; a problem names its source, never the key."""
    try:
        key = signing_key.load(settings.signing)
    except SigningKeyError as exc:
        return [str(exc)]
    form = gate_config.of(settings).offer_receipt.format
    if key is not None and form == "eip712" and key.secp256k1_secret is None:
        return [f'offer_receipt.format = "eip712" needs a secp256k1 key; [signing]\'s key signs {key.algorithm}']
    return []


def _sealing_key_problems(database: str) -> list[str]:
    """The sealing key as a start would load it, without making a key file: missing for PostgreSQL,
    or malformed (the variable, its file, or the key file beside a SQLite database)."""
    from gate.sealing import ENV_KEY, SealingKeyMissing, decode_ring

    try:
        if os.environ.get(ENV_KEY) or is_database_url(database):
            load_key(database)
        elif database != ":memory:" and os.path.exists(database + ".sealing-key"):
            decode_ring(Path(database + ".sealing-key").read_text(), f"sealing key file {database}.sealing-key")
    except SealingKeyMissing as exc:
        return [str(exc)]
    except OSError as exc:
        return [f"sealing key file {database}.sealing-key cannot be read ({exc.strerror})"]
    return []


def _settings(args: argparse.Namespace) -> Settings:
    """The configuration a management command works on: `--config`, with `--database` over it.

    Its SQLite file must exist unless the command may create it (`keys create`, `migrate`);
    on the embedded defaults the command says which file it uses."""
    settings = load_settings(args.config)
    if args.database:
        settings = replace(settings, database=args.database)
    if is_database_url(settings.database):
        return settings
    path = os.path.abspath(settings.database)
    found = os.path.exists(path)
    if not found and not args.may_create:
        raise NoDatabase(
            f"no database at {path} ({_source(args)}); run this where the server runs, "
            f"or give the server's configuration with --config FILE or {CONFIG_ENV}"
        )
    if not (args.config or args.database or os.environ.get(CONFIG_ENV)):
        print(f"note: no --config or {CONFIG_ENV}: using {path}{'' if found else ' (new)'}", file=sys.stderr)
    return settings


def _source(args: argparse.Namespace) -> str:
    """Where a command's database came from, for its messages."""
    if args.database:
        return "from --database"
    if args.config:
        return f"from --config {args.config}"
    if os.environ.get(CONFIG_ENV):
        return f"from {CONFIG_ENV}={os.environ[CONFIG_ENV]}"
    return f"the embedded defaults; no --config or {CONFIG_ENV} given"


def _with_database(args: argparse.Namespace, work: Callable[[Database], Awaitable[T]]) -> T:
    """Run `work` against the configured database (or `--database`), opened for it and closed after."""
    from server.engines import open_database

    async def run() -> T:
        db = open_database(_settings(args).database)
        await db.open()
        try:
            return await work(db)
        finally:
            await db.close()

    return asyncio.run(run())


@contextlib.asynccontextmanager
async def _opened_services(args: argparse.Namespace, settings: Settings | None = None) -> AsyncIterator[Services]:
    """The server and its gate on the configured database, every table up to date; nothing served."""
    from gate.gate import PaymentGate
    from server.app import Services

    services = Services(settings or _settings(args), PaymentGate.from_parts)
    try:
        await services.open_store()
        yield services
    finally:
        await services.anonymous.close()
        await services.agents.aclose()
        await services.db.close()


def cmd_keys(args: argparse.Namespace) -> int:
    return _with_database(args, lambda db: _keys(args, db))


def _utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch))


def duration(text: str) -> float:
    """`--expires-in`: a positive number with a unit (s, m, h, d), e.g. 90d."""
    try:
        return payment_filters.duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


async def _keys(args: argparse.Namespace, db: Database) -> int:
    from server import principals

    await principals.create_tables(db)
    if args.keys_command == "create":
        expires_at = time.time() + args.expires_in if args.expires_in is not None else None
        try:
            key, digest = await principals.create_key(db, args.name, args.agent or ["*"], expires_at)
        except ValueError as exc:
            print(f"error: {exc}; choose another name (`a2a-gate keys list` shows the names taken)", file=sys.stderr)
            return 2
        print(f"key (shown once, keep it secret): {key}")
        if expires_at is not None:
            print(f"expires {_utc(expires_at)} UTC")
        print("stored form, for a [[keys]] entry in a configuration file:")
        print(
            f'  [[keys]]\n  name = "{args.name}"\n  sha256 = "{digest}"\n  agents = {json.dumps(args.agent or ["*"])}'
        )
    elif args.keys_command == "list":
        now = time.time()
        for row in await principals.list_keys(db):
            expired = row["expires_at"] is not None and row["expires_at"] <= now
            state = "revoked" if row["revoked"] else "expired" if expired else "active"
            expires = f"expires {_utc(row['expires_at'])}" if row["expires_at"] is not None else "no expiry"
            used = f"last used {_utc(row['last_used_at'])}" if row["last_used_at"] is not None else "never used"
            print(f"{row['name']}\t{state}\t{','.join(row['agents'])}\tsha256:{row['sha256'][:12]}…\t{expires}\t{used}")
    elif args.keys_command == "revoke":
        if await principals.revoke_key(db, args.name) == 0:
            print(f"error: no key named {args.name!r}", file=sys.stderr)
            return 2
        print(f"revoked {args.name}")
    return 0


# amount: what the row's payment is charged; authorized: what its payer signed for (an upto ceiling)
PAYMENT_COLUMNS = ("time (UTC)", "action", "agent", "payer", "amount", "authorized", "transaction", "error", "task")


def cmd_payments(args: argparse.Namespace) -> int:
    from gate.payment_log import PaymentLog

    if args.payments_command == "records":
        return cmd_payment_records(args)
    if args.payments_command == "export":
        return cmd_payments_export(args)
    if args.summary:
        return cmd_payments_summary(args)
    action = "write_off" if args.unsettled else "needs_attention" if args.needs_attention else args.action

    async def read(db: Database) -> list[dict[str, Any]]:
        log = PaymentLog(db)
        await log.create_tables()
        return await log.rows(agent=args.agent, payer=args.payer, action=action, limit=args.limit)

    rows = _with_database(args, read)
    print("\t".join(PAYMENT_COLUMNS))
    for row in rows:
        at = _utc(row["at"])
        print(
            f"{at}\t{row['action']}\t{row['agent']}\t{row['payer'] or '-'}\t{row['amount'] or '-'}\t"
            f"{row.get('authorized') or row['amount'] or '-'}\t{row['transaction'] or '-'}\t"
            f"{row['error'] or '-'}\t{row['task_id'] or '-'}"
        )
    if not rows:
        print("(no payment log rows" + (" match" if action or args.agent or args.payer else "") + ")", file=sys.stderr)
    return 0


def cmd_payments_summary(args: argparse.Namespace) -> int:
    """Per agent and day: callers asked to pay, paid requests, revenue, settle outcomes, owed, written off."""
    from gate.payment_log import PaymentLog
    from gate.payment_summary import COUNTS, summary

    since = time.time() - args.days * 86400

    async def read(db: Database) -> list[Any]:
        await PaymentLog(db).create_tables()
        return await summary(db, since, agent=args.agent or "")

    rows = _with_database(args, read)
    table: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:  # per day and agent, each money named beside its amount
        entry = table.setdefault(
            (row.day, row.agent), {"revenue": Counter(), "authorized": Counter(), **dict.fromkeys(COUNTS, 0)}
        )
        money = f"{row.asset}@{row.network}"
        if row.counts["settled"]:
            entry["revenue"][money] += row.revenue
        if row.counts["verified"]:
            entry["authorized"][money] += row.authorized
        for name in COUNTS:
            entry[name] += row.count(name)
    amounts = ("revenue (atomic units, asset@network)", "authorized (atomic units, asset@network)")
    print("\t".join(["day (UTC)", "agent", *COUNTS[:3], *amounts, *COUNTS[3:]]))  # the money after the first three
    for (day, agent), entry in sorted(table.items()):
        revenue = ", ".join(f"{amount} {money}" for money, amount in sorted(entry["revenue"].items())) or "0"
        authorized = ", ".join(f"{amount} {money}" for money, amount in sorted(entry["authorized"].items())) or "0"
        counts = [str(entry[name]) for name in COUNTS]
        print("\t".join([day, agent, *counts[:3], revenue, authorized, *counts[3:]]))
    if not table:
        print(f"(nothing in the last {args.days:g} days)", file=sys.stderr)
    return 0


def record_filters(args: argparse.Namespace) -> Any:
    """The records `payments records` and `payments export` name, checked (`BadFilter`)."""
    return payment_filters.record_filters(
        args.since, args.until, args.agent, args.payer, getattr(args, "state", None), time.time()
    )


RECORD_LINE = (
    "started (UTC)",
    "state",
    "agent",
    "payer",
    "scheme",
    "amount",
    "authorized",
    "asset@network",
    "transaction",
    "settled (UTC)",
    "error",
    "task",
    "payment",
)


def cmd_payment_records(args: argparse.Namespace) -> int:
    """Payments as records, newest first: what became of each, and why."""
    from gate.payment_log import PaymentLog
    from gate.payment_records import PaymentRecords

    try:
        filters = record_filters(args)
    except BadFilter as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    async def read(db: Database) -> list[Any]:
        await PaymentLog(db).create_tables()
        found = []
        async for record in PaymentRecords(db).read(filters, newest_first=True):
            found.append(record)
            if len(found) >= args.limit:
                break
        return found

    records = _with_database(args, read)
    print("\t".join(RECORD_LINE))
    for r in records:
        print(
            f"{_utc(r.started_at)}\t{r.state}\t{r.agent or '-'}\t{r.payer or '-'}\t{r.scheme or '-'}\t"
            f"{r.amount or '-'}\t{r.authorized or '-'}\t{r.asset or '-'}@{r.network or '-'}\t{r.transaction or '-'}\t"
            f"{_utc(r.settled_at) if r.settled_at else '-'}\t{r.error or '-'}\t{r.task_id or '-'}\t{r.payment_id[:16]}"
        )
    if not records:
        print("(no payment records match)", file=sys.stderr)
    return 0


def cmd_payments_export(args: argparse.Namespace) -> int:
    """Records or the daily summary, as CSV or JSON, on stdout or into a file."""
    from gate import payment_exports as exports
    from gate.payment_log import PaymentLog
    from gate.payment_records import PaymentRecords
    from gate.payment_summary import summary

    try:
        if args.format not in exports.FORMATS:  # named before the filters, as it always was
            raise BadFilter(f"--format {args.format!r}: one of {', '.join(exports.FORMATS)}")
        filters = record_filters(args)
        payment_filters.export_checked(args.what, args.format, filters)
    except BadFilter as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    async def write(db: Database) -> None:
        await PaymentLog(db).create_tables()
        if args.what == "summary":
            rows = exports.each(exports.summary_rows(await summary(db, filters.since, filters.until, filters.agent)))
            columns = exports.SUMMARY_COLUMNS
        else:
            rows, columns = exports.record_rows(PaymentRecords(db).read(filters)), exports.RECORD_COLUMNS
        with contextlib.ExitStack() as files:
            out = sys.stdout
            if args.output:
                out = files.enter_context(open(args.output, "w", encoding="utf-8", newline=""))
            async for chunk in exports.encoded(rows, columns, args.format):
                out.write(chunk)

    try:
        _with_database(args, write)
    except OSError as exc:  # the output file
        print(f"error: --output {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


CHANNEL_COLUMNS = (
    "channel",
    "payer",
    "charged",
    "claimed",
    "balance",
    "in flight",
    "failed claims",
    "last charge (UTC)",
    "first unclaimed charge (UTC)",
    "state",
)


def cmd_channels(args: argparse.Namespace) -> int:
    from gate.flows.channel import flow as channel
    from gate.gate import PaymentGate

    settings = _settings(args)
    if getattr(args, "facilitator", None):
        settings = gate_config.with_facilitator_url(settings, args.facilitator)
    if args.channels_command in ("claim", "refund") and not gate_config.of(settings).facilitator.url:
        print(
            "error: no facilitator to send the claims to: set [facilitator] url, or pass --facilitator URL"
            " (the one `serve` uses: http://127.0.0.1:8402 with --dev-facilitator 8402)",
            file=sys.stderr,
        )
        return 2

    async def run() -> int:
        async with _opened_services(args, settings) as services:
            gate = services.anonymous
            assert isinstance(gate, PaymentGate)
            channels = channel.of(gate.parts.flows)
            if args.channels_command == "claim":
                from gate.flows.channel import jobs as channel_jobs

                await gate.check_sealing_key()
                if args.retry_refused:
                    print(f"{await channels.store.retry_refused()} refused voucher(s) to claim again")
                outcomes = await gate.claim_channels(now=True)
                for outcome in outcomes:
                    print("\t".join(f"{k}={v}" for k, v in outcome.items()))
                left = await channel_jobs.left_unclaimed(channels)
                for row in left:
                    print("\t".join(f"{k}={v}" for k, v in {"outcome": "left", **row}.items()))
                claimed = [o for o in outcomes if o["outcome"] == "claimed"]
                why = Counter(str(row["why"]).split(":")[0] for row in left)
                print(
                    f"{sum(o['channels'] for o in claimed)} channel(s) claimed"
                    f" ({sum(o['amount'] for o in claimed)} atomic units); {len(left)} left with unclaimed charges"
                    + (f" ({', '.join(f'{n} {w}' for w, n in sorted(why.items()))})" if left else "")
                )
                fine = ("claimed", "swept", "skipped", "confirmed", "withdrawal_requested")
                set_aside_before = all(str(row["why"]).startswith("refused") for row in left)
                return 0 if all(o["outcome"] in fine for o in outcomes) and set_aside_before else 1
            if args.channels_command == "refund":
                await gate.check_sealing_key()
                outcomes = await gate.refund_channels(args.idle)
                for outcome in outcomes:
                    print("\t".join(f"{k}={v}" for k, v in outcome.items()))
                print(f"{sum(o['outcome'] == 'refunded' for o in outcomes)} channel(s) refunded")
                return 0 if all(o["outcome"] in ("refunded", "swept") for o in outcomes) else 1
            print("\t".join(CHANNEL_COLUMNS))
            for c in await channels.store.listing(args.limit):
                at = _utc(c.charged_at) if c.charged_at else "-"
                first = c.first_charged_at if c.unclaimed else 0
                since = _utc(first) if first else "-"
                print(
                    f"{c.channel_id}\t{c.payer}\t{c.charged}\t{c.total_claimed}\t{c.balance}\t"
                    f"{'yes' if c.reserved_by else 'no'}\t{c.claim_failures}\t{at}\t{since}\t{c.claim_state()}"
                )
            return 0

    return asyncio.run(run())


def cmd_migrate(args: argparse.Namespace) -> int:
    """Create or bring up to date every table, then stop (a deployment step before replicas start)."""

    async def run() -> list[dict[str, Any]]:
        async with _opened_services(args) as services:
            return await services.db.fetch("SELECT component, version FROM schema_versions ORDER BY component")

    for row in asyncio.run(run()):
        print(f"{row['component']}\tversion {row['version']}")
    return 0


def cmd_reconcile(args: argparse.Namespace) -> int:
    from gate.gate import PaymentGate

    async def run() -> list[dict[str, Any]]:
        async with _opened_services(args) as services:
            assert isinstance(services.anonymous, PaymentGate)
            if args.reopen is not None:
                await services.anonymous.check_sealing_key()
                task_id = None if args.reopen == "all" else args.reopen
                reopened = await services.anonymous.claims.reopen(task_id)
                print(f"{reopened} settlement(s) needing attention re-opened")
            return await services.anonymous.reconcile_once()

    outcomes = asyncio.run(run())
    for outcome in outcomes:
        print(
            f"{outcome['task_id']}\t{outcome['payer']}\t{outcome['state']}\t{outcome['x402.payment.status']}\t"
            f"{outcome.get('x402.payment.error', '')}"
        )
    states = Counter(str(outcome["state"]) for outcome in outcomes)
    told = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    print(f"{len(outcomes)} owed settlement(s) attempted" + (f": {told}" if told else ""))
    # decided (settled, written off, charged nothing, taken by another process) is done; still owed or
    # undecidable is the operator's to look at: a missing key, a facilitator down, no chain endpoint
    return 1 if states.keys() & {"settle_failed", "needs_attention"} else 0


def cmd_signing_key(args: argparse.Namespace) -> int:
    """The public half of the operator's signing key ([signing]), for payers and clients to pin: its
    JWK, its `kid` (what every signature names) and, for a secp256k1 key, its Ethereum address (what
    an EIP-712 signature recovers). Never the private key."""
    settings = load_settings(args.config)
    try:
        key = signing_key.load(settings.signing)
    except SigningKeyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if key is None:
        print("error: no signing key configured ([signing] key_file or key_env): nothing is signed", file=sys.stderr)
        return 2
    shown = {"alg": key.algorithm, "kid": key.kid, "jwk": key.public_jwk}
    if key.address:
        shown["address"] = key.address
    print(json.dumps(shown, indent=2))
    return 0


def cmd_sealing_key(args: argparse.Namespace) -> int:
    """`show`: the ring's fingerprints beside the ones the database records; `reseal`: every stored
    sealed value under the ring's first key, which the database then records alone."""
    from gate.sealing import Sealer

    async def run() -> int:
        async with _opened_services(args) as services:
            sealer = Sealer(load_key(services.settings.database))
            if args.sealing_command == "reseal":
                counts = await sealer.reseal(services.db)
                for table, n in counts.items():
                    print(f"{table}\t{n} value(s) sealed again")
            recorded = await sealer.recorded(services.db)
            print(
                "ring:\t"
                + "\t".join(f"{fp} ({'seals' if i == 0 else 'unseals'})" for i, fp in enumerate(sealer.fingerprints))
            )
            print("database:\t" + "\t".join(recorded[name] for name in sorted(recorded)))
            missing = sorted(set(recorded.values()) - set(sealer.fingerprints))
            if missing:
                print(
                    f"error: this ring lacks {', '.join(missing)}, which sealed values the database holds",
                    file=sys.stderr,
                )
                return 2
            return 0

    return asyncio.run(run())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="a2a-gate",
        description="An A2A server with an x402 payment gate.",
        epilog=f"Every subcommand takes --config FILE (before or after it) or reads ${CONFIG_ENV}.",
    )
    parser.add_argument("--config", help=CONFIG_HELP)
    parser.add_argument("--database", help=DATABASE_HELP)
    parser.set_defaults(may_create=False)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(parent: Any, name: str, help: str, *, may_create: bool = False) -> argparse.ArgumentParser:
        """A subcommand taking --config and --database like every other (unset here: the top level's stay)."""
        child: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help)
        child.add_argument("--config", default=argparse.SUPPRESS, help=CONFIG_HELP)
        child.add_argument("--database", default=argparse.SUPPRESS, help=DATABASE_HELP)
        child.set_defaults(may_create=may_create)
        return child

    serve = command(sub, "serve", "run the server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1, help="worker processes (they share the SQLite file)")
    serve.add_argument(
        "--trusted-proxy", action="append", help="peer address whose X-Forwarded-* headers count (repeatable)"
    )
    serve.add_argument(
        "--dev-facilitator",
        type=int,
        metavar="PORT",
        help="also start the development facilitator on this port and use it (a2a-gate-devnet: pip install ./devnet)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-json", action="store_true", help="one JSON object per log line")
    serve.set_defaults(func=cmd_serve)

    check = command(
        sub, "check-config", "every check serve makes before it listens, without listening; prints every problem"
    )
    check.add_argument("file", nargs="?", help="the file (or --config FILE, or $A2A_GATE_CONFIG)")
    check.add_argument(
        "--file-only",
        action="store_true",
        help="check the file alone, without its secrets or its database (a build step that has neither);"
        " by default every check serve makes before it listens",
    )
    check.set_defaults(func=cmd_check_config)

    keys = command(sub, "keys", "create, list and revoke API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = command(keys_sub, "create", "create a key; prints it once, with its stored form", may_create=True)
    create.add_argument("name")
    create.add_argument("--agent", action="append", help="agent the key may use (repeatable; default: all)")
    create.add_argument(
        "--expires-in",
        type=duration,
        metavar="DURATION",
        help="the key lapses after this long (e.g. 90d, 12h, 30m, 3600s); default: never",
    )
    command(keys_sub, "list", "list keys (never the keys themselves)")
    revoke = command(keys_sub, "revoke", "revoke a key by name")
    revoke.add_argument("name")
    keys.set_defaults(func=cmd_keys)

    payments = command(sub, "payments", "recent payment log rows")
    payments.add_argument("--agent")
    payments.add_argument("--payer")
    payments.add_argument(
        "--action",
        choices=list(ACTIONS),
    )
    terminal = payments.add_mutually_exclusive_group()
    terminal.add_argument(
        "--unsettled",
        action="store_true",
        help="delivered work written off: the settlement was refused for good (write_off rows)",
    )
    terminal.add_argument(
        "--needs-attention",
        action="store_true",
        help="settlements nobody could decide (no chain endpoint, chain unreachable)",
    )
    payments.add_argument("--limit", type=int, default=50)
    payments.add_argument(
        "--summary",
        action="store_true",
        help="a report per agent and day: 402s, paid requests, revenue, settle outcomes, owed, written off",
    )
    payments.add_argument("--days", type=float, default=7, help="how far back --summary reaches (default 7)")
    payments.set_defaults(func=cmd_payments, payments_command=None)
    payments_sub = payments.add_subparsers(dest="payments_command")
    records = command(payments_sub, "records", "payments as records: what became of each, newest first")
    export = command(
        payments_sub, "export", "payment records or the daily summary as CSV or JSON (columns: docs/operations.md)"
    )
    export.add_argument("--what", choices=("records", "summary"), default="records")
    export.add_argument("--format", default="csv", help="csv (default) or json")
    export.add_argument("--output", metavar="FILE", help="write here instead of stdout")
    for child in (records, export):
        # given before the subcommand or after it (SUPPRESS: the one before stays unless repeated)
        child.add_argument("--agent", default=argparse.SUPPRESS)
        child.add_argument("--payer", default=argparse.SUPPRESS)
        child.add_argument("--state", help="a record state (see docs/operations.md)")
        child.add_argument("--since", help="begun at or after: 2026-12-01, 2026-12-01T08:00:00Z, or 7d back")
        child.add_argument("--until", help="begun before: the same forms")
    records.add_argument("--limit", type=int, default=argparse.SUPPRESS)

    reconcile = command(sub, "reconcile", "settle delivered-but-unsettled work now")
    reconcile.add_argument(
        "--reopen",
        nargs="?",
        const="all",
        metavar="TASK_ID",
        help="first put settlements needing attention (all, or one task's) back to owed with a fresh"
        " budget, e.g. after adding the network's rpc_url",
    )
    reconcile.set_defaults(func=cmd_reconcile)

    sealing = command(sub, "sealing-key", "the sealing key ring: show its fingerprints, or re-seal with its first key")
    sealing_sub = sealing.add_subparsers(dest="sealing_command", required=True)
    command(sealing_sub, "show", "the ring's fingerprints (the first seals) and the ones the database records")
    command(
        sealing_sub,
        "reseal",
        "seal every stored value again with the ring's first key, then record it alone (an old key may then go)",
    )
    sealing.set_defaults(func=cmd_sealing_key)

    signing = command(sub, "signing-key", "the operator's signing key ([signing]): show its public half")
    signing_sub = signing.add_subparsers(dest="signing_command", required=True)
    command(signing_sub, "show", "its public JWK, its kid and (secp256k1) its address, as JSON; never the key")
    signing.set_defaults(func=cmd_signing_key)

    channels = command(sub, "channels", "payment channels (batch-settlement): list them, or claim them now")
    channels_sub = channels.add_subparsers(dest="channels_command", required=True)
    listing = command(channels_sub, "list", "every channel: charged, claimed on chain, balance, payer")
    listing.add_argument("--limit", type=int, default=50)
    claim = command(
        channels_sub,
        "claim",
        "claim every channel's unclaimed vouchers on chain now and sweep the funds to payTo (the schedule"
        " does this by [channels] claim_at_amount / claim_after_seconds)",
    )
    claim.add_argument(
        "--retry-refused",
        action="store_true",
        help="first make the vouchers set aside as refused claimable again (e.g. once their payers topped up)",
    )
    refund = command(
        channels_sub,
        "refund",
        "refund idle channels now: what each holds beyond its charged total goes back to its payer",
    )
    refund.add_argument(
        "--idle",
        type=float,
        default=None,
        metavar="SECONDS",
        help="unused this long (default [channels] refund_after_seconds)",
    )
    for child in (claim, refund):
        child.add_argument(
            "--facilitator", metavar="URL", help="the facilitator to send them to (default: [facilitator] url)"
        )
    channels.set_defaults(func=cmd_channels)

    migrate = command(sub, "migrate", "create or update the database's tables, then exit", may_create=True)
    migrate.set_defaults(func=cmd_migrate)

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        secret_files.load()  # the sealing key and PGPASSWORD from NAME_FILE or a credential, if so given
        return args.func(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    except (SealingKeyMissing, SealingKeyMismatch, NoDatabase, secret_files.SecretFileError, SigningKeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (DatabaseRefused, DatabaseUnavailable) as exc:  # a management command's database
        print(f"error: the database cannot be opened: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
