"""The engine's own words on Kubernetes, against the real API server and controllers: a pod
whose container runs and whose readiness probe fails is asked, on its own address, what its
engine says. The demo engine's pod (the test kubelet runs it) whose checkpoint cannot load
fails the start at once with the engine's reason, not at ``cold_start_timeout``; one that loads
slowly shows its load progress on the waiting page's status, in the ``/readyz`` node's shape
(``{"stage": "loading", "progress": 0.4}``), and then serves."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from router.scale.state import Phase
from tests.helpers import warmgate

from .test_pools_on_kube import Lab, config, demo_deployment, lab  # noqa: F401 - a fixture
from .test_warmgate_on_kube import eventually
from .workloads import engine_service

EMPTY = {"prompt": {}}
"""A render (a POST to ComfyUI's /prompt wakes a cold target)."""


async def deploy(lab: Lab, name: str, checkpoint: Path, *args: str) -> None:  # noqa: F811
    """A demo engine Deployment at 0 (and its Service), its engine run with ``args`` more."""
    manifest = copy.deepcopy(demo_deployment(name, checkpoint))
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    container["args"] = [*container["args"], *args]
    container["env"] = [{"name": "EAGER_LOAD_MODEL", "value": "1"}]
    await client.AppsV1Api(lab.admin).create_namespaced_deployment(lab.namespace, manifest)
    await client.CoreV1Api(lab.admin).create_namespaced_service(lab.namespace, engine_service(name))


async def pods(lab: Lab, name: str) -> list[Any]:  # noqa: F811
    core = client.CoreV1Api(lab.admin)
    listed = await core.list_namespaced_pod(lab.namespace, label_selector=f"app={name}")
    return list(listed.items)


async def test_a_pod_whose_checkpoint_cannot_load_fails_the_start_with_the_engines_words(
    lab: Lab,  # noqa: F811
) -> None:
    (lab.tmp / "not-a-dir").write_text("")  # the checkpoint cannot be made under a file
    await deploy(lab, "broken", lab.tmp / "not-a-dir" / "model.safetensors")
    scaling = {"cold_start_timeout": "10m", "failure_backoff": "10m"}
    data = config({"broken": lab.target("broken", scaling=scaling)})
    async with warmgate(data) as wg, aiohttp.ClientSession() as http:
        runtime = wg.runtime("broken")
        async with asyncio.timeout(120):  # long before cold_start_timeout (10 minutes)
            async with http.post(wg.url + "/broken/prompt", json=EMPTY) as resp:
                status, body = resp.status, await resp.json()
        assert status == 503, body
        assert body["error"]["code"] == "target_failed"
        assert "not-a-dir" in body["error"]["message"], body  # the engine's own reason
        assert runtime.state.phase is Phase.FAILED and "not-a-dir" in runtime.state.reason
        assert runtime.state.endpoints == ()  # never served: its pod was never ready

        # The backoff, as for a process target: answered at once, no second start.
        async with http.post(wg.url + "/broken/prompt", json=EMPTY) as resp:
            assert resp.status == 503 and int(resp.headers["Retry-After"]) > 60
        async with http.get(wg.url + "/.warmgate/status/broken") as resp:
            shown = await resp.json()
        assert shown["phase"] == "failed" and "not-a-dir" in str(shown["failure"])
        # and no GPU held through it: scaled back to 0, the pod gone
        assert await lab.replicas("broken") == 0
        await eventually(lambda: _none(pods(lab, "broken")), within=60)


async def test_a_pod_loading_its_checkpoint_shows_its_progress_then_serves(
    lab: Lab,  # noqa: F811
) -> None:
    await deploy(lab, "slow", lab.tmp / "slow.bin", "--load-seconds", "8")
    data = config({"slow": lab.target("slow", scaling={"cold_start_timeout": "5m"})})
    async with warmgate(data) as wg, aiohttp.ClientSession() as http:
        runtime = wg.runtime("slow")

        async def get() -> int:
            async with http.post(wg.url + "/slow/prompt", json=EMPTY) as resp:
                await resp.read()
                return resp.status

        held = asyncio.ensure_future(get())
        seen: list[dict[str, Any]] = []

        async def progressed() -> bool:
            async with http.get(wg.url + "/.warmgate/status/slow") as resp:
                seen.append(await resp.json())
            progress = seen[-1]["progress"]
            return isinstance(progress, float) and 0 < progress < 1

        await eventually(progressed, within=120)
        assert seen[-1]["phase"] == "starting" and seen[-1]["stage"] == "loading", seen[-1]
        assert runtime.state.endpoints == ()  # asked on the pod, not served through it
        (pod,) = await pods(lab, "slow")
        assert not any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions)
        async with asyncio.timeout(120):
            assert await held == 200  # served by the engine once its pod is ready
        assert runtime.state.phase is Phase.READY
        assert runtime.state.endpoints == (f"http://{pod.status.pod_ip}:8188",)


async def _none(items: Any) -> bool:
    return not await items
