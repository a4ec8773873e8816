"""KEDA's external scaler over real gRPC on loopback, with a client that behaves as KEDA does
(tests/keda_client.py): against a real warmgate with a ``process`` target, and against a
``mode: keda`` lifecycle whose fake Deployment only the client scales."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from grpc import StatusCode, aio

from backends.base import Observation, RequestFacts
from router.cluster.keda import ScalerServer
from router.cluster.keda_proto import externalscaler_pb2 as pb
from router.cluster.keda_proto import externalscaler_pb2_grpc as pb_grpc
from router.config import HostPort, parse_config
from router.errors import ConfigError
from router.metrics import Metrics
from router.scale.deadline import SLACK
from router.scale.lifecycle import Lifecycle
from router.scale.state import Phase
from router.scale.targets import TargetRuntime
from router.server import Server
from tests.backends.test_process import process_config
from tests.fakes import FakeBackend, FakeEngine
from tests.helpers import wait_until, warmgate
from tests.keda_client import FakeKeda

GET = RequestFacts(method="GET", path="/", is_websocket=False, is_navigation=False)


def with_scaler(config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "scaler_listen": "127.0.0.1:0"}


async def fetch(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url) as resp:
        await resp.read()
        return resp.status


async def test_keda_hears_active_within_100ms_of_the_first_hold_and_inactive_only_after_idle() -> (
    None
):
    config = with_scaler(process_config(load=0.5, idle_after="1s"))
    async with warmgate(config) as wg:
        runtime = wg.runtime()
        loop = asyncio.get_running_loop()
        held_at: list[float] = []
        runtime.on_first_hold.append(lambda: held_at.append(loop.time()))
        address = f"127.0.0.1:{wg.server.scaler_port}"
        async with FakeKeda(address, "t") as keda, aiohttp.ClientSession() as http:
            assert keda.active is False, "cold: KEDA keeps it at zero"
            assert keda.spec is not None
            (spec,) = keda.spec.metricSpecs
            assert (spec.metricName, spec.targetSize, spec.targetSizeFloat) == ("warmgate-t", 1, 1)

            # Held for the 0.5 s load, then in flight for 1.5 s: longer than idle_after.
            request = loop.create_task(fetch(http, wg.url + "/slow?s=1.5"))
            pushed_at, active = await keda.next_push()
            assert active
            # Pushed on the hold itself (typically a few ms here), not at a poll: KEDA's default
            # polling interval is 30 s. The bound is loose because this machine is shared.
            assert pushed_at - held_at[0] < 1.0, "pushed at once, not at KEDA's next poll"
            assert await request == 200

            released_at, active = await keda.next_push(within=5)
            assert not active
            finished = runtime.activity.last_request  # when the request ended
            assert released_at >= finished + 1.0 - SLACK, "inactive only after idle_after"
            assert released_at < finished + 1.0 + 1.5, "pushed at the release, not later"
            # Two polls ended after the release: the second was asked after it (every 0.1 s).
            await wait_until(lambda: sum(p.at > released_at for p in keda.polls) >= 2)

        wanted = [p for p in keda.polls if pushed_at + 0.05 < p.at < released_at - 0.05]
        assert wanted and all(p.active for p in wanted), "IsActive agrees with the stream"
        assert max(p.metric for p in wanted) >= 1, "the held / in-flight request is the metric"
        assert not keda.polls[-1].active and keda.polls[-1].metric == 0


async def test_unknown_or_missing_target_is_refused_with_a_clear_status() -> None:
    config = with_scaler(process_config())
    async with (
        warmgate(config) as wg,
        aio.insecure_channel(f"127.0.0.1:{wg.server.scaler_port}") as ch,
    ):
        stub = pb_grpc.ExternalScalerStub(ch)
        unknown = pb.ScaledObjectRef(name="so", namespace="render", scalerMetadata={"target": "x"})
        calls = [
            stub.IsActive(unknown),
            stub.GetMetricSpec(unknown),
            stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=unknown, metricName="m")),
            stub.StreamIsActive(unknown).read(),
        ]
        for call in calls:
            with pytest.raises(aio.AioRpcError) as caught:
                await call
            assert caught.value.code() is StatusCode.NOT_FOUND
            assert "no target named 'x' (targets: t)" in str(caught.value.details())
            assert "render/so" in str(caught.value.details())
        with pytest.raises(aio.AioRpcError) as caught:
            await stub.IsActive(pb.ScaledObjectRef(name="so", namespace="render"))
        assert caught.value.code() is StatusCode.INVALID_ARGUMENT
        assert "metadata 'target:'" in str(caught.value.details())


async def test_streams_end_cleanly_when_warmgate_stops() -> None:
    async with warmgate(with_scaler(process_config())) as wg:
        keda = FakeKeda(f"127.0.0.1:{wg.server.scaler_port}", "t")
        await keda.__aenter__()
    try:
        with pytest.raises(AssertionError, match="ended"):
            await keda.next_push(within=5)
        assert keda.ended and keda.stream_error is None, "a clean end, not an error"
    finally:
        await keda.__aexit__(None, None, None)


def test_scaler_listen_is_validated_like_listen() -> None:
    base = process_config()
    assert parse_config(base).scaler_listen is None
    parsed = parse_config({**base, "scaler_listen": "0.0.0.0:9091"}).scaler_listen
    assert parsed == HostPort(host="0.0.0.0", port=9091)
    with pytest.raises(ConfigError) as caught:
        parse_config({**base, "scaler_listen": "9091"}, "w.yaml")
    assert "scaler_listen" in str(caught.value) and "host:port" in str(caught.value)
    clash = {**base, "admin_listen": "127.0.0.1:9091", "scaler_listen": "127.0.0.1:9091"}
    with pytest.raises(ConfigError, match="scaler_listen must differ"):
        parse_config(clash)


async def test_a_taken_scaler_port_is_a_clean_listen_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = Server(parse_config({**process_config(), "scaler_listen": f"127.0.0.1:{port}"}))
        with pytest.raises(OSError, match=f"scaler_listen 127.0.0.1:{port}"):
            await server.start()
        await server.stop()


async def test_no_scaler_without_scaler_listen() -> None:
    async with warmgate(process_config()) as wg:
        assert wg.server.scaler is None


# -- mode: keda: the client is the only one that scales -----------------------------------------


@asynccontextmanager
async def keda_mode(**scaling: Any) -> AsyncIterator[tuple[TargetRuntime, FakeBackend, str]]:
    """A target whose replicas KEDA owns: a lifecycle in keda mode over a fake Deployment, and
    the scaler on a loopback port."""
    config = parse_config(
        {
            "targets": {
                "t": {
                    "routes": [{}],
                    "backend": {"kind": "process", "command": ["engine"]},
                    "scaling": {"cold_start_timeout": "10s", **scaling},
                }
            }
        }
    )
    backend, engine = FakeBackend("http://10.0.0.7:8188"), FakeEngine()
    loop = asyncio.get_running_loop()
    runtime = TargetRuntime("t", config.targets["t"], backend, engine, Metrics(), loop)
    lifecycle = Lifecycle(runtime)
    lifecycle.keda = True  # what a kubernetes backend with mode: keda says
    await lifecycle.open()
    scaler = ScalerServer({"t": runtime}, HostPort(host="127.0.0.1", port=0))
    port = await scaler.start()
    try:
        yield runtime, backend, f"127.0.0.1:{port}"
    finally:
        await scaler.stop()
        await lifecycle.close()


async def serve(runtime: TargetRuntime) -> bool:
    """One request: held if needed, then in flight for a moment; returns whether it was cold."""
    result = await runtime.acquire(GET)
    with runtime.in_flight():
        await asyncio.sleep(0.01)
    return result.cold


async def phase(runtime: TargetRuntime, want: Phase, within: float = 5.0, **fields: Any) -> None:
    async with asyncio.timeout(within):
        await runtime.cell.wait_for(
            lambda s: s.phase is want and all(getattr(s, k) == v for k, v in fields.items())
        )


async def test_in_keda_mode_only_keda_scales_and_held_requests_go_out_when_it_does() -> None:
    async with keda_mode(idle_after="500ms") as (runtime, backend, address):

        def scale(replicas: int) -> None:  # the Deployment KEDA scales; the pod is ready at once
            running = Observation(running=True, endpoints=(backend.endpoint,))
            backend.set(running if replicas else Observation())

        async with FakeKeda(address, "t", cooldown=1.0, scale=scale) as keda:
            assert await serve(runtime), "held through the cold start KEDA performed"
            assert keda.replicas == 1 and runtime.state.phase is Phase.READY

            # Idle: the lifecycle commits the release and waits; KEDA's cooldown runs meanwhile.
            await phase(runtime, Phase.DRAINING, stopping=True)
            assert keda.active is False and keda.replicas == 1
            # A request within the cooldown: KEDA keeps the replica, warmgate adopts it again.
            assert await serve(runtime)
            assert runtime.state.phase is Phase.READY and keda.replicas == 1

            # Idle again, and this time KEDA's cooldown passes: scaled to zero -> cold.
            await phase(runtime, Phase.DRAINING, stopping=True)
            await phase(runtime, Phase.COLD, within=3)
            assert keda.replicas == 0 and "KEDA" in runtime.state.reason
        assert "up" not in backend.calls and "down" not in backend.calls, "never scaled itself"
