"""Activity of one target: what keeps its GPU from being released.

Counted on the request hot path, so plain attributes and no locks (one event loop). The
lifecycle reads it through :meth:`Activity.idle_since`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable


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
        "quiet_ends",
        "streams",
        "wanted_until",
    )

    def __init__(self, now: float) -> None:
        self.in_flight = 0
        """Requests being forwarded (not held, not long-lived streams)."""
        self.held = 0
        """Requests waiting for the target to become ready; they want it, but are not activity."""
        self.held_sockets = 0
        """Websockets held open while the target is not ready (``waiting.hold_websockets``):
        they count in ``max_held`` with ``held``, but never wake the target and are no
        activity."""
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
        self.streams: dict[object, Callable[[int, str], Awaitable[None]]] = {}
        """Open long-lived streams: key -> ``close(code, reason)``; closed at release."""
        self.on_resume: Callable[[float], None] | None = None
        """Called with the loop time when a request begins with none in flight (before it is
        counted): where a gap between bursts ends (``idle_after: auto``)."""
        self.quiet_ends = 0
        """Ends still to come that are no activity (see :meth:`rejoin`)."""

    def begin(self, now: float, *, counts: bool = True) -> None:
        """A request in flight. ``counts=False``: in flight (no release meanwhile) but no use of
        the GPU: neither it nor its :meth:`end` moves the idle clock (a tab's websocket while
        its upstream connects, where the engine counts its sockets by their frames)."""
        if not counts:
            self.in_flight += 1
            return
        if self.in_flight == 0 and self.on_resume is not None:
            self.on_resume(now)
        self.in_flight += 1
        self.last_request = now

    def end(self, now: float, *, counts: bool = True) -> None:
        self.in_flight -= 1
        if not counts:
            return
        if self.quiet_ends > 0:
            self.quiet_ends -= 1
        else:
            self.last_request = now

    def rejoin(self) -> None:
        """Count again a request that stopped counting while its answer, a long-lived stream,
        counted by its frames or jobs: the :meth:`end` that follows at once balances it and
        leaves the idle clock alone, since the end of a stream is no activity."""
        self.in_flight += 1
        self.quiet_ends += 1

    def idle_since(self, stream_window: float) -> float | None:
        """Loop time since which the target has been idle, or ``None`` while it is active."""
        if self.in_flight > 0:
            return None
        return max(self.last_request, self.last_frame + stream_window, self.busy_until)
