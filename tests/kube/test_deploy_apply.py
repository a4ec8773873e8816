"""deploy/'s core objects applied with kubectl to the real test API server (v1.20.2). Kinds it
does not know (DRA's ResourceClaimTemplate, Gateway API, Flux) and the pod fields that refer to
DRA claims are left out here; tests/test_deploy.py validates all of them offline against a
current schema."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import pytest

from tests.deploy_tree import CRD_KINDS, build, kubectl

from .cluster import KubeCluster

LATER_THAN_1_20 = {"ResourceClaimTemplate"}
ROUTER = "system:serviceaccount:warmgate:warmgate"


def for_1_20(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without the DRA claim fields (Kubernetes 1.31+), which 1.20 rejects."""
    pod = obj.get("spec", {}).get("template", {}).get("spec")
    if obj["kind"] == "Deployment" and pod is not None:
        pod.pop("resourceClaims", None)
        for container in pod["containers"]:
            container.get("resources", {}).pop("claims", None)
    return obj


def core_objects(tree: str) -> list[dict[str, Any]]:
    return [
        for_1_20(o)
        for o in build(tree)
        if (o["apiVersion"], o["kind"]) not in CRD_KINDS and o["kind"] not in LATER_THAN_1_20
    ]


class Kubectl:
    def __init__(self, cluster: KubeCluster) -> None:
        self.cluster = cluster

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        done = subprocess.run(
            [kubectl(), "--kubeconfig", str(self.cluster.kubeconfig_path), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0 or not check, f"kubectl {' '.join(args)}:\n{done.stderr}"
        return done.stdout

    async def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return await asyncio.to_thread(self.run, *args, stdin=stdin, check=check)


async def remove(k: Kubectl, manifest: str) -> None:
    """Delete it all and wait until it is gone. The test cluster runs no PVC/PV protection
    controller, so their finalizers are lifted here as that controller would (nothing uses
    them)."""
    await k("delete", "--wait=false", "--ignore-not-found", "-f", "-", stdin=manifest)
    unfinalize = ["--type=merge", "-p", '{"metadata":{"finalizers":null}}']
    await k("patch", "pvc/models", "-n", "render", *unfinalize, check=False)
    await k("patch", "pv/render-models", *unfinalize, check=False)
    gone = ["namespace/render", "namespace/warmgate", "pv/render-models"]
    await k("wait", "--for=delete", "--timeout=90s", *gone, check=False)


@pytest.mark.parametrize("tree", ["base", "overlays/single-node"])
async def test_the_core_objects_apply_to_a_real_api_server(
    kube_cluster: KubeCluster, tree: str
) -> None:
    objects = core_objects(tree)
    assert {o["kind"] for o in objects} == {
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Service",
        "PersistentVolume",
        "PersistentVolumeClaim",
        "Deployment",
    }
    k = Kubectl(kube_cluster)
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    try:
        out = await k("apply", "-f", "-", stdin=manifest)
        assert out.count(" created") == len(objects), out
        again = await k("apply", "-f", "-", stdin=manifest)
        changed = [line for line in again.splitlines() if not line.endswith(" unchanged")]
        assert changed == [], "applying twice changes nothing"
        for obj in objects:
            meta = obj["metadata"]
            where = ["-n", meta["namespace"]] if "namespace" in meta else []
            got = json.loads(await k("get", obj["kind"].lower(), meta["name"], *where, "-o=json"))
            assert got["metadata"]["name"] == meta["name"]
            if obj["kind"] == "Deployment":
                assert got["spec"]["replicas"] == obj["spec"]["replicas"]
        # The Roles are what warmgate's ServiceAccount may do, as the API server sees it.
        for verb, what, want in [
            ("patch", ["deployments", "--subresource=scale", "-n", "render"], "yes"),
            ("watch", ["endpointslices.discovery.k8s.io", "-n", "render"], "yes"),
            ("create", ["leases.coordination.k8s.io", "-n", "warmgate"], "yes"),
            ("patch", ["deployments", "-n", "render"], "no"),  # the Deployment itself: no
            ("list", ["pods", "-n", "render"], "no"),
            ("list", ["deployments", "-n", "default"], "no"),
            ("list", ["secrets", "-n", "warmgate"], "no"),
        ]:
            answer = await k("auth", "can-i", verb, *what, "--as", ROUTER, check=False)
            assert answer.strip() == want, (verb, what)
    finally:
        await remove(k, manifest)
