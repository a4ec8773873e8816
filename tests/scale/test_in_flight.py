"""router.scale.activity's blocks: a request is counted in flight from the call that makes it,
and its begin and end pair up however the block ends; a stream leaves and rejoins without
moving the idle clock at its end; held requests, held websockets, streams and a stream's jobs
count while their blocks run, and not after."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Gauge

from router.scale.activity import (
    Activity,
    Flights,
    InFlight,
    StreamEnd,
    holding,
    holding_socket,
    stream,
)


class _Runtime:
    """What an :class:`InFlight` counts on: the activity, the gauge and the loop's clock."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.activity = Activity(loop.time())
        self.registry = CollectorRegistry()
        gauge = Gauge("in_flight", "in flight", ["target"], registry=self.registry)
        self.m_in_flight = gauge.labels("t")

    def in_flight(self, *, counts: bool = True) -> InFlight:
        return InFlight(self.activity, self.m_in_flight, self.loop.time, counts=counts)

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
    with request:  # idempotent: never counted down twice
        pass
    assert rt.activity.in_flight == 0 and rt.gauge == 0

    async with rt.in_flight():
        assert rt.activity.idle_since(0.0) is None
    assert rt.activity.in_flight == 0 and rt.gauge == 0


async def test_a_stream_leaves_and_rejoins_without_moving_the_idle_clock_at_its_end() -> None:
    loop = asyncio.get_running_loop()
    rt = _Runtime(loop)
    with rt.in_flight() as request:
        began = rt.activity.last_request
        with request.paused():  # a stream that counts by its frames from here
            ended = rt.activity.last_request
            assert rt.activity.in_flight == 0 and rt.gauge == 0 and ended >= began
            rt.activity.last_request = ended - 100.0  # idle long since, by its frames
        # the stream ends: in flight again until the block ends
        assert rt.activity.in_flight == 1 and rt.gauge == 1
    assert rt.activity.in_flight == 0 and rt.gauge == 0
    assert rt.activity.last_request == ended - 100.0  # the end of a stream is no activity


async def test_a_socket_that_does_not_count_leaves_the_idle_clock_alone() -> None:
    rt = _Runtime(asyncio.get_running_loop())
    rt.activity.last_request = -50.0
    with rt.in_flight(counts=False):
        assert rt.activity.idle_since(0.0) is None  # no release meanwhile
    assert rt.activity.last_request == -50.0


async def test_a_paused_request_that_does_not_count_leaves_no_quiet_end_behind() -> None:
    """The quiet end belongs to the request that paused: another request's end still moves
    the idle clock (a parked target's event stream once left one for whoever ended next)."""
    rt = _Runtime(asyncio.get_running_loop())
    with rt.in_flight(counts=False) as parked, parked.paused():
        pass
    rt.activity.last_request = -50.0
    with rt.in_flight():
        rt.activity.last_request = -50.0
    assert rt.activity.last_request > -50.0


async def test_a_stream_s_jobs_each_count_in_flight_until_they_or_the_stream_end() -> None:
    rt = _Runtime(asyncio.get_running_loop())
    with Flights(rt.in_flight) as jobs:
        jobs.runs(2)
        assert rt.activity.in_flight == 2 and rt.gauge == 2
        jobs.runs(1)
        assert rt.activity.in_flight == 1 and rt.gauge == 1
        jobs.runs(3)
        assert rt.activity.in_flight == 3
    assert rt.activity.in_flight == 0 and rt.gauge == 0


async def test_held_requests_sockets_and_streams_count_while_their_blocks_run() -> None:
    rt = _Runtime(asyncio.get_running_loop())
    activity, gauge = rt.activity, rt.m_in_flight  # any gauge will do
    closed: list[str] = []

    async def close(why: str) -> None:
        closed.append(why)

    with pytest.raises(RuntimeError), holding(activity, gauge), holding_socket(activity, gauge):
        assert (activity.held, activity.held_sockets, rt.gauge) == (1, 1, 2)
        raise RuntimeError("the client left")
    assert (activity.held, activity.held_sockets, rt.gauge) == (0, 0, 0)
    with stream(activity, close, gauge):
        assert len(activity.streams) == 1 and rt.gauge == 1
        await activity.close_streams(StreamEnd.RELEASED)
    assert activity.streams == {} and rt.gauge == 0
    assert closed == ["idle: the GPU is released"]
