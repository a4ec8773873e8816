"""Chat completions and embeddings on a local target: held through its cold start, then
forwarded to its OpenAI-compatible server through the streaming proxy (event streams pass
through unbuffered).

What goes to the target: the client's JSON (with the placement's model name when it differs)
and the client's headers minus credentials and warmgate's own headers. The cloud's API key is
never among them: it lives only in the cloud backend.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from typing import Final

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from backends.base import RequestFacts
from router.config import Placement
from router.http.headers import upstream_request_headers
from router.http.proxy import forward_http
from router.openai.call import PATHS, UPSTREAM_ID, Call
from router.scale.targets import TargetRuntime

DROPPED: Final = frozenset({"authorization", "content-length", "cookie", "proxy-authorization"})
"""Client headers a local target never sees: warmgate's client key is not the target's key."""


@functools.cache
def api_facts(path: str) -> RequestFacts:
    """What an engine sees of an API request when deciding whether it may wake a cold target."""
    return RequestFacts(method="POST", path=path, is_websocket=False, is_navigation=False)


def local_body(call: Call, placement: Placement) -> bytes:
    """The body for the target: the client's bytes, or re-encoded with the local model name."""
    if placement.model is None or placement.model == call.model:
        return call.raw
    return json.dumps({**call.body, "model": placement.model}).encode()


def local_headers(call: Call, trust_forwarded: bool) -> CIMultiDict[str]:
    request = call.request
    peer = request.transport.get_extra_info("peername") if request.transport else None
    headers = upstream_request_headers(
        request.headers,
        client_ip=peer[0] if peer else None,
        scheme=request.scheme,
        prefix=None,
        trust_forwarded=trust_forwarded,
    )
    for name in list(headers):
        lower = name.lower()
        if lower in DROPPED or lower.startswith("x-warmgate-"):
            headers.popall(name, None)
    headers["Content-Type"] = "application/json"
    headers["X-Request-Id"] = call.request.get(UPSTREAM_ID, call.request_id)
    return headers


async def forward_local(
    call: Call,
    runtime: TargetRuntime,
    session: aiohttp.ClientSession,
    placement: Placement,
    loads: Counter[str],
    *,
    trust_forwarded: bool,
) -> web.StreamResponse:
    """Hold (if cold) and forward; ``loads`` counts API requests in progress per target."""
    path = placement.base_path.rstrip("/") + PATHS[call.kind]
    name = runtime.name
    loads[name] += 1
    try:
        held = await runtime.acquire(api_facts(path))
        # Counted in flight before the next await (see TargetRuntime.acquire).
        with runtime.in_flight() as in_flight:
            cold_wait = held.waited if held.cold else None
            if cold_wait is not None:
                call.notes["cold_wait"] = f"{cold_wait:.3f}"
            url = URL(runtime.pick_endpoint(held.state) + path)
            headers = local_headers(call, trust_forwarded)
            body = local_body(call, placement)
            return await forward_http(
                call.request,
                runtime,
                session,
                url,
                headers,
                cold_wait,
                in_flight,
                body=body,
                first_bytes=lambda: call.first_bytes("local", runtime.loop.time()),
            )
    finally:
        loads[name] -= 1
