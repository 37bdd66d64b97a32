"""Secrets from files (server/secret_files.py) and the sealing key's own check (gate/sealing.py):
a `NAME_FILE` or a systemd credential stands for the variable NAME, a set variable wins, and an
unreadable file or a malformed key is one line naming where it came from, never the value."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from gate.sealing import SealingKeyMalformed, decode_key
from server import secret_files
from server.config import state_directory


def test_a_name_file_stands_for_the_variable(tmp_path: Path):
    (tmp_path / "key").write_text("s3cret-value\n")
    env = {"PGPASSWORD_FILE": str(tmp_path / "key")}
    assert secret_files.secret("PGPASSWORD", env) == "s3cret-value"  # one trailing newline dropped
    assert secret_files.load(environ=env) == ["PGPASSWORD"]
    assert env["PGPASSWORD"] == "s3cret-value"


def test_a_systemd_credential_stands_for_the_variable(tmp_path: Path):
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "A2A_GATE_SEALING_KEY").write_text("k\n")
    env = {"CREDENTIALS_DIRECTORY": str(credentials)}
    assert secret_files.load(environ=env) == ["A2A_GATE_SEALING_KEY"]
    assert env["A2A_GATE_SEALING_KEY"] == "k"
    assert secret_files.secret("OTHER", env) is None


def test_a_variable_that_is_set_wins_over_its_files(tmp_path: Path):
    (tmp_path / "key").write_text("from-file")
    env = {"PGPASSWORD": "from-env", "PGPASSWORD_FILE": str(tmp_path / "key")}
    assert secret_files.load(environ=env) == []
    assert env["PGPASSWORD"] == "from-env"


def test_a_name_file_wins_over_a_credential(tmp_path: Path):
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "TOKEN").write_text("credential")
    (tmp_path / "token").write_text("file")
    env = {"CREDENTIALS_DIRECTORY": str(credentials), "TOKEN_FILE": str(tmp_path / "token")}
    assert secret_files.secret("TOKEN", env) == "file"


def test_an_unreadable_file_names_the_variable_and_never_a_value(tmp_path: Path):
    env = {"A2A_GATE_SEALING_KEY_FILE": str(tmp_path / "missing")}
    with pytest.raises(secret_files.SecretFileError) as raised:
        secret_files.load(environ=env)
    assert str(raised.value).startswith("A2A_GATE_SEALING_KEY_FILE: ")
    assert "No such file" in str(raised.value)
    assert "A2A_GATE_SEALING_KEY" not in env


def test_only_the_names_asked_for_are_looked_up(tmp_path: Path):
    """Another program's *_FILE variable (TF_CLI_CONFIG_FILE, say) is none of the gate's business."""
    env = {"TF_CLI_CONFIG_FILE": str(tmp_path / "missing"), "EMPTY_FILE": ""}
    assert secret_files.load(environ=env) == []
    assert secret_files.secret("EMPTY", env) is None
    assert set(env) == {"TF_CLI_CONFIG_FILE", "EMPTY_FILE"}


def test_a_sealing_key_decodes_or_names_its_source():
    key = os.urandom(32)
    assert decode_key(base64.urlsafe_b64encode(key).decode() + "\n", "X") == key
    for bad in ("", "abc", "not a key at all!", base64.urlsafe_b64encode(key).decode()[:-4], "é" * 44):
        with pytest.raises(SealingKeyMalformed) as raised:
            decode_key(bad, "A2A_GATE_SEALING_KEY")
        assert str(raised.value).startswith("A2A_GATE_SEALING_KEY is not a sealing key")
        assert bad not in str(raised.value) or not bad


def test_the_state_directory_is_systemds_first():
    assert state_directory({}) is None
    assert state_directory({"STATE_DIRECTORY": ""}) is None
    assert state_directory({"STATE_DIRECTORY": "/var/lib/a2a-gate:/var/lib/other"}) == Path("/var/lib/a2a-gate")
