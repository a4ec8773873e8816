"""An upstream's ``101 Switching Protocols`` reaches only a client that asked to upgrade, and
only as a websocket that completed its handshake: a 101 to a plain request, or to an upgrade
with a wrong ``Sec-WebSocket-Accept``, is a 502 and the connection to the client stays HTTP."""

from __future__ import annotations

import asyncio

from tests.helpers import static_config, warmgate
from tests.rawserver import ok, raw_upstream

SWITCH = (
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Accept: bm90IHRoZSByaWdodCBhY2NlcHQ=\r\n\r\n"
)
UPGRADE = (
    b"GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def respond(head: bytes) -> bytes:
    return SWITCH if head.startswith((b"GET /switch", b"GET /ws")) else ok(b"fine")


async def first_response(port: int, *requests: bytes) -> list[bytes]:
    """The status lines answering ``requests``, sent one after the other on one connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = []
    try:
        for request in requests:
            writer.write(request)
            line = await reader.readline()
            lines.append(line.strip())
            length = 0
            while (field := await reader.readline()) not in (b"\r\n", b""):
                if field.lower().startswith(b"content-length:"):
                    length = int(field.split(b":")[1])
            await reader.readexactly(length)
    finally:
        writer.close()
    return lines


async def test_a_101_to_a_plain_request_is_a_502_and_the_connection_stays_http() -> None:
    async with (
        raw_upstream(respond) as (url, _),
        warmgate(static_config(url)) as wg,
    ):
        plain = b"GET /switch HTTP/1.1\r\nHost: t\r\n\r\n"
        after = b"GET /after HTTP/1.1\r\nHost: t\r\n\r\n"
        lines = await first_response(wg.server.public_port, plain, after)
    assert lines[0].startswith(b"HTTP/1.1 502 "), lines
    assert lines[1].startswith(b"HTTP/1.1 200 "), lines


async def test_a_websocket_upgrade_with_a_wrong_accept_is_a_502() -> None:
    async with (
        raw_upstream(respond) as (url, _),
        warmgate(static_config(url)) as wg,
    ):
        lines = await first_response(wg.server.public_port, UPGRADE)
    assert lines[0].startswith(b"HTTP/1.1 502 "), lines
