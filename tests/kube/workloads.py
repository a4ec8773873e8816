"""Manifests for the real test cluster: a render Deployment whose pod is the sleepy test engine
(run by the test kubelet on its own 127.0.0.N address), and the Service that selects it."""

from __future__ import annotations

import sys
from typing import Any

from tests.helpers import ROOT

ENGINE_PORT = 8188


def deployment(name: str, container: dict[str, Any], *, replicas: int = 0) -> dict[str, Any]:
    """A Deployment of ``replicas`` pods of the one ``container``, selected by ``app: name``."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def engine_deployment(name: str, *, replicas: int = 0, load: float = 0.2) -> dict[str, Any]:
    container = {
        "name": "engine",
        "image": "local/sleepy-engine",
        "command": [sys.executable, "-m", "tests.sleepy_engine"],
        "args": ["--host", "{host}", "--port", "{port}", "--load", str(load)],
        "workingDir": str(ROOT),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 1},
    }
    return deployment(name, container, replicas=replicas)


def engine_service(name: str, target_port: int | str = "http") -> dict[str, Any]:
    """The Service on port 80 in front of ``name``'s pods (their port ``target_port``)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": "http", "port": 80, "targetPort": target_port}],
        },
    }
