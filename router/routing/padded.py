"""A held answer kept alive: what a client with a short read timeout gets through a cold start.

``gradio_client`` reads ``/config``, ``{api}/info`` and ``queue/join`` with httpx's default
timeout, 5 s between two reads; every cold start is longer (Gradio's launch check alone is
3.5 s, Wan2GP takes 20-40 s), so a held request failed with ``ReadTimeout``. Where the engine
answers a request with JSON (:func:`backends.base.json_answer`), a hold that lasts past
:data:`PAD_AFTER` is answered ``200`` at once, chunked, and its body led by a space every
:data:`PAD_EVERY` (whitespace before a JSON value is part of JSON), until the engine's own body
follows it at ready. The whole cold start fits in a read timeout of a second or more.

What it costs: the status is told before the engine's. A start that fails or a hold that times
out writes its error (``{"error": {"code", "message", "target"}}``) after the whitespace and
cuts the connection; an engine that then answers anything but a plain ``200`` is cut too: the
client sees a body that never ended (an error, never a wrong answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Final

from aiohttp import web

from router.errors import RequestError, UpstreamError
from router.http.failures import translate
from router.http.h1.pool import UpstreamFailure
from router.http.h1.response import Response
from router.http.replies import STARTED, error_payload
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.proxy")

PAD_AFTER: Final = 1.0
"""Seconds a hold may last before its answer begins: a ready or parked target answers sooner
with its own status (a wake from parked takes about a second)."""
PAD_EVERY: Final = 1.0
"""Seconds between two spaces: far under httpx's 5 s, and 7 bytes a second on the wire."""
PAD: Final = b" "


def may_pad(request: web.BaseRequest) -> bool:
    """A client whose answer may begin before the engine's: a generic HTTP client (no
    ``Sec-Fetch-Mode``: not a browser, which waits as long as it takes) that accepts any type
    (no ``Accept``, or ``*/*``, as httpx and requests send, and gradio_client through httpx). A
    client that names what it accepts (``application/json``) is answered with the hold's own
    status, a failure as a 503 with its reason."""
    if "Sec-Fetch-Mode" in request.headers:
        return False
    accept = request.headers.get("Accept", "*/*").replace(" ", "")
    return accept in ("", "*/*")


class PaddedHold:
    """One held request whose answer may begin before its target is ready. Made before the
    hold begins; :meth:`stop` once it ended (in flight already: an await here is a moment the
    lifecycle must not see as idle); then :meth:`finish` where the answer began, else the
    request goes on as any other."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None
        """The answer, once it began."""
        self._task = asyncio.get_running_loop().create_task(self._pad(), name="padded-hold")

    async def _pad(self) -> None:
        await asyncio.sleep(PAD_AFTER)
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "application/json", "Cache-Control": "no-store"}
        )
        response.enable_chunked_encoding()
        # Marked before its head goes out: from here no other reply may follow, only a cut.
        self.request[STARTED] = self.response = response
        with contextlib.suppress(ConnectionResetError, RuntimeError):  # the client went away
            await response.prepare(self.request)
            while True:
                await response.write(PAD)
                await asyncio.sleep(PAD_EVERY)

    async def stop(self) -> None:
        """No more padding: the hold ended, one way or the other."""
        self._task.cancel()
        await asyncio.wait((self._task,))  # its end, without taking this request's cancel

    def cancel(self) -> None:
        """No more padding, from a request that ends otherwise (never a task left behind)."""
        self._task.cancel()

    async def fail(self, error: RequestError) -> None:
        """The hold failed after the answer began: the error as JSON after the whitespace, for
        whoever reads the body; its end never comes (the caller cuts the connection)."""
        if self.response is None or not self.response.prepared:
            return
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await self.response.write(json.dumps(error_payload(error)).encode())

    @property
    def began(self) -> bool:
        return self.response is not None

    async def finish(self, runtime: TargetRuntime, upstream: Response) -> web.StreamResponse:
        """The engine's answer, after the padding: its body as it comes (the caller closes
        ``upstream``). One that cannot follow a ``200`` of JSON is cut."""
        response = self.response
        assert response is not None, "finish() on a hold whose answer did not begin"
        encoding = upstream.headers.get("Content-Encoding", "identity").lower()
        if upstream.status != 200 or encoding != "identity":
            log.warning(
                "%s: the engine answered %d (%s) after the held answer began with 200: cut",
                runtime.name,
                upstream.status,
                encoding,
            )
            raise UpstreamError(
                f"the engine answered {upstream.status} after warmgate began the answer",
                target=runtime.name,
            )
        if not response.prepared:  # cancelled while its head went out
            await response.prepare(self.request)
        sent = 0
        try:
            while chunk := await upstream.read():
                await response.write(chunk)
                sent += len(chunk)
            await response.write_eof()
        except UpstreamFailure as exc:
            raise translate(exc, runtime, "body") from exc
        except ConnectionResetError:
            pass  # the client went away while it waited; the caller closes the exchange
        finally:
            runtime.m_bytes_out.inc(sent)
        return response
