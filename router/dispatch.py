"""The public request path: match a route, get a ready endpoint (holding through a cold start),
forward, account. Errors from any step become one reply (router.replies)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import aiohttp
from aiohttp import web
from yarl import URL

from backends.base import RequestFacts
from router.errors import BadRequest, BodyTooLarge, NoRoute, RequestError
from router.headers import WEBSOCKET_HANDSHAKE, upstream_request_headers
from router.match import Match, RouteTable
from router.metrics import Metrics
from router.proxy import forward_http
from router.replies import error_response
from router.targets import TargetRuntime
from router.websocket import forward_websocket, is_websocket_upgrade

log = logging.getLogger("warmgate.access")


def is_navigation(request: web.BaseRequest) -> bool:
    """A browser loading a page (not XHR/fetch, not an asset)."""
    if request.method != "GET" or "text/html" not in request.headers.get("Accept", ""):
        return False
    mode = request.headers.get("Sec-Fetch-Mode")
    if mode is not None:
        return mode == "navigate"
    return request.headers.get("X-Requested-With") is None


class Dispatcher:
    def __init__(
        self,
        table: RouteTable,
        runtimes: Mapping[str, TargetRuntime],
        sessions: Mapping[str, aiohttp.ClientSession],
        metrics: Metrics,
        *,
        trust_forwarded: bool,
        access_log: bool,
    ) -> None:
        self.table = table
        self.runtimes = runtimes
        self.sessions = sessions
        self.metrics = metrics
        self.trust_forwarded = trust_forwarded
        self.access_log = access_log
        self.waiting_page: WaitingPageHook | None = None
        self.loop = asyncio.get_running_loop()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = request.raw_path
        runtime: TargetRuntime | None = None
        started = self.loop.time()
        try:
            if not raw.startswith("/"):
                raise BadRequest("the request target must be an absolute path")
            path, _, _query = raw.partition("?")
            match = self.table.match(request.host, path, request.headers)
            if match is None:
                raise NoRoute(f"no route for {request.host}{path}")
            runtime = self.runtimes[match.target]
            response = await self._serve(request, runtime, match.upstream_path, raw, match)
        except RequestError as error:
            response = error_response(request, error)
        target = runtime.name if runtime is not None else "-"
        self.metrics.requests.labels(target, request.method, str(response.status)).inc()
        if runtime is not None:
            runtime.m_request_duration.observe(self.loop.time() - started)
        if self.access_log:
            log.info(
                '%s "%s %s" %s target=%s %.3fs',
                request.remote,
                request.method,
                raw,
                response.status,
                target,
                self.loop.time() - started,
            )
        return response

    async def _serve(
        self,
        request: web.Request,
        runtime: TargetRuntime,
        upstream_path: str,
        raw: str,
        match: Match,
    ) -> web.StreamResponse:
        spec = runtime.spec
        length = request.content_length
        if length is not None and length > spec.limits.max_body:
            raise BodyTooLarge(
                f"request body of {length} bytes is larger than {spec.limits.max_body}",
                target=runtime.name,
            )
        websocket = is_websocket_upgrade(request)
        cold_wait: float | None = None
        state = runtime.servable_now()
        if state is None:
            facts = RequestFacts(
                method=request.method,
                path=upstream_path,
                is_websocket=websocket,
                is_navigation=is_navigation(request),
            )
            if self.waiting_page is not None and not websocket:
                page = self.waiting_page(request, runtime, facts)
                if page is not None:
                    return page
            held = await runtime.acquire(facts)
            state = held.state
            cold_wait = held.waited if held.cold else None
        base = runtime.pick_endpoint(state)
        _, mark, query = raw.partition("?")
        url = URL(base + upstream_path + mark + query, encoded=True)
        prefix = match.entry.prefix if match.entry.strip_prefix else None
        peer = request.transport.get_extra_info("peername") if request.transport else None
        headers = upstream_request_headers(
            request.headers,
            client_ip=peer[0] if peer else None,
            scheme=request.scheme,
            prefix=prefix.rstrip("/") if prefix else None,
            trust_forwarded=self.trust_forwarded,
            skip=WEBSOCKET_HANDSHAKE if websocket else (),
        )
        session = self.sessions[runtime.name]
        if websocket:
            return await forward_websocket(request, runtime, session, url, headers, cold_wait)
        activity = runtime.activity
        activity.begin(runtime.loop.time())
        runtime.m_in_flight.inc()
        try:
            return await forward_http(request, runtime, session, url, headers, cold_wait)
        finally:
            activity.end(runtime.loop.time())
            runtime.m_in_flight.dec()


WaitingPageHook = Callable[[web.Request, TargetRuntime, RequestFacts], web.StreamResponse | None]
"""A response for a browser loading a page from a cold target, or ``None`` to hold."""
