"""`check-config` is `serve` without the listening: for each broken configuration (or environment)
below, both refuse, exit 2, with the same error lines, each naming the key or the variable, and no
traceback. The same configurations with the one fault mended are accepted by both."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.support.gate_helpers import REPO
from tests.support.gate_process import free_port
from tests.support.paid import ASSET, PAY_TO
from tests.support.services import postgres_url

PRICE = f'price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}'
GOOD = f"""
database = "gate.db"

[facilitator]
url = "http://127.0.0.1:9"

[agents.echo]
description = "Echo"

[agents.paid]
{PRICE}
"""
CHANNEL = (
    'price = { network = "eip155:84532", asset = "' + ASSET + '", amount = "1000", pay_to = "' + PAY_TO + '",'
    ' accepts = [{ scheme = "batch-settlement", receiver_authorizer = "0x'
    + "ab" * 20
    + '", withdraw_delay_seconds = 900 }] }'
)
KEY = base64.urlsafe_b64encode(os.urandom(32)).decode()
# an install without the `otel` extra: a plain module on PYTHONPATH hides the installed OpenTelemetry
WITHOUT_OTEL = {"PYTHONPATH": str(REPO / "tests" / "support" / "without_otel")}
TRACING = "\n[tracing]\nenabled = true\n"
HOOK = '\n[[webhooks.endpoints]]\nname = "books"\nurl = "http://127.0.0.1:9/hook"\nevents = ["payment.settled"]\n'

SIGNING = '\n[signing]\nkey_env = "A2A_GATE_SIGNING_KEY"\n'
ED25519 = (
    Ed25519PrivateKey.generate()
    .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    .decode()
)

# (name, configuration text, environment, what the error line names)
BROKEN = [
    ("not TOML", "database = \n", {}, "not valid TOML"),
    ("public_url not http", GOOD + 'public_url = "ftp://x"\n', {}, "public_url"),
    ("trusted proxy a host name", GOOD + '\n[proxy]\ntrusted = ["nginx"]\n', {}, "proxy.trusted[0]"),
    ("trusted proxy not an address", GOOD + '\n[proxy]\ntrusted = ["300.1.1.1"]\n', {}, "proxy.trusted[0]"),
    ("negative limit", GOOD + "\n[limits]\nper_ip_per_minute = -1\n", {}, "limits.per_ip_per_minute"),
    ("unknown backend", GOOD + '\n[agents.x]\nbackend = "nope"\n', {}, "agents.x.backend"),
    ("python agent missing", GOOD + '\n[agents.x]\nbackend = "python"\ncallable = "no.such:thing"\n', {}, "agents.x"),
    ("upstream without url", GOOD + '\n[agents.x]\nbackend = "upstream"\n', {}, "agents.x"),
    ("bad pay_to", GOOD.replace(PAY_TO, "0x123"), {}, "agents.paid.price"),
    ("bad amount", GOOD.replace('amount = "1000"', 'amount = "ten"'), {}, "agents.paid.price"),
    ("negative amount", GOOD.replace('amount = "1000"', 'amount = "-5"'), {}, "agents.paid.price"),
    ("bad network", GOOD.replace('network = "eip155:84532"', 'network = "base"'), {}, "agents.paid.price"),
    ("unknown scheme", GOOD.replace("price = {", 'price = { scheme = "nope",'), {}, "agents.paid.price"),
    ("facilitator url", GOOD.replace('url = "http://127.0.0.1:9"', 'url = "not a url"'), {}, "facilitator.url"),
    ("metrics token unset", GOOD + '\n[http]\nmetrics_token_env = "NO_SUCH_TOKEN_VAR"\n', {}, "http.metrics_token_env"),
    (
        "facilitator credential unset",
        GOOD.replace("[facilitator]\n", '[facilitator]\nauth_header_env = "NO_SUCH_CREDENTIAL"\n'),
        {},
        "facilitator.auth_header_env",
    ),
    (
        "upstream credential unset",
        GOOD + '\n[agents.up]\nbackend = "upstream"\nurl = "http://127.0.0.1:9/"\nupstream_auth_env = "NO_SUCH_UP"\n',
        {},
        "agents.up.upstream_auth_env",
    ),
    ("sealing key malformed", GOOD, {"A2A_GATE_SEALING_KEY": "not-a-key"}, "A2A_GATE_SEALING_KEY"),
    ("sealing key ring malformed", GOOD, {"A2A_GATE_SEALING_KEY": KEY + ",nope"}, "key 2 of 2"),
    ("sealing key file missing", GOOD, {"A2A_GATE_SEALING_KEY_FILE": "/nonexistent/key"}, "A2A_GATE_SEALING_KEY_FILE"),
    ("postgresql without a sealing key", GOOD.replace('"gate.db"', f'"{postgres_url()}"'), {}, "A2A_GATE_SEALING_KEY"),
    (
        "postgresql database that does not exist",
        GOOD.replace('"gate.db"', f'"{postgres_url().rsplit("/", 1)[0]}/no_such_database"'),
        {"A2A_GATE_SEALING_KEY": KEY},
        "database cannot be opened",
    ),
    (
        "webhook secret unset",
        GOOD + HOOK + 'secret_env = "NO_SUCH_HOOK_SECRET"\n',
        {},
        "webhooks.endpoints[0].secret_env",
    ),
    (
        "webhook secret file missing",
        GOOD + HOOK + 'secret_env = "HOOK_SECRET"\n',
        {"HOOK_SECRET_FILE": "/nonexistent/secret"},
        "HOOK_SECRET_FILE",
    ),
    ("webhook secret in the file", GOOD + HOOK + 'secret = "s3cr3t"\n', {}, "webhooks.endpoints[0].secret"),
    ("webhook without a secret variable", GOOD + HOOK, {}, "webhooks.endpoints[0].secret_env"),
    (
        "webhook event unknown",
        GOOD + HOOK.replace("payment.settled", "payment.maybe") + 'secret_env = "HOME"\n',
        {},
        "webhooks.endpoints[0].events[0]",
    ),
    ("webhook url", GOOD + HOOK.replace("http://127.0.0.1:9/hook", "hook") + 'secret_env = "HOME"\n', {}, "url"),
    (
        "webhook lease shorter than its sends",
        GOOD + "\n[webhooks]\ntimeout_seconds = 30\nlease_seconds = 60\n" + HOOK + 'secret_env = "HOME"\n',
        {},
        "webhooks.lease_seconds",
    ),
    ("tracing without the otel extra", GOOD + TRACING, WITHOUT_OTEL, "tracing.enabled"),
    ("tracing endpoint", GOOD + TRACING + 'endpoint = "collector:4318"\n', {}, "tracing.endpoint"),
    ("database directory missing", GOOD.replace('"gate.db"', '"/nonexistent/dir/gate.db"'), {}, "/nonexistent/dir"),
    ("channel offer unwatched", GOOD.replace(PRICE, CHANNEL), {}, "rpc_url"),
    ("signing key unset", GOOD + SIGNING, {}, "signing.key_env names A2A_GATE_SIGNING_KEY"),
    ("signing key not a key", GOOD + SIGNING, {"A2A_GATE_SIGNING_KEY": "s3cr3t-not-a-key"}, "not a signing key"),
    ("signing key out of range", GOOD + SIGNING, {"A2A_GATE_SIGNING_KEY": "0x" + "ff" * 32}, "out of range"),
    ("signing key PEM unreadable", GOOD + SIGNING, {"A2A_GATE_SIGNING_KEY": "-----BEGIN PRIVATE KEY-----\nxx"}, "PEM"),
    ("signing key file missing", GOOD + '\n[signing]\nkey_file = "no-such.key"\n', {}, "signing.key_file"),
    (
        "signing key file and variable",
        GOOD + '\n[signing]\nkey_file = "k"\nkey_env = "A2A_GATE_SIGNING_KEY"\n',
        {},
        "signing.key_env: give key_file or key_env, not both",
    ),
    ("signing form unknown", GOOD + SIGNING + '\n[offer_receipt]\nformat = "pgp"\n', {}, "offer_receipt.format"),
    (
        "eip712 without a secp256k1 key",
        GOOD + SIGNING + '\n[offer_receipt]\nformat = "eip712"\n',
        {"A2A_GATE_SIGNING_KEY": ED25519},
        "needs a secp256k1 key",
    ),
    (
        "claim schedule past the withdraw delay",
        GOOD.replace(PRICE, CHANNEL) + '\n[networks."eip155:84532"]\nrpc_url = "http://127.0.0.1:9/rpc"\n'
        "\n[channels]\nclaim_after_seconds = 3600\n",
        {},
        "channels.claim_after_seconds",
    ),
]


def run(home: Path, text: str, env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    config = home / "gate.toml"
    config.write_text(text)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("A2A_GATE_")} | env
    return subprocess.run(
        [sys.executable, "-m", "gate.cli", *command, "--config", str(config)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environment,
        timeout=60,
    )


def serve(home: Path, text: str, env: dict[str, str]) -> subprocess.CompletedProcess[str] | None:
    """`serve`'s refusal, or None when it started listening (then it is stopped)."""
    config = home / "gate.toml"
    config.write_text(text)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("A2A_GATE_")} | env
    command = [sys.executable, "-m", "gate.cli", "serve", "--config", str(config), "--port", str(free_port())]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=environment
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            out, err = process.communicate()
            return subprocess.CompletedProcess(command, process.returncode, out, err)
        time.sleep(0.1)
    process.terminate()
    process.communicate(timeout=20)
    return None


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(("name", "text", "env", "names"), BROKEN, ids=[b[0] for b in BROKEN])
def test_check_config_and_serve_refuse_alike(tmp_path: Path, name: str, text: str, env: dict[str, str], names: str):
    checked = run(tmp_path, text, env, "check-config")
    served = serve(tmp_path, text, env)
    assert served is not None, f"serve started on a configuration check-config says: {checked.stderr or checked.stdout}"
    assert checked.returncode == 2 and served.returncode == 2, (checked.stderr, served.stderr)
    assert "Traceback" not in checked.stderr + served.stderr
    assert errors(checked.stderr) and errors(checked.stderr) == errors(served.stderr), (checked.stderr, served.stderr)
    assert any(names in line for line in errors(checked.stderr)), checked.stderr
    assert not (tmp_path / "gate.db").exists()  # a refused configuration leaves no database behind


