"""Where warmgate keeps its state in a cluster, against the fake API twin (tests/kube/fake.py;
tests/kube/test_contract.py holds it to the real API server): a target's documents as an
annotation on its Deployment, the replicas' as keys of one ConfigMap; what cannot be read is
ignored with a warning, what cannot be written is a BackendError."""

from __future__ import annotations

import pytest

from backends.base import BackendError
from backends.kubernetes.api import CONFIGMAPS, DEPLOYMENTS
from backends.kubernetes.state import ConfigMapStore, DeploymentAnnotations
from tests.kube.fake import FakeCluster, everything_but


async def test_a_targets_documents_live_on_its_deployment(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = FakeCluster()
    cluster.create_deployment("render", "comfyui")
    api = cluster.client()

    def deployment() -> dict[str, object] | None:
        return cluster._objects.get(("apps/deployments", "render", "comfyui"))

    store = DeploymentAnnotations("render", "comfyui", lambda: api, deployment)
    assert await store.load("cold-start") is None
    await store.save("cold-start", {"version": 1, "starts": [8.2]})
    stored = await api.get(DEPLOYMENTS, "render", "comfyui")
    assert stored["metadata"]["annotations"] == {
        "warmgate.io/cold-start": '{"starts":[8.2],"version":1}'
    }
    assert stored["spec"]["replicas"] == 0  # nothing else changed
    assert await store.load("cold-start") == {"version": 1, "starts": [8.2]}
    assert await store.load_all("cold") == {"cold-start": {"version": 1, "starts": [8.2]}}
    await api.patch(
        DEPLOYMENTS, "render", "comfyui", {"metadata": {"annotations": {"warmgate.io/x": "{"}}}
    )
    assert await store.load("x") is None and "ignoring unreadable state" in caplog.text
    denied = cluster.client(everything_but("patch deployments"))
    refused = DeploymentAnnotations("render", "comfyui", lambda: denied, deployment)
    with pytest.raises(BackendError, match="forbidden"):
        await refused.save("cold-start", {"starts": []})
    away = DeploymentAnnotations("render", "comfyui", lambda: None, deployment)
    with pytest.raises(BackendError, match="not connected"):
        await away.save("cold-start", {"starts": []})


async def test_the_replicas_keep_one_key_each_in_a_configmap_made_on_first_write() -> None:
    cluster = FakeCluster()
    api = cluster.client()
    a = ConfigMapStore("warmgate", lambda: api)
    b = ConfigMapStore("warmgate", lambda: api)
    assert await a.load("budget.warmgate-a") is None  # no ConfigMap yet: nothing, no error
    await a.save("budget.warmgate-a", {"day": "2026-03-02", "spent": 1.5})
    await b.save("budget.warmgate-b", {"day": "2026-03-02", "spent": 0.5})
    configmap = await api.get(CONFIGMAPS, "warmgate", "warmgate-state")
    assert configmap["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "warmgate"}
    assert await b.load_all("budget.") == {
        "budget.warmgate-a": {"day": "2026-03-02", "spent": 1.5},
        "budget.warmgate-b": {"day": "2026-03-02", "spent": 0.5},
    }
    cluster.go_down()
    assert await a.load("budget.warmgate-a") is None  # away: a warning, nothing read
    with pytest.raises(BackendError, match="unreachable"):
        await a.save("budget.warmgate-a", {"day": "2026-03-02", "spent": 2.0})


async def test_an_annotation_over_the_size_limit_is_not_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The same door as a state file's (backends/documents.py): bounded, one JSON object."""
    from backends.documents import MAX_DOCUMENT

    cluster = FakeCluster()
    cluster.create_deployment("render", "comfyui")
    api = cluster.client()
    pad = "x" * MAX_DOCUMENT
    annotations = {"warmgate.io/big": f'{{"pad": "{pad}"}}', "warmgate.io/deep": "[" * 10**5}
    await api.patch(DEPLOYMENTS, "render", "comfyui", {"metadata": {"annotations": annotations}})

    def deployment() -> dict[str, object] | None:
        return cluster._objects.get(("apps/deployments", "render", "comfyui"))

    store = DeploymentAnnotations("render", "comfyui", lambda: api, deployment)
    assert await store.load("big") is None and "larger than" in caplog.text
    assert await store.load("deep") is None
    assert await store.load_all("") == {}
