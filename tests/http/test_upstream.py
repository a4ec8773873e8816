"""warmgate's own upstream client (router.http.h1.pool) through the proxy, against raw HTTP/1.1
servers on 127.0.0.1 that answer exactly what each test needs."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from tests.helpers import serve_app, static_config, wait_until, warmgate
from tests.rawserver import ok, raw_upstream, serve_raw


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


async def test_keep_alive_connections_are_reused(client: aiohttp.ClientSession) -> None:
    async with (
        raw_upstream(lambda head: ok(b"hi")) as (url, upstream),
        warmgate(static_config(url)) as wg,
    ):
        for _ in range(20):
            async with client.get(wg.url + "/x") as resp:
                assert await resp.read() == b"hi"
    assert upstream.connections == 1 and len(upstream.heads) == 20


async def test_a_closed_idle_connection_is_replaced_without_an_error(
    client: aiohttp.ClientSession,
) -> None:
    async with (
        raw_upstream(lambda head: ok(b"hi")) as (url, upstream),
        warmgate(static_config(url)) as wg,
    ):
        async with client.get(wg.url + "/x") as resp:
            assert resp.status == 200
        for writer in upstream.writers:  # the upstream's keep-alive timeout, say
            writer.transport.abort()
        async with client.get(wg.url + "/x") as resp:
            assert resp.status == 200 and await resp.read() == b"hi"


async def test_chunked_and_until_close_bodies_pass_through(client: aiohttp.ClientSession) -> None:
    chunks = [b"a" * 10, b"b" * 70000, b"c"]

    def respond(head: bytes) -> bytes | None:
        if head.startswith(b"GET /chunked"):
            body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"
        return None

    async with raw_upstream(respond) as (url, _), warmgate(static_config(url)) as wg:
        resp = await client.get(wg.url + "/chunked")
        assert resp.status == 200 and await resp.read() == b"".join(chunks)

    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"z" * 100_000)
        await writer.drain()
        writer.close()

    async with serve_raw(until_close) as url, warmgate(static_config(url)) as wg:
        for _ in range(2):
            async with client.get(wg.url + "/eof") as resp:
                assert await resp.read() == b"z" * 100_000


async def test_bodiless_answers_head_204_304_and_100_continue(
    client: aiohttp.ClientSession,
) -> None:
    def respond(head: bytes) -> bytes | None:
        if head.startswith(b"HEAD"):
            return b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n"
        if b"/204" in head:
            return b"HTTP/1.1 204 No Content\r\n\r\n"
        if b"/304" in head:
            return b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\n\r\n'
        return b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"after continue")

    async with raw_upstream(respond) as (url, upstream), warmgate(static_config(url)) as wg:
        async with client.head(wg.url + "/h") as resp:
            assert resp.status == 200 and resp.headers["Content-Length"] == "1234"
        for path, status in (("/204", 204), ("/304", 304)):
            async with client.get(wg.url + path) as resp:
                assert resp.status == status and await resp.read() == b""
        async with client.get(wg.url + "/c") as resp:
            assert resp.status == 200 and await resp.read() == b"after continue"
    assert upstream.connections == 1  # every one of them left the connection reusable


async def test_invalid_or_cut_off_responses(client: aiohttp.ClientSession) -> None:
    def respond(head: bytes) -> bytes | None:
        if b"/garbage" in head:
            return b"SPDY/9 nonsense\r\n\r\n"
        if b"/short" in head:
            return b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 70000
        return None

    async def cut_after(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        answer = respond(head)
        if answer:
            writer.write(answer)
            await writer.drain()
        writer.close()

    async with serve_raw(cut_after) as url, warmgate(static_config(url)) as wg:
        async with client.get(wg.url + "/garbage") as resp:
            assert resp.status == 502
        async with client.get(wg.url + "/nothing") as resp:
            assert resp.status == 502
        with pytest.raises(aiohttp.ClientPayloadError):
            async with client.get(wg.url + "/short") as resp:
                assert resp.status == 200
                await resp.read()  # the client connection is cut: no silent truncation


async def test_max_connections_is_a_limit_and_requests_wait_for_one(
    client: aiohttp.ClientSession,
) -> None:
    release = asyncio.Event()
    in_progress: list[str] = []
    most = 0
    peers: set[object] = set()

    async def slow(request: web.Request) -> web.Response:
        nonlocal most
        assert request.transport is not None
        peers.add(request.transport.get_extra_info("peername"))
        in_progress.append(request.path)
        most = max(most, len(in_progress))
        await release.wait()
        in_progress.remove(request.path)
        return web.Response(text=request.path)

    app = web.Application()
    app.router.add_get("/{tail:.*}", slow)
    config = static_config("", limits={"max_connections": 2})
    async with serve_app(app) as url:
        config["targets"]["t"]["backend"]["url"] = url
        async with warmgate(config) as wg:
            tasks = [asyncio.ensure_future(client.get(f"{wg.url}/r{i}")) for i in range(8)]
            await wait_until(lambda: len(in_progress) >= 2)
            await asyncio.sleep(0.2)
            assert len(in_progress) == 2  # the others wait for a connection
            release.set()
            responses = await asyncio.gather(*tasks)
            bodies = [await r.text() for r in responses]
    assert sorted(bodies) == sorted(f"/r{i}" for i in range(8))
    assert most == 2 and len(peers) == 2


async def test_chunked_upload_passes_through(client: aiohttp.ClientSession) -> None:
    async def echo_size(request: web.Request) -> web.Response:
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
        return web.json_response({"size": size, "te": request.headers.get("Transfer-Encoding")})

    app = web.Application()
    app.router.add_post("/up", echo_size)

    async def body() -> AsyncIterator[bytes]:
        for _ in range(50):
            yield b"q" * 10_000

    async with serve_app(app) as url, warmgate(static_config(url)) as wg:
        async with client.post(wg.url + "/up", data=body()) as resp:
            assert await resp.json() == {"size": 500_000, "te": "chunked"}
        async with client.post(wg.url + "/up", data=b"") as resp:
            assert (await resp.json())["size"] == 0


async def test_a_slow_client_holds_back_the_upstream(client: aiohttp.ClientSession) -> None:
    block, blocks = 2**16, 256  # 16 MiB, each block its own byte: a reused buffer would show

    def body() -> bytes:
        return b"".join(bytes([i % 251]) * block for i in range(blocks))

    async def big(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = block * blocks
        await response.prepare(request)
        for i in range(blocks):
            await response.write(bytes([i % 251]) * block)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/big", big)
    async with serve_app(app) as url, warmgate(static_config(url)) as wg:
        received = hashlib.sha256()
        size = 0
        async with client.get(wg.url + "/big") as resp:
            while chunk := await resp.content.read(2**16):
                received.update(chunk)
                size += len(chunk)
                if size < 4 * 2**20:
                    await asyncio.sleep(0.005)  # slow at first: warmgate must pause, then resume
        assert size == block * blocks
        assert received.digest() == hashlib.sha256(body()).digest()


async def test_a_head_in_pieces_and_a_body_until_close(client: aiohttp.ClientSession) -> None:
    pieces = {
        b"/split": [b"HTTP/1.1 200 OK\r\nContent-Le", b"ngth: 5\r\n\r", b"\nhello"],
        b"/eof": [b"HTTP/1.0 200 OK\r\n", b"\r\nuntil ", b"close"],
    }

    async def piecewise(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            path = head.split(b" ")[1]
            for piece in pieces[path]:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.05)
            if path == b"/eof":
                break
        writer.close()

    async with serve_raw(piecewise) as url, warmgate(static_config(url)) as wg:
        for path, body in (("/split", b"hello"), ("/eof", b"until close"), ("/split", b"hello")):
            async with client.get(wg.url + path) as resp:
                assert resp.status == 200 and await resp.read() == body
