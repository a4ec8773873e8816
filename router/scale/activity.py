"""Activity of one target: what keeps its GPU from being released, and the blocks that count it.

Counted on the request hot path, so plain attributes and no locks (one event loop). The
lifecycle reads it through :meth:`Activity.idle_since`. Its counts (requests in flight and
held, websockets held, open streams) and their gauges move only in the blocks below, each
count up paired with its count down by a ``with``: :class:`InFlight`, :func:`holding`,
:func:`holding_socket`, :func:`stream` and :class:`Flights` (tests/test_house_rules.py fails on a
count moved anywhere else).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from enum import StrEnum
from types import TracebackType
from typing import Protocol, Self

StreamCloser = Callable[[str], Awaitable[None]]
"""Closes a long-lived stream, told why warmgate ends it (a :class:`StreamEnd`); the close
code that says so on the wire is http's (:func:`router.http.websocket.close_for`)."""


class StreamEnd(StrEnum):
    """Why warmgate ends the long-lived streams of a target: scale's word, and the reason a
    websocket's close frame carries."""

    RELEASED = "idle: the GPU is released"
    SHUTDOWN = "warmgate is shutting down"


class Level(Protocol):
    """A gauge's child: what a count shows on ``/metrics``."""

    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


class Activity:
    __slots__ = (
        "busy_until",
        "held",
        "held_sockets",
        "in_flight",
        "last_frame",
        "last_request",
        "last_wanted",
        "on_resume",
        "streams",
        "wanted_until",
    )

    def __init__(self, now: float) -> None:
        self.in_flight = 0
        """Requests being forwarded (not held, not long-lived streams): :class:`InFlight`."""
        self.held = 0
        """Requests waiting for the target to become ready, or for a free upstream connection;
        they want it, but are not activity: :func:`holding`."""
        self.held_sockets = 0
        """Websockets held open while the target is not ready (``waiting.hold_websockets``):
        they count in ``max_held`` with ``held``, but never wake the target and are no
        activity: :func:`holding_socket`."""
        self.last_request = now
        """Loop time a request last started or finished."""
        self.last_frame = float("-inf")
        """Loop time any websocket or SSE stream last carried a frame that counts."""
        self.busy_until = float("-inf")
        """The engine reported itself busy until at least this loop time."""
        self.wanted_until = float("-inf")
        """Someone asked for the target to start without holding a request (a browser on the
        waiting page, a request sent to the cloud with ``warm_on_cloud``) until this loop time."""
        self.last_wanted = float("-inf")
        """Loop time someone last waited for the target: a held request let go (ready, timed
        out, or its client gone), a start asked for, the waiting page polling. A start nobody
        waited for since ``abandon_after`` is given up."""
        self.streams: dict[object, StreamCloser] = {}
        """Open long-lived streams, each with its ``close(why)``: :func:`stream`."""
        self.on_resume: Callable[[float], None] | None = None
        """Called with the loop time when a request begins with none in flight (before it is
        counted): where a gap between bursts ends (``idle_after: auto``)."""

    def idle_since(self, stream_window: float) -> float | None:
        """Loop time since which the target has been idle, or ``None`` while it is active."""
        if self.in_flight > 0:
            return None
        return max(self.last_request, self.last_frame + stream_window, self.busy_until)

    async def close_streams(self, why: StreamEnd) -> None:
        """Close every long-lived stream open now (a release, warmgate's shutdown); each leaves
        :attr:`streams` as its block ends."""
        for close in list(self.streams.values()):
            with contextlib.suppress(Exception):
                await close(why)


class InFlight:
    """One request in flight: begun when made, ended once, on leaving its ``with`` (or
    ``async with``) block.

    Counting is the call itself (no await before it), so a held request let go is never, even
    for one turn of the loop, neither held nor in flight: the lifecycle cannot release under
    it. The activity and the ``warmgate_in_flight`` gauge move together. ``counts=False``: in
    flight (no release meanwhile) but no use of the GPU, so neither its begin nor its end moves
    the idle clock (a tab's socket while its upstream connects)."""

    __slots__ = ("_activity", "_clock", "_counts", "_gauge", "_open", "_quiet")

    def __init__(
        self,
        activity: Activity,
        gauge: Level,
        clock: Callable[[], float],
        *,
        counts: bool = True,
    ) -> None:
        self._activity, self._gauge, self._clock, self._counts = activity, gauge, clock, counts
        self._quiet = False
        """Its end moves no idle clock: it came back from :meth:`paused`."""
        if counts:
            now = clock()
            if activity.in_flight == 0 and activity.on_resume is not None:
                activity.on_resume(now)
            activity.last_request = now
        activity.in_flight += 1
        gauge.inc()
        self._open = True

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Out of flight while the block runs (a stream that counts by its frames or jobs from
        here on; leaving counts as activity); in flight again when it ends, until this request's
        own end, which then leaves the idle clock alone: the end of a stream is no activity
        (its frames or jobs were)."""
        self._end()
        try:
            yield
        finally:
            if not self._open:
                self._open, self._quiet = True, True
                self._activity.in_flight += 1
                self._gauge.inc()

    def _end(self) -> None:
        if self._open:
            self._open = False
            activity = self._activity
            activity.in_flight -= 1
            self._gauge.dec()
            if self._counts and not self._quiet:
                activity.last_request = self._clock()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._end()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._end()


class Flights:
    """One request in flight per piece of work that runs now (the jobs an event stream
    carries, :class:`router.http.sse.JobWatch`): :meth:`runs` says how many; those left end
    with the block."""

    __slots__ = ("_begin", "_running")

    def __init__(self, begin: Callable[[], InFlight]) -> None:
        self._begin = begin
        self._running: list[InFlight] = []

    def runs(self, count: int) -> None:
        """``count`` run now: one begins per piece begun, one ends per piece finished."""
        running = self._running
        while len(running) < count:
            running.append(self._begin())
        while len(running) > max(count, 0):
            with running.pop():  # ended as its block ends
                pass

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.runs(0)


@contextlib.contextmanager
def holding(activity: Activity, gauge: Level) -> Iterator[None]:
    """A request held while the block runs: waiting for the target's readiness, or for a free
    upstream connection (``limits.max_connections``)."""
    activity.held += 1
    gauge.inc()
    try:
        yield
    finally:
        activity.held -= 1
        gauge.dec()


@contextlib.contextmanager
def holding_socket(activity: Activity, gauge: Level) -> Iterator[None]:
    """A tab's websocket held open while the block runs, for a target that is not ready."""
    activity.held_sockets += 1
    gauge.inc()
    try:
        yield
    finally:
        activity.held_sockets -= 1
        gauge.dec()


@contextlib.contextmanager
def stream(activity: Activity, close: StreamCloser, gauge: Level | None = None) -> Iterator[None]:
    """A long-lived stream (an event stream, a websocket bridged to the engine) open while the
    block runs: closed with ``close`` at a release or warmgate's shutdown; shown on ``gauge``
    (websockets: ``warmgate_websockets_open``)."""
    key = object()
    activity.streams[key] = close
    if gauge is not None:
        gauge.inc()
    try:
        yield
    finally:
        del activity.streams[key]
        if gauge is not None:
            gauge.dec()
