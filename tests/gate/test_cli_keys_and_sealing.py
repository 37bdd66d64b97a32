"""The operator's commands for keys and the sealing key, as an operator runs them: `keys create
--expires-in` and `keys list` (expiry, last use, a revoked name reused), `sealing-key show|reseal`
through a whole rotation, and `serve --trusted-proxy` refusing what `[proxy] trusted` refuses."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import time
from pathlib import Path

from gate.sealing import Sealer
from server.engines import open_database
from tests.support.gate_helpers import cli
from tests.support.gate_process import free_port


def test_a_key_with_an_expiry_lapses_and_a_revoked_name_is_free(tmp_path: Path):
    config = tmp_path / "gate.toml"
    config.write_text('database = "gate.db"\n\n[agents.echo]\ndescription = "Echo"\n')
    # long enough to list it active on a machine busy with the whole suite
    created = cli("keys", "create", "short", "--expires-in", "30s", "--config", str(config))
    lapses = time.time() + 30
    assert re.search(r"^expires \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$", created.stdout, re.M)
    cli("keys", "create", "long", "--config", str(config))
    listed = cli("keys", "list", "--config", str(config)).stdout.splitlines()
    assert listed[0].startswith("short\tactive\t*") and "\tnever used" in listed[0]
    assert listed[1].startswith("long\tactive\t*") and "\tno expiry\t" in listed[1]
    time.sleep(max(0.0, lapses - time.time()) + 0.2)
    assert cli("keys", "list", "--config", str(config)).stdout.startswith("short\texpired\t")
    taken = cli("keys", "create", "long", "--config", str(config), check=False)
    assert taken.returncode == 2 and "a live key named 'long' exists already" in taken.stderr
    cli("keys", "revoke", "long", "--config", str(config))
    cli("keys", "create", "long", "--config", str(config))  # the name is free again
    states = [line.split("\t")[:2] for line in cli("keys", "list", "--config", str(config)).stdout.splitlines()]
    assert states == [["short", "expired"], ["long", "revoked"], ["long", "active"]]
    for bad in ("soon", "0d", "-1h", "5y"):
        refused = cli("keys", "create", "x", "--expires-in", bad, "--config", str(config), check=False)
        assert refused.returncode == 2 and "--expires-in" in refused.stderr, bad


def test_a_sealing_key_rotation_from_the_command_line(tmp_path: Path):
    config = tmp_path / "gate.toml"
    config.write_text('database = "gate.db"\n\n[agents.echo]\ndescription = "Echo"\n')
    cli("migrate", "--config", str(config))
    first = cli("sealing-key", "show", "--config", str(config)).stdout  # a SQLite gate makes its key file
    old = base64.urlsafe_b64decode((tmp_path / "gate.db.sealing-key").read_text())
    assert first.startswith(f"ring:\t{Sealer([old]).fingerprint} (seals)")
    new = os.urandom(32)

    def ring(*keys: bytes) -> dict[str, str]:
        return {"A2A_GATE_SEALING_KEY": ",".join(base64.urlsafe_b64encode(k).decode() for k in keys)}

    async def seal_one_owed_claim() -> None:
        db = open_database(str(tmp_path / "gate.db"))
        await db.open()
        try:
            await Sealer([old]).check(db)  # what a start does: the database records the key that seals
            await db.execute(
                "INSERT INTO claims (token_digest, state, sealed_payment) VALUES ('t1', 'settle_failed', ?)",
                (Sealer([old]).seal({"payload": "owed"}, "t1"),),
            )
        finally:
            await db.close()

    async def opens_with(key: bytes) -> dict:
        db = open_database(str(tmp_path / "gate.db"))
        await db.open()
        try:
            sealed = await db.fetchval("SELECT sealed_payment FROM claims WHERE token_digest = 't1'")
            return Sealer([key]).unseal(sealed, "t1")
        finally:
            await db.close()

    asyncio.run(seal_one_owed_claim())
    old_fp, new_fp = Sealer([old]).fingerprint, Sealer([new]).fingerprint
    rotated = cli("sealing-key", "show", "--config", str(config), env=ring(new, old)).stdout
    assert f"ring:\t{new_fp} (seals)\t{old_fp} (unseals)" in rotated and f"{old_fp}" in rotated.split("database:")[1]
    early = cli("sealing-key", "show", "--config", str(config), env=ring(new), check=False)
    assert early.returncode == 2 and old_fp in early.stderr  # the old key may not go yet
    resealed = cli("sealing-key", "reseal", "--config", str(config), env=ring(new, old)).stdout
    assert "claims\t1 value(s) sealed again" in resealed and resealed.strip().endswith(f"database:\t{new_fp}")
    assert asyncio.run(opens_with(new)) == {"payload": "owed"}
    cli("sealing-key", "show", "--config", str(config), env=ring(new))  # the new key alone now
    stale = cli("sealing-key", "show", "--config", str(config), env=ring(old), check=False)
    assert stale.returncode == 2 and new_fp in stale.stderr and "Traceback" not in stale.stderr
    serve = cli("serve", "--config", str(config), "--port", str(free_port()), env=ring(old), check=False)
    assert serve.returncode == 2 and new_fp in serve.stderr and "Traceback" not in serve.stderr


def test_serve_refuses_a_trusted_proxy_flag_that_names_no_address(tmp_path: Path):
    config = tmp_path / "gate.toml"
    config.write_text('database = "gate.db"\n\n[agents.echo]\ndescription = "Echo"\n')
    for bad in ("nginx", "localhost", "300.1.1.1", "*"):
        refused = cli("serve", "--config", str(config), "--port", str(free_port()), "--trusted-proxy", bad, check=False)
        assert refused.returncode == 2 and f"--trusted-proxy {bad!r}" in refused.stderr, refused.stderr