def test_the_good_configuration_passes_both(tmp_path: Path):
    assert run(tmp_path, GOOD, {}, "check-config").returncode == 0
    assert serve(tmp_path, GOOD, {}) is None


def test_a_webhook_with_its_secret_set_passes_both(tmp_path: Path):
    secret = tmp_path / "hook-secret"
    secret.write_text("s3cr3t\n")
    text, env = GOOD + HOOK + 'secret_env = "HOOK_SECRET"\n', {"HOOK_SECRET_FILE": str(secret)}
    checked = run(tmp_path, text, env, "check-config")
    assert checked.returncode == 0, checked.stderr
    assert serve(tmp_path, text, env) is None


@pytest.mark.parametrize("form", ["jws", "eip712"])
def test_a_signing_key_passes_both_and_is_never_shown(tmp_path: Path, form: str):
    secret = "0x" + "5e" * 32
    text, env = GOOD + SIGNING + f'\n[offer_receipt]\nformat = "{form}"\n', {"A2A_GATE_SIGNING_KEY": secret}
    checked = run(tmp_path, text, env, "check-config")
    assert checked.returncode == 0, checked.stderr
    assert serve(tmp_path, text, env) is None
    shown = run(tmp_path, text, env, "signing-key", "show")
    assert shown.returncode == 0 and '"kid": "did:jwk:' in shown.stdout, shown.stderr
    assert "5e5e5e" not in shown.stdout + shown.stderr + checked.stdout + checked.stderr
    refused = run(tmp_path, text, {**env, "A2A_GATE_SIGNING_KEY": secret[:-1] + "x"}, "check-config")
    assert refused.returncode == 2 and "5e5e5e" not in refused.stderr  # a refusal names the source, not the text


