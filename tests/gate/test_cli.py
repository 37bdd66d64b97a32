"""The `a2a-gate` command's conventions, run as a real process in an empty directory: every
subcommand finds its configuration the same way (`--config` before or after the subcommand, or
A2A_GATE_CONFIG), a command that only reads never creates a database it did not find, and a key
name is never taken twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.gate_helpers import KEY_LINE, cli

CONFIG = """
database = "gate.db"

[agents.echo]
"""


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    """An empty working directory, as an operator's shell in another folder."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


@pytest.fixture
def config(tmp_path: Path) -> Path:
    home = tmp_path / "deploy"
    home.mkdir()
    path = home / "gate.toml"
    path.write_text(CONFIG)
    return path


@pytest.mark.parametrize("command", [["payments"], ["keys", "list"], ["payments", "--summary"]])
def test_a_reading_command_without_configuration_or_database_says_so_and_creates_nothing(empty, command):
    done = cli(*command, check=False, cwd=empty)
    assert done.returncode != 0
    assert "no database" in done.stderr and "--config" in done.stderr and "A2A_GATE_CONFIG" in done.stderr
    assert "Traceback" not in done.stderr
    assert list(empty.iterdir()) == []


def test_a_reading_command_never_creates_the_database_its_configuration_names(empty, config):
    done = cli("payments", "--config", str(config), check=False, cwd=empty)
    assert done.returncode != 0 and "no database" in done.stderr and str(config.parent / "gate.db") in done.stderr
    assert not (config.parent / "gate.db").exists()


@pytest.mark.parametrize(
    "where",
    [
        "before the subcommand",
        "after the subcommand",
        "after the action",
        "in A2A_GATE_CONFIG",
    ],
)
def test_every_spelling_of_the_configuration_reaches_the_same_database(empty, config, where):
    def keys(*args: str, check: bool = True):
        if where == "in A2A_GATE_CONFIG":
            return cli("keys", *args, cwd=empty, env={"A2A_GATE_CONFIG": str(config)}, check=check)
        if where == "before the subcommand":
            return cli("--config", str(config), "keys", *args, cwd=empty, check=check)
        if where == "after the subcommand":
            return cli("keys", "--config", str(config), *args, cwd=empty, check=check)
        return cli("keys", *args, "--config", str(config), cwd=empty, check=check)

    created = keys("create", "ops", "--agent", "echo")
    assert KEY_LINE.search(created.stdout)
    assert "ops\tactive\techo" in keys("list").stdout
    assert (config.parent / "gate.db").exists() and list(empty.iterdir()) == []
    for command in (["payments"], ["migrate"], ["reconcile"]):
        if where == "in A2A_GATE_CONFIG":
            done = cli(*command, cwd=empty, env={"A2A_GATE_CONFIG": str(config)}, check=False)
        else:
            done = cli(*command, "--config", str(config), cwd=empty, check=False)
        assert done.returncode == 0, (command, done.stderr)
    assert list(empty.iterdir()) == []


def test_check_config_takes_the_file_positionally_by_option_or_from_the_environment(empty, config):
    for done in (
        cli("check-config", str(config), cwd=empty),
        cli("check-config", "--config", str(config), cwd=empty),
        cli("--config", str(config), "check-config", cwd=empty),
        cli("check-config", cwd=empty, env={"A2A_GATE_CONFIG": str(config)}),
    ):
        assert ": OK (1 agents" in done.stdout, done.stderr
    missing = cli("check-config", cwd=empty, check=False)
    assert missing.returncode == 2 and "--config" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.parametrize("command", ["serve", "check-config", "keys", "payments", "reconcile", "migrate"])
def test_every_subcommands_help_names_the_configuration_variable(command):
    assert "A2A_GATE_CONFIG" in cli(command, "--help").stdout


def test_creating_a_key_under_a_name_taken_fails_loudly_and_prints_no_key(empty, config):
    cli("keys", "create", "ops", "--config", str(config), cwd=empty)
    again = cli("keys", "create", "ops", "--config", str(config), cwd=empty, check=False)
    assert again.returncode != 0
    assert "exists already" in again.stderr and "keys list" in again.stderr
    assert "key (shown once" not in again.stdout


def test_a_command_on_the_embedded_defaults_names_the_database_it_uses(empty):
    """`keys create` without a configuration makes the working directory's database, and says where."""
    created = cli("keys", "create", "me", "--agent", "echo", cwd=empty)
    assert KEY_LINE.search(created.stdout)
    assert str(empty / "a2a-gate.db") in created.stderr
    assert "me\tactive\techo" in cli("keys", "list", cwd=empty).stdout
