"""router.http.in_flight: a request is counted in flight from the call that makes it, and its
begin and end pair up however the block ends; a stream leaves and rejoins without moving the
idle clock at its end."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Gauge

from router.http.in_flight import InFlight
from router.scale.activity import Activity


class _Runtime:
    """What an :class:`InFlight` counts on: the activity, the gauge and the loop's clock."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.activity = Activity(loop.time())
        self.registry = CollectorRegistry()
        gauge = Gauge("in_flight", "in flight", ["target"], registry=self.registry)
        self.m_in_flight = gauge.labels("t")

    def in_flight(self, *, counts: bool = True) -> InFlight:
        return InFlight(self, counts=counts)  # type: ignore[arg-type]

    @property
    def gauge(self) -> float:
        return self.registry.get_sample_value("in_flight", {"target": "t"}) or 0.0


async def test_counted_at_the_call_and_ended_once_however_the_block_ends() -> None:
    rt = _Runtime(asyncio.get_running_loop())
    request = rt.in_flight()  # counted before anything is awaited
    assert rt.activity.in_flight == 1 and rt.gauge == 1
    with pytest.raises(RuntimeError), request:
        raise RuntimeError("the upstream broke")
    assert rt.activity.in_flight == 0 and rt.gauge == 0
    request.end()  # idempotent: never counted down twice
    assert rt.activity.in_flight == 0 and rt.gauge == 0

    async with rt.in_flight():
        assert rt.activity.idle_since(0.0) is None
    assert rt.activity.in_flight == 0 and rt.gauge == 0


async def test_a_stream_leaves_and_rejoins_without_moving_the_idle_clock_at_its_end() -> None:
    loop = asyncio.get_running_loop()
    rt = _Runtime(loop)
    with rt.in_flight() as request:
        began = rt.activity.last_request
        request.end()  # a stream that counts by its frames from here
        ended = rt.activity.last_request
        assert rt.activity.in_flight == 0 and rt.gauge == 0 and ended >= began
        rt.activity.last_request = ended - 100.0  # idle long since, by its frames
        request.rejoin()  # the stream ends: in flight again until the block ends
        assert rt.activity.in_flight == 1 and rt.gauge == 1
    assert rt.activity.in_flight == 0 and rt.gauge == 0
    assert rt.activity.last_request == ended - 100.0  # the end of a stream is no activity


async def test_a_socket_that_does_not_count_leaves_the_idle_clock_alone() -> None:
    rt = _Runtime(asyncio.get_running_loop())
    rt.activity.last_request = -50.0
    with rt.in_flight(counts=False):
        assert rt.activity.idle_since(0.0) is None  # no release meanwhile
    assert rt.activity.last_request == -50.0
