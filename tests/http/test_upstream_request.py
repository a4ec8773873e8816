"""One request to an upstream (router.http.upstream.UpstreamRequest), on its own: a front server
on 127.0.0.1 forwards each request through it to a raw upstream that closes a kept-alive
connection as the next request arrives on it (uvicorn's idle close racing the request)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from router.config.targets import Limits, Timeouts
from router.errors import UpstreamError
from router.http.h1.connector import UpstreamConnector
from router.http.h1.pool import endpoint
from router.http.headers import serialize_request_head
from router.http.upstream import UpstreamRequest
from router.metrics import Metrics
from tests.helpers import serve_app
from tests.rawserver import ok, serve_raw


class _Target:
    """The little of a target an upstream request reads (router.http.runtime.Runtime)."""

    name = "t"

    def __init__(self) -> None:
        self.metrics = Metrics()
        self.spec = SimpleNamespace(timeouts=Timeouts(response_headers=10), limits=Limits())
        self.m_bytes_in = self.metrics.bytes.labels("t", "in")

    def errors(self, kind: str) -> float:
        labels = {"target": "t", "kind": kind}
        return self.metrics.registry.get_sample_value("warmgate_upstream_errors_total", labels) or 0


class _ClosesTheSecond:
    """Answers the first request on each connection; closes the connection when a second one
    arrives on it, unanswered. ``thinking``: set while a first request waits for ``answer``."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bytes]] = []
        """(connection, method) of each request head that arrived."""
        self.connections = 0
        self.answer = asyncio.Event()
        self.answer.set()
        self.thinking = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self.connections = self.connections + 1
        served = 0
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            self.seen.append((conn, head.split(b" ", 1)[0]))
            served += 1
            if served == 2:
                writer.transport.abort()
                return
            self.thinking.set()
            await self.answer.wait()
            writer.write(ok(b"fine"))
            await writer.drain()


@asynccontextmanager
async def _front(
    upstream: str, target: _Target
) -> AsyncIterator[tuple[str, list[asyncio.Task[Any]]]]:
    """A server that forwards every request to ``upstream`` through an UpstreamRequest; yields
    its URL and the tasks of the requests it serves."""
    ep = endpoint(upstream)
    tasks: list[asyncio.Task[Any]] = []
    connector = UpstreamConnector(keepalive_timeout=30)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def forward(request: web.Request) -> web.StreamResponse:
            task = asyncio.current_task()
            assert task is not None
            tasks.append(task)
            head = functools.partial(
                serialize_request_head, request.method, request.raw_path, CIMultiDict(), b"up"
            )
            try:
                exchange = await UpstreamRequest(request, target, session, ep, head)
            except UpstreamError as exc:
                return web.Response(status=502, text=str(exc))
            try:
                body = await exchange.read_all()
            finally:
                exchange.close()
            return web.Response(status=exchange.status, body=body)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        async with serve_app(app) as url:
            yield url, tasks


async def test_an_idempotent_request_goes_again_when_its_kept_alive_connection_closed() -> None:
    """GET, HEAD, PUT, DELETE, OPTIONS: sent again, on a new connection, and answered; POST and
    PATCH (the upstream may have acted on them) are not: 502, counted as a reset."""
    for method in ("GET", "HEAD", "PUT", "DELETE", "OPTIONS", "POST", "PATCH"):
        upstream, target = _ClosesTheSecond(), _Target()
        async with (
            serve_raw(upstream.serve) as url,
            _front(url, target) as (wg, _),
            aiohttp.ClientSession() as client,
        ):
            async with client.get(wg + "/first") as resp:
                assert await resp.read() == b"fine"
            async with client.request(method, wg + "/next") as resp:
                again = method not in ("POST", "PATCH")
                assert resp.status == (200 if again else 502), method
        sent = method.encode()
        assert upstream.seen == [(1, b"GET"), (1, sent)] + ([(2, sent)] if again else []), method
        assert target.errors("reset") == (0 if again else 1), method


async def test_a_streamed_body_is_not_sent_again() -> None:
    """A PUT whose body streams from its client (not buffered, so not at hand a second time)
    is not sent again: 502."""

    async def upload() -> AsyncIterator[bytes]:
        yield b"part one, "
        yield b"part two"

    upstream, target = _ClosesTheSecond(), _Target()
    async with (
        serve_raw(upstream.serve) as url,
        _front(url, target) as (wg, _),
        aiohttp.ClientSession() as client,
    ):
        async with client.get(wg + "/first") as resp:
            assert await resp.read() == b"fine"
        async with client.put(wg + "/next", data=upload()) as resp:
            assert resp.status == 502
    assert upstream.seen == [(1, b"GET"), (1, b"PUT")]
    assert target.errors("reset") == 1


async def test_no_frame_of_the_client_is_kept_while_the_upstream_thinks() -> None:
    """A request waiting for its response head is the awaiting handler's frame and no more
    (thousands may wait at once): the upstream request steps what it awaits itself."""
    upstream, target = _ClosesTheSecond(), _Target()
    upstream.answer.clear()
    async with (
        serve_raw(upstream.serve) as url,
        _front(url, target) as (wg, tasks),
        aiohttp.ClientSession() as client,
    ):
        answered = asyncio.ensure_future(client.get(wg + "/slow"))
        await asyncio.wait_for(upstream.thinking.wait(), 10)
        (task,) = tasks
        chain, awaited = [], task.get_coro()
        while hasattr(awaited, "cr_code"):  # each coroutine, down to what is awaited
            chain.append(awaited.cr_code.co_name)
            awaited = awaited.cr_await
        assert chain[-1] == "forward"
        assert isinstance(awaited, UpstreamRequest)
        upstream.answer.set()
        async with await answered as resp:
            assert await resp.read() == b"fine"


async def test_a_request_cancelled_while_the_upstream_thinks_closes_its_connection() -> None:
    """The client leaves while the response head is awaited: the handler is cancelled, and the
    upstream connection is closed (never given back to the pool half-used)."""
    closed = asyncio.Event()
    thinking = asyncio.Event()

    async def thinks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        thinking.set()
        if await reader.read() == b"":
            closed.set()

    target = _Target()
    async with serve_raw(thinks) as url, _front(url, target) as (wg, tasks):
        async with aiohttp.ClientSession() as client:
            answered = asyncio.ensure_future(client.get(wg + "/slow"))
            await asyncio.wait_for(thinking.wait(), 10)
            answered.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await answered
        await asyncio.wait_for(closed.wait(), 10)
        (task,) = tasks
        assert task.cancelled()
    assert target.errors("reset") == 0
