"""The composition root: the one place that puts the A2A server (`server/`) and the payment
gate (its anonymous path) together, for `a2a-gate serve` and for each of its workers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from starlette.applications import Starlette

from gate import config as gate_config
from gate.config import default_settings, load_config
from server.config import Settings

CONFIG_ENV = "A2A_GATE_CONFIG"


def load_settings(path: str | None) -> Settings:
    if path:
        return load_config(path)
    if os.environ.get(CONFIG_ENV):
        return load_config(os.environ[CONFIG_ENV])
    return default_settings()


def configured(path: str | None, overrides: dict[str, Any]) -> Settings:
    """The configuration as `serve` runs it: the file (or the embedded defaults) under the
    command line's overrides; read again, the same way, by a reload (SIGHUP)."""
    return apply_overrides(load_settings(path), overrides)


def build_app(settings: Settings, reread: Callable[[], Settings] | None = None) -> Starlette:
    """The server for `settings`, with the payment gate answering callers without a key."""
    from gate.gate import PaymentGate
    from server.app import create_app

    return create_app(settings, anonymous=PaymentGate.from_parts, reread=reread)


def app_from_env() -> Starlette:  # uvicorn factory for --workers > 1
    from server import request_log

    request_log.configure(
        json_lines=os.environ.get("A2A_GATE_LOG_JSON") == "1", level=os.environ.get("A2A_GATE_LOG_LEVEL", "info")
    )
    overrides = json.loads(os.environ.get("A2A_GATE_OVERRIDES", "{}"))
    return build_app(configured(None, overrides), lambda: configured(None, overrides))


def apply_overrides(settings: Settings, overrides: dict[str, Any]) -> Settings:
    if overrides.get("trusted_proxies"):
        settings = replace(settings, trusted_proxies=tuple(overrides["trusted_proxies"]))
    if overrides.get("facilitator_url"):
        settings = gate_config.with_facilitator_url(settings, overrides["facilitator_url"])
        if overrides.get("dev_chain"):  # the development facilitator's chain: the gate watches its channels there
            settings = gate_config.with_dev_chain(settings, overrides["facilitator_url"])
    if overrides.get("database"):
        settings = replace(settings, database=overrides["database"])
    return settings
