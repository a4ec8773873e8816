"""The parked tier and a GPU pool of ``kind: kubernetes`` targets against the real API server and
controllers: the demo engine's pods run as local processes (the test kubelet), warmgate scales the
Deployments as deploy/'s ServiceAccount. A park calls each ready pod and leaves the replica count
alone; a pool of capacity 1 parks the idle target and scales up the one asked for."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from router.scale.state import Phase
from tests.helpers import ROOT, metric_value, warmgate

from .access import apply_rbac, as_warmgate
from .cluster import KubeCluster
from .kubelet import TestKubelet
from .workloads import ENGINE_PORT, deployment, engine_service


def demo_deployment(name: str, checkpoint: Path) -> dict[str, Any]:
    """A render Deployment at 0 replicas whose pod is the demo engine (ComfyUI's API)."""
    container = {
        "name": "engine",
        "image": "local/demo-engine",
        "command": [sys.executable, "-m", "backends.demo_engine"],
        "args": ["--host", "{host}", "--port", "{port}", "--checkpoint-size", "1MiB",
                 "--checkpoint", str(checkpoint), "--render-seconds", "0.1"],
        "workingDir": str(ROOT),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 1},
    }  # fmt: skip
    return deployment(name, container)


@dataclass
class Lab:
    admin: client.ApiClient
    namespace: str
    tmp: Path

    async def replicas(self, name: str) -> int:
        apps = client.AppsV1Api(self.admin)
        scale = await apps.read_namespaced_deployment_scale(name, self.namespace)
        return int(scale.spec.replicas or 0)

    def target(self, name: str, *, max_replicas: int = 1, **spec: Any) -> dict[str, Any]:
        return {
            "engine": "comfyui",
            "routes": [{"path_prefix": f"/{name}", "strip_prefix": True}],
            "backend": {
                "kind": "kubernetes",
                "namespace": self.namespace,
                "deployment": name,
                "service": name,
                "port": ENGINE_PORT,
                "route_to": "pods",
                "max_replicas": max_replicas,
            },
            "readiness": {"path": "/readyz", "interval": "100ms"},
            **spec,
        }


@pytest.fixture
async def lab(
    kube_cluster: KubeCluster,
    kube_client: client.ApiClient,
    kube_namespace: str,
    kubelet: TestKubelet,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> AsyncIterator[Lab]:
    ns = kube_namespace
    await apply_rbac(kube_client, ns)
    apps, core = client.AppsV1Api(kube_client), client.CoreV1Api(kube_client)
    for name in ("comfy", "wan"):
        await apps.create_namespaced_deployment(ns, demo_deployment(name, tmp_path / f"{name}.bin"))
        await core.create_namespaced_service(ns, engine_service(name))
    await as_warmgate(kube_cluster, ns, monkeypatch)
    yield Lab(kube_client, ns, tmp_path)


def config(targets: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False, "drain_grace": "15s"},
        "targets": targets,
        **top,
    }


async def stats(http: aiohttp.ClientSession, endpoint: str) -> str:
    """What the pod's engine says of its checkpoint (straight to the pod)."""
    async with http.get(endpoint + "/system_stats") as resp:
        return str((await resp.json())["checkpoint"]["state"])


async def until(runtime: Any, phase: Phase, within: float = 60) -> None:
    async with asyncio.timeout(within):
        await runtime.cell.wait_for(lambda s: s.phase is phase and not s.parking and not s.waking)


async def test_a_park_calls_every_ready_pod_and_keeps_the_replicas(lab: Lab) -> None:
    spec = lab.target("comfy", max_replicas=2, scaling={"park_after": "2s", "idle_after": "10m"})
    async with warmgate(config({"comfy": spec})) as wg, aiohttp.ClientSession() as http:
        runtime = wg.runtime("comfy")
        async with http.get(wg.url + "/comfy/", headers={"Accept": "text/plain"}) as resp:
            assert resp.status == 200
        async with asyncio.timeout(60):  # both pods ready and published
            await runtime.cell.wait_for(lambda s: len(s.endpoints) == 2)
        endpoints = runtime.state.endpoints
        await until(runtime, Phase.PARKED)
        assert [await stats(http, e) for e in endpoints] == ["parked", "parked"]
        assert await lab.replicas("comfy") == 2, "a park is no scale change"
        assert runtime.state.endpoints == endpoints, "parked pods stay ready in their Service"

        async with http.get(wg.url + "/comfy/", headers={"Accept": "text/plain"}) as resp:
            assert resp.status == 200 and resp.headers.get("X-Warmgate-Cold-Start") is not None
        assert runtime.state.phase is Phase.READY
        assert runtime.state.reason.startswith("woke in")
        assert await lab.replicas("comfy") == 2
        assert await metric_value(wg.admin, "warmgate_parks_total", target="comfy") == 1


async def test_a_pool_of_one_parks_the_idle_deployment_and_scales_up_the_other(lab: Lab) -> None:
    targets = {
        "comfy": lab.target("comfy", pool="gpu", scaling={"idle_after": "10m"}),
        "wan": lab.target("wan", pool="gpu", scaling={"idle_after": "10m"}),
    }
    pools = {"gpu": {"capacity": 1, "yield_after": "1s"}}
    async with warmgate(config(targets, pools=pools)) as wg, aiohttp.ClientSession() as http:
        comfy, wan = wg.runtime("comfy"), wg.runtime("wan")
        async with http.get(wg.url + "/comfy/", headers={"Accept": "text/plain"}) as resp:
            assert resp.status == 200
        assert await lab.replicas("comfy") == 1 and await lab.replicas("wan") == 0
        (comfy_pod,) = comfy.state.endpoints

        async with http.get(wg.url + "/wan/", headers={"Accept": "text/plain"}) as resp:
            assert resp.status == 200
        assert wan.state.phase is Phase.READY and await lab.replicas("wan") == 1
        assert comfy.state.phase is Phase.PARKED
        assert comfy.state.reason == "making room for wan in its pool"
        assert await stats(http, comfy_pod) == "parked"
        assert await lab.replicas("comfy") == 1, "parked: its pod stays"
        assert await metric_value(wg.admin, "warmgate_pool_resident", pool="gpu") == 1
        displaced = await metric_value(
            wg.admin, "warmgate_pool_displacements_total", pool="gpu", target="comfy", how="park"
        )
        assert displaced == 1
