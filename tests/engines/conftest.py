"""The heavy tier: real engines and their real clients (ComfyUI's own web page in Chromium,
llama.cpp's server). ``make test-engines`` runs it (WARMGATE_ENGINES=1); the plain suite
skips it, saying why."""

from __future__ import annotations

import os

import pytest

ENGINES = os.environ.get("WARMGATE_ENGINES") == "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if ENGINES:
        return
    skip = pytest.mark.skip(reason="the heavy tier of real engines: make test-engines runs it")
    for item in items:
        if "tests/engines/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(skip)
