"""The Kubernetes backend against the in-memory twin of its API wrapper (tests/kube/fake.py,
held to the real server by tests/kube/test_contract.py), on a fast-forwarded loop clock:
outages, backoffs and half-hour idle windows pass in milliseconds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from backends.base import BackendError, Observation, RequestFacts
from backends.kubernetes.api import KubeApi
from backends.kubernetes.backend import KubernetesBackend
from backends.kubernetes.client import Access, resolve_access
from backends.kubernetes.informer import Backoff
from backends.specs import KubernetesSpec
from router.config import parse_config
from router.errors import ConfigError
from router.metrics import Metrics
from router.scale.lifecycle import Lifecycle
from router.scale.state import Phase, TargetState
from router.scale.targets import TargetRuntime
from tests.fakes import FakeEngine
from tests.kube.fake import FakeCluster, everything_but

pytestmark = pytest.mark.looptime

NS = "render"
GET = RequestFacts(method="GET", path="/", is_websocket=False, is_navigation=False)


def spec(**overrides: Any) -> KubernetesSpec:
    data = {"kind": "kubernetes", "namespace": NS, "deployment": "comfyui", "port": 8188}
    return KubernetesSpec.model_validate({**data, **overrides})


def connector(cluster: FakeCluster, allowed: set[str] | None = None) -> Callable[[], Any]:
    async def connect() -> KubeApi:
        return cluster.client(allowed)

    return connect


class Recorder:
    def __init__(self) -> None:
        self.seen: list[Observation] = []
        self.changed = asyncio.Event()

    def __call__(self, observation: Observation) -> None:
        self.seen.append(observation)
        self.changed.set()


async def seen(recorder: Recorder, predicate: Callable[[Observation], bool]) -> Observation:
    """Wait (on the backend's own reports, no polling) until an observation satisfies it."""
    async with asyncio.timeout(60):
        while not (recorder.seen and predicate(recorder.seen[-1])):
            recorder.changed.clear()
            await recorder.changed.wait()
    return recorder.seen[-1]


@asynccontextmanager
async def opened(
    cluster: FakeCluster, allowed: set[str] | None = None, **overrides: Any
) -> AsyncIterator[tuple[KubernetesBackend, Recorder]]:
    backend = KubernetesBackend(
        "comfyui",
        spec(**overrides),
        connect=connector(cluster, allowed),
        backoff=Backoff(initial=0.5, maximum=8.0, jitter=0.0),
        watch_timeout=60,
    )
    recorder = Recorder()
    await backend.open(recorder)
    try:
        yield backend, recorder
    finally:
        await backend.close()


# -- start ----------------------------------------------------------------------------------


async def test_open_lists_first_so_a_running_deployment_is_seen_at_once() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui", replicas=1)
    await asyncio.sleep(0.1)  # the fake pod turns ready
    (address,) = cluster.ready_addresses(NS, "comfyui")
    async with opened(cluster) as (backend, _):
        obs = backend.observe()
        assert obs.running and obs.endpoints == (f"http://{address}:8188",)
        assert obs.degraded is None and obs.failure is None


async def test_a_cold_deployment_is_seen_cold_and_nothing_is_scaled() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui")
    async with opened(cluster) as (backend, _):
        assert backend.observe() == Observation()
    assert not [c for c in cluster.calls if c.startswith("patch")]


async def test_endpointslices_are_read_in_the_version_the_server_serves() -> None:
    cluster = FakeCluster(endpointslice_versions=("v1beta1",))  # Kubernetes 1.20
    cluster.create_deployment(NS, "comfyui", replicas=1)
    await asyncio.sleep(0.1)
    async with opened(cluster) as (backend, _):
        assert len(backend.observe().endpoints) == 1


async def test_route_to_service_is_one_endpoint_once_a_pod_is_ready() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui", service="comfy-svc")
    async with opened(cluster, route_to="service", service="comfy-svc", service_port=80) as (
        backend,
        recorder,
    ):
        await backend.scale_up()
        await seen(recorder, lambda o: bool(o.endpoints))
        assert backend.observe().endpoints == ("http://comfy-svc.render.svc:80",)


@pytest.mark.parametrize(
    ("make", "owner"),
    [
        (lambda c: c.create_hpa(NS, "comfy-hpa", "comfyui"), "HorizontalPodAutoscaler comfy-hpa"),
        (lambda c: c.create_scaled_object(NS, "comfy-so", "comfyui"), "ScaledObject comfy-so"),
    ],
)
async def test_direct_mode_is_refused_next_to_another_owner_of_the_replicas(
    make: Callable[[FakeCluster], None], owner: str
) -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui")
    make(cluster)
    with pytest.raises(BackendError) as err:
        async with opened(cluster):
            pass
    assert owner in str(err.value) and "mode: direct refused" in str(err.value)


async def test_an_hpa_for_another_deployment_is_no_conflict() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui")
    cluster.create_hpa(NS, "other-hpa", "wan2gp")
    async with opened(cluster) as (backend, _):
        assert backend.observe().failure is None


async def test_keda_mode_watches_but_never_scales() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui")
    cluster.create_scaled_object(NS, "comfy-so", "comfyui")  # expected here: KEDA owns it
    async with opened(cluster, mode="keda") as (backend, recorder):
        await backend.scale_up()
        await backend.scale_down()
        assert cluster.replicas(NS, "comfyui") == 0
        cluster.scale(NS, "comfyui", 1)  # what KEDA does
        await seen(recorder, lambda o: bool(o.endpoints))
    assert not [c for c in cluster.calls if "scale" in c or "scaledobjects" in c]


async def test_missing_rbac_refuses_to_start_with_the_rule_to_add() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui")
    with pytest.raises(BackendError) as err:
        async with opened(cluster, allowed=everything_but("list deployments")):
            pass
    message = str(err.value)
    assert "refused warmgate's credentials" in message and "cannot list" in message
    assert "deploy/base/router/rbac.yaml" in message


async def test_a_missing_deployment_is_degraded_and_a_start_fails_clearly() -> None:
    cluster = FakeCluster()
    async with opened(cluster) as (backend, _):
        assert backend.observe().degraded == "deployment render/comfyui not found"
        with pytest.raises(BackendError, match="not found"):
            await backend.scale_up()
        assert not backend.observe().running


# -- scaling ----------------------------------------------------------------------------------


async def test_scale_up_patches_the_scale_and_the_pod_is_reported_on_its_watch_event() -> None:
    cluster = FakeCluster(pod_ready_after=3.0)
    cluster.create_deployment(NS, "comfyui")
    async with opened(cluster, max_replicas=2) as (backend, recorder):
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await backend.scale_up()
        assert cluster.replicas(NS, "comfyui") == 2
        assert backend.observe().running, "running as soon as asked"
        await seen(recorder, lambda o: len(o.endpoints) == 2)
        assert 3.0 <= loop.time() - t0 < 3.1, "released by the watch event, not a poll"
        patches = [c for c in cluster.calls if c.startswith("patch")]
        await backend.scale_up()  # already up: nothing patched
        assert [c for c in cluster.calls if c.startswith("patch")] == patches


async def test_scale_up_leaves_a_deployment_someone_scaled_up_alone() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui", replicas=3)
    async with opened(cluster) as (backend, _):
        await backend.scale_up()
        assert cluster.replicas(NS, "comfyui") == 3


async def test_scale_down_reads_as_stopped_at_once_and_stays_stopped() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui", replicas=1)
    await asyncio.sleep(0.1)
    async with opened(cluster) as (backend, recorder):
        assert backend.observe().running
        before = len(recorder.seen)
        await backend.scale_down()
        assert cluster.replicas(NS, "comfyui") == 0
        assert not backend.observe().running
        await asyncio.sleep(1)
        after = recorder.seen[before:]
        assert after and not any(o.running for o in after), "never seen running after the stop"
        assert backend.observe() == Observation()


async def test_a_scale_up_the_rbac_forbids_fails_with_a_clear_error() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui")
    allowed = everything_but("patch deployments/scale")
    async with opened(cluster, allowed=allowed) as (backend, _):
        with pytest.raises(BackendError) as err:
            await backend.scale_up()
        assert "cannot patch" in str(err.value) and "Role" in str(err.value)
        assert not backend.observe().running


async def test_someone_scaling_the_deployment_to_zero_is_seen() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui", replicas=1)
    await asyncio.sleep(0.1)
    async with opened(cluster) as (_, recorder):
        cluster.scale(NS, "comfyui", 0)
        await seen(recorder, lambda o: not o.running)


async def test_a_pod_that_disappears_leaves_the_endpoints_on_its_event() -> None:
    cluster = FakeCluster(pod_ready_after=2.0)
    cluster.create_deployment(NS, "comfyui", replicas=2)
    await asyncio.sleep(2.1)
    async with opened(cluster) as (backend, recorder):
        assert len(backend.observe().endpoints) == 2
        gone = cluster.delete_pod(NS, "comfyui", 0)
        await seen(recorder, lambda o: len(o.endpoints) == 1)
        assert gone not in backend.observe().endpoints[0]
        await seen(recorder, lambda o: len(o.endpoints) == 2)  # its replacement


# -- the API server away ----------------------------------------------------------------------


async def test_while_the_api_server_is_away_endpoints_stay_and_scaling_is_retried() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui", replicas=1)
    await asyncio.sleep(0.1)
    async with opened(cluster) as (backend, recorder):
        endpoints = backend.observe().endpoints
        lists = [c for c in cluster.calls if c.startswith("list deployments")]
        cluster.go_down()
        await seen(recorder, lambda o: o.degraded is not None)
        assert "cannot watch deployments.apps" in (backend.observe().degraded or "")
        assert backend.observe().endpoints == endpoints, "warm targets keep being served"

        await backend.scale_down()  # idle while away: asked, pending, retried
        obs = backend.observe()
        assert not obs.running and "scale to 0 pending" in (obs.degraded or "")
        await asyncio.sleep(120)
        patches = [c for c in cluster.calls if c == "patch deployments/scale"]
        assert 5 <= len(patches) <= 25, "retried with a capped backoff"
        assert cluster.replicas(NS, "comfyui") == 1

        cluster.come_back(restarted=True)
        await seen(recorder, lambda o: o == Observation())
        assert cluster.replicas(NS, "comfyui") == 0
        await asyncio.sleep(1)
        relists = [c for c in cluster.calls if c.startswith("list deployments")]
        assert len(relists) > len(lists), "410 Gone after the restart: listed again"


async def test_a_stop_with_a_deadline_is_given_up_at_it_and_never_lands_later() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui", replicas=1)
    await asyncio.sleep(0.1)
    async with opened(cluster) as (backend, _):
        loop = asyncio.get_running_loop()
        cluster.go_down()
        await backend.scale_down(deadline=loop.time() + 5)  # the others serve again then
        assert not backend.observe().running, "asked, pending"
        await asyncio.sleep(6)
        assert backend.observe().running, "given up: the Deployment as it is"
        assert "pending" not in (backend.observe().degraded or "")
        cluster.come_back(restarted=False)
        await asyncio.sleep(60)
        assert cluster.replicas(NS, "comfyui") == 1, "a given-up stop never lands"


async def test_a_scale_up_while_away_is_retried_and_wins_over_a_pending_stop() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui", replicas=1)
    await asyncio.sleep(0.1)
    async with opened(cluster) as (backend, recorder):
        cluster.go_down()
        await backend.scale_down()
        await asyncio.sleep(3)
        await backend.scale_up()  # a request came after the idle release
        assert backend.observe().running and backend.observe().endpoints
        await asyncio.sleep(30)
        cluster.come_back(restarted=False)
        await asyncio.sleep(30)
        assert cluster.replicas(NS, "comfyui") == 1, "the stop was superseded, never applied"
        await seen(recorder, lambda o: o.degraded is None)


async def test_a_pending_scale_up_lands_within_a_second_of_the_api_server_coming_back() -> None:
    # A person waits for it: neither the watches' backoff (up to its cap after a long outage)
    # nor the scale's own may hold it once the API server answers again.
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui", replicas=0)
    await asyncio.sleep(0.1)
    async with opened(cluster) as (backend, _):
        cluster.go_down()
        await asyncio.sleep(1)
        await backend.scale_up()
        assert "scale to 1 pending" in (backend.observe().degraded or "")
        await asyncio.sleep(50)  # the watches and the retry wait their capped 8 s
        cluster.come_back(restarted=True)
        for _ in range(30):  # 1.5 s of looptime
            if cluster.replicas(NS, "comfyui") == 1:
                break
            await asyncio.sleep(0.05)
        assert cluster.replicas(NS, "comfyui") == 1, "stored within a second or so"


async def test_starting_while_the_api_server_is_away_is_degraded_then_catches_up() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui", replicas=1)
    await asyncio.sleep(0.1)
    cluster.go_down()
    async with opened(cluster) as (backend, recorder):
        obs = backend.observe()
        assert not obs.running and "waiting for the API server" in (obs.degraded or "")
        cluster.come_back(restarted=False)
        await seen(recorder, lambda o: bool(o.endpoints))
        assert backend.observe().degraded is None
        assert recorder.seen[-1] == backend.observe()


async def test_watches_resume_from_their_version_after_a_short_outage() -> None:
    cluster = FakeCluster()
    cluster.create_deployment(NS, "comfyui")
    async with opened(cluster) as (_, recorder):
        cluster.go_down()
        await asyncio.sleep(5)
        cluster.come_back(restarted=False)
        cluster.scale(NS, "comfyui", 1)
        await seen(recorder, lambda o: bool(o.endpoints))
        relists = [c for c in cluster.calls if c.startswith("list deployments")]
        assert len(relists) == 1, "resumed from the last resourceVersion: no relist"


# -- with the lifecycle ----------------------------------------------------------------------


class Rig:
    def __init__(self, cluster: FakeCluster, idle_after: str = "30m") -> None:
        config = parse_config(
            {
                "targets": {
                    "comfyui": {
                        "routes": [{}],
                        "backend": {
                            "kind": "kubernetes",
                            "namespace": NS,
                            "deployment": "comfyui",
                            "port": 8188,
                        },
                        "scaling": {"idle_after": idle_after, "cold_start_timeout": "5m"},
                    }
                }
            }
        )
        target = config.targets["comfyui"]
        assert isinstance(target.backend, KubernetesSpec)
        self.cluster = cluster
        self.backend = KubernetesBackend(
            "comfyui", target.backend, connect=connector(cluster), watch_timeout=60
        )
        self.engine = FakeEngine()
        loop = asyncio.get_running_loop()
        self.runtime = TargetRuntime("comfyui", target, self.backend, self.engine, Metrics(), loop)
        self.lifecycle = Lifecycle(self.runtime)

    async def until(self, phase: Phase, limit: float = 3600) -> TargetState:
        async with asyncio.timeout(limit):
            return await self.runtime.cell.wait_for(lambda s: s.phase is phase)


@asynccontextmanager
async def rig(cluster: FakeCluster, **kw: Any) -> AsyncIterator[Rig]:
    r = Rig(cluster, **kw)
    await r.lifecycle.open()
    try:
        yield r
    finally:
        await r.lifecycle.close()


async def test_a_held_request_scales_from_zero_and_idle_scales_back() -> None:
    cluster = FakeCluster(pod_ready_after=20)
    cluster.create_deployment(NS, "comfyui")
    async with rig(cluster) as r:
        assert r.runtime.state.phase is Phase.COLD
        held = await r.runtime.acquire(GET)
        ready_at = asyncio.get_running_loop().time()
        assert held.cold and 20 <= held.waited < 21, "released on the EndpointSlice event"
        assert held.state.endpoints and cluster.replicas(NS, "comfyui") == 1
        await r.until(Phase.COLD)
        assert 1800 <= asyncio.get_running_loop().time() - ready_at < 1830
        assert cluster.replicas(NS, "comfyui") == 0


async def test_ready_endpoints_follow_the_pods() -> None:
    cluster = FakeCluster(pod_ready_after=1)
    cluster.create_deployment(NS, "comfyui", replicas=2)
    await asyncio.sleep(1.1)
    async with rig(cluster) as r:
        state = await r.until(Phase.READY)
        assert len(state.endpoints) == 2
        gone = cluster.delete_pod(NS, "comfyui", 0)
        await r.runtime.cell.wait_for(lambda s: len(s.endpoints) == 1)
        assert r.runtime.state.phase is Phase.READY
        assert all(gone not in e for e in r.runtime.state.endpoints)
        await r.runtime.cell.wait_for(lambda s: len(s.endpoints) == 2)
        for _ in range(2):
            cluster.delete_pod(NS, "comfyui", 0)
        await r.until(Phase.STARTING)  # none left: wait for the replacements
        state = await r.until(Phase.READY)
        assert len(state.endpoints) == 2


async def test_a_restart_adopts_a_busy_deployment_and_gives_it_a_full_idle_window() -> None:
    cluster = FakeCluster(pod_ready_after=0.1)
    cluster.create_deployment(NS, "comfyui", replicas=1)
    await asyncio.sleep(0.2)
    async with rig(cluster, idle_after="10m") as r:
        loop = asyncio.get_running_loop()
        assert r.runtime.state.phase is Phase.STARTING, "adopted during open, before serving"
        await r.until(Phase.READY)
        adopted = loop.time()
        await asyncio.sleep(540)
        assert cluster.replicas(NS, "comfyui") == 1
        await r.until(Phase.COLD)
        assert loop.time() - adopted >= 600
    patches = [c for c in cluster.calls if c == "patch deployments/scale"]
    assert patches == ["patch deployments/scale"], "only the idle release, never a restart"


async def test_a_deployment_someone_else_scaled_up_is_adopted() -> None:
    cluster = FakeCluster(pod_ready_after=0.1)
    cluster.create_deployment(NS, "comfyui")
    async with rig(cluster) as r:
        cluster.scale(NS, "comfyui", 1)
        await r.until(Phase.READY)


async def test_requests_go_to_the_endpoint_with_the_fewest_in_flight() -> None:
    cluster = FakeCluster()
    async with rig(cluster) as r:
        runtime = r.runtime
        state = TargetState(Phase.READY, 0.0, endpoints=("http://a:1", "http://b:1"))
        release = asyncio.Event()
        picked: list[str] = []

        async def long_request() -> None:
            picked.append(runtime.pick_endpoint(state))
            await release.wait()

        tasks = [asyncio.ensure_future(long_request()) for _ in range(3)]
        await asyncio.sleep(0)
        assert {picked.count("http://a:1"), picked.count("http://b:1")} == {1, 2}
        assert sum(runtime.endpoint_load.values()) == 3
        release.set()
        await asyncio.gather(*tasks)
        assert runtime.endpoint_load == {}
        runtime.endpoint_load["http://a:1"] = 5
        assert {runtime.pick_endpoint(state) for _ in range(4)} == {"http://b:1"}
        runtime.endpoint_load.clear()


# -- config and credentials -----------------------------------------------------------------


def kube_target(**backend: Any) -> dict[str, Any]:
    spec = {"kind": "kubernetes", "namespace": NS, "deployment": "comfyui", "port": 8188}
    return {"targets": {"t": {"routes": [{}], "backend": {**spec, **backend}}}}


def test_config_route_to_service_needs_a_service() -> None:
    with pytest.raises(ConfigError, match="route_to: service needs service"):
        parse_config(kube_target(route_to="service"))
    config = parse_config(kube_target(route_to="service", service="comfy"))
    assert config.targets["t"].backend.kind == "kubernetes"


def test_config_names_are_checked_and_the_kind_is_listed() -> None:
    with pytest.raises(ConfigError, match="expected a DNS label"):
        parse_config(kube_target(namespace="Render"))
    with pytest.raises(ConfigError, match="process, kubernetes"):
        parse_config(kube_target(kind="kube"))
    with pytest.raises(ConfigError, match="port"):
        parse_config({"targets": {"t": {"routes": [{}], "backend": {"kind": "kubernetes"}}}})


def test_credentials_in_cluster_when_a_token_is_mounted(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    access = resolve_access({**env, "KUBECONFIG": "/x"}, serviceaccount_dir=tmp_path)
    assert access == Access("in-cluster", host="https://10.0.0.1:443", serviceaccount_dir=tmp_path)


def test_credentials_from_kubeconfig_otherwise(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    access = resolve_access({**env, "KUBECONFIG": "/a:/b"}, serviceaccount_dir=tmp_path)
    assert access.kind == "kubeconfig" and access.kubeconfig == Path("/a")
    access = resolve_access({"HOME": "/home/me"}, serviceaccount_dir=tmp_path)
    assert access.kubeconfig == Path("/home/me/.kube/config")


# -- pure readings of the watched objects -----------------------------------------------------


def test_ready_addresses_follow_the_endpointslice_conditions() -> None:
    from backends.kubernetes.observe import endpoint_urls, ready_addresses

    def endpoint(address: str, **conditions: Any) -> dict[str, Any]:
        return {"addresses": [address], "conditions": conditions}

    slices = [
        {
            "addressType": "IPv4",
            "endpoints": [
                endpoint("10.0.0.10", ready=True),
                endpoint("10.0.0.9"),  # ready unknown: counts as ready
                endpoint("10.0.0.11", ready=False),
                endpoint("10.0.0.12", ready=True, terminating=True),
            ],
        },
        {"addressType": "IPv6", "endpoints": [endpoint("fd00::2", ready=True)]},
        {"addressType": "FQDN", "endpoints": [endpoint("engine.example.com", ready=True)]},
    ]
    addresses = ready_addresses(slices)
    assert addresses == ["10.0.0.9", "10.0.0.10", "fd00::2"]
    assert endpoint_urls(spec(), addresses) == (
        "http://10.0.0.9:8188",
        "http://10.0.0.10:8188",
        "http://[fd00::2]:8188",
    )


def test_a_replica_failure_is_reported_once_the_controller_saw_the_spec() -> None:
    from backends.kubernetes.observe import observe

    condition = {"type": "ReplicaFailure", "status": "True", "message": "exceeded quota: gpu"}
    deployment = {
        "metadata": {"name": "comfyui", "generation": 3},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 2, "conditions": [condition]},
    }
    assert observe(spec(), deployment, []).failure is None, "stale: from before the scale-up"
    deployment["status"]["observedGeneration"] = 3
    assert observe(spec(), deployment, []).failure == "cannot create pods: exceeded quota: gpu"
    assert observe(spec(), deployment, [], intent=0).failure is None, "not asked to run"
