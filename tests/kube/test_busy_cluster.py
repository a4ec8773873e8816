"""Cold starts on a busy cluster, against the real control plane: kube-scheduler places the
render pods by the one ``nvidia.com/gpu`` the test kubelet's Node advertises, with deploy/'s
PriorityClasses, and warmgate runs as deploy/'s ServiceAccount with deploy/'s Role.

- a second GPU target woken while the first holds the GPU is ``unschedulable`` with the
  scheduler's own message; an API request that may use the cloud goes there at once; a browser
  gets the waiting page that says so;
- a ``batch`` pod that holds the GPU is preempted for a render UI, which becomes ready;
- a bad image and a crash loop are ``failed`` within seconds, held requests answered 503;
- a start whose client went away is scaled back to 0 after ``abandon_after``;
- after warmgate restarts, the first waiting page shows the ETA learned before (kept on the
  Deployment)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from router.scale.state import Phase
from tests.deploy_tree import build
from tests.fake_openai import FakeOpenAI
from tests.helpers import Running, metric_value, serve_app, warmgate

from .access import apply_rbac, as_warmgate
from .cluster import KubeCluster
from .kubelet import TestKubelet
from .test_warmgate_on_kube import eventually
from .workloads import ENGINE_PORT, engine_deployment, engine_service

GPU = "nvidia.com/gpu"
TARGETS = ("comfyui", "wan2gp")
"""The render Deployments by deploy/'s names: its Role lets warmgate annotate only these."""
PAGE = {"Accept": "text/html,application/xhtml+xml", "Sec-Fetch-Mode": "navigate"}
KEY_ENV = "WARMGATE_BUSY_CLOUD_KEY"
HELLO = [{"role": "user", "content": "hello"}]


def gpu_deployment(name: str, load: float = 0.3) -> dict[str, Any]:
    """A render Deployment as deploy/ writes them: one GPU, priority warmgate-interactive."""
    deployment = engine_deployment(name, load=load)
    pod = deployment["spec"]["template"]["spec"]
    pod["priorityClassName"] = "warmgate-interactive"
    pod["terminationGracePeriodSeconds"] = 5
    pod["containers"][0]["resources"] = {"limits": {GPU: 1}}
    return deployment


def batch_pod(name: str) -> dict[str, Any]:
    """A training job's pod at priority batch, holding the GPU until it is evicted."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "trainer"}},
        "spec": {
            "priorityClassName": "batch",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "train",
                    "image": "local/trainer",
                    "command": [sys.executable, "-c", "import time; time.sleep(3600)"],
                    "resources": {"limits": {GPU: 1}},
                }
            ],
        },
    }


@dataclass
class Busy:
    cluster: KubeCluster
    admin: client.ApiClient
    namespace: str
    kubeconfig: Path

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.admin)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.admin)

    async def replicas(self, name: str) -> int:
        scale = await self.apps.read_namespaced_deployment_scale(name, self.namespace)
        return int(scale.spec.replicas or 0)

    async def pods(self, app: str) -> list[Any]:
        selector = f"app={app}"
        return list(
            (await self.core.list_namespaced_pod(self.namespace, label_selector=selector)).items
        )

    async def stopped(self, name: str) -> bool:
        return await self.replicas(name) == 0

    async def gone(self, app: str) -> bool:
        return not await self.pods(app)

    def config(self, cloud_url: str | None = None, **scaling: Any) -> dict[str, Any]:
        targets = {
            name: {
                "routes": [{"path_prefix": f"/{name}", "strip_prefix": True}],
                "backend": {
                    "kind": "kubernetes",
                    "namespace": self.namespace,
                    "deployment": name,
                    "port": ENGINE_PORT,
                    "service": name,
                },
                "readiness": {"path": "/readyz", "interval": "100ms"},
                "scaling": {"idle_after": "30m", "cold_start_timeout": "60s", **scaling},
            }
            for name in TARGETS
        }
        config: dict[str, Any] = {
            "listen": "127.0.0.1:0",
            "admin_listen": "127.0.0.1:0",
            "server": {"access_log": False, "drain_grace": "5s"},
            "targets": targets,
        }
        if cloud_url is not None:
            cloud = {"cloud": "managed", "model": "frontier", "cost": {"output_per_mtok": 1.0}}
            config["models"] = {"wan": {"placements": [{"target": "wan2gp"}, cloud]}}
            config["clouds"] = {"managed": {"base_url": cloud_url + "/v1", "api_key_env": KEY_ENV}}
            config["policy"] = {"daily_cloud_budget_usd": 10, "max_wait": "10m"}
            config["api"] = {"allow_anonymous": True}
        return config


async def create_priority_classes(admin: client.ApiClient) -> None:
    """deploy/'s PriorityClasses (cluster-wide: made once per cluster)."""
    scheduling = client.SchedulingV1Api(admin)
    for obj in build("base"):
        if obj["kind"] == "PriorityClass":
            obj["metadata"].pop("labels", None)
            with contextlib.suppress(ApiException):  # 409: made by an earlier test
                await scheduling.create_priority_class(obj)


