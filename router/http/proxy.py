"""Forwarding one HTTP exchange: streamed both ways, never buffering a whole body.

The upstream side is warmgate's own client (router.http.h1.pool); its errors, and aiohttp's for
websockets, are translated here into warmgate's error tree; the app turns them into replies.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Final

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from backends.base import stream_farewell
from router.errors import RequestError
from router.http.failures import translate
from router.http.h1.pool import Exchange, UpstreamFailure, endpoint
from router.http.headers import downstream_response_headers, serialize_request_head
from router.http.replies import STARTED
from router.http.runtime import Flight, Runtime
from router.http.sse import EventParser, JobWatch
from router.http.upstream import UpstreamRequest

log = logging.getLogger("warmgate.proxy")

SMALL_BODY: Final = 64 * 1024
"""Upstream bodies of known length up to this are read at once and written in one go."""

COLD_START_HEADER: Final = "X-Warmgate-Cold-Start"


async def forward_http(
    request: web.Request,
    runtime: Runtime,
    session: aiohttp.ClientSession,
    url: URL,
    headers: CIMultiDict[str],
    cold_wait: float | None,
    in_flight: Flight,
    body: bytes | None = None,
    first_bytes: Callable[[], None] | None = None,
) -> web.StreamResponse:
    """Send ``request`` to ``url`` and stream the answer back, counted by the caller's
    ``in_flight``.

    ``body``: a request body already read (the OpenAI API reads JSON to place it); the request's
    own body is then not touched, and ``headers`` must not carry a Content-Length.
    ``first_bytes``: called once, when the answer's first body bytes are in hand (the API's
    time to first token)."""
    ep = endpoint(f"{url.scheme}://{url.raw_authority}")
    head = functools.partial(
        serialize_request_head, request.method, url.raw_path_qs, headers, ep.host_header
    )
    exchange = await UpstreamRequest(request, runtime, session, ep, head, body)
    try:
        return await respond(
            request, runtime, exchange, url.path, cold_wait, in_flight, first_bytes
        )
    finally:
        exchange.close()


async def respond(
    request: web.Request,
    runtime: Runtime,
    upstream: Exchange,
    path: str,
    cold_wait: float | None,
    in_flight: Flight,
    first_bytes: Callable[[], None] | None = None,
) -> web.StreamResponse:
    """Stream ``upstream``'s response to the client (the caller closes ``upstream``); a stream
    that counts by its frames or jobs leaves ``in_flight`` while it runs. ``first_bytes``: see
    :func:`forward_http`."""
    headers = downstream_response_headers(upstream.headers)
    if cold_wait is not None:
        headers[COLD_START_HEADER] = f"{cold_wait:.3f}"
    length = upstream.length
    if length is not None and length <= SMALL_BODY and request.method != "HEAD":
        try:
            body = await upstream.read_all()
        except UpstreamFailure as exc:
            raise translate(exc, runtime, "body") from exc
        if first_bytes is not None and body:
            first_bytes()
        headers.popall("Content-Length", None)
        runtime.m_bytes_out.inc(len(body))
        return web.Response(
            status=upstream.status, reason=upstream.reason, body=body, headers=headers
        )

    stream = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
    # Body bytes already here go out with the head, in one write; otherwise (and for event
    # streams, whose clients want the head at once) the head is sent as soon as it is ready.
    kind = _WithFirstBytes if upstream.chunks and not stream else web.StreamResponse
    response = kind(status=upstream.status, reason=upstream.reason, headers=headers)
    if length is None and request.version >= aiohttp.HttpVersion11:
        response.enable_chunked_encoding()
    ended = False
    """warmgate ended the stream itself (a release, a shutdown): the end of its body."""
    counting: contextlib.ExitStack | None = None
    """A stream's blocks: its entry, its pause from ``in_flight``, its jobs; closed last."""
    # The engine says how an event stream counts: for its whole life (``open``: it stays in
    # flight, e.g. a streamed completion), while it carries events (``frames``), while a job it
    # carries runs (``jobs``: Gradio's queue/data, watched by router.http.sse), or never.
    mode = runtime.engine.stream_activity(path) if stream else "open"
    counts = mode == "frames"
    watch = JobWatch(runtime) if mode == "jobs" else None
    # What the engine's page must read before a stream warmgate ends (Gradio's close_stream),
    # and where the events it forwarded end, so that it comes as an event of its own.
    farewell = stream_farewell(runtime.engine, path) if stream else None
    events = (watch.parser if watch is not None else EventParser()) if farewell else None
    if stream:

        async def close(why: str) -> None:
            nonlocal ended
            ended = True
            upstream.close()

        counting = contextlib.ExitStack()
        counting.enter_context(runtime.stream(close))
        if mode != "open":
            counting.enter_context(in_flight.paused())
        if watch is not None:  # its jobs end before the request is in flight again
            counting.enter_context(watch.running)
    sent = 0
    try:
        await response.prepare(request)
        request[STARTED] = response
        if stream or upstream.chunks or not upstream.done:
            sent = await _body(
                request, runtime, upstream, response, stream, counts, watch, first_bytes, events
            )
        if ended:
            sent += await _farewell(response, farewell, events)
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away; the caller's close() ends the upstream exchange
    except UpstreamFailure as exc:
        # A stream warmgate did not get to close before its own stop (a Gradio tab's heartbeat
        # when the leader of several replicas stops first): ended by warmgate all the same; or
        # one the engine dropped after its own last word (Gradio's stream error): its end.
        said_last = watch is not None and watch.jobs.over
        ended = ended or runtime.stopped_by_warmgate or said_last
        if said_last and watch is not None and watch.jobs.closed:
            farewell = None  # the engine's own close_stream came already
        if ended and (response.chunked or length is None):
            # A terminating chunk (or the end of the connection): a clean end, no error.
            with contextlib.suppress(ConnectionResetError):
                sent += await _farewell(response, farewell, events)
                await response.write_eof()
        else:
            # Headers are gone already: the only honest signal left is to cut the connection.
            if not ended:
                translate(exc, runtime, "body")
            if request.transport is not None:
                request.transport.close()
    except Exception as exc:
        # The request failed after the answer began (a chunked upload past max_body): no
        # second response may follow the first; cut the connection instead.
        if not response.prepared:
            raise
        if not isinstance(exc, RequestError):
            log.warning("%s: response cut off: %r", runtime.name, exc)
        if request.transport is not None:
            request.transport.close()
    finally:
        runtime.m_bytes_out.inc(sent + upstream.sent)
        if counting is not None:
            counting.close()
    return response


