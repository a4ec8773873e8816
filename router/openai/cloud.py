"""A request placed in the cloud: reserve its estimated cost, call the cloud backend (retrying
what is worth retrying), answer verbatim (event streams event by event, as they come), and
settle the reservation from the usage the cloud reports.

A failure before anything was answered raises :class:`CloudUnavailable`, so the caller may fall
back to a local target; a failure mid-stream ends the stream with an error event.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from backends.cloud_api import Cloud, CloudError
from router.config import Placement
from router.openai.budget import Budget, Reservation
from router.openai.call import Call
from router.openai.costs import actual
from router.openai.errors import BudgetExhausted, CloudRejected, NotPlaced

log = logging.getLogger("warmgate.api")

RETRY_DELAY = 0.25
"""Seconds before warmgate's first retry of a failed cloud call; doubles per retry."""


class CloudUnavailable(Exception):
    """The cloud failed before a byte was answered; the request may still go elsewhere."""

    def __init__(self, error: CloudError) -> None:
        super().__init__(error.message)
        self.error = error


class EventStream:
    """Splits a server-sent-event byte stream into whole events as they arrive; notes the
    usage a chunk reports, and drops the usage-only chunk when the client did not ask for it."""

    def __init__(self, keep_usage_chunk: bool) -> None:
        self.keep_usage_chunk = keep_usage_chunk
        self.usage: Mapping[str, Any] | None = None
        self._buffer = b""

    def feed(self, chunk: bytes) -> bytes:
        """The complete events received so far, to pass on (possibly nothing yet)."""
        data = self._buffer + chunk
        end = max(data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n"))
        if end < 0:
            self._buffer = data
            return b""
        cut = end + (4 if data[end : end + 4] == b"\r\n\r\n" else 2)
        complete, self._buffer = data[:cut], data[cut:]
        if b'"usage"' not in complete:
            return complete
        events = complete.replace(b"\r\n", b"\n").split(b"\n\n")
        kept = [event for event in events if event and self._keep(event)]
        return b"".join(event + b"\n\n" for event in kept)

    def flush(self) -> bytes:
        rest, self._buffer = self._buffer, b""
        return rest

    def _keep(self, event: bytes) -> bool:
        lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
        try:
            payload = json.loads(b"\n".join(lines)) if lines else None
        except ValueError:
            return True
        if not isinstance(payload, dict) or not isinstance(payload.get("usage"), dict):
            return True
        self.usage = payload["usage"]
        return self.keep_usage_chunk or payload.get("choices") != []


def _json(body: bytes) -> Mapping[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class CloudCaller:
    def __init__(
        self,
        clouds: Mapping[str, Cloud],
        retries: Mapping[str, int],
        budget: Budget,
    ) -> None:
        self.clouds = clouds
        self.retries = retries
        self.budget = budget

    async def run(self, call: Call, placement: Placement) -> web.StreamResponse:
        if call.ask.private or call.private_reason is not None:
            # The policy never sends private work out; this is the second lock on that door.
            raise NotPlaced("private work never leaves the building")
        assert placement.cloud is not None and placement.model is not None
        cloud = self.clouds[placement.cloud]
        body: dict[str, Any] = {**call.body, "model": placement.model}
        amount = call.bound.price(placement.cost)
        reservation = self.budget.reserve(amount, placement.cloud, call.model)
        if reservation is None:
            raise BudgetExhausted("the daily cloud budget is spent")
        try:
            return await self._attempts(call, cloud, placement, body, reservation)
        finally:
            # Whatever happened (cancelled, failed), the reservation never outlives the request.
            self.budget.settle(reservation, reservation.amount)

    async def _attempts(
        self,
        call: Call,
        cloud: Cloud,
        placement: Placement,
        body: dict[str, Any],
        reservation: Reservation,
    ) -> web.StreamResponse:
        attempts = 1 + self.retries.get(cloud.name, 0)
        for attempt in range(attempts):
            try:
                if call.stream:
                    return await self._stream(call, cloud, placement, body, reservation)
                return await self._once(call, cloud, placement, body, reservation)
            except CloudError as error:
                log.warning(
                    "%s: %s (attempt %d of %d)", call.request_id, error, attempt + 1, attempts
                )
                if not error.retryable:
                    self.budget.release(reservation)
                    if error.kind == "status" and error.status is not None and error.status < 500:
                        raise CloudRejected(error.status, error.error, error.message) from None
                    raise CloudUnavailable(error) from None
                if attempt + 1 == attempts:
                    self.budget.release(reservation)
                    raise CloudUnavailable(error) from None
                await asyncio.sleep(RETRY_DELAY * 2**attempt)
        raise AssertionError("unreachable")

    async def _once(
        self,
        call: Call,
        cloud: Cloud,
        placement: Placement,
        body: dict[str, Any],
        reservation: Reservation,
    ) -> web.StreamResponse:
        reply = await cloud.create(call.kind, body)  # type: ignore[arg-type]
        if reply.body:
            call.first_bytes("cloud", asyncio.get_running_loop().time())
        answer = _json(reply.body)
        data = answer.get("data")
        images = len(data) if isinstance(data, list) else 0
        usage = answer.get("usage")
        spent = actual(
            call.kind, usage if isinstance(usage, dict) else None, images, placement.cost
        )
        self.budget.settle(reservation, reservation.amount if spent is None else spent)
        return web.Response(
            status=reply.status,
            body=reply.body,
            content_type=reply.content_type.split(";")[0].strip(),
        )

    async def _stream(
        self,
        call: Call,
        cloud: Cloud,
        placement: Placement,
        body: dict[str, Any],
        reservation: Reservation,
    ) -> web.StreamResponse:
        options = body.get("stream_options")
        options = dict(options) if isinstance(options, dict) else {}
        events = EventStream(keep_usage_chunk=options.get("include_usage") is True)
        body["stream_options"] = {**options, "include_usage": True}
        request = call.request
        async with cloud.stream("chat", body) as chunks:
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            response.enable_chunked_encoding()
            await response.prepare(request)
            try:
                async for chunk in chunks:
                    out = events.feed(chunk)
                    if out:
                        call.first_bytes("cloud", asyncio.get_running_loop().time())
                        await response.write(out)
                if rest := events.flush():
                    await response.write(rest)
            except CloudError as error:
                # The status line is gone: end the stream with an error event the SDKs raise.
                log.warning("%s: %s (mid-stream)", call.request_id, error)
                payload = {
                    "error": {
                        "message": error.message,
                        "type": "server_error",
                        "param": None,
                        "code": "cloud_error",
                    }
                }
                await response.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            await response.write_eof()
        spent = actual("chat", events.usage, 0, placement.cost)
        self.budget.settle(reservation, reservation.amount if spent is None else spent)
        return response
