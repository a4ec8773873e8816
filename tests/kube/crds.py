"""What the API server serves, and deploy/'s objects as it can take them; the upstream CRDs of
the kinds deploy/ uses that Kubernetes does not build in (Gateway API,
KEDA, the Prometheus Operator, Flux), and the stand-in DRA DeviceClass: shared/crds beside the
repository (its README says where each file comes from), or ``$WARMGATE_CRDS``."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from tests.helpers import ROOT

from .cluster import KubeCluster
from .flags import pdb_api_version

CRDS = Path(os.environ.get("WARMGATE_CRDS") or ROOT.parent / "shared" / "crds")
DEVICE_CLASS = "deviceclass-gpu.nvidia.com.yaml"
DRA = "resource.k8s.io/v1"
Obj = dict[str, Any]


class Runs(Protocol):
    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> str: ...

    def said(self, *args: str) -> str: ...


def served_versions(cluster: KubeCluster) -> set[str]:
    """Every ``group/version`` the API server serves (``v1`` for the core group)."""
    status, core = cluster.request("GET", "/api")
    assert status == 200, core
    status, groups = cluster.request("GET", "/apis")
    assert status == 200, groups
    return set(core["versions"]) | {
        v["groupVersion"] for g in groups["groups"] for v in g["versions"]
    }


def install_crds(cluster: KubeCluster, kubectl: Runs) -> dict[str, str]:
    """Create each CRD (as its project ships it: not validated by kubectl), wait until they are
    served, and the DeviceClass where DRA is. Returns the CRDs the server refused, by the
    ``group/version Kind``s they define, with its words: an old server cannot take some of the
    current upstream schemas (1.20 reads a ``default: ""`` as null and refuses it)."""
    if not CRDS.is_dir():
        message = f"no CRDs at {CRDS} (shared/crds beside the repository, or WARMGATE_CRDS)"
        if os.environ.get("WARMGATE_KUBE_REQUIRED"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    refused: dict[str, str] = {}
    for path in sorted(CRDS.glob("*.yaml")):
        if path.name == DEVICE_CLASS:
            continue
        said = kubectl.said("create", "--validate=false", "-f", str(path))
        if "created" in said or "AlreadyExists" in said:
            continue
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            refused[f"{group}/{version['name']} {kind}"] = said.strip().splitlines()[0]
    kubectl.run("wait", "--for=condition=Established", "crd", "--all", "--timeout=120s")
    if DRA in served_versions(cluster):
        kubectl.run("apply", "-f", str(CRDS / DEVICE_CLASS))
    return refused


def as_served(
    objects: list[Obj], served: set[str], refused: Collection[str] = ()
) -> tuple[list[Obj], list[str]]:
    """The objects in the versions the server serves, and the ones it cannot take (named):
    those of a version it does not serve, or of a ``group/version Kind`` in ``refused``."""
    sent, left_out = [], []
    dra = DRA in served
    for obj in objects:
        if obj["kind"] == "PodDisruptionBudget":
            obj["apiVersion"] = pdb_api_version(served)
        if obj["apiVersion"] not in served or f"{obj['apiVersion']} {obj['kind']}" in refused:
            left_out.append(f"{obj['apiVersion']} {obj['kind']} {obj['metadata']['name']}")
            continue
        pod = obj.get("spec", {}).get("template", {}).get("spec")
        if not dra and obj["kind"] == "Deployment" and pod is not None:
            if pod.pop("resourceClaims", None) is not None:
                left_out.append(f"the resourceClaims of Deployment {obj['metadata']['name']}")
            for container in pod["containers"]:
                container.get("resources", {}).pop("claims", None)
        sent.append(obj)
    return sent, left_out
