"""The streaming proxy against real upstream servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import gzip
import socket
import time

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import make_mocked_request
from yarl import URL

from router.errors import UpstreamError
from router.http.replies import error_response
from tests.helpers import metric_value, serve_app, static_config, warmgate

RELEASE = web.AppKey("release_event_2", asyncio.Event)
CANCELLED = web.AppKey("cancelled", asyncio.Event)
SLOW_STARTED = web.AppKey("slow_started", asyncio.Event)
WS_CLOSED = web.AppKey("ws_closed_with", list)


def comfy_like_upstream(seen: list[web.Request]) -> web.Application:
    """Answers 403 like ComfyUI when Origin's host differs from Host; echoes what it saw."""

    @web.middleware
    async def origin_check(request: web.Request, handler: object) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin and origin.split("://", 1)[-1] != request.headers.get("Host"):
            return web.Response(status=403, text="origin mismatch")
        return await handler(request)  # type: ignore[operator]

    async def echo(request: web.Request) -> web.Response:
        seen.append(request)
        body = await request.read()
        return web.json_response(
            {
                "path": request.raw_path,
                "host": request.headers.get("Host"),
                "headers": dict(request.headers),
                "body_len": len(body),
            }
        )

    async def gz(request: web.Request) -> web.Response:
        data = gzip.compress(b"x" * 5000)
        return web.Response(body=data, headers={"Content-Encoding": "gzip"})

    async def sse(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: one\n\n")
        release = request.app[RELEASE]
        await release.wait()
        await response.write(b"data: two\n\n")
        await response.write_eof()
        return response

    async def slow(request: web.Request) -> web.Response:
        request.app[SLOW_STARTED].set()
        try:
            await asyncio.sleep(float(request.query.get("s", "5")))
        except asyncio.CancelledError:
            request.app[CANCELLED].set()
            raise
        return web.Response(text="late")

    async def reset(request: web.Request) -> web.Response:
        assert request.transport is not None
        request.transport.close()
        return web.Response(text="never")

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse(protocols=("comfy",))
        await sock.prepare(request)
        async for msg in sock:
            if msg.type is WSMsgType.TEXT and msg.data.startswith("close:"):
                _, code, reason = msg.data.split(":", 2)
                await sock.close(code=int(code), message=reason.encode())
            elif msg.type is WSMsgType.TEXT:
                await sock.send_str(msg.data)
            elif msg.type is WSMsgType.BINARY:
                await sock.send_bytes(msg.data)
        request.app[WS_CLOSED].append(sock.close_code)
        return sock

    app = web.Application(middlewares=[origin_check])
    app[RELEASE] = asyncio.Event()
    app[CANCELLED] = asyncio.Event()
    app[SLOW_STARTED] = asyncio.Event()
    app[WS_CLOSED] = []
    app.router.add_get("/gzip", gz)
    app.router.add_get("/sse", sse)
    app.router.add_get("/slow", slow)
    app.router.add_get("/reset", reset)
    app.router.add_get("/ws", ws)
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


@pytest.fixture
async def stack():  # type: ignore[no-untyped-def]
    seen: list[web.Request] = []
    upstream_app = comfy_like_upstream(seen)
    async with (
        serve_app(upstream_app) as upstream,
        warmgate(
            static_config(
                upstream, timeouts={"response_headers": "1s"}, limits={"max_body": "1KiB"}
            )
        ) as wg,
        aiohttp.ClientSession(
            auto_decompress=False, skip_auto_headers=("Accept-Encoding", "User-Agent")
        ) as client,
    ):
        yield wg, client, upstream_app


async def test_get_post_and_forwarded_headers(stack) -> None:  # type: ignore[no-untyped-def]
    wg, client, _ = stack
    async with client.post(
        URL(wg.url + "/a/b?x=1&y=%2F", encoded=True),
        data=b"hello",
        headers={"Host": "render.lab", "Connection": "keep-alive, X-Drop", "X-Drop": "1"},
    ) as resp:
        assert resp.status == 200
        seen = await resp.json()
    assert seen["path"] == "/a/b?x=1&y=%2F"
    assert seen["host"] == "render.lab"
    assert seen["body_len"] == 5
    headers = seen["headers"]
    assert headers["X-Forwarded-For"] == "127.0.0.1"
    assert headers["X-Forwarded-Proto"] == "http"
    assert headers["X-Forwarded-Host"] == "render.lab"
    assert "X-Drop" not in headers and "Keep-Alive" not in headers
    assert "Accept-Encoding" not in headers, "warmgate must not add headers of its own"


async def test_host_and_origin_preserved_like_comfyui_wants(stack) -> None:  # type: ignore[no-untyped-def]
    wg, client, _ = stack
    host = f"127.0.0.1:{wg.server.public_port}"
    async with client.get(wg.url + "/x", headers={"Origin": f"http://{host}"}) as resp:
        assert resp.status == 200
    async with client.get(wg.url + "/x", headers={"Origin": "http://evil.example"}) as resp:
        assert resp.status == 403
    async with client.ws_connect(wg.url + "/ws", headers={"Origin": f"http://{host}"}) as ws:
        await ws.send_str("hi")
        assert (await ws.receive()).data == "hi"
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await client.ws_connect(wg.url + "/ws", headers={"Origin": "http://evil.example"})
    assert refused.value.status == 403


async def test_gzip_passes_through_undecoded(stack) -> None:  # type: ignore[no-untyped-def]
    wg, client, _ = stack
    async with client.get(wg.url + "/gzip", headers={"Accept-Encoding": "gzip"}) as resp:
        assert resp.headers["Content-Encoding"] == "gzip"
        raw = await resp.read()
    assert gzip.decompress(raw) == b"x" * 5000


async def test_websocket_binary_text_and_close_codes(stack) -> None:  # type: ignore[no-untyped-def]
    wg, client, upstream_app = stack
    payload = bytes(range(256)) * 1000
    async with client.ws_connect(wg.url + "/ws", protocols=("comfy",)) as ws:
        assert ws.protocol == "comfy"
        await ws.send_bytes(payload)
        msg = await ws.receive()
        assert msg.type is WSMsgType.BINARY and msg.data == payload
        await ws.send_str("ünïcode ✓")
        assert (await ws.receive()).data == "ünïcode ✓"
        pong = await ws.ping(b"are you there")  # type: ignore[func-returns-value]
        del pong
        await ws.send_str("close:4001:upstream says bye")
        msg = await ws.receive()
        assert msg.type is WSMsgType.CLOSE
        assert msg.data == 4001 and msg.extra == "upstream says bye"
    # And from the client side: the upstream sees the client's code.
    async with client.ws_connect(wg.url + "/ws") as ws:
        await ws.send_str("ping")
        await ws.receive()
        await ws.close(code=4002, message=b"tab closed")
    assert ws.close_code == 4002, "the close is answered with the client's own code"
    for _ in range(100):
        if 4002 in upstream_app[WS_CLOSED]:
            break
        await asyncio.sleep(0.02)
    assert 4002 in upstream_app[WS_CLOSED]


async def test_sse_chunks_arrive_as_sent(stack) -> None:  # type: ignore[no-untyped-def]
    wg, client, upstream_app = stack
    async with client.get(wg.url + "/sse") as resp:
        first = await asyncio.wait_for(resp.content.readline(), 5)
        assert first == b"data: one\n"
        # Event 1 is in the client's hands while the upstream has not sent event 2 yet.
        upstream_app[RELEASE].set()
        rest = await resp.read()
    assert b"data: two" in rest


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [("/reset", 502, "upstream_error"), ("/slow?s=5", 504, "upstream_timeout")],
)
async def test_upstream_errors(stack, path: str, status: int, code: str) -> None:  # type: ignore[no-untyped-def]
    wg, client, _ = stack
    async with client.get(wg.url + path) as resp:
        assert resp.status == status
        body = await resp.json()
    assert body["error"]["code"] == code and body["error"]["target"] == "t"
    says = {
        "/reset": "target 't' closed the connection before sending its response headers",
        "/slow?s=5": "target 't' sent no response headers in time",
    }
    assert body["error"]["message"] == says[path]


