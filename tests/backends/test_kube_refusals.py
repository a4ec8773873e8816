"""A restarting API server's 401/403 is not a missing Role (backends.kubernetes.refusals):
within a short window of the first answer after a lost connection, or while /readyz is not
ready, it is retried as the API server being away; a steady one is the refusal it says. The
backend on the in-memory twin (tests/kube/fake.py), its clock fast-forwarded; the real API
server's case is tests/kube/test_restart_refusals_on_kube.py."""

from __future__ import annotations

import asyncio

import pytest

from backends.base import BackendError
from backends.kubernetes.api import DEPLOYMENTS, Forbidden, KubeApi, Unreachable
from backends.kubernetes.backend import KubernetesBackend
from backends.kubernetes.informer import Backoff
from backends.kubernetes.refusals import RESTART_WINDOW, Connection, SteadyRefusals, transient
from tests.backends.test_kubernetes_backend import NS, Recorder, seen, spec
from tests.kube.fake import FakeCluster, everything_but

pytestmark = pytest.mark.looptime


def test_the_rule() -> None:
    assert not transient(Connection(), 5.0), "never lost: a refusal is RBAC's"
    assert transient(Connection(lost_at=1.0), 100.0), "lost and no answer since"
    assert transient(Connection(1.0, 2.0), 2.0 + RESTART_WINDOW)
    assert not transient(Connection(1.0, 2.0), 2.1 + RESTART_WINDOW)
    assert transient(Connection(1.0, 2.0), 3.0, window=1.0)
    assert not transient(Connection(1.0, 2.0), 3.5, window=1.0)


class Readyz:
    def __init__(self) -> None:
        self.ready = True
        self.asked = 0

    async def __call__(self) -> bool:
        self.asked += 1
        return self.ready


def steady(cluster: FakeCluster, readyz: Readyz, allowed: set[str] | None = None) -> KubeApi:
    return SteadyRefusals(cluster.client(allowed), readyz)


async def test_a_refusal_right_after_the_api_server_came_back_is_transient() -> None:
    cluster, readyz = FakeCluster(), Readyz()
    cluster.create_deployment(NS, "comfyui")
    api = steady(cluster, readyz, everything_but("list deployments"))
    with pytest.raises(Forbidden):
        await api.list(DEPLOYMENTS, NS)  # never lost, /readyz ready: RBAC's
    assert readyz.asked == 1

    cluster.go_down()
    with pytest.raises(Unreachable):
        await api.list(DEPLOYMENTS, NS)
    cluster.come_back()
    with pytest.raises(Unreachable, match="the API server is starting"):
        await api.list(DEPLOYMENTS, NS)
    await asyncio.sleep(RESTART_WINDOW - 1)
    with pytest.raises(Unreachable):
        await api.list(DEPLOYMENTS, NS)
    await asyncio.sleep(2)
    with pytest.raises(Forbidden):
        await api.list(DEPLOYMENTS, NS)  # steady: answering for longer than the window


async def test_a_refusal_while_readyz_is_not_ready_is_transient() -> None:
    cluster, readyz = FakeCluster(), Readyz()
    cluster.create_deployment(NS, "comfyui")
    api = steady(cluster, readyz, everything_but("list deployments"))
    readyz.ready = False
    with pytest.raises(Unreachable, match="/readyz is not ready"):
        await api.list(DEPLOYMENTS, NS)
    readyz.ready = True
    with pytest.raises(Forbidden):
        await api.list(DEPLOYMENTS, NS)


async def test_a_watch_broken_by_a_restart_starts_the_window() -> None:
    cluster, readyz = FakeCluster(), Readyz()
    cluster.create_deployment(NS, "comfyui")
    grant = everything_but()
    api = steady(cluster, readyz, grant)
    listed = await api.list(DEPLOYMENTS, NS)
    async with api.watch(
        DEPLOYMENTS, NS, resource_version=listed.resource_version, timeout_seconds=60
    ) as events:
        cluster.scale(NS, "comfyui", 1)
        assert (await anext(events)).type == "MODIFIED"
        cluster.go_down()
        with pytest.raises(Unreachable):
            async for _ in events:
                pass
    cluster.come_back()
    grant.discard("patch deployments/scale")
    with pytest.raises(Unreachable, match="the API server is starting"):
        await api.patch_scale(NS, "comfyui", 1)
    assert readyz.asked == 0, "within the window /readyz is not asked"


async def test_a_scale_up_refused_by_a_starting_api_server_waits_and_then_happens() -> None:
    cluster, readyz = FakeCluster(), Readyz()
    cluster.create_deployment(NS, "comfyui")
    grant = everything_but()
    connected: list[KubeApi] = []

    async def connect() -> KubeApi:
        connected.append(steady(cluster, readyz, grant))
        return connected[-1]

    backend = KubernetesBackend(
        "comfyui",
        spec(),
        connect=connect,
        backoff=Backoff(initial=0.5, maximum=8.0, jitter=0.0),
        watch_timeout=60,
    )
    recorder = Recorder()
    await backend.open(recorder)
    try:
        cluster.go_down()
        await seen(recorder, lambda o: o.degraded is not None)
        cluster.come_back()
        grant.discard("patch deployments/scale")  # its authorizer not ready yet
        await backend.scale_up()  # no BackendError: retried
        pending = await seen(recorder, lambda o: "scale to 1 pending" in (o.degraded or ""))
        assert "the API server is starting" in (pending.degraded or "")
        assert cluster.replicas(NS, "comfyui") == 0
        grant.add("patch deployments/scale")
        await seen(recorder, lambda o: o.endpoints != ())
        assert cluster.replicas(NS, "comfyui") == 1
    finally:
        await backend.close()


async def test_a_steady_refusal_is_still_a_missing_role() -> None:
    cluster, readyz = FakeCluster(), Readyz()
    cluster.create_deployment(NS, "comfyui")

    async def connect() -> KubeApi:
        return steady(cluster, readyz, everything_but("patch deployments/scale"))

    backend = KubernetesBackend("comfyui", spec(), connect=connect)
    await backend.open(Recorder())
    try:
        with pytest.raises(BackendError, match="Grant the Role"):
            await backend.scale_up()
    finally:
        await backend.close()


async def test_the_starting_api_server_is_said_first_whatever_the_length_of_its_refusal() -> None:
    """The server's words are cut to one bounded line: warmgate's own come before them."""

    class Refusing:
        server = "https://127.0.0.1:6443"
        down = True

        async def list(self, *args: object, **kwargs: object) -> object:
            if self.down:
                raise Unreachable("connection refused")
            raise Forbidden("deployments.apps is forbidden: " + "x" * 600, status=403)

    inner, readyz = Refusing(), Readyz()
    api = SteadyRefusals(inner, readyz)  # type: ignore[arg-type]
    with pytest.raises(Unreachable):
        await api.list(DEPLOYMENTS, NS)
    inner.down = False
    with pytest.raises(Unreachable, match="the API server is starting"):
        await api.list(DEPLOYMENTS, NS)
