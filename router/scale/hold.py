"""Holding a request while its target cold-starts.

A held request is an object waiting on the target's state broadcast with a deadline; the wait
reports whether it was a cold start and how long it took. It never polls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from router.errors import HoldTimeout, Shedding, ShuttingDown, TargetFailed
from router.scale.state import Phase, StateCell, TargetState


@dataclass(frozen=True, slots=True)
class HoldResult:
    state: TargetState
    waited: float
    """Seconds spent waiting; 0.0 when the target was already ready."""
    cold: bool


SHUTDOWN_RETRY_AFTER = 5.0
"""Retry-After (seconds) for a request that would wait for a cold start during the drain: the
other replicas serve it at once, a restarted warmgate in seconds."""


def shutting_down(target: str) -> ShuttingDown:
    return ShuttingDown(
        f"warmgate is shutting down; target {target!r} is not started now",
        target=target,
        retry_after=SHUTDOWN_RETRY_AFTER,
    )


async def wait_ready(
    cell: StateCell,
    target: str,
    limit: float,
    loop: asyncio.AbstractEventLoop,
    closing: Callable[[], bool] = lambda: False,
) -> HoldResult:
    """Wait until the target is ready. Raises :class:`HoldTimeout` past ``limit`` seconds,
    :class:`TargetFailed` when its cold start fails and :class:`ShuttingDown` once ``closing()``
    (the SIGTERM drain: the cell wakes its waiters then)."""
    started = loop.time()
    before = cell.current

    def settled(state: TargetState) -> bool:
        # A failure that was already there when the wait began belongs to the previous try.
        if state.phase is not Phase.READY and closing():
            return True
        return state.phase is Phase.READY or (state.phase is Phase.FAILED and state is not before)

    try:
        async with asyncio.timeout(limit):
            state = await cell.wait_for(settled)
    except TimeoutError:
        waiting = cell.current.waiting_for  # a full GPU pool (docs/pools.md)
        why = f" ({waiting})" if waiting else ""
        raise HoldTimeout(
            f"target {target!r} did not become ready within {limit:g}s{why}", target=target
        ) from None
    if state.phase is not Phase.READY and closing():
        raise shutting_down(target)
    if state.phase is Phase.FAILED:
        raise TargetFailed(
            _failed(target, state),
            target=target,
            retry_after=max(1.0, state.retry_at - loop.time()),
        )
    return HoldResult(state, loop.time() - started, cold=True)


def release_at(next_free: float, now: float, rate: float | None) -> tuple[float, float]:
    """When one more request held through a start may go on, and from when the one after it
    may: at most ``rate`` per second (``waiting.release_rate``; ``None``: all at once). Pure."""
    if rate is None:
        return now, next_free
    at = max(now, next_free)
    return at, at + 1.0 / rate


def admission_error(
    state: TargetState, held: int, max_held: int, target: str, now: float
) -> Shedding | TargetFailed | None:
    """Why a new request may not even be held right now, or ``None``. Pure."""
    if state.phase is Phase.FAILED and now < state.retry_at:
        return TargetFailed(
            _failed(target, state),
            target=target,
            retry_after=max(1.0, state.retry_at - now),
        )
    if held >= max_held:
        return Shedding(
            f"target {target!r} is starting and {held} requests are already waiting",
            target=target,
            retry_after=5.0,
        )
    return None


def _failed(target: str, state: TargetState) -> str:
    """What a request held for a failed start is told: the engine's own reason, where its
    readiness answer said why, or the exception its process ended with (a backend's other
    failures stay in the log)."""
    why = f": {state.told}" if state.told else ""
    return f"target {target!r} could not be started{why}; it is retried after a backoff"