async def test_browsers_get_html_errors(stack) -> None:  # type: ignore[no-untyped-def]
    wg, client, _ = stack
    async with client.get(wg.url + "/reset", headers={"Accept": "text/html"}) as resp:
        assert resp.status == 502
        assert resp.content_type == "text/html"
        assert "refused" in await resp.text() or "closed" in await resp.text()


async def test_a_browser_s_error_page_for_a_broken_engine_tries_again_by_itself(stack) -> None:  # type: ignore[no-untyped-def]
    """A page load that met a 502 (an engine that broke, restarting) continues by itself, as
    the waiting page does; a POST's page does not resend it."""
    wg, client, _ = stack
    async with client.get(wg.url + "/reset", headers={"Accept": "text/html"}) as resp:
        page = await resp.text()
    assert resp.status == 502
    assert '<meta http-equiv="refresh" content="5">' in page and "tries again in 5 s" in page
    post = make_mocked_request("POST", "/render", headers={"Accept": "text/html"})
    reply = error_response(post, UpstreamError("target 't' closed the connection", target="t"))
    assert reply.status == 502 and "http-equiv" not in (reply.text or "")


async def test_a_connection_closed_before_the_headers_is_said_in_words(stack) -> None:  # type: ignore[no-untyped-def]
    wg, client, _ = stack
    async with client.get(wg.url + "/reset") as resp:
        assert resp.status == 502
        message = (await resp.json())["error"]["message"]
    assert message == "target 't' closed the connection before sending its response headers"
    async with client.get(wg.url + "/reset", headers={"Accept": "text/html"}) as resp:
        assert "closed the connection before sending its response headers" in await resp.text()


