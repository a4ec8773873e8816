"""deploy/ end to end on the suite's API server: the single-node overlay's objects applied for
real, warmgate's Deployment run by the test kubelet from the warmgate image (built by
``make test-images``) with podman, as a kubelet runs it (uid 10001, read-only root, the config
ConfigMap, the replicas' token Secret and the ServiceAccount's token mounted), and its ComfyUI
Deployment a demo engine (a local process, as the other kube tests run engines). A browser's
request is held, routed once the pod is ready, and the engine is released to zero when idle.
Run by ``make test-images`` (``WARMGATE_IMAGES=1``), skipped otherwise."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client

from tests.deploy_tree import find
from tests.images.test_images_built import image

from .cluster import KubeCluster
from .containers import RUNTIME
from .crds import served_versions
from .kubelet import TestKubelet
from .test_deploy_apply import Kubectl, core_objects, gone, remove
from .test_pools_on_kube import demo_deployment

HOST = "comfyui.lab.local"


def lab_objects(cluster: KubeCluster, warmgate: str, checkpoint: Path) -> list[dict[str, Any]]:
    """The single-node overlay's objects, with the warmgate image built here, a config of
    one target (the demo engine as ComfyUI, released after 5 s idle), and the Secret deploy/
    asks the user to make."""
    objects = core_objects("overlays/single-node", served_versions(cluster))
    router = find(objects, "Deployment", "warmgate")
    pod = router["spec"]["template"]
    pod["metadata"].setdefault("annotations", {})[RUNTIME] = "podman"
    pod["spec"]["containers"][0]["image"] = warmgate
    pod["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    configmap = find(objects, "ConfigMap")
    config = yaml.safe_load(configmap["data"]["warmgate.yaml"])
    config["targets"] = {"comfyui": config["targets"]["comfyui"]}
    config["targets"]["comfyui"]["scaling"] = {"idle_after": "5s", "cold_start_timeout": "60s"}
    configmap["data"]["warmgate.yaml"] = yaml.safe_dump(config)
    comfyui = find(objects, "Deployment", "comfyui")
    engine = demo_deployment("comfyui", checkpoint)["spec"]["template"]["spec"]
    comfyui["spec"]["template"]["spec"] = engine
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "warmgate-replicas", "namespace": "warmgate"},
        "stringData": {"token": "a-token-the-replicas-share"},
    }
    return [*objects, secret]


async def ready_pod(core: client.CoreV1Api, namespace: str, within: float = 120) -> Any:
    async with asyncio.timeout(within):
        while True:
            for pod in (await core.list_namespaced_pod(namespace)).items:
                conditions = {c.type: c.status for c in pod.status.conditions or []}
                if conditions.get("Ready") == "True":
                    return pod
            await asyncio.sleep(0.3)


async def replicas(apps: client.AppsV1Api, want: int, within: float = 60) -> None:
    async with asyncio.timeout(within):
        while True:
            scale = await apps.read_namespaced_deployment_scale("comfyui", "render")
            if (scale.spec.replicas or 0) == want:
                return
            await asyncio.sleep(0.3)


async def test_deploys_warmgate_image_scales_the_engine_from_zero_and_back(
    kube_cluster: KubeCluster,
    kube_client: client.ApiClient,
    kubelet: TestKubelet,
    tmp_path: Path,
) -> None:
    warmgate = image("warmgate")
    k = Kubectl(kube_cluster)
    objects = lab_objects(kube_cluster, warmgate, tmp_path / "checkpoint.bin")
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    core, apps = client.CoreV1Api(kube_client), client.AppsV1Api(kube_client)
    await gone(k)  # another test's, still being deleted
    started = time.monotonic()
    try:
        await k("apply", "-f", "-", stdin=manifest)
        router = await ready_pod(core, "warmgate")
        up = time.monotonic() - started
        assert router.metadata.annotations[RUNTIME] == "podman"
        url = f"http://{router.status.pod_ip}:8080/"
        page = {"Host": HOST, "Accept": "text/html", "Sec-Fetch-Mode": "navigate"}
        async with aiohttp.ClientSession() as http:
            held = time.monotonic()
            async with http.get(url, headers=page) as r:
                waiting = r.status, await r.text()
            async with http.get(url + "system_stats", headers={"Host": HOST}) as r:
                status, body = r.status, await r.text()
                cold = r.headers.get("X-Warmgate-Cold-Start")
            answered = time.monotonic() - held
            assert waiting[0] in (200, 503), waiting
            assert status == 200 and "system" in json.loads(body), body
            await replicas(apps, 0, within=60)  # idle for 5 s: released
            released = time.monotonic() - held
        print(
            f"\nwarmgate's pod ready {up:.1f}s after the apply (podman, image {warmgate}); a "
            f"request held from zero answered in {answered:.1f}s (cold start {cold} s as "
            f"warmgate measured it); released to zero {released:.1f}s after it came"
        )
        (log,) = (tmp_path / "pods").glob(f"warmgate_{router.metadata.name}.log")
        stages = [line for line in log.read_text().splitlines() if "comfyui: " in line]
        print("the cold start by stage, as warmgate's pod logged it:\n" + "\n".join(stages))
    finally:
        await remove(k, manifest)