@pytest.mark.parametrize("command", [("migrate",), ("reconcile",), ("signing-key", "show")])
def test_a_management_command_without_the_signing_key_says_so(tmp_path: Path, command: tuple[str, ...]):
    run(tmp_path, GOOD, {}, "migrate")  # the database exists: the key is what is missing
    refused = run(tmp_path, GOOD + SIGNING, {}, *command)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert errors(refused.stderr) == ["error: signing.key_env names A2A_GATE_SIGNING_KEY, which is not set (or empty)"]


def test_tracing_with_the_extra_installed_passes_both(tmp_path: Path):
    text = GOOD + TRACING + 'endpoint = "http://127.0.0.1:9"\n'  # no collector there: spans are dropped, not fatal
    checked = run(tmp_path, text, {}, "check-config")
    assert checked.returncode == 0, checked.stderr
    assert serve(tmp_path, text, {}) is None


def test_a_malformed_key_file_beside_an_existing_database_is_refused_alike(tmp_path: Path):
    assert serve(tmp_path, GOOD, {}) is None  # makes the database and its key file
    (tmp_path / "gate.db.sealing-key").write_text("garbage")
    checked, served = run(tmp_path, GOOD, {}, "check-config"), serve(tmp_path, GOOD, {})
    assert served is not None and checked.returncode == served.returncode == 2
    assert errors(checked.stderr) == errors(served.stderr) and "sealing key file" in checked.stderr
