"""HTTP/1.1 responses framed sans-IO: bytes in, events out (as h11's ``Connection`` does; no
socket, no asyncio here, so a fuzzer drives it with nothing but bytes).

One :class:`ResponseFramer` per response. :meth:`~ResponseFramer.feed` takes what the
connection read and returns events: :class:`Informational` heads (1xx but 101), then one
:class:`Head`, the body as :class:`Data`, and :class:`End`. A body is never copied: ``Data``
is a view of the bytes fed (chunked bodies too), valid until those bytes are overwritten.

Where h11 is strict this is as strict (differential fuzzing holds it to that), and stricter in a
few places on purpose: see router.http.h1.head. Besides, a head (each 1xx head on its own) is
bounded at :data:`MAX_HEAD` bytes however it is split, the trailers together too, and bytes
after the end of a response (warmgate never pipelines) mean the connection cannot be reused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from multidict import CIMultiDict, CIMultiDictProxy

from router.http.h1.head import Fields, FramingError, check_fields, parse_field, parse_head

__all__ = [
    "MAX_HEAD",
    "Data",
    "End",
    "Event",
    "Framing",
    "FramingError",
    "Head",
    "Informational",
    "ResponseFramer",
]

MAX_HEAD: Final = 64 * 1024
"""Bytes a response head may have, its blank line included; also the bound of a chunk-size
line and of the trailers."""

Framing = Literal["none", "length", "chunked", "close"]
"""How a body ends: there is none, after Content-Length bytes, at its last chunk, with the
connection."""

_HTTP: Final = b"HTTP/1."
_CRLF: Final = b"\r\n"
_BLANK: Final = b"\r\n\r\n"
_CHUNK_SIZE_LINE: Final = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;[^\r\n]*)?[ \t]*")
"""``1*HEXDIG [ ";" extensions ] OWS``: extensions are ignored (as h11, at most 20 digits)."""

_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE, _FAILED = range(9)


@dataclass(slots=True)
class Informational:
    """A 1xx head (100 Continue, 103 Early Hints): the final head follows."""

    status: int
    reason: str
    headers: Fields


@dataclass(slots=True)
class Head:
    """The final response head."""

    status: int
    reason: str
    headers: Fields
    keep_alive: bool
    """The response lets the connection carry another exchange (HTTP/1.1, no
    ``Connection: close``, a body that does not end with the connection, not 101)."""
    length: int | None
    """Content-Length when sent and not chunked (for HEAD, 204, 304: what was said, no body)."""
    framing: Framing


@dataclass(slots=True)
class Data:
    """Body bytes: a view of the bytes fed, no copy (copy it to keep it past the next read)."""

    data: memoryview


@dataclass(frozen=True, slots=True)
class End:
    """The response is complete."""

    trailers: Fields | None = None
    """The trailer fields of a chunked body, if it had any (warmgate forwards none)."""


Event = Informational | Head | Data | End

_END: Final = End()


class ResponseFramer:
    """Frames one response; ``head_request``: it answers HEAD (no body, whatever it says).

    :meth:`feed` and :meth:`feed_eof` raise :class:`FramingError` on anything that is not a
    valid response, and again on every call after."""

    __slots__ = (
        "_pending",
        "_remaining",
        "_state",
        "_trailer_bytes",
        "_trailers",
        "head_request",
        "must_close",
        "started",
        "stray",
    )

    def __init__(self, head_request: bool = False) -> None:
        self.head_request = head_request
        self.started = False
        """Some bytes of a response arrived."""
        self.stray = False
        """The first bytes fed were not the start of a response: on a reused connection, what
        an upstream sent after its last response (it miscounted its body, or answered HEAD
        with one), not an answer to the request just sent (known with the first bytes)."""
        self.must_close = False
        """The connection cannot carry another exchange: the response said so (known with its
        :class:`Head`), or bytes came after its end (known when they come)."""
        self._state = _HEAD
        self._remaining = 0
        """Body bytes left of a Content-Length body or of the current chunk."""
        self._pending: bytearray | None = None
        """The start of a head or a line that came in pieces."""
        self._trailers: CIMultiDict[str] | None = None
        self._trailer_bytes = 0

    @property
    def done(self) -> bool:
        """:class:`End` was returned."""
        return self._state == _DONE

    def feed(self, data: bytes | bytearray, start: int = 0, stop: int | None = None) -> list[Event]:
        """``data[start:stop]`` arrived (``feed(b"")`` is no end: see :meth:`feed_eof`).
        ``Data`` events are views of ``data``: valid while ``data`` is not written again."""
        if stop is None:
            stop = len(data)
        events: list[Event] = []
        if start >= stop:
            return events
        if not self.started:
            self.started = True
            self.stray = not _HTTP.startswith(data[start : min(stop, start + len(_HTTP))])
        view: memoryview | None = None
        while start < stop:
            state = self._state
            if state in (_LENGTH, _CHUNK):
                remaining = self._remaining
                end = stop if stop - start <= remaining else start + remaining
                if view is None:
                    view = memoryview(data)
                events.append(Data(view[start:end]))
                remaining -= end - start
                self._remaining = remaining
                start = end
                if not remaining:
                    if state == _CHUNK:
                        self._state = _CHUNK_END
                    else:
                        self._state = _DONE
                        events.append(_END)
            elif state == _UNTIL_CLOSE:
                if view is None:
                    view = memoryview(data)
                events.append(Data(view[start:stop]))
                break
            elif state == _DONE:
                self.must_close = True  # never pipelined: whatever this is, it is not ours
                break
            elif state == _FAILED:
                raise FramingError("the response was invalid already")
            else:
                try:
                    start = self._framing(state, data, start, stop, events)
                except FramingError:
                    self._state = _FAILED
                    self._pending = None
                    raise
        return events

    def feed_eof(self) -> list[Event]:
        """The connection ended: the end of a close-delimited body, or an error."""
        state = self._state
        if state == _DONE:
            return []
        if state == _UNTIL_CLOSE:
            self._state = _DONE
            return [_END]
        if state == _FAILED:
            raise FramingError("the response was invalid already")
        self._state = _FAILED
        if state == _HEAD:
            raise FramingError(
                "closed before the response head ended"
                if self.started
                else "closed before any response"
            )
        raise FramingError("closed before the end of the body")

    # -- heads and lines ------------------------------------------------------------------

    def _framing(
        self, state: int, data: bytes | bytearray, start: int, stop: int, events: list[Event]
    ) -> int:
        """One step in a line-oriented state; returns where the rest of ``data`` starts."""
        if state == _CHUNK_END:
            return self._chunk_end(data, start, stop)
        if state == _HEAD:
            block, start = self._unit(data, start, stop, _BLANK, MAX_HEAD)
            if block is not None:
                self._head(block, events)
                return start
            begun = bytes((self._pending or b"")[:16])
            if not _HTTP.startswith(begun[:7]):  # no need to wait for the rest of it
                raise FramingError(f"not an HTTP/1.x response: {begun!r}")
            return start
        if state == _CHUNK_SIZE:
            line, start = self._unit(data, start, stop, _CRLF, MAX_HEAD)
            if line is not None:
                self._chunk_size(line)
            return start
        line, start = self._unit(data, start, stop, _CRLF, MAX_HEAD - self._trailer_bytes)
        if line is not None:
            self._trailer(line, events)
        return start

    def _unit(
        self, data: bytes | bytearray, start: int, stop: int, term: bytes, limit: int
    ) -> tuple[bytes | bytearray | None, int]:
        """The bytes before ``term`` (a head or a line), joined with the pieces that came
        before, and where the rest starts; None when it has not ended yet (then kept).
        At most ``limit`` bytes with ``term``, however it is split."""
        pending = self._pending
        if pending is None:
            found = data.find(term, start, stop)
            if found < 0:
                if stop - start >= limit:
                    raise FramingError(f"a head or line over {limit} bytes")
                self._pending = bytearray(data[start:stop])
                return None, stop
            end = found + len(term)
            if end - start > limit:
                raise FramingError(f"a head or line over {limit} bytes")
            return data[start:found], end
        # The end may straddle the pieces: look where they meet first.
        width = len(term) - 1
        kept = min(width, len(pending))
        joined = bytes(pending[len(pending) - kept :]) + data[start : start + width]
        found = joined.find(term)
        if found >= 0:
            end = start + found + len(term) - kept
        else:
            found = data.find(term, start, stop)
            end = found + len(term) if found >= 0 else -1
        if end < 0:
            if len(pending) + stop - start >= limit:
                raise FramingError(f"a head or line over {limit} bytes")
            pending += data[start:stop]
            return None, stop
        if len(pending) + end - start > limit:
            raise FramingError(f"a head or line over {limit} bytes")
        pending += data[start:end]
        self._pending = None
        del pending[-len(term) :]
        return pending, end

    def _head(self, block: bytes | bytearray, events: list[Event]) -> None:
        head = parse_head(block)
        status = head.status
        if status < 200 and status != 101:
            events.append(Informational(status, head.reason, head.headers))
            return  # the final head follows
        keep_alive = not head.close and status != 101
        if self.head_request or status in (204, 304) or status < 200:
            framing: Framing = "none"
        elif head.chunked:
            framing = "chunked"
        elif head.length is not None:
            framing = "length"
        else:
            framing = "close"
            keep_alive = False
        self.must_close = not keep_alive
        events.append(Head(status, head.reason, head.headers, keep_alive, head.length, framing))
        if framing == "length" and head.length:
            self._state = _LENGTH
            self._remaining = head.length
        elif framing == "chunked":
            self._state = _CHUNK_SIZE
        elif framing == "close":
            self._state = _UNTIL_CLOSE
        else:
            self._state = _DONE
            events.append(_END)

    def _chunk_size(self, line: bytes | bytearray) -> None:
        found = _CHUNK_SIZE_LINE.fullmatch(line)
        if found is None:
            raise FramingError(f"invalid chunk size line {bytes(line[:80])!r}")
        self._remaining = int(found[1], 16)
        self._state = _CHUNK if self._remaining else _TRAILERS

    def _chunk_end(self, data: bytes | bytearray, start: int, stop: int) -> int:
        """The CRLF after a chunk's data (``_remaining`` 1: its CR came already)."""
        left = _CRLF[1:] if self._remaining else _CRLF
        got = data[start : start + len(left)]
        if not left.startswith(got):
            raise FramingError(f"chunk data not followed by CRLF: {bytes(got)!r}")
        if len(got) < len(left):
            self._remaining = 1
        else:
            self._remaining = 0
            self._state = _CHUNK_SIZE
        return start + len(got)

    def _trailer(self, line: bytes | bytearray, events: list[Event]) -> None:
        self._trailer_bytes += len(line) + 2
        trailers = self._trailers
        if line:
            if trailers is None:
                trailers = self._trailers = CIMultiDict()
            parse_field(line, trailers)
            return
        self._state = _DONE
        if trailers is None:
            events.append(_END)
            return
        check_fields(trailers)
        events.append(End(CIMultiDictProxy(trailers)))
