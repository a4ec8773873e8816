"""warmgate with a ``kind: kubernetes`` target against the real API server and controllers: the
engine's pods run as local processes (the test kubelet), warmgate authenticates as the
ServiceAccount from deploy/ with exactly deploy/'s Role and RoleBinding, and real clients send
real requests. Scale from zero and back, a forbidden action, a pod deleted mid-request, the API
server restarted and away mid-run, warmgate itself restarted while work is in flight, and a new
image applied at zero replicas verified at the next cold start."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client

from backends.base import BackendError
from backends.kubernetes.api import DEPLOYMENTS, Forbidden
from backends.kubernetes.client import Access, connect
from router.scale.state import Phase
from tests.helpers import ROOT, Running, metric_value, warmgate

from .access import apply_rbac, as_warmgate
from .cluster import KubeCluster
from .kubelet import TestKubelet
from .workloads import ENGINE_PORT, engine_deployment, engine_service


@dataclass
class Lab:
    """A namespace with deploy/'s RBAC in it, and an engine Deployment (at 0) with its Service."""

    cluster: KubeCluster
    admin: client.ApiClient
    namespace: str
    kubeconfig: Path
    """Authenticates as deploy/'s ServiceAccount (nothing but its Roles applies)."""

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.admin)

    async def replicas(self) -> int:
        scale = await self.apps.read_namespaced_deployment_scale("engine", self.namespace)
        return int(scale.spec.replicas or 0)

    async def generation(self) -> int:
        deployment = await self.apps.read_namespaced_deployment("engine", self.namespace)
        return int(deployment.metadata.generation)

    async def pods(self) -> list[Any]:
        core = client.CoreV1Api(self.admin)
        return list((await core.list_namespaced_pod(self.namespace)).items)

    def config(self, max_replicas: int = 1, **scaling: Any) -> dict[str, Any]:
        return {
            "listen": "127.0.0.1:0",
            "admin_listen": "127.0.0.1:0",
            "server": {"access_log": False, "drain_grace": "15s"},
            "targets": {
                "t": {
                    "routes": [{"path_prefix": "/"}],
                    "backend": {
                        "kind": "kubernetes",
                        "namespace": self.namespace,
                        "deployment": "engine",
                        "port": ENGINE_PORT,
                        "route_to": "pods",
                        "service": "engine",
                        "max_replicas": max_replicas,
                        "mode": "direct",
                    },
                    "readiness": {"path": "/readyz", "interval": "100ms"},
                    "scaling": {"idle_after": "30m", "cold_start_timeout": "60s", **scaling},
                }
            },
        }


@pytest.fixture
async def lab(
    kube_cluster: KubeCluster,
    kube_client: client.ApiClient,
    kube_namespace: str,
    kubelet: TestKubelet,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Lab]:
    ns = kube_namespace
    await apply_rbac(kube_client, ns)
    apps, core = client.AppsV1Api(kube_client), client.CoreV1Api(kube_client)
    await apps.create_namespaced_deployment(ns, engine_deployment("engine"))
    await core.create_namespaced_service(ns, engine_service("engine"))
    kubeconfig = await as_warmgate(kube_cluster, ns, monkeypatch)
    yield Lab(kube_cluster, kube_client, ns, kubeconfig)


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, str, str | None]:
    async with http.get(url) as resp:
        return resp.status, await resp.text(), resp.headers.get("X-Warmgate-Cold-Start")


async def readyz(wg: Running) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(wg.admin + "/readyz") as resp:
        body: dict[str, Any] = await resp.json()
        body["code"] = resp.status
        return body


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 30.0) -> None:
    """Poll something outside (the API server, /readyz) until ``check`` holds."""
    async with asyncio.timeout(within):
        while True:
            if await check():
                return
            await asyncio.sleep(0.05)


async def _true(value: bool) -> bool:
    return value


async def _none(items: Awaitable[list[Any]]) -> bool:
    return not await items


async def _problem(wg: Running, text: str | None) -> bool:
    """/readyz lists a problem containing ``text`` (None: reports ready)."""
    ready = await readyz(wg)
    return ready["status"] == "ready" if text is None else text in str(ready["problems"])


async def phase(wg: Running, want: Phase, within: float = 60) -> None:
    async with asyncio.timeout(within):
        await wg.runtime().cell.wait_for(lambda s: s.phase is want)


