"""A real headless Chromium (Debian's, through Playwright) for the tests that drive a page."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (make test installs Debian's chromium)"
)


@asynccontextmanager
async def chromium(width: int = 1280, height: int = 900) -> AsyncIterator[Any]:
    """A fresh page in a browser that is closed afterwards."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            yield await browser.new_page(viewport={"width": width, "height": height})
        finally:
            await browser.close()
