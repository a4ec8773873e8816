"""The deploy/ kustomize tree as the cluster would receive it: built with ``kubectl kustomize``
(kustomize v5 inside kubectl), as Flux's kustomize-controller builds it."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from functools import cache
from typing import Any

import pytest
import yaml

from tests.helpers import ROOT

DEPLOY = ROOT / "deploy"
Obj = dict[str, Any]

CRD_KINDS = {
    ("gateway.networking.k8s.io/v1", "Gateway"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
    ("source.toolkit.fluxcd.io/v1", "GitRepository"),
    ("kustomize.toolkit.fluxcd.io/v1", "Kustomization"),
}
"""Kinds defined by CRDs (Gateway API, Flux): no Kubernetes schema knows them."""


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        message = "kubectl not found (it builds the kustomize tree)"
        if os.environ.get("WARMGATE_KUBE_REQUIRED"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return found


@cache
def _build(path: str) -> tuple[Obj, ...]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise AssertionError(f"kubectl kustomize deploy/{path} failed:\n{out.stderr}")
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def build(path: str) -> list[Obj]:
    """The objects ``deploy/<path>`` renders to (deep copies: callers may change them)."""
    return copy.deepcopy(list(_build(path)))


def find(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    hits = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]


Rule = tuple[str, str, tuple[str, ...]]
"""(API group, resource, resourceNames: empty for every object)."""


def role_rules(role: Obj) -> dict[Rule, list[str]]:
    """What a Role allows, rule by rule flattened: (group, resource, names) -> sorted verbs."""
    rules: dict[Rule, list[str]] = {}
    for rule in role["rules"]:
        names = tuple(sorted(rule.get("resourceNames") or ()))
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs = rules.setdefault((group, resource, names), [])
                verbs[:] = sorted({*verbs, *rule["verbs"]})
    return rules


def selects(selector: Obj, labels: Obj) -> bool:
    """A label selector (matchLabels only, as deploy/ writes them) selects these labels."""
    assert set(selector) <= {"matchLabels"}, selector
    return dict(selector.get("matchLabels") or {}).items() <= dict(labels).items()


def router_rbac(namespaces: dict[str, str]) -> list[Obj]:
    """deploy/'s ServiceAccount, Roles and RoleBindings, moved into other namespaces
    (``{"render": ..., "warmgate": ...}``), so a test can run warmgate with exactly them."""
    out = []
    for obj in build("base"):
        if obj["kind"] not in ("ServiceAccount", "Role", "RoleBinding"):
            continue
        obj["metadata"]["namespace"] = namespaces[obj["metadata"]["namespace"]]
        for subject in obj.get("subjects") or ():
            subject["namespace"] = namespaces[subject["namespace"]]
        obj["metadata"].get("labels", {}).pop("app.kubernetes.io/part-of", None)
        out.append(obj)
    return out