async def test_refused_upstream_is_502() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with warmgate(static_config(dead)) as wg, aiohttp.ClientSession() as client:
        async with client.get(wg.url + "/") as resp:
            assert resp.status == 502
            assert (await resp.json())["error"]["message"] == "target 't' refused the connection"
        assert await metric_value(wg.admin, "warmgate_upstream_errors_total", kind="connect") == 1


async def test_no_route_is_404() -> None:
    config = static_config("http://127.0.0.1:9")
    config["targets"]["t"]["routes"] = [{"path_prefix": "/only"}]
    async with (
        warmgate(config) as wg,
        aiohttp.ClientSession() as client,
        client.get(wg.url + "/elsewhere") as resp,
    ):
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "no_route"


async def test_body_too_large_is_413_with_and_without_length(stack) -> None:  # type: ignore[no-untyped-def]
    wg, client, _ = stack
    async with client.post(wg.url + "/up", data=b"x" * 2048) as resp:
        assert resp.status == 413

    async def chunks():  # type: ignore[no-untyped-def]
        for _ in range(4):
            yield b"y" * 512

    async with client.post(wg.url + "/up", data=chunks()) as resp:
        assert resp.status == 413
    async with client.post(wg.url + "/up", data=b"z" * 1000) as resp:
        assert resp.status == 200


async def test_malformed_request_is_400(stack) -> None:  # type: ignore[no-untyped-def]
    wg, _, _ = stack
    reader, writer = await asyncio.open_connection("127.0.0.1", wg.server.public_port)
    writer.write(b"GET http://elsewhere.example/ HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    status = await reader.readline()
    assert status.split(b" ")[1] == b"400", status
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", wg.server.public_port)
    writer.write(b"GARBAGE\r\n\r\n")
    await writer.drain()
    assert (await reader.readline()).split(b" ")[1] == b"400"
    writer.close()


async def test_client_disconnect_cancels_the_upstream_request(stack) -> None:  # type: ignore[no-untyped-def]
    wg, _, upstream_app = stack
    async with aiohttp.ClientSession() as other:
        task = asyncio.ensure_future(other.get(wg.url + "/slow?s=30"))
        await asyncio.wait_for(upstream_app[SLOW_STARTED].wait(), 5)  # forwarded
        task.cancel()
    await asyncio.wait_for(upstream_app[CANCELLED].wait(), 5)


async def test_admin_is_separate_and_exports_metrics(stack) -> None:  # type: ignore[no-untyped-def]
    wg, client, _ = stack
    async with client.get(wg.url + "/x") as resp:
        await resp.read()
    async with client.get(wg.admin + "/healthz") as resp:
        assert resp.status == 200
    async with client.get(wg.admin + "/readyz") as resp:
        assert resp.status == 200 and (await resp.json())["status"] == "ready"
    async with client.get(wg.url + "/metrics") as resp:
        assert "warmgate_requests_total" not in await resp.text()  # forwarded, not ours
    async with client.get(wg.admin + "/metrics") as resp:
        text = await resp.text()
    for name in (
        "warmgate_requests_total",
        "warmgate_request_duration_seconds_bucket",
        "warmgate_in_flight",
        "warmgate_upstream_errors_total",
        "warmgate_websockets_open",
        "warmgate_bytes_total",
    ):
        assert name in text, name
    assert await metric_value(wg.admin, "warmgate_requests_total", method="GET", code="200") >= 1


async def test_router_connects_only_to_configured_upstreams(stack) -> None:  # type: ignore[no-untyped-def]
    wg, client, _ = stack
    started = time.monotonic()
    async with client.get(wg.url + "//evil.example/x", headers={"Host": "evil.example"}) as resp:
        seen = await resp.json()
    assert seen["path"] == "//evil.example/x"  # reached our upstream, as a path
    assert time.monotonic() - started < 5
