"""Forwarding one HTTP exchange: streamed both ways, never buffering a whole body.

Library errors are translated here into warmgate's error tree; the app turns them into replies.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Final

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from router.errors import BodyTooLarge, UpstreamError, UpstreamTimeout
from router.headers import downstream_response_headers
from router.targets import TargetRuntime

SMALL_BODY: Final = 64 * 1024
"""Upstream bodies of known length up to this are read at once and written in one go."""

COLD_START_HEADER: Final = "X-Warmgate-Cold-Start"


class _LimitedBody:
    """A request body of unknown length, cut off past ``limit`` bytes."""

    def __init__(self, content: aiohttp.StreamReader, limit: int, runtime: TargetRuntime) -> None:
        self.content = content
        self.limit = limit
        self.runtime = runtime
        self.exceeded = False

    async def chunks(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self.content.iter_any():
            total += len(chunk)
            if total > self.limit:
                self.exceeded = True
                raise BodyTooLarge(
                    f"request body is larger than {self.limit} bytes", target=self.runtime.name
                )
            self.runtime.m_bytes_in.inc(len(chunk))
            yield chunk


def _translate(exc: BaseException, runtime: TargetRuntime, phase: str) -> Exception:
    name = runtime.name
    if isinstance(exc, TimeoutError):
        kind = "connect_timeout" if isinstance(exc, aiohttp.ConnectionTimeoutError) else "timeout"
        runtime.metrics.upstream_errors.labels(name, kind).inc()
        if kind == "connect_timeout":
            return UpstreamTimeout(f"could not connect to target {name!r} in time", target=name)
        return UpstreamTimeout(f"target {name!r} sent no response {phase} in time", target=name)
    kind = "connect" if isinstance(exc, aiohttp.ClientConnectorError) else "reset"
    runtime.metrics.upstream_errors.labels(name, kind).inc()
    if kind == "connect":
        return UpstreamError(f"target {name!r} refused the connection", target=name)
    return UpstreamError(f"target {name!r} closed the connection {phase}", target=name)


async def forward_http(
    request: web.Request,
    runtime: TargetRuntime,
    session: aiohttp.ClientSession,
    url: URL,
    headers: CIMultiDict[str],
    cold_wait: float | None,
    body: bytes | None = None,
) -> web.StreamResponse:
    """Send ``request`` to ``url`` and stream the answer back. The caller counts it in flight.

    ``body``: a request body already read (the OpenAI API reads JSON to place it); the request's
    own body is then not touched, and ``headers`` must not carry a Content-Length."""
    spec = runtime.spec
    limited: _LimitedBody | None = None
    data: object = None
    if body is not None:
        data = body
        runtime.m_bytes_in.inc(len(body))
    elif request.body_exists:
        if request.content_length is not None:
            data = request.content
            runtime.m_bytes_in.inc(request.content_length)
        else:
            limited = _LimitedBody(request.content, spec.limits.max_body, runtime)
            data = limited.chunks()
    try:
        async with asyncio.timeout(spec.timeouts.response_headers):
            upstream = await session.request(
                request.method, url, headers=headers, data=data, allow_redirects=False
            )
    except (aiohttp.ClientError, TimeoutError) as exc:
        if limited is not None and limited.exceeded:
            raise BodyTooLarge(
                f"request body is larger than {limited.limit} bytes", target=runtime.name
            ) from exc
        raise _translate(exc, runtime, "headers") from exc
    try:
        return await _respond(request, runtime, upstream, cold_wait)
    finally:
        upstream.release()


async def _respond(
    request: web.Request,
    runtime: TargetRuntime,
    upstream: aiohttp.ClientResponse,
    cold_wait: float | None,
) -> web.StreamResponse:
    headers = downstream_response_headers(upstream.headers)
    if cold_wait is not None:
        headers[COLD_START_HEADER] = f"{cold_wait:.3f}"
    length = upstream.content_length
    if length is not None and length <= SMALL_BODY and request.method != "HEAD":
        try:
            body = await upstream.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _translate(exc, runtime, "body") from exc
        headers.popall("Content-Length", None)
        runtime.m_bytes_out.inc(len(body))
        return web.Response(
            status=upstream.status, reason=upstream.reason, body=body, headers=headers
        )

    response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    if length is None and request.version >= aiohttp.HttpVersion11:
        response.enable_chunked_encoding()
    stream = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
    stream_key: object | None = None
    activity = runtime.activity
    # The engine says how an event stream counts: for its whole life (``open``: it stays in
    # flight, e.g. a running Gradio job), while it carries events (``frames``), or never.
    mode = runtime.engine.stream_activity(upstream.url.path) if stream else "open"
    counts = mode == "frames"
    if stream:
        stream_key = object()
        if mode != "open":
            activity.end(runtime.loop.time())
            runtime.m_in_flight.dec()

        async def close(code: int, reason: str) -> None:
            upstream.close()

        activity.streams[stream_key] = close
    await response.prepare(request)
    sent = 0
    try:
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
            sent += len(chunk)
            if counts:
                activity.last_frame = runtime.loop.time()
    except (aiohttp.ClientError, TimeoutError) as exc:
        # Headers are gone already: the only honest signal left is to cut the connection.
        _translate(exc, runtime, "body")
        if request.transport is not None:
            request.transport.close()
        return response
    except ConnectionResetError:
        return response  # the client went away; the upstream connection is closed by release()
    finally:
        runtime.m_bytes_out.inc(sent)
        if stream_key is not None:
            activity.streams.pop(stream_key, None)
            if mode != "open":
                activity.begin(runtime.loop.time())  # balanced by the caller's end()
                runtime.m_in_flight.inc()
    await response.write_eof()
    return response
