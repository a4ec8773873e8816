"""What forwarding needs of a target: its name and limits, its activity, the metrics it bumps,
its engine's word on streams, and the loop's clock. router.scale.targets.TargetRuntime is one
(structurally: router.http imports nothing of router.scale); tests may pass any other."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from router.http.in_flight import InFlight

StreamCloser = Callable[[int, str], Awaitable[None]]
"""Closes a long-lived stream with a (websocket) close code and reason."""


class Count(Protocol):
    """A metric's child that counts up (a Prometheus counter or gauge)."""

    def inc(self, amount: float = 1) -> None: ...


class Level(Count, Protocol):
    """A metric's child that goes up and down (a Prometheus gauge)."""

    def dec(self, amount: float = 1) -> None: ...


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
    """A target's activity: requests in flight, frames carried, long-lived streams open."""

    last_frame: float
    """Loop time a stream last carried a frame that counts."""
    held: int
    """Requests waiting: for the target to be ready, or for a free upstream connection."""

    @property
    def streams(self) -> dict[object, StreamCloser]: ...

    def begin(self, now: float, *, counts: bool = True) -> None: ...

    def end(self, now: float, *, counts: bool = True) -> None: ...

    def rejoin(self) -> None:
        """Count a request in flight again without activity: its coming end is none."""
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

    @property
    def m_in_flight(self) -> Level: ...

    def in_flight(self, *, counts: bool = True) -> InFlight:
        """This request counted in flight until its ``with`` block ends
        (:mod:`router.http.in_flight`)."""
        ...

    @property
    def m_held(self) -> Level: ...

    @property
    def m_ws_open(self) -> Level: ...
