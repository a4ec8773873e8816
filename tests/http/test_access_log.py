"""The access log writes a request's path without its query string unless ``server.log_query``
says otherwise: tokens and signed URLs travel in query strings."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.helpers import serve_app, static_config, warmgate
from tests.openai_stack import stack


def upstream() -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/{tail:.*}", hello)
    return app


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "warmgate.access"]


@pytest.mark.parametrize("log_query", [None, False, True])
async def test_the_query_string_is_left_out_of_the_access_log(
    caplog: pytest.LogCaptureFixture, log_query: bool | None
) -> None:
    caplog.set_level(logging.INFO, logger="warmgate.access")
    async with serve_app(upstream()) as url:
        config: dict[str, Any] = static_config(url)
        config["server"] = {"access_log": True}
        if log_query is not None:
            config["server"]["log_query"] = log_query
        async with warmgate(config) as wg, aiohttp.ClientSession() as http:
            async with http.get(wg.url + "/view/file.png?token=s3cr3t&x=1") as resp:
                assert resp.status == 200
            async with http.get(wg.url + "/other?sig=abc") as resp:
                assert resp.status == 200
    (line, other) = access_lines(caplog)
    assert "/view/file.png" in line and "/other" in other
    if log_query:
        assert "/view/file.png?token=s3cr3t&x=1" in line and "?sig=abc" in other
    else:
        assert "s3cr3t" not in line and "?" not in line.split('"')[1]
        assert "sig=abc" not in other


@pytest.mark.parametrize("log_query", [False, True])
async def test_the_api_access_log_follows_the_same_rule(
    caplog: pytest.LogCaptureFixture, log_query: bool
) -> None:
    caplog.set_level(logging.INFO, logger="warmgate.access")

    def tweak(config: dict[str, Any]) -> None:
        config["server"] = {"access_log": True, "log_query": log_query}

    async with stack(tweak=tweak) as st, aiohttp.ClientSession() as http:
        chat = {"model": "local-only", "messages": [{"role": "user", "content": "hi"}]}
        url = st.wg.url + "/v1/chat/completions?api_key=s3cr3t"
        async with http.post(url, json=chat) as resp:
            assert resp.status == 200
    lines = [line for line in access_lines(caplog) if "/v1/chat/completions" in line]
    assert lines, access_lines(caplog)
    assert lines[0].endswith("s"), "a line with no notes ends in its time, not a space"
    if log_query:
        assert "/v1/chat/completions?api_key=s3cr3t" in lines[0]
    else:
        assert "s3cr3t" not in lines[0]
