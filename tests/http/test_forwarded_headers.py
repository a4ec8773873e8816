"""What an engine is told of the client: a client's own ``Forwarded`` and ``X-Real-IP`` (and
``X-Forwarded-*``) reach it only behind a trusted gateway (``server.trust_forwarded``); HTTP
requests and websocket upgrades alike, against a real upstream on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.helpers import serve_app, static_config, warmgate

FORGED = {
    "Forwarded": "for=10.0.0.1;proto=https",
    "X-Real-IP": "10.0.0.1",
    "X-Forwarded-For": "10.0.0.1",
    "X-Forwarded-Host": "admin.example",
}


def echo_app(seen: list[dict[str, str]]) -> web.Application:
    async def echo(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        if request.headers.get("Upgrade", "").lower() == "websocket":
            sock = web.WebSocketResponse()
            await sock.prepare(request)
            await sock.close()
            return sock
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/{tail:.*}", echo)
    return app


async def engine_sees(sent: dict[str, str], trusted: bool) -> list[dict[str, str]]:
    """The headers the engine got for one request and one websocket upgrade sending ``sent``."""
    seen: list[dict[str, str]] = []
    async with serve_app(echo_app(seen)) as url:
        config: dict[str, Any] = static_config(url)
        config["server"]["trust_forwarded"] = trusted
        async with warmgate(config) as wg, aiohttp.ClientSession() as client:
            async with client.get(wg.url + "/x", headers=sent) as resp:
                assert resp.status == 200
            sock = await client.ws_connect(wg.url + "/ws", headers=sent)
            await sock.close()
    assert len(seen) == 2
    return seen


@pytest.mark.parametrize("trusted", [False, True])
async def test_a_clients_forwarding_headers_pass_only_when_trusted(trusted: bool) -> None:
    seen = await engine_sees(FORGED, trusted)
    for headers in seen:
        if trusted:
            assert headers["Forwarded"] == FORGED["Forwarded"]
            assert headers["X-Real-IP"] == "10.0.0.1"
            assert headers["X-Forwarded-For"] == "10.0.0.1, 127.0.0.1"
            assert headers["X-Forwarded-Host"] == "admin.example"
        else:
            assert "Forwarded" not in headers and "X-Real-IP" not in headers
            assert headers["X-Forwarded-For"] == "127.0.0.1"
            assert headers["X-Forwarded-Host"] != "admin.example"


UNDERSCORED = {
    "X_Forwarded_For": "10.0.0.1",
    "X_Real_IP": "10.0.0.1",
    "X_Forwarded_Host": "admin.example",
    "X_Forwarded_Proto": "https",
    "x_forwarded_prefix": "/admin",
    "X-Engine_Token": "kept",
}


@pytest.mark.parametrize("trusted", [False, True])
async def test_underscore_spellings_of_forwarding_headers_never_pass(trusted: bool) -> None:
    """A WSGI or CGI server reads ``X_Forwarded_For`` as ``X-Forwarded-For``: they never pass,
    trusted or not (warmgate writes the real ones)."""
    for headers in await engine_sees(UNDERSCORED, trusted):
        assert [name for name in headers if "_" in name] == ["X-Engine_Token"], headers
        assert headers["X-Forwarded-For"] == "127.0.0.1"
        assert headers["X-Forwarded-Proto"] == "http"
