"""The replicas' endpoints that change state answer only to the token the replicas share
(``replicas.token_file``): a fence, an unfence or a report without it is a 401, and a report of
a negative or non-finite spend is a 400 however it is signed. Every request one replica makes of
another carries the token."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.cluster.test_replicas_budget import table  # noqa: F401 - a fixture
from tests.helpers import ROOT, metric_value, serve_app, warmgate

TOKEN_FILE = ROOT / "tests" / "replicas-token"
TOKEN = TOKEN_FILE.read_text().strip()
STATE_CHANGING = ("/replicas/fence", "/replicas/unfence", "/replicas/report")


def config(identity: str) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": {"t": {"routes": [{}], "backend": {"kind": "static", "url": "http://x:1"}}},
        "replicas": {
            "namespace": "w",
            "service": "p",
            "identity": identity,
            "poll_interval": "50ms",
            "token_file": str(TOKEN_FILE),
        },
    }


async def post(admin: str, path: str, body: object, token: str | None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with (
        aiohttp.ClientSession() as http,
        http.post(admin + path, data=json.dumps(body), headers=headers) as resp,
    ):
        text = await resp.text()
        if resp.status == 401:
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        return resp.status, text


@pytest.mark.parametrize("path", STATE_CHANGING)
async def test_state_changing_endpoints_need_the_shared_token(
    path: str,
    table: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    body = {"target": "t", "leader": "intruder", "seconds": 5, "replica": "intruder"}
    async with warmgate(config("me")) as wg:
        table["me"] = wg.admin
        assert (await post(wg.admin, path, body, None))[0] == 401
        assert (await post(wg.admin, path, body, "not-the-token"))[0] == 401
        assert (await post(wg.admin, path, body, TOKEN + "x"))[0] == 401
        status, _ = await post(wg.admin, path, body, TOKEN)
        assert status == 200
        async with aiohttp.ClientSession() as http, http.get(wg.admin + "/replicas") as resp:
            assert resp.status == 200, "reading stays open"


@pytest.mark.parametrize(
    "budget",
    [
        {"day": "2030-01-01", "usd": -1000.0},
        {"day": "2030-01-01", "usd": float("nan")},
        {"day": "2030-01-01", "usd": float("-inf")},
        {"day": "2030-01-01", "usd": 1.0, "remembered": {"gone": {"day": "2030-01-01", "usd": -5}}},
        {"day": "2030-01-01", "usd": "lots"},
        {"day": "2030-01-01", "usd": 10**400},
        {
            "day": "2030-01-01",
            "usd": 1.0,
            "remembered": {"gone": {"day": "2030-01-01", "usd": 1e400}},
        },
    ],
)
async def test_a_report_of_a_negative_or_non_finite_spend_is_a_400(
    budget: dict[str, Any],
    table: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    body = {"replica": "other", "targets": {}, "budget": budget}
    async with warmgate(config("me")) as wg:
        table["me"] = wg.admin
        status, text = await post(wg.admin, "/replicas/report", body, TOKEN)
        assert status == 400, text
        assert "usd" in text


async def test_a_replica_sends_the_token_to_the_others(
    table: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    heard: list[str | None] = []
    read = asyncio.Event()

    async def activity(request: web.Request) -> web.Response:
        heard.append(request.headers.get("Authorization"))
        read.set()
        return web.json_response({"replica": "other", "targets": {}})

    app = web.Application()
    app.router.add_get("/replicas/activity", activity)
    async with serve_app(app) as other, warmgate(config("me")) as wg:
        table.update({"me": wg.admin, "other": other})
        async with asyncio.timeout(10):
            await read.wait()
    assert heard[0] == f"Bearer {TOKEN}"


@pytest.mark.parametrize("path", STATE_CHANGING)
async def test_a_body_nested_too_deep_is_a_plain_400(
    path: str,
    table: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    deep = b'{"replica": "other", "targets": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    async with warmgate(config("me")) as wg:
        table["me"] = wg.admin
        async with (
            aiohttp.ClientSession() as http,
            http.post(wg.admin + path, data=deep, headers=headers) as resp,
        ):
            assert resp.status == 400, await resp.text()
            assert "nested" in await resp.text()


@pytest.mark.parametrize("seconds", ["NaN", float("nan"), 1e400, 10**400, True, "5"])
async def test_a_fence_for_a_number_of_seconds_that_is_none_is_refused(
    seconds: object,
    table: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    async with warmgate(config("me")) as wg:
        table["me"] = wg.admin
        for body in ({"seconds": seconds}, {"seconds": 5, "idle": seconds}):
            body = {"target": "t", "leader": "other", **body}
            status, text = await post(wg.admin, "/replicas/fence", body, TOKEN)
            answer = json.loads(text)
            assert status == 200 and answer["fenced"] is False, (body, text)
            assert "must be a finite number" in answer["reason"], (body, text)


async def test_a_peers_idle_for_beyond_the_float_range_is_no_answer_and_replicas_stays_json(
    table: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    async def activity(request: web.Request) -> web.Response:
        body = b'{"replica": "other", "targets": {"t": {"phase": "ready", "idle_for": 1e400}}}'
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/replicas/activity", activity)
    async with serve_app(app) as other, warmgate(config("me")) as wg:
        table.update({"me": wg.admin, "other": other})
        async with asyncio.timeout(10):
            while await metric_value(wg.admin, "warmgate_outside_refused_total") < 2:  # noqa: ASYNC110 - a metric has no event
                await asyncio.sleep(0.05)
        refused = {"source": "peer", "field": "idle_for"}
        assert await metric_value(wg.admin, "warmgate_outside_refused_total", **refused) >= 2
        async with aiohttp.ClientSession() as http, http.get(wg.admin + "/replicas") as resp:
            text = await resp.text()
        view = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in {text}"))
        assert "Infinity" not in text and view  # and the peer is silent, not idle since ever
        replicas = wg.server.apps.replicas if wg.server.apps else None
        assert replicas is not None and not replicas.records["other"].reachable


async def test_a_peers_words_reach_views_and_logs_as_one_line(
    table: dict[str, str],  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    hostile = "ready\r\n2026-12-05 09:00:00,000 ERROR warmgate forged\x1b[2J\x00"

    async def activity(request: web.Request) -> web.Response:
        body = {"replica": "other", "targets": {"t": {"phase": hostile, "idle_for": 1}}}
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/replicas/activity", activity)
    caplog.set_level(logging.INFO)
    async with serve_app(app) as other, warmgate(config("me")) as wg:
        table.update({"me": wg.admin, "other": other})
        body = {"target": "t", "leader": hostile, "seconds": 5}
        status, _ = await post(wg.admin, "/replicas/fence", body, TOKEN)
        assert status == 200
        async with asyncio.timeout(10):
            while await metric_value(wg.admin, "warmgate_outside_refused_total", field="phase") < 1:  # noqa: ASYNC110 - a metric has no event
                await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as http, http.get(wg.admin + "/replicas") as resp:
            text = await resp.text()
        assert "forged" not in text  # a phase warmgate does not know is no answer
    said = [r.getMessage() for r in caplog.records if "forged" in r.getMessage()]
    for message in said:
        assert not set(message) & set("\r\x1b\x00") and "\n2026" not in message
