"""The Redis and PostgreSQL servers the scale-out tests run against.

The development and CI machines run both (Redis 7, PostgreSQL 15 with trust
authentication); a test takes their URLs from the environment, works in its own key
prefix or schema, and cleans up. A missing server skips the test with a one-line
reason, except in CI (`CI=true`), where it fails: a skipped scale-out test there would
hide that the guarantees were never checked.

The fixtures are registered for the whole suite by `tests/conftest.py`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn
from urllib.parse import quote, urlencode, urlsplit

import pytest
import redis

from tests.support.gate_process import free_port

REDIS_URL_VARIABLE = "A2A_GATE_TEST_REDIS_URL"
POSTGRES_URL_VARIABLE = "A2A_GATE_TEST_POSTGRES_URL"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


def redis_url() -> str:
    return os.environ.get(REDIS_URL_VARIABLE) or DEFAULT_REDIS_URL


def postgres_url() -> str:
    return os.environ.get(POSTGRES_URL_VARIABLE) or DEFAULT_POSTGRES_URL


def in_ci() -> bool:
    """CI is set (to anything but empty, `0` or `false`): every test must run there."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def missing(reason: str) -> NoReturn:
    """A server (or tool) the test needs is not there: fail in CI, skip elsewhere."""
    if in_ci():
        pytest.fail(f"{reason} (CI={os.environ['CI']}: scale-out tests must run)", pytrace=False)
    pytest.skip(reason)


def where(url: str) -> str:
    """host:port of a URL, without any password it carries (for a skip reason)."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


@dataclass
class RedisService:
    """A Redis server and the key prefix this test owns there."""

    url: str
    prefix: str
    client: redis.Redis

    def key_names(self) -> list[str]:
        return sorted(k.decode() for k in self.client.scan_iter(match=f"{self.prefix}*", count=1000))


@pytest.fixture
def redis_service() -> Iterator[RedisService]:
    """The shared Redis (A2A_GATE_TEST_REDIS_URL), with a fresh key prefix deleted afterwards."""
    url = redis_url()
    client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        missing(f"Redis at {where(url)} is not answering ({type(exc).__name__}); set {REDIS_URL_VARIABLE}")
    service = RedisService(url, f"a2a-gate-test:{uuid.uuid4().hex[:12]}:", client)
    try:
        yield service
    finally:
        for key in service.key_names():
            client.delete(key)
        client.close()


class OwnRedis:
    """A redis-server process of the test's own on a free loopback port, to stop and restart
    (the machine's Redis is shared with everyone else's tests and must stay up)."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> OwnRedis:
        command = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
        ]
        with open(self.workdir / "redis.log", "ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url, socket_timeout=1.0, socket_connect_timeout=1.0)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                try:
                    client.ping()
                    return self
                except redis.RedisError:
                    time.sleep(0.05)
        finally:
            client.close()
        self.kill()
        raise TimeoutError(f"redis-server did not start on port {self.port}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    """A private redis-server (`redis-server` on PATH or in /usr/sbin), killed afterwards.

    A missing binary skips even in CI: the machine's Redis may run elsewhere (a container), and
    the fallback itself is also tested against a closed port and a hung server."""
    binary = shutil.which("redis-server") or shutil.which("redis-server", path="/usr/sbin:/usr/bin")
    if binary is None:
        pytest.skip("no redis-server binary on this machine (apt-get install redis-server)")
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = OwnRedis(binary, workdir).start()
    try:
        yield server
    finally:
        server.kill()


@dataclass
class PostgresSchema:
    """A PostgreSQL database and the schema this test owns in it (dropped afterwards)."""

    url: str
    schema: str

    def store_url(self, settings: str = "", **params: str) -> str:
        """The URL a store (or a gate's `database`) uses: this schema first on the search path
        (libpq `options`), more `-c` settings, more URL parameters."""
        options = f"-csearch_path={self.schema} {settings}".strip()
        query = urlencode({"options": options, **params}, quote_via=quote)
        return f"{self.url}{'&' if '?' in self.url else '?'}{query}"


@pytest.fixture
def postgres_schema() -> Iterator[PostgresSchema]:
    """A fresh schema in the PostgreSQL of A2A_GATE_TEST_POSTGRES_URL, dropped with all it holds."""
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[test]')")
    url = postgres_url()
    schema = f"a2a_gate_test_{uuid.uuid4().hex[:12]}"
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        missing(f"PostgreSQL at {where(url)} is not answering ({type(exc).__name__}); set {POSTGRES_URL_VARIABLE}")
    try:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        yield PostgresSchema(url, schema)
    finally:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.close()


class OwnPostgres:
    """A PostgreSQL cluster of the test's own on a free loopback port, to stop and restart (the
    machine's server is shared with everyone else's tests and must stay up). Run as the
    `postgres` user when the tests run as root: the server refuses to run as root."""

    def __init__(self, bindir: Path, workdir: Path) -> None:
        self.bindir = bindir
        self.workdir = workdir
        self.data = workdir / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def run(self, *command: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *command], check=True, capture_output=True, timeout=60)

    def init(self) -> OwnPostgres:
        if os.geteuid() == 0:
            shutil.chown(self.workdir, "postgres", "postgres")
        self.run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )
        return self

    def start(self) -> OwnPostgres:
        options = f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.workdir / "log"),
            "-w",
            "start",
        )
        return self

    def stop(self) -> None:
        """A fast shutdown, as a restart does it: every backend is told and disconnected."""
        self.run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")


def postgres_bindir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return versions[-1].parent if versions else None


@pytest.fixture
def own_postgres() -> Iterator[OwnPostgres]:
    """A private PostgreSQL cluster (initdb and pg_ctl from the machine's PostgreSQL), removed afterwards.

    Missing binaries skip even in CI, as for `own_redis`: the machine's server may run elsewhere."""
    bindir = postgres_bindir()
    if bindir is None or (os.geteuid() == 0 and shutil.which("runuser") is None):
        pytest.skip("no PostgreSQL server binaries on this machine (apt-get install postgresql)")
    workdir = Path(tempfile.mkdtemp(prefix="a2a-gate-pg-"))  # not under tmp_path: the postgres user must enter it
    server = OwnPostgres(bindir, workdir).init().start()
    try:
        yield server
    finally:
        try:
            server.stop()
        except subprocess.CalledProcessError:
            pass  # stopped already
        shutil.rmtree(workdir, ignore_errors=True)
