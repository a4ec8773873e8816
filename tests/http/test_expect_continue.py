"""``Expect: 100-continue`` with a body the route refuses (larger than ``limits.max_body``) gets
its 413 at once, never ``100 Continue`` first: the client need not send the body at all. A body
within the limit gets ``100 Continue`` and is forwarded."""

from __future__ import annotations

import asyncio

from tests.helpers import static_config, warmgate
from tests.rawserver import ok, raw_upstream


def head(length: int) -> bytes:
    return (
        b"POST /upload HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
        b"Content-Length: %d\r\n\r\n" % length
    )


async def test_a_body_above_max_body_gets_413_before_any_100_continue() -> None:
    async with (
        raw_upstream(lambda head: ok(b"stored")) as (url, upstream),
        warmgate(static_config(url, limits={"max_body": "1KiB"})) as wg,
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", wg.server.public_port)
        writer.write(head(2048))
        first = await reader.readline()
        writer.close()
        assert first.startswith(b"HTTP/1.1 413 "), first
        assert upstream.heads == []

        reader, writer = await asyncio.open_connection("127.0.0.1", wg.server.public_port)
        writer.write(head(10))
        first = await reader.readline()
        assert first.startswith(b"HTTP/1.1 100 "), first  # the control: within the limit
        assert await reader.readline() == b"\r\n"
        writer.write(b"0123456789")
        final = await reader.readline()
        writer.close()
        assert final.startswith(b"HTTP/1.1 200 "), final