@pytest.fixture
async def busy(
    kube_cluster: KubeCluster,
    kube_client: client.ApiClient,
    kube_namespace: str,
    kubelet: TestKubelet,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Busy]:
    if not kube_cluster.has_scheduler:
        message = "kube-scheduler not built (tools/kube/build.sh builds it)"
        if os.environ.get("WARMGATE_KUBE_REQUIRED"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    ns = kube_namespace
    await apply_rbac(kube_client, ns)
    await create_priority_classes(kube_client)
    lab = Busy(kube_cluster, kube_client, ns, Path())
    for name in TARGETS:
        await lab.apps.create_namespaced_deployment(ns, gpu_deployment(name))
        await lab.core.create_namespaced_service(ns, engine_service(name))
    lab.kubeconfig = await as_warmgate(kube_cluster, ns, monkeypatch)
    monkeypatch.setenv(KEY_ENV, "sk-busy-cloud")
    yield lab


async def status(http: aiohttp.ClientSession, wg: Running, target: str) -> dict[str, Any]:
    async with http.get(f"{wg.url}/.warmgate/status/{target}") as resp:
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
        return body


async def until_status(
    http: aiohttp.ClientSession, wg: Running, target: str, check: Any, within: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        got = await status(http, wg, target)
        if check(got):
            return got
        assert time.monotonic() < deadline, f"{target}: {got}"
        await asyncio.sleep(0.1)


async def ready(http: aiohttp.ClientSession, wg: Running, target: str) -> float:
    """Wake ``target`` with a held request; the seconds it was held."""
    async with http.get(f"{wg.url}/{target}/hello") as resp:
        assert resp.status == 200, await resp.text()
        return float(resp.headers.get("X-Warmgate-Cold-Start") or 0)


async def test_no_free_gpu_is_unschedulable_and_api_work_goes_to_the_cloud(busy: Busy) -> None:
    cloud = FakeOpenAI(api_key="sk-busy-cloud", name="cloud")
    async with serve_app(cloud.app()) as cloud_url:
        config = busy.config(cloud_url)
        async with warmgate(config) as wg, aiohttp.ClientSession() as http:
            await ready(http, wg, "comfyui")  # it takes the only GPU
            async with http.get(f"{wg.url}/wan2gp/", headers=PAGE) as resp:
                assert resp.status == 503  # the waiting page; the start is asked for
            stuck = await until_status(http, wg, "wan2gp", lambda s: s["stage"] == "unschedulable")
            assert f"Insufficient {GPU}" in stuck["stage_message"]  # the scheduler's words
            assert stuck["stage_text"] == "waiting for a free GPU: all are busy with other work"
            assert stuck["remaining"] is None  # no ETA while no GPU is free
            async with http.get(f"{wg.url}/wan2gp/", headers=PAGE) as resp:
                page = await resp.text()
            assert "Waiting for a free GPU: all are busy with other work." in page
            assert "no ETA until a GPU is free" in page

            began = time.monotonic()
            body = {"model": "wan", "messages": HELLO, "max_tokens": 5}
            async with http.post(f"{wg.url}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                decision = resp.headers["X-Warmgate-Decision"]
            assert decision == "managed/frontier; reason=local_unschedulable"
            assert time.monotonic() - began < 5, "at once, not after the latency budget"
            assert cloud.count("/v1/chat/completions") == 1
            targets = await (await http.get(wg.admin + "/targets")).json()
            assert targets["wan2gp"]["stage"] == "unschedulable"
            assert f"Insufficient {GPU}" in targets["wan2gp"]["stage_message"]


async def test_a_batch_pod_holding_the_gpu_is_preempted_for_a_render_ui(busy: Busy) -> None:
    await busy.core.create_namespaced_pod(busy.namespace, batch_pod("trainer"))

    async def training() -> bool:
        return any(p.status.phase == "Running" for p in await busy.pods("trainer"))

    await eventually(training, within=60)
    async with warmgate(busy.config()) as wg, aiohttp.ClientSession() as http:
        held = await ready(http, wg, "comfyui")
        assert held > 0
        assert wg.runtime("comfyui").state.phase is Phase.READY
        preempting = await metric_value(
            wg.admin,
            "warmgate_cold_start_stage_seconds_count",
            target="comfyui",
            stage="preempting",
        )
        assert preempting == 1, "the start waited while the batch pod was evicted"
    assert not [p for p in await busy.pods("trainer") if not p.metadata.deletion_timestamp]


async def test_a_bad_image_and_a_crash_loop_fail_within_seconds(busy: Busy) -> None:
    patch = {
        "spec": {
            "template": {
                "spec": {"containers": [{"name": "engine", "image": "warmgate.test/bad:1"}]}
            }
        }
    }
    await busy.apps.patch_namespaced_deployment("comfyui", busy.namespace, patch)
    crash = [sys.executable, "-c", "import sys; sys.exit(3)"]
    patch = {
        "spec": {
            "template": {"spec": {"containers": [{"name": "engine", "command": crash, "args": []}]}}
        }
    }
    await busy.apps.patch_namespaced_deployment("wan2gp", busy.namespace, patch)
    async with warmgate(busy.config()) as wg, aiohttp.ClientSession() as http:
        for target, reason in (("comfyui", "ErrImagePull"), ("wan2gp", "CrashLoopBackOff")):
            began = time.monotonic()
            async with http.get(f"{wg.url}/{target}/hello") as resp:
                assert resp.status == 503
                error = (await resp.json())["error"]
            assert time.monotonic() - began < 10, f"{target}: failed fast, not at the timeout"
            assert error["code"] == "target_failed"
            state = wg.runtime(target).state
            assert state.phase is Phase.FAILED and reason in state.reason
            await eventually(functools.partial(busy.stopped, target))  # no GPU in the backoff


async def test_a_start_nobody_waits_for_is_scaled_back_to_zero(busy: Busy) -> None:
    async with warmgate(busy.config(abandon_after="3s")) as wg, aiohttp.ClientSession() as http:
        await ready(http, wg, "comfyui")
        with contextlib.suppress(TimeoutError):  # the client gives up while it waits
            timeout = aiohttp.ClientTimeout(total=2)
            async with http.get(f"{wg.url}/wan2gp/hello", timeout=timeout):
                pass
        assert await busy.replicas("wan2gp") == 1
        async with asyncio.timeout(30):
            await wg.runtime("wan2gp").cell.wait_for(lambda s: s.phase is Phase.COLD)
        assert "abandoned" in wg.runtime("wan2gp").state.reason
        assert await busy.replicas("wan2gp") == 0
        await eventually(lambda: busy.gone("wan2gp"))  # the Pending pod takes no GPU later


async def test_after_a_restart_the_first_waiting_page_shows_the_learned_eta(busy: Busy) -> None:
    config = busy.config(expected_cold_start="77s", idle_after="2s")
    async with warmgate(config) as wg, aiohttp.ClientSession() as http:
        assert (await status(http, wg, "comfyui"))["eta"] == 77.0
        await ready(http, wg, "comfyui")
        learned = (await status(http, wg, "comfyui"))["eta"]
        assert 0 < learned < 30
        async with asyncio.timeout(30):  # idle: released
            await wg.runtime("comfyui").cell.wait_for(lambda s: s.phase is Phase.COLD)
    deployment = await busy.apps.read_namespaced_deployment("comfyui", busy.namespace)
    kept = json.loads(deployment.metadata.annotations["warmgate.io/cold-start"])
    assert len(kept["starts"]) == 1 and "pulling" in kept["stages"]

    async with warmgate(config) as wg, aiohttp.ClientSession() as http:
        async with http.get(f"{wg.url}/comfyui/", headers=PAGE) as resp:
            assert resp.status == 503
            page = await resp.text()
        assert f"about {learned:.0f} s expected" in page, "learned, not the expected 77 s"
        assert (await status(http, wg, "comfyui"))["eta"] == learned


async def test_the_learned_idle_histogram_is_kept_on_the_deployment(busy: Busy) -> None:
    config = busy.config(idle_after="auto", idle_bounds=["1s", "1h"])
    async with warmgate(config) as wg, aiohttp.ClientSession() as http:
        await ready(http, wg, "comfyui")
        for _ in range(2):
            await asyncio.sleep(1.5)  # a pause between bursts, past the lower bound
            async with http.get(f"{wg.url}/comfyui/hello") as resp:
                assert resp.status == 200
        learned = wg.runtime("comfyui").learned.describe_idle()["learned"]
        assert learned["learned"] and learned["gaps"] >= 2

        async def kept() -> bool:
            deployment = await busy.apps.read_namespaced_deployment("comfyui", busy.namespace)
            document = (deployment.metadata.annotations or {}).get("warmgate.io/idle")
            return document is not None and json.loads(document)["gaps"] == learned["gaps"]

        await eventually(kept)

    async with warmgate(config) as wg:  # read back from the annotation: not relearned
        again = wg.runtime("comfyui").learned.describe_idle()["learned"]
        assert again["learned"] and again["gaps"] == learned["gaps"]
