"""Error replies: every :class:`RequestError` becomes an HTTP response here, in one place.

Browsers (``Accept: text/html``) get a short HTML page, everything else JSON
``{"error": {"code", "message", "target"}}``.
"""

from __future__ import annotations

import html
import json
import math

from aiohttp import web

from router.errors import RequestError


def wants_html(request: web.BaseRequest) -> bool:
    return "text/html" in request.headers.get("Accept", "")


def error_response(request: web.BaseRequest, error: RequestError) -> web.Response:
    headers = {"Cache-Control": "no-store"}
    if error.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    if wants_html(request):
        title = html.escape(f"{error.status} {error.code.replace('_', ' ')}")
        body = (
            "<!doctype html><html><head><meta charset=utf-8>"
            f"<title>{title}</title></head><body><h1>{title}</h1>"
            f"<p>{html.escape(error.message)}</p><hr><small>warmgate</small></body></html>"
        )
        return web.Response(
            status=error.status, text=body, content_type="text/html", headers=headers
        )
    payload = {"error": {"code": error.code, "message": error.message, "target": error.target}}
    return web.Response(
        status=error.status,
        text=json.dumps(payload),
        content_type="application/json",
        headers=headers,
    )