class _WithFirstBytes(web.StreamResponse):
    """A response whose head waits for its first body bytes, to leave in the same write."""

    _send_headers_immediately = False


async def _farewell(
    response: web.StreamResponse, farewell: bytes | None, events: EventParser | None
) -> int:
    """Send the engine's last event on a stream warmgate ends; the bytes written."""
    if farewell is None:
        return 0
    if events is not None and not events.between_events:
        farewell = b"\n\n" + farewell  # end the event cut short first: the farewell is its own
    await response.write(farewell)
    return len(farewell)


async def _body(
    request: web.Request,
    runtime: Runtime,
    upstream: Exchange,
    response: web.StreamResponse,
    stream: bool,
    counts: bool,
    watch: JobWatch | None = None,
    first_bytes: Callable[[], None] | None = None,
    events: EventParser | None = None,
) -> int:
    """Stream the body; returns the bytes written here (``upstream.sent`` counts the rest)."""
    writer = request.writer
    send_headers = getattr(writer, "send_headers", None)
    transport = request.transport
    if not stream and send_headers is not None and transport is not None:
        # A plain body goes straight from the upstream socket's callback to the client's
        # transport: no await per chunk, only when the client is slower than the upstream.
        first = upstream.take()
        if first_bytes is not None:  # the body begins (here, or as the pipe's first chunk)
            first_bytes()
        if first:
            await response.write(first)  # with the head (see _WithFirstBytes)
        send_headers()
        await upstream.pipe(transport, response.chunked, writer.drain)
        return len(first)
    sent = 0
    while chunk := await upstream.read():
        if first_bytes is not None and not sent:
            first_bytes()
        await response.write(chunk)
        sent += len(chunk)
        if counts:
            runtime.activity.last_frame = runtime.loop.time()
        elif watch is not None:
            watch.feed(chunk)
        elif events is not None:
            events.feed(chunk)
    return sent
