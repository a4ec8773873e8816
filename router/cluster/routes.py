"""The replicas' endpoints on the admin listener (never served publicly): what this replica
says of its targets, the others' fences and reports, and a view of them all (docs/replicas.md).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from router.cluster.replicas import Replicas

REPLICAS = web.AppKey("replicas", Replicas)


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"expected a JSON object: {exc}") from exc
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="expected a JSON object")
    return body


async def view(request: web.Request) -> web.Response:
    return web.json_response(request.app[REPLICAS].describe())


async def activity(request: web.Request) -> web.Response:
    return web.json_response(request.app[REPLICAS].report())


async def fence(request: web.Request) -> web.Response:
    body = await _json_body(request)
    target, leader = str(body.get("target") or ""), str(body.get("leader") or "?")
    try:
        seconds = float(body.get("seconds") or 0)
    except (TypeError, ValueError) as exc:
        raise web.HTTPBadRequest(text="seconds: expected a number") from exc
    refused = request.app[REPLICAS].fence(target, seconds, leader)
    return web.json_response({"fenced": refused is None, "reason": refused})


async def unfence(request: web.Request) -> web.Response:
    body = await _json_body(request)
    request.app[REPLICAS].unfence(str(body.get("target") or ""))
    return web.json_response({"fenced": False})


async def report(request: web.Request) -> web.Response:
    request.app[REPLICAS].heard_from(await _json_body(request))
    return web.json_response({"ok": True})


def add_routes(app: web.Application, replicas: Replicas) -> None:
    app[REPLICAS] = replicas
    app.router.add_get("/replicas", view)
    app.router.add_get("/replicas/activity", activity)
    app.router.add_post("/replicas/fence", fence)
    app.router.add_post("/replicas/unfence", unfence)
    app.router.add_post("/replicas/report", report)
