"""A malformed or refused request costs the log one warning line, without a traceback, and a
flood of them a few lines in all (rate-limited): never aiohttp's ERROR with a traceback each."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.helpers import static_config, warmgate
from tests.rawserver import ok, raw_upstream

BAD = [
    b"GET /a HTTP/1.1\r\nHost: t\r\nX: a\x00b\r\n\r\n",  # aiohttp's parser refuses it
    b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n",  # warmgate does
]


async def answer(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        return await reader.read()  # to the end: the connection is closed after a 400
    finally:
        writer.close()


async def test_fifty_bad_requests_log_a_few_warning_lines_without_tracebacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with (
        raw_upstream(lambda head: ok(b"fine")) as (url, _),
        warmgate(static_config(url)) as wg,
    ):
        for index in range(50):
            received = await answer(wg.server.public_port, BAD[index % 2])
            assert received[:13] in (b"HTTP/1.1 400 ", b"HTTP/1.0 400 "), received[:200]
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert noisy == []
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "warmgate"]
    assert 1 <= len(warned) <= 5, [r.getMessage() for r in warned]
    assert "127.0.0.1" in warned[0].getMessage() and "400" in warned[0].getMessage()
    assert all("\n" not in r.getMessage() for r in warned)
