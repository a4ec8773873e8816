"""Error replies: every :class:`RequestError` becomes an HTTP response here, in one place.

Browsers (``Accept: text/html``) get a short HTML page, everything else JSON
``{"error": {"code", "message", "target"}}``.
"""

from __future__ import annotations

import html
import json
import math
from typing import Final, TypeVar, cast

from aiohttp import web

from router.errors import RequestError

T = TypeVar("T")


def request_key(name: str, kind: type[T]) -> web.RequestKey[T]:
    """A typed key of a request's storage where aiohttp has them (3.13 on, which warns about
    plain names); the plain name on older versions (the floor, 3.12.14)."""
    make = getattr(web, "RequestKey", None)
    return make(name, kind) if make is not None else cast("web.RequestKey[T]", name)


STARTED: Final = request_key("warmgate_started", web.StreamResponse)
"""The response whose head went out already (a stream, a websocket), set once it did: what a
request that ends before its handler returns (the client left) was answered, and why no error
reply may follow it."""


def wants_html(request: web.BaseRequest) -> bool:
    return "text/html" in request.headers.get("Accept", "")


AGAIN_AFTER: Final = 5
"""Seconds after which a browser's page for a passing failure (502, 503, 504 on a page load)
loads itself again, where the error names no ``Retry-After`` of its own."""


def error_payload(error: RequestError) -> dict[str, dict[str, str | None]]:
    """The JSON body of an error reply."""
    return {"error": {"code": error.code, "message": error.message, "target": error.target}}


def error_response(request: web.BaseRequest, error: RequestError) -> web.Response:
    headers = {"Cache-Control": "no-store"}
    if error.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    if wants_html(request):
        title = html.escape(f"{error.status} {error.code.replace('_', ' ')}")
        again, note = "", ""
        if error.status in (502, 503, 504) and request.method in ("GET", "HEAD"):
            # An engine that broke or restarts: the page continues by itself, as the waiting
            # page does (a POST's page is not sent again).
            seconds = (
                AGAIN_AFTER if error.retry_after is None else max(1, math.ceil(error.retry_after))
            )
            again = f'<meta http-equiv="refresh" content="{seconds}">'
            note = f"<p>This page tries again in {seconds} s.</p>"
        body = (
            f"<!doctype html><html><head><meta charset=utf-8>{again}"
            f"<title>{title}</title></head><body><h1>{title}</h1>"
            f"<p>{html.escape(error.message)}</p>{note}<hr><small>warmgate</small></body></html>"
        )
        return web.Response(
            status=error.status, text=body, content_type="text/html", headers=headers
        )
    return web.Response(
        status=error.status,
        text=json.dumps(error_payload(error)),
        content_type="application/json",
        headers=headers,
    )
