"""The fault suite's Kubernetes case: the API server SIGKILLed and started again (same port,
same etcd) while steady traffic goes to a ready target. No request fails, the watches resume
(a pod deleted afterwards is seen going and its replacement coming), and a scale-up asked for
another target during the outage is held, pending, and happens once the API server is back."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from router.scale.state import Phase
from tests.helpers import warmgate

from .test_warmgate_on_kube import (  # noqa: F401  # lab: the fixture
    Lab,
    _problem,
    _true,
    eventually,
    get,
    lab,
    readyz,
)
from .workloads import ENGINE_PORT, engine_deployment, engine_service

OUTAGE_START = 240.0
"""Seconds ``other``'s start asked in the outage may take (its ``cold_start_timeout``)."""


def with_other_target(setup: Lab) -> dict[str, Any]:
    """The lab's config (target ``t`` at /) and a second target ``other`` at /other, cold."""
    config = setup.config()
    other = dict(config["targets"]["t"])
    other["routes"] = [{"path_prefix": "/other", "strip_prefix": True}]
    other["backend"] = {**other["backend"], "deployment": "other", "service": "other"}
    # Its start spans the outage: the API server's restart, then the controllers' and the
    # kubelet's own reconnect backoffs (client-go's reach 30 s) before the pod is even made.
    # The lab's 60 s is less than that on a loaded machine: the start would be given up in
    # the middle, and the held request answered 504, for want of time, not of warmgate.
    other["scaling"] = {**other.get("scaling", {}), "cold_start_timeout": f"{OUTAGE_START:g}s"}
    config["targets"]["other"] = other
    return config


async def replicas(setup: Lab, deployment: str) -> int:
    scale = await setup.apps.read_namespaced_deployment_scale(deployment, setup.namespace)
    return int(scale.spec.replicas or 0)


async def test_the_api_server_killed_under_traffic_fails_nothing_and_a_scale_up_waits(
    lab: Lab,  # noqa: F811  # the fixture imported above
) -> None:
    await lab.apps.create_namespaced_deployment(lab.namespace, engine_deployment("other"))
    await client.CoreV1Api(lab.admin).create_namespaced_service(
        lab.namespace, engine_service("other")
    )
    async with warmgate(with_other_target(lab)) as wg, aiohttp.ClientSession() as http:
        ready, other = wg.runtime("t"), wg.runtime("other")
        assert (await get(http, wg.url + "/"))[0] == 200
        assert ready.state.phase is Phase.READY and other.state.phase is Phase.COLD

        stop, statuses = asyncio.Event(), []

        async def steady() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                statuses.append((await get(http, wg.url + f"/r{i}"))[0])
                await asyncio.sleep(0.02)

        traffic = asyncio.ensure_future(steady())
        await asyncio.sleep(0.5)
        apiserver = lab.cluster.pids["kube-apiserver"]
        assert apiserver is not None
        os.kill(apiserver, signal.SIGKILL)
        killed = time.monotonic()
        try:
            held = asyncio.ensure_future(get(http, wg.url + "/other/"))
            await eventually(lambda: _problem(wg, "scale to 1 pending"), within=30)
            assert other.state.phase is Phase.STARTING and not held.done()
            during = len(statuses)
            await asyncio.sleep(1)  # the ready target keeps serving while the API is away
            assert len(statuses) > during
        finally:
            await asyncio.to_thread(lab.cluster.start_apiserver)
        back = time.monotonic()

        status, _, cold = await asyncio.wait_for(held, OUTAGE_START)
        answered = time.monotonic()
        assert status == 200 and cold is not None, "the scale-up asked in the outage happened"
        assert await replicas(lab, "other") == 1
        await asyncio.sleep(0.5)
        stop.set()
        await traffic
        assert len(statuses) > 20 and set(statuses) == {200}, "not one request failed"
        print(
            f"\nAPI server SIGKILLed, back after {back - killed:.1f}s; {len(statuses)} requests "
            f"to the ready target, all 200; the scale-up asked in the outage answered "
            f"{answered - back:.1f}s after the API server was back"
        )
        for runtime in (ready, other):
            backend = runtime.backend
            await eventually(lambda b=backend: _true(b.observe().degraded is None))
        await eventually(lambda: _problem(wg, None))

        # The watches resumed: a pod deleted now is seen going, and its replacement coming.
        (victim,) = ready.state.endpoints
        (pod,) = [
            p for p in await lab.pods() if victim == f"http://{p.status.pod_ip}:{ENGINE_PORT}"
        ]
        await client.CoreV1Api(lab.admin).delete_namespaced_pod(pod.metadata.name, lab.namespace)
        async with asyncio.timeout(30):
            await ready.cell.wait_for(lambda s: victim not in s.endpoints)
        async with asyncio.timeout(60):
            await ready.cell.wait_for(lambda s: len(s.endpoints) == 1)
        assert (await get(http, wg.url + "/after"))[0] == 200
        assert (await readyz(wg))["status"] == "ready"
