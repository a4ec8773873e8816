"""What a wake from parked took, kept on the target's Deployment (``warmgate.io/wake``) as the
learned cold starts are, against the real API server: the demo engine's pod parks and wakes,
and a restarted warmgate reads the wake back from the annotation instead of relearning it."""

from __future__ import annotations

import json

import aiohttp
from kubernetes_asyncio import client

from router.scale.state import Phase
from tests.helpers import metric_value, warmgate

from .test_pools_on_kube import Lab, config, demo_deployment, lab, until  # noqa: F401 - a fixture
from .test_warmgate_on_kube import eventually
from .workloads import engine_service

PLAIN = {"Accept": "text/plain"}


async def test_the_learned_wake_is_kept_on_the_deployment(lab: Lab) -> None:  # noqa: F811
    # comfyui: a render Deployment deploy/'s Role lets warmgate annotate
    apps, core = client.AppsV1Api(lab.admin), client.CoreV1Api(lab.admin)
    deployment = demo_deployment("comfyui", lab.tmp / "comfyui.bin")
    await apps.create_namespaced_deployment(lab.namespace, deployment)
    await core.create_namespaced_service(lab.namespace, engine_service("comfyui"))
    scaling = {"park_after": "1s", "idle_after": "10m", "expected_wake": "45s"}
    data = config({"comfyui": lab.target("comfyui", scaling=scaling)})

    async def kept() -> list[float] | None:
        read = await apps.read_namespaced_deployment("comfyui", lab.namespace)
        document = (read.metadata.annotations or {}).get("warmgate.io/wake")
        return None if document is None else list(json.loads(document)["wakes"])

    async def kept_is(wakes: list[float]) -> bool:
        return await kept() == wakes

    async with warmgate(data) as wg, aiohttp.ClientSession() as http:
        runtime = wg.runtime("comfyui")
        for _ in range(2):  # a cold start, then a wake from parked
            async with http.get(wg.url + "/comfyui/", headers=PLAIN) as resp:
                assert resp.status == 200
            await until(runtime, Phase.PARKED)
        assert await metric_value(wg.admin, "warmgate_wake_seconds_count", target="comfyui") == 1
        learned = runtime.learned.wakes.predicted()
        assert 0 < learned < 45
        await eventually(lambda: kept_is([learned]))  # written through, while up

    async with warmgate(data) as wg:  # read back from the annotation: not relearned
        again = wg.runtime("comfyui").learned.wakes
        assert (again.predicted(), len(again.history)) == (learned, 1)
