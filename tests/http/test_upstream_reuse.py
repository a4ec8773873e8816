"""When a keep-alive connection to an upstream may carry the next request, and when a request
is sent again: through warmgate, against raw upstreams on 127.0.0.1 that miscount, answer HEAD
with a body, or close a connection as a request arrives (as uvicorn does after 5 s idle)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.helpers import metric_value, static_config, wait_until, warmgate
from tests.rawserver import ok, raw_upstream, serve_raw


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


def _path(head: bytes) -> bytes:
    return head.split(b" ")[1]


FORGED = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
"""Bytes after a response that look like the next one: never anyone's answer."""


@pytest.mark.parametrize(
    "extra", [b"cde", FORGED], ids=["Content-Length 2 and 5 bytes", "a response after it"]
)
async def test_bytes_after_a_complete_response_close_the_connection(
    client: aiohttp.ClientSession, extra: bytes
) -> None:
    def respond(head: bytes) -> bytes:
        if _path(head) == b"/miscount":
            return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nab" + extra
        return ok(_path(head))

    async with raw_upstream(respond) as (url, upstream), warmgate(static_config(url)) as wg:
        async with client.get(wg.url + "/miscount") as resp:
            assert resp.status == 200 and await resp.read() == b"ab"
        for path in ("/next", "/then"):
            async with client.get(wg.url + path) as resp:
                assert resp.status == 200 and await resp.read() == path.encode()
    # Each request sent once; the miscounting connection carried no other.
    assert [_path(h) for h in upstream.heads] == [b"/miscount", b"/next", b"/then"]
    assert upstream.connections == 2


async def test_a_head_answered_with_a_body_closes_the_connection(
    client: aiohttp.ClientSession,
) -> None:
    def respond(head: bytes) -> bytes:
        if head.startswith(b"HEAD"):
            return b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
        return ok(_path(head))

    async with raw_upstream(respond) as (url, upstream), warmgate(static_config(url)) as wg:
        async with client.head(wg.url + "/h") as resp:
            assert resp.status == 200 and resp.headers["Content-Length"] == "6"
        async with client.get(wg.url + "/next") as resp:
            assert resp.status == 200 and await resp.read() == b"/next"
    assert [_path(h) for h in upstream.heads] == [b"/h", b"/next"]
    assert upstream.connections == 2


class LateBytes:
    """The first connection answers ``/first`` with a response of ``Content-Length: 2``, then,
    in a later write, ``extra``: when the test says (the connection idle in warmgate's pool), or
    once the next request arrived on it. Later connections answer with their path."""

    def __init__(self, first: bytes, extra: bytes, after_next_request: bool) -> None:
        self.first, self.extra, self.after_next = first, extra, after_next_request
        self.go = asyncio.Event()
        self.closed = asyncio.Event()
        self.connections = 0
        self.paths: list[bytes] = []
        self.after_extra = b""
        """What warmgate sent on the first connection after the extra bytes."""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        first = self.connections == 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.paths.append(_path(head))
                if not first:
                    writer.write(ok(_path(head)))
                    await writer.drain()
                    continue
                writer.write(self.first)
                await writer.drain()
                if self.after_next:  # the next request, on this connection
                    self.paths.append(_path(await reader.readuntil(b"\r\n\r\n")))
                else:
                    await self.go.wait()
                writer.write(self.extra)
                await writer.drain()
                self.after_extra = await reader.read()  # until warmgate closes it
                self.closed.set()
                return
        except asyncio.IncompleteReadError:
            pass


async def test_bytes_in_a_later_read_close_an_idle_connection(
    client: aiohttp.ClientSession,
) -> None:
    for first in (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nab",
        b"HTTP/1.1 204 No Content\r\n\r\n",
    ):
        upstream = LateBytes(first, FORGED, after_next_request=False)
        async with serve_raw(upstream.serve) as url, warmgate(static_config(url)) as wg:
            async with client.get(wg.url + "/first") as resp:
                await resp.read()
            upstream.go.set()  # the connection is idle in warmgate's pool now
            await asyncio.wait_for(upstream.closed.wait(), 10)
            async with client.get(wg.url + "/next") as resp:
                assert resp.status == 200 and await resp.read() == b"/next"
        assert upstream.after_extra == b""  # nothing was sent on it after the stray bytes
        assert upstream.paths == [b"/first", b"/next"] and upstream.connections == 2


async def test_stray_bytes_before_an_answer_on_a_reused_connection(
    client: aiohttp.ClientSession,
) -> None:
    """The extra bytes of the last response arrive after the next request went out on the
    same connection: no response starts so, so they are the last one's. An idempotent
    request goes again on a new connection; a POST is not sent twice (502)."""
    for method, status in (("GET", 200), ("PUT", 200), ("POST", 502)):
        upstream = LateBytes(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nab", b"cde", after_next_request=True
        )
        async with serve_raw(upstream.serve) as url, warmgate(static_config(url)) as wg:
            async with client.get(wg.url + "/first") as resp:
                assert await resp.read() == b"ab"
            async with client.request(method, wg.url + "/next") as resp:
                assert resp.status == status, method
                if status == 200:
                    assert await resp.read() == b"/next"
            await asyncio.wait_for(upstream.closed.wait(), 10)
        sent = 2 if status == 200 else 1
        assert upstream.paths == [b"/first"] + [b"/next"] * sent, method


async def test_a_request_that_races_the_upstreams_idle_close(
    client: aiohttp.ClientSession,
) -> None:
    """The upstream closes a kept-alive connection as the next request arrives on it (it may
    or may not have acted on it): only an idempotent method is sent again."""
    served: dict[int, int] = {}

    async def closes_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = len(served)
        served[conn] = 0
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            seen.append(head.split(b" ", 1)[0])
            served[conn] += 1
            if served[conn] == 2:
                writer.transport.abort()
                return
            writer.write(ok(b"fine"))
            await writer.drain()

    for method in ("GET", "HEAD", "PUT", "DELETE", "OPTIONS", "POST", "PATCH"):
        seen: list[bytes] = []
        served.clear()
        async with serve_raw(closes_second) as url, warmgate(static_config(url)) as wg:
            async with client.get(wg.url + "/") as resp:
                assert resp.status == 200
            async with client.request(method, wg.url + "/") as resp:
                retried = method not in ("POST", "PATCH")
                assert resp.status == (200 if retried else 502), method
            errors = await metric_value(wg.admin, "warmgate_upstream_errors_total", kind="reset")
        assert seen == [b"GET", method.encode()] + ([method.encode()] if retried else []), method
        assert errors == (0 if retried else 1), method


async def test_idle_upstream_connections_are_closed_before_the_upstreams_timeout(
    client: aiohttp.ClientSession,
) -> None:
    async with raw_upstream(lambda head: ok(b"hi")) as (url, upstream):
        config = static_config(url, timeouts={"upstream_idle": "200ms"})
        async with warmgate(config) as wg:
            assert wg.runtime().spec.timeouts.upstream_idle == 0.2
            async with client.get(wg.url + "/x") as resp:
                assert await resp.read() == b"hi"
            await wait_until(lambda: upstream.open == 0)  # warmgate closed it, idle
            async with client.get(wg.url + "/x") as resp:
                assert await resp.read() == b"hi"
            assert upstream.connections == 2
        async with warmgate(static_config(url)) as wg:
            assert wg.runtime().spec.timeouts.upstream_idle == 4.0  # under uvicorn's 5 s
