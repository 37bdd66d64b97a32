"""A real headless Chromium for the console's test: Debian's `chromium`, driven by Playwright's
Python package (given the executable: no browser is downloaded). Missing, it fails under CI and
skips elsewhere, as a missing server does (`.ci/run` installs both)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.support.services import in_ci

CHROMIUM_VARIABLE = "A2A_GATE_CHROMIUM"  # another Chromium's path, if not Debian's


def chromium_path() -> str:
    path = os.environ.get(CHROMIUM_VARIABLE) or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(path, os.X_OK):
        _missing(f"no Chromium at {path} (apt-get install chromium, or set {CHROMIUM_VARIABLE})")
    return path


def _missing(reason: str) -> None:
    if in_ci():
        pytest.fail(f"{reason} (CI={os.environ['CI']}: the browser test must run)", pytrace=False)
    pytest.skip(reason)


@contextmanager
def headless_chromium() -> Iterator[Any]:
    """A browser (Playwright's `Browser`) on Debian's Chromium, closed afterwards."""
    executable = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed (the test extra has it)")
    with sync_playwright() as driver:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
        browser = driver.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()
