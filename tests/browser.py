"""Debian's Chromium under Playwright, as every browser test (and bench/dashboard.py) drives it.

Playwright's own browser download is never used: it cannot run here, and the
project's set-up (`make test`) installs Debian's `chromium` instead.
"""

from __future__ import annotations

from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def launch_chromium(playwright):
    """A headless Debian Chromium; a missing one fails the test loudly, it is never skipped."""
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"browser tests need Chromium at {CHROMIUM} (Debian package `chromium`)")
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def log_in(page, base_url: str, next_path: str, *, username: str, password: str) -> None:
    """Sign in through the login form and land on ``next_path``."""
    page.goto(f"{base_url}/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"**{next_path}")
