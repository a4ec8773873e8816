"""What forwarding needs of a target: its name and limits, its activity, the metrics it bumps,
the blocks that count its requests and streams, its engine's word on streams, and the loop's
clock. router.scale.targets.TargetRuntime is one (structurally: router.http imports nothing of
router.scale, nor router.scale of router.http); tests may pass any other."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Protocol, Self

StreamCloser = Callable[[str], Awaitable[None]]
"""Closes a long-lived stream, told why warmgate ends it (scale's word: a release, its
shutdown); the close code that says so is :func:`router.http.websocket.close_for`'s."""


class Count(Protocol):
    """A metric's child that counts up (a Prometheus counter or gauge)."""

    def inc(self, amount: float = 1) -> None: ...


class Labelled(Protocol):
    """A metric with labels (a Prometheus counter)."""

    def labels(self, *values: Any) -> Count: ...


class Metrics(Protocol):
    @property
    def upstream_errors(self) -> Labelled:
        """Labelled (target, kind): ``connect``, ``connect_timeout``, ``timeout``, ``reset``."""
        ...


class Timeouts(Protocol):
    @property
    def connect(self) -> float: ...

    @property
    def response_headers(self) -> float: ...

    @property
    def upstream_idle(self) -> float: ...


class Limits(Protocol):
    @property
    def max_body(self) -> int: ...

    @property
    def max_ws_message(self) -> int: ...


class Spec(Protocol):
    @property
    def timeouts(self) -> Timeouts: ...

    @property
    def limits(self) -> Limits: ...


class Activity(Protocol):
    """A target's activity, as forwarding moves it outside its counting blocks."""

    last_frame: float
    """Loop time a stream last carried a frame that counts."""


class Flight(Protocol):
    """One request counted in flight (router.scale.activity.InFlight): begun when made, ended
    on leaving its ``with`` block."""

    def __enter__(self) -> Self: ...

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def paused(self) -> AbstractContextManager[None]:
        """Out of flight while the block runs (a stream that counts by its frames or jobs);
        in again at its end, and the request's own end then moves no idle clock."""
        ...


class Flights(Protocol):
    """One request in flight per job a stream carries (router.scale.activity.Flights)."""

    def __enter__(self) -> Self: ...

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def runs(self, count: int) -> None:
        """``count`` jobs run now."""
        ...


class Engine(Protocol):
    def stream_activity(self, path: str) -> str:
        """``open``, ``frames`` or ``none``: how a stream at this upstream path counts."""
        ...


class Runtime(Protocol):
    """One target, as forwarding sees it."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> Spec: ...

    @property
    def activity(self) -> Activity: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def stopped_by_warmgate(self) -> bool:
        """warmgate itself is stopping the target (or has): what its upstream breaks now, it
        broke, and no error of the engine's is counted for it."""
        ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def m_bytes_in(self) -> Count: ...

    @property
    def m_bytes_out(self) -> Count: ...

    def in_flight(self, *, counts: bool = True) -> Flight:
        """This request counted in flight until its ``with`` block ends."""
        ...

    def flights(self) -> Flights:
        """One request in flight per job a stream carries, until its ``with`` block ends."""
        ...

    def stream(
        self, close: StreamCloser, *, websocket: bool = False
    ) -> AbstractContextManager[None]:
        """A long-lived stream open while the block runs: closed with ``close`` at a release
        or warmgate's shutdown; a ``websocket`` counted on ``warmgate_websockets_open``."""
        ...
