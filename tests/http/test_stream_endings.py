"""How a forwarded response ends, each way it can: cut off by the upstream (a reset is a
truncation), ended by warmgate itself at a release (a clean end, no upstream error), left by its
client (still logged and counted once), or overtaken by an upload past ``max_body`` (no second
response). Real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.helpers import ROOT, metric_value, serve_app, static_config, wait_until, warmgate
from tests.rawserver import serve_raw


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


def reset(writer: asyncio.StreamWriter) -> None:
    """End the connection with a TCP reset (RST), not a FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def test_a_reset_during_a_body_that_ends_with_the_connection_is_a_truncation(
    client: aiohttp.ClientSession,
) -> None:
    go = asyncio.Event()

    async def until_reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + b"z" * 1000)
        await writer.drain()
        await go.wait()
        reset(writer)

    async with serve_raw(until_reset) as url, warmgate(static_config(url)) as wg:
        async with client.get(wg.url + "/eof") as resp:
            assert resp.status == 200
            assert await resp.content.readexactly(1000) == b"z" * 1000
            go.set()
            with pytest.raises(aiohttp.ClientPayloadError):  # not a clean end
                await resp.read()
        assert await metric_value(wg.admin, "warmgate_upstream_errors_total", kind="reset") == 1


async def test_upstream_header_lines_up_to_the_head_size_are_accepted() -> None:
    big = "v" * 60_000  # one line, within the 64 KiB of a head

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="ok", headers={"X-Big": big})

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        sock.headers["X-Big"] = big
        await sock.prepare(request)
        async for msg in sock:
            await sock.send_str(msg.data)
        return sock

    app = web.Application(handler_args={"max_field_size": 70_000})
    app.router.add_get("/ws", ws)
    app.router.add_get("/", page)
    async with (
        serve_app(app) as url,
        warmgate(static_config(url)) as wg,
        aiohttp.ClientSession(max_line_size=70_000, max_field_size=70_000) as client,
    ):
        async with client.get(wg.url + "/") as resp:
            assert resp.status == 200 and resp.headers["X-Big"] == big
        sock = await client.ws_connect(wg.url + "/ws")
        await sock.send_str("hi")
        assert (await sock.receive()).data == "hi"
        await sock.close()


async def test_an_upload_past_max_body_after_the_answer_began_gets_no_second_response() -> None:
    async def answers_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        while await reader.read(65536):  # the upload, as it comes
            pass

    config = static_config("", limits={"max_body": "1KiB"})
    async with serve_raw(answers_first) as url:
        config["targets"]["t"]["backend"]["url"] = url
        async with warmgate(config) as wg:
            reader, writer = await asyncio.open_connection("127.0.0.1", wg.server.public_port)
            writer.write(b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
            assert await reader.readuntil(b"hello\r\n") == b"5\r\nhello\r\n"
            for _ in range(4):  # 2 KiB in all: past max_body after the answer began
                writer.write(b"200\r\n" + b"u" * 512 + b"\r\n")
                await writer.drain()
            rest = b""  # what follows, until warmgate cuts the connection
            while chunk := await asyncio.wait_for(reader.read(65536), 10):
                rest += chunk
                if b"HTTP/1.1 " in rest:
                    break
            writer.close()
    assert rest == b""  # no 413 after the 200, and no terminating chunk either


async def test_a_release_ends_an_open_event_stream_cleanly(tmp_path: Path) -> None:
    token = "a-release-token-8c1d"
    (tmp_path / "admin-token").write_text(token)
    data = {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "admin": {"token_file": "admin-token"},
        "targets": {
            "t": {
                "routes": [{"path_prefix": "/"}],
                "backend": {
                    "kind": "process",
                    "command": ["python", "-m", "tests.sleepy_engine", "--port", "{port}"],
                    "cwd": str(ROOT),
                    "stop_grace": "2s",
                },
                "readiness": {"path": "/readyz", "interval": "50ms"},
                "scaling": {"idle_after": "10m", "stream_activity_window": "100ms"},
            }
        },
    }
    auth = {"Authorization": f"Bearer {token}"}
    async with warmgate(data, str(tmp_path)) as wg, aiohttp.ClientSession() as client:
        async with client.get(wg.url + "/events", headers={"Accept": "text/event-stream"}) as resp:
            assert resp.status == 200 and await resp.content.readline() == b"data: one\n"
            await wait_until(lambda: bool(wg.runtime().activity.streams))
            await asyncio.sleep(0.2)  # quiet for longer than stream_activity_window
            async with client.post(wg.admin + "/targets/t/release", headers=auth) as released:
                assert released.status == 202, await released.text()
            assert await resp.read() == b"\n"  # the rest of the stream, and a clean end
        await wait_until(lambda: wg.runtime().state.phase.value == "cold")
        assert await metric_value(wg.admin, "warmgate_upstream_errors_total") == 0


async def test_a_stream_its_client_leaves_is_logged_and_counted_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    left = asyncio.Event()

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: one\n\n")
        try:
            await asyncio.Event().wait()
        finally:
            left.set()
        return response

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response(text="late")

    app = web.Application()
    app.router.add_get("/events", events)
    app.router.add_get("/slow", slow)
    config = static_config("")
    config["server"]["access_log"] = True
    caplog.set_level(logging.INFO, logger="warmgate.access")
    async with serve_app(app) as url:
        config["targets"]["t"]["backend"]["url"] = url
        async with warmgate(config) as wg:
            async with aiohttp.ClientSession() as client:
                resp = await client.get(wg.url + "/events")
                assert await resp.content.readline() == b"data: one\n"
                resp.close()  # a tab's heartbeat stream, closed by the tab
                await asyncio.wait_for(left.wait(), 10)
                slow_request = asyncio.ensure_future(client.get(wg.url + "/slow"))
                await wait_until(lambda: wg.runtime().activity.in_flight == 1)
                slow_request.cancel()  # the client leaves before any answer
            for code, path in (("200", "/events"), ("499", "/slow")):
                await wait_until(lambda p=path: any(p in r.getMessage() for r in caplog.records))
                lines = [r.getMessage() for r in caplog.records if f"GET {path}" in r.getMessage()]
                assert len(lines) == 1 and f" {code} target=t " in lines[0], lines
                count = await metric_value(wg.admin, "warmgate_requests_total", code=code)
                assert count == 1, (path, code)
