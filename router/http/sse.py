"""Watching the jobs an event stream carries (a stream the engine calls ``jobs``: Gradio's
``queue/data``): busy while a job it carries is unfinished, not for the stream's whole life.

Gradio's page may keep a ``queue/data`` stream open with nothing behind it but
``{"msg": "heartbeat", "event_id": null}`` every 15 s; counted for its life, such a stream kept a
GPU up for good. Here a job runs from the first message naming its event id (``estimation``
while it waits in Gradio's queue, ``process_starts`` ...) until its ``process_completed``;
``close_stream`` (and the stream's end) ends them all; heartbeats are nothing.

Sans-IO: :class:`EventParser` (bytes in, however split, each event's data out) and
:class:`Jobs` (messages in, jobs started and finished out) decide; :class:`JobWatch` only
counts what they say in the target's activity, in a block the stream's end ends. The proxy
feeds it a copy of each piece of a ``jobs`` stream; every other stream is piped untouched."""

from __future__ import annotations

import json
import re
from typing import Final

from router.http.runtime import Runtime

MAX_EVENT: Final = 64 * 1024
"""Bytes of one event's data kept; past it the rest is dropped (Gradio's ``msg`` and
``event_id`` come first, and are read from what is kept)."""

_MSG = re.compile(r'"msg"\s*:\s*"([A-Za-z_]+)"')
_EVENT_ID = re.compile(r'"event_id"\s*:\s*"([^"\\]*)"')


class EventParser:
    """Server-sent events, sans-IO: :meth:`feed` bytes as they come (split anywhere, lines
    ended by CRLF, LF or CR); it returns the data of each event completed, and whether it was
    cut at :data:`MAX_EVENT`."""

    def __init__(self, max_event: int = MAX_EVENT) -> None:
        self.max_event = max_event
        self._line = bytearray()
        self._data: list[bytes] = []
        self._size = 0
        self._cut = False
        self._after_cr = False

    def feed(self, data: bytes) -> list[tuple[str, bool]]:
        events: list[tuple[str, bool]] = []
        start = 0
        if self._after_cr and data[:1] == b"\n":
            start = 1  # the LF of a CRLF split between two pieces
        self._after_cr = False
        end = len(data)
        while start < end:
            cr = data.find(b"\r", start)
            lf = data.find(b"\n", start)
            stop = min(i for i in (cr, lf, end) if i >= 0)
            self._keep(data[start:stop])
            if stop == end:
                break
            if data[stop] == 13:  # CR, perhaps followed by LF
                if stop + 1 == end:
                    self._after_cr = True
                elif data[stop + 1] == 10:
                    stop += 1
            self._end_line(events)
            start = stop + 1
        return events

    @property
    def between_events(self) -> bool:
        """The bytes fed so far end an event (or hold none): what follows is a new event."""
        return not (self._line or self._data)

    def _keep(self, piece: bytes) -> None:
        room = self.max_event + 8 - len(self._line)  # the line's field name fits in 8 more
        if len(piece) > room:
            piece = piece[: max(room, 0)]
            self._cut = True
        self._line += piece

    def _end_line(self, events: list[tuple[str, bool]]) -> None:
        line = bytes(self._line)
        self._line.clear()
        if not line:
            if self._data:
                text = b"\n".join(self._data).decode("utf-8", "replace")
                events.append((text, self._cut))
            self._data, self._size, self._cut = [], 0, False
            return
        field, colon, value = line.partition(b":")
        if field != b"data":
            return  # event, id, retry, comments: a job's messages say it all in their data
        if colon and value.startswith(b" "):
            value = value[1:]
        room = self.max_event - self._size
        if len(value) > room:
            value, self._cut = value[: max(room, 0)], True
        self._data.append(value)
        self._size += len(value) + 1


def job_message(data: str, cut: bool) -> tuple[str, str | None] | None:
    """``(msg, event_id)`` of one Gradio queue message, or ``None`` for data that is not one."""
    try:
        message = json.loads(data)
    except ValueError:
        if not cut:
            return None
        msg, event_id = _MSG.search(data), _EVENT_ID.search(data)
        return (msg.group(1), event_id.group(1) if event_id else None) if msg else None
    if not isinstance(message, dict) or not isinstance(message.get("msg"), str):
        return None
    event_id = message.get("event_id")
    return message["msg"], event_id if isinstance(event_id, str) else None


class Jobs:
    """The unfinished jobs of one stream, by event id. :meth:`feed` a message; it returns how
    many jobs started and how many finished with it."""

    FINISHED: Final = frozenset({"process_completed"})
    """Messages that end their job."""
    ENDS_ALL: Final = frozenset({"close_stream", "server_stopped"})
    """Messages after which the stream carries no job any more."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.over = False
        """The engine said the stream's last word (``close_stream``, ``server_stopped``, an
        ``unexpected_error`` of no job: Gradio 5.50 answers a session it does not know so,
        then drops the connection without the body's end)."""
        self.closed = False
        """That word was ``close_stream`` itself: the page needs no other."""

    def feed(self, msg: str, event_id: str | None) -> tuple[int, int]:
        if msg in self.ENDS_ALL or (msg == "unexpected_error" and event_id is None):
            self.over = True
            self.closed = self.closed or msg == "close_stream"
            return 0, self.end()
        if event_id is None or msg == "heartbeat":
            return 0, 0
        if msg in self.FINISHED or msg == "unexpected_error":
            if event_id in self.running:
                self.running.discard(event_id)
                return 0, 1
            return 0, 0
        if event_id in self.running:
            return 0, 0
        # estimation (queued), process_starts, or progress of a job begun before this stream
        self.running.add(event_id)
        return 1, 0

    def end(self) -> int:
        """The stream is over: every job it carried is, for it."""
        left = len(self.running)
        self.running.clear()
        return left


class JobWatch:
    """A ``jobs`` stream being forwarded: each job it carries counts in flight while it runs,
    in the ``running`` block, which the stream's end ends (and every job left with it)."""

    def __init__(self, runtime: Runtime) -> None:
        self.parser = EventParser()
        self.jobs = Jobs()
        self.running = runtime.flights()
        """One in flight per job the stream carries and that has not finished."""

    def feed(self, data: bytes) -> None:
        for text, cut in self.parser.feed(data):
            message = job_message(text, cut)
            if message is not None:
                self.jobs.feed(*message)
                self.running.runs(len(self.jobs.running))
