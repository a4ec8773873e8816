"""The replicas' endpoints on the admin listener (never served publicly): what this replica
says of its targets, the others' fences and reports, and a view of them all (docs/replicas.md).

The endpoints that change state (fence, unfence, report) answer only to the replicas' shared
token (``replicas.token_file``) as ``Authorization: Bearer``, compared in constant time: 401
without it. Reading (``GET /replicas``, ``GET /replicas/activity``) stays open.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from backends.outside import number, one_line
from backends.units import MAX_DURATION
from router.cluster.replicas import Replicas
from router.cluster.spend import spend_problem
from router.http.finite_json import dumps

REPLICAS = web.AppKey("replicas", Replicas)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _answer(body: Any) -> web.Response:
    """A JSON answer that is always JSON: a number that is not finite is written ``null``."""
    return web.json_response(body, dumps=dumps)


def _signed(handler: Handler) -> Handler:
    """Only with the replicas' token: anyone else who reaches the admin port gets a 401."""

    async def checked(request: web.Request) -> web.StreamResponse:
        token = request.app[REPLICAS].token
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if (
            token is None
            or scheme.lower() != "bearer"
            or not hmac.compare_digest(given.strip().encode(), token.encode())
        ):
            raise web.HTTPUnauthorized(
                text="the replicas' token is needed (Authorization: Bearer)",
                headers={"WWW-Authenticate": 'Bearer realm="warmgate replicas"'},
            )
        return await handler(request)

    return checked


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"expected a JSON object: {exc}") from exc
    except RecursionError as exc:
        raise web.HTTPBadRequest(text="expected a JSON object: nested too deeply") from exc
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="expected a JSON object")
    return body


async def view(request: web.Request) -> web.Response:
    return _answer(request.app[REPLICAS].describe())


async def activity(request: web.Request) -> web.Response:
    return _answer(request.app[REPLICAS].report())


async def fence(request: web.Request) -> web.Response:
    body = await _json_body(request)
    target, leader = str(body.get("target") or ""), one_line(body.get("leader") or "?", 100)
    # a number that is none (a string, a bool, NaN, 1e400, a 401-digit integer) is refused
    seconds = number(body.get("seconds") or 0)
    needed = None if body.get("idle") is None else number(body["idle"], 0, MAX_DURATION)
    if seconds is None:
        refused: str | None = "seconds must be a finite number"
    elif needed is None and body.get("idle") is not None:
        refused = "idle must be a finite number of seconds, 0 to 3650d"
    else:
        refused = request.app[REPLICAS].fence(target, seconds, leader, needed)
    return _answer({"fenced": refused is None, "reason": refused})


async def unfence(request: web.Request) -> web.Response:
    body = await _json_body(request)
    request.app[REPLICAS].unfence(str(body.get("target") or ""), body.get("parked") is True)
    return _answer({"fenced": False})


async def grant(request: web.Request) -> web.Response:
    body = await _json_body(request)
    pool, target = str(body.get("pool") or ""), str(body.get("target") or "")
    refused = request.app[REPLICAS].grant_here(pool, target)
    return _answer({"granted": refused is None, "reason": refused})


async def report(request: web.Request) -> web.Response:
    body = await _json_body(request)
    problem = spend_problem(body.get("budget"))
    if problem is not None:  # a negative or NaN spend would lift the shared budget
        raise web.HTTPBadRequest(text=problem)
    request.app[REPLICAS].heard_from(body)
    return _answer({"ok": True})


def add_routes(app: web.Application, replicas: Replicas) -> None:
    app[REPLICAS] = replicas
    app.router.add_get("/replicas", view)
    app.router.add_get("/replicas/activity", activity)
    app.router.add_post("/replicas/fence", _signed(fence))
    app.router.add_post("/replicas/unfence", _signed(unfence))
    app.router.add_post("/replicas/report", _signed(report))
    app.router.add_post("/replicas/grant", _signed(grant))