async def test_a_held_request_scales_from_zero_to_the_pod_and_idle_scales_back(lab: Lab) -> None:
    async with warmgate(lab.config(idle_after="3s")) as wg, aiohttp.ClientSession() as http:
        assert wg.runtime().state.phase is Phase.COLD
        assert await lab.replicas() == 0
        status, body, cold = await get(http, wg.url + "/hello")
        assert status == 200 and body.startswith("pid ")
        assert cold is not None and float(cold) > 0, "held through the cold start"
        assert await lab.replicas() == 1
        (endpoint,) = wg.runtime().state.endpoints
        (pod,) = await lab.pods()
        assert endpoint == f"http://{pod.status.pod_ip}:{ENGINE_PORT}"
        assert pod.status.pod_ip != "127.0.0.1", "forwarded to the pod's own address"
        ready = await readyz(wg)
        assert (ready["code"], ready["status"]) == (200, "ready")

        await phase(wg, Phase.COLD, within=30)  # idle for 3 s: released
        assert await lab.replicas() == 0
        await eventually(lambda: _none(lab.pods()))
        status, _, cold = await get(http, wg.url + "/again")  # and woken again
        assert status == 200 and cold is not None


async def test_a_forbidden_action_fails_with_a_clear_error(
    lab: Lab, kube_client: client.ApiClient, tmp_path: Path
) -> None:
    core = client.CoreV1Api(kube_client)
    other = f"{lab.namespace}-other"  # no RoleBinding here: deploy/'s Role does not reach it
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))
    try:
        await client.AppsV1Api(kube_client).create_namespaced_deployment(
            other, engine_deployment("engine")
        )
        config = lab.config()
        config["targets"]["t"]["backend"]["namespace"] = other
        with pytest.raises(BackendError) as err:
            async with warmgate(config):
                pass
        message = str(err.value)
        assert f"system:serviceaccount:{lab.namespace}:warmgate" in message
        assert "cannot list resource" in message and f'namespace "{other}"' in message
        assert "deploy/base/router/rbac.yaml" in message

        # The command line says the same, in one line, and exits 1.
        path = tmp_path / "warmgate.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "KUBECONFIG": str(lab.kubeconfig)}
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "router", "serve", "--config", str(path)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1, done.stderr
        assert "warmgate: target 't': the API server refused" in done.stderr
        assert "Traceback" not in done.stderr
    finally:
        await core.delete_namespace(other)


async def test_in_cluster_credentials_carry_exactly_deploys_rbac(lab: Lab) -> None:
    sa_dir = await asyncio.to_thread(lab.cluster.in_cluster_dir, lab.namespace, "warmgate", False)
    api = await connect(Access("in-cluster", host=lab.cluster.base_url, serviceaccount_dir=sa_dir))
    try:
        listed = await api.list(DEPLOYMENTS, lab.namespace)
        assert [d["metadata"]["name"] for d in listed.items] == ["engine"]
        assert await api.patch_scale(lab.namespace, "engine", 0) == 0
        with pytest.raises(Forbidden):
            await api.list(DEPLOYMENTS, "default")
    finally:
        await api.close()


async def test_a_pod_deleted_mid_request_fails_that_request_only(lab: Lab) -> None:
    async with warmgate(lab.config(max_replicas=2)) as wg, aiohttp.ClientSession() as http:
        runtime = wg.runtime()
        assert (await get(http, wg.url + "/"))[0] == 200
        async with asyncio.timeout(60):
            await runtime.cell.wait_for(lambda s: len(s.endpoints) == 2)
        # Longer than the pod's grace: only the kill ends it, however late the delete comes.
        first = asyncio.ensure_future(get(http, wg.url + "/slow?s=30"))
        await eventually(lambda: _true(len(runtime.endpoint_load) == 1), within=10)
        (victim,) = runtime.endpoint_load
        second = asyncio.ensure_future(get(http, wg.url + "/slow?s=8"))
        await eventually(lambda: _true(len(runtime.endpoint_load) == 2), within=10)
        (pod,) = [p for p in await lab.pods() if victim.endswith(f"//{p.status.pod_ip}:8188")]
        await client.CoreV1Api(lab.admin).delete_namespaced_pod(pod.metadata.name, lab.namespace)
        async with asyncio.timeout(10):  # its EndpointSlice event takes it out at once
            await runtime.cell.wait_for(lambda s: victim not in s.endpoints)
        after = await asyncio.gather(*(get(http, wg.url + f"/n{i}") for i in range(20)))
        assert [status for status, _, _ in after] == [200] * 20
        assert (await first)[0] == 502, "the request on the deleted pod"
        assert (await second)[0] == 200, "the request on the other pod"
        async with asyncio.timeout(60):  # the Deployment replaced the pod
            state = await runtime.cell.wait_for(lambda s: len(s.endpoints) == 2)
        assert victim not in state.endpoints and state.phase is Phase.READY


async def _steady_requests(
    wg: Running, stop: asyncio.Event, statuses: list[int], degraded: list[str]
) -> None:
    async with aiohttp.ClientSession() as http:
        i = 0
        while not stop.is_set():
            i += 1
            statuses.append((await get(http, wg.url + f"/r{i}"))[0])
            ready = await readyz(wg)
            if ready["status"] == "degraded":
                degraded.extend(ready["problems"])
            await asyncio.sleep(0.05)


