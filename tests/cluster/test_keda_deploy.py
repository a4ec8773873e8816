"""deploy/keda/, the kustomize component that hands the render Deployments to KEDA, as
``kubectl kustomize`` renders it on top of a base."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_tree import kubectl
from tests.helpers import ROOT

KEDA = ROOT / "deploy" / "keda"
Obj = dict[str, Any]

MINIMAL_BASE = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: warmgate, namespace: warmgate, labels: {app.kubernetes.io/name: warmgate}}
spec:
  replicas: 2
  selector: {matchLabels: {app.kubernetes.io/name: warmgate}}
  template:
    metadata: {labels: {app.kubernetes.io/name: warmgate}}
    spec:
      containers:
        - name: warmgate
          image: warmgate
          ports: [{name: http, containerPort: 8080}, {name: admin, containerPort: 9090}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: comfyui, namespace: render}
spec:
  replicas: 0
  selector: {matchLabels: {app: comfyui}}
  template:
    metadata: {labels: {app: comfyui}}
    spec: {containers: [{name: comfyui, image: comfyui}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: wan2gp, namespace: render}
spec:
  replicas: 0
  selector: {matchLabels: {app: wan2gp}}
  template:
    metadata: {labels: {app: wan2gp}}
    spec: {containers: [{name: wan2gp, image: wan2gp}]}
"""


def render(tmp: Path, base: Path) -> list[Obj]:
    """An overlay of ``base`` with the component, as kustomize renders it."""
    overlay = tmp / "overlay"
    overlay.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base, overlay)],
        "components": [os.path.relpath(KEDA, overlay)],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    out = subprocess.run(
        [kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def minimal_base(tmp: Path) -> Path:
    base = tmp / "base"
    base.mkdir()
    (base / "objects.yaml").write_text(MINIMAL_BASE)
    (base / "kustomization.yaml").write_text("resources: [objects.yaml]\n")
    return base


def of_kind(objects: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def check_scaled_objects(objects: list[Obj], router_replicas: int) -> None:
    deployments = of_kind(objects, "Deployment")
    services = of_kind(objects, "Service")
    scaled = of_kind(objects, "ScaledObject")
    render = {n for n, d in deployments.items() if d["metadata"]["namespace"] == "render"}
    assert render and set(scaled) == render, "one ScaledObject per render Deployment"

    service = services["warmgate-keda"]
    (port,) = service["spec"]["ports"]
    address = f"warmgate-keda.{service['metadata']['namespace']}.svc.cluster.local:{port['port']}"
    for name, obj in scaled.items():
        spec = obj["spec"]
        assert obj["metadata"]["namespace"] == "render"
        assert spec["scaleTargetRef"]["name"] == name
        assert spec["minReplicaCount"] == 0, "scale from zero"
        assert spec["cooldownPeriod"] <= 60, "short: warmgate already waited idle_after"
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "external-push"
        assert trigger["metadata"] == {"scalerAddress": address, "target": name}

    router = deployments["warmgate"]
    assert (
        service["spec"]["selector"].items()
        <= router["spec"]["template"]["metadata"]["labels"].items()
    )
    (container,) = router["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named["scaler"] == 9091 and port["targetPort"] == "scaler"
    assert {"http", "admin"} <= set(named), "the base's ports are kept"
    # Several router replicas: the one KEDA's stream reaches answers for all of them.
    assert router["spec"]["replicas"] == router_replicas, "the base's replica count is kept"

    # KEDA's operator may reach the scaler port through a NetworkPolicy of its own (policies
    # add up: the base's keeps its rules for the other ports).
    policy = of_kind(objects, "NetworkPolicy")["warmgate-keda"]
    assert policy["metadata"]["namespace"] == router["metadata"]["namespace"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= router["spec"]["template"]["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": "scaler"}]
    (keda,) = rule["from"]
    assert keda["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}
    assert keda["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "keda-operator"}}


def test_the_component_hands_each_render_deployment_to_keda(tmp_path: Path) -> None:
    check_scaled_objects(render(tmp_path, minimal_base(tmp_path)), router_replicas=2)


def test_the_component_fits_the_deploy_base(tmp_path: Path) -> None:
    base = ROOT / "deploy" / "base"
    if not (base / "kustomization.yaml").is_file():
        pytest.skip("deploy/base is not there")
    objects = render(tmp_path, base)
    check_scaled_objects(objects, router_replicas=2)
    # With the base's NetworkPolicy, every port warmgate's pods serve has a rule.
    policies = of_kind(objects, "NetworkPolicy")
    assert set(policies) == {"warmgate", "warmgate-keda"}
    allowed = {
        p["port"] for o in policies.values() for r in o["spec"]["ingress"] for p in r["ports"]
    }
    (container,) = of_kind(objects, "Deployment")["warmgate"]["spec"]["template"]["spec"][
        "containers"
    ]
    assert allowed == {p["name"] for p in container["ports"]} == {"http", "admin", "scaler"}