async def test_an_api_server_restart_mid_run_loses_no_request(lab: Lab) -> None:
    async with warmgate(lab.config(idle_after="3s")) as wg:
        async with aiohttp.ClientSession() as http:
            assert (await get(http, wg.url + "/"))[0] == 200
        stop, statuses, degraded = asyncio.Event(), [], []
        steady = asyncio.ensure_future(_steady_requests(wg, stop, statuses, degraded))
        await asyncio.sleep(0.5)
        await asyncio.to_thread(lab.cluster.restart_apiserver)
        await asyncio.sleep(1)
        stop.set()
        await steady
        assert len(statuses) > 20 and set(statuses) == {200}, "warm: served all along"
        assert any("cannot watch" in p for p in degraded), "/readyz said degraded meanwhile"
        backend = wg.runtime().backend
        await eventually(lambda: _true(backend.observe().degraded is None))
        # The watches are back: the idle release lands and is seen, and a cold start works.
        await phase(wg, Phase.COLD, within=30)
        assert await lab.replicas() == 0
        async with aiohttp.ClientSession() as http:
            status, _, cold = await get(http, wg.url + "/")
        assert status == 200 and cold is not None


async def test_while_the_api_server_is_away_a_held_request_waits_for_it(lab: Lab) -> None:
    # The hold outlasts the outage (up to 20 s) and the control plane's own restart, which on
    # a loaded machine alone took most of a 60 s budget.
    async with (
        warmgate(lab.config(cold_start_timeout="180s")) as wg,
        aiohttp.ClientSession() as http,
    ):
        await asyncio.to_thread(lab.cluster.stop_apiserver)
        try:
            held = asyncio.ensure_future(get(http, wg.url + "/"))
            await eventually(lambda: _problem(wg, "scale to 1 pending"), within=20)
            ready = await readyz(wg)
            assert (ready["code"], ready["status"]) == (200, "degraded")
            assert not held.done()
        finally:
            await asyncio.to_thread(lab.cluster.start_apiserver)
        status, _, cold = await held
        assert status == 200 and cold is not None, "retried when the API server came back"
        assert await lab.replicas() == 1
        await eventually(lambda: _problem(wg, None))


async def test_a_warmgate_restart_with_work_in_flight_never_scales_down(lab: Lab) -> None:
    config = lab.config()
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession())
        first = await stack.enter_async_context(warmgate(config))
        status, body, _ = await get(http, first.url + "/")
        assert status == 200
        generation, (pod,) = await lab.generation(), await lab.pods()
        in_flight = asyncio.ensure_future(get(http, first.url + "/slow?s=4"))
        await asyncio.sleep(0.3)

        # A rolling update: the new warmgate starts while the old one still drains.
        async with warmgate(config) as second:
            adopted = second.runtime().state
            assert adopted.phase in (Phase.STARTING, Phase.READY), "adopted at start"
            await phase(second, Phase.READY, within=10)
            assert await metric_value(second.admin, "warmgate_cold_starts_total") == 0
            await stack.aclose()  # the old one stops; its request finishes first
            assert (await in_flight)[0] == 200
            async with aiohttp.ClientSession() as http2:
                status, body2, _ = await get(http2, second.url + "/")
            assert status == 200 and body2 == body, "the same pod, never restarted"
            await asyncio.sleep(2)
            assert await lab.replicas() == 1
            assert await lab.generation() == generation, "no scale patch at all"
            (still,) = await lab.pods()
            assert still.metadata.uid == pod.metadata.uid


async def rollout_events(wg: Running) -> list[str]:
    """What /status's events say of rollouts, oldest first."""
    async with aiohttp.ClientSession() as http, http.get(wg.admin + "/status") as resp:
        events = (await resp.json())["events"]
    return [e["reason"] for e in reversed(events) if e["kind"] == "rollout"]


async def test_a_new_image_at_zero_is_verified_at_the_next_cold_start(lab: Lab) -> None:
    async with warmgate(lab.config()) as wg, aiohttp.ClientSession() as http:
        watch = wg.runtime().rollout
        await eventually(lambda: _true(watch.declared == "local/sleepy-engine"))
        patch = {"spec": {"template": {"spec": {"containers": [
            {"name": "engine", "image": "local/sleepy-engine:v2"}
        ]}}}}  # fmt: skip
        await lab.apps.patch_namespaced_deployment("engine", lab.namespace, patch)

        async def told(words: str) -> bool:
            return any(words in reason for reason in await rollout_events(wg))

        await eventually(lambda: told("declared local/sleepy-engine:v2"))
        assert await lab.replicas() == 0, "followed, never made"
        status, _, cold = await get(http, wg.url + "/hello")
        assert status == 200 and cold is not None, "held through the cold start"
        await eventually(lambda: told("verified: rollout complete"), within=60)
        (pod,) = await lab.pods()
        assert pod.spec.containers[0].image == "local/sleepy-engine:v2"
        said = await rollout_events(wg)
        assert said[-1] == "rollout t: verified: rollout complete, /readyz 200, 1 of 1 pods"
