"""Several warmgate replicas against the real API server and controllers: warmgate itself runs
as the pods of a Deployment (the test kubelet runs each as a local ``warmgate serve`` process on
its own 127.0.0.N address), finds the others through the EndpointSlices the real controller
publishes for its headless Service, and elects a leader with a real ``coordination.k8s.io/v1``
Lease, with exactly deploy/'s RBAC. Traffic on one replica keeps the target; the release
happens once, when all are idle; killing the leader mid-idle-window hands over; killing a
replica with requests in flight loses only its own connections; in KEDA mode the replica KEDA
is connected to answers for all of them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client, watch

from tests.helpers import ROOT
from tests.keda_client import FakeKeda

from .fixtures import (  # noqa: F401 - pytest fixtures
    kube_client_fixture,
    kube_cluster_fixture,
    kube_namespace_fixture,
    kubelet_fixture,
)
from .kubelet import TestKubelet
from .test_warmgate_on_kube import Lab, eventually
from .test_warmgate_on_kube import lab as lab

ADMIN_PORT, PUBLIC_PORT, SCALER_PORT = 9090, 8080, 9091
TIMING = {
    "lease_duration": "3s",
    "renew_interval": "1s",
    "poll_interval": "500ms",
    "peer_grace": "2s",
    "fence_timeout": "5s",
}


def replicas_config(
    lab: Lab, *, idle_after: str, mode: str = "direct", **timing: str
) -> dict[str, Any]:
    config = lab.config(idle_after=idle_after)
    config["targets"]["t"]["backend"]["mode"] = mode
    config["replicas"] = {
        "namespace": lab.namespace,
        "service": "warmgate-peers",
        "port": "admin",
        "token_file": str(ROOT / "tests" / "replicas-token"),  # the secret they share
        **TIMING,
        **timing,
    }
    if mode == "keda":
        config["scaler_listen"] = f"0.0.0.0:{SCALER_PORT}"
    return config


def warmgate_deployment(config_file: Path, replicas: int, keda: bool) -> dict[str, Any]:
    labels = {"app": "warmgate"}
    container = {
        "name": "warmgate",
        "image": "local/warmgate",
        "command": [sys.executable, "-m", "router", "serve", "--config", str(config_file)],
        "args": ["--listen", f"{{host}}:{PUBLIC_PORT}", "--admin-listen", "{host}:{port}"]
        + (["--scaler-listen", f"{{host}}:{SCALER_PORT}"] if keda else []),
        "workingDir": str(ROOT),
        "ports": [
            {"name": "admin", "containerPort": ADMIN_PORT},
            {"name": "http", "containerPort": PUBLIC_PORT},
        ],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "admin"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "warmgate", "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


PEERS_SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "warmgate-peers"},
    "spec": {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {"app": "warmgate"},
        "ports": [{"name": "admin", "port": ADMIN_PORT, "targetPort": "admin"}],
    },
}


@dataclass
class Replica:
    name: str
    host: str
    pid: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{PUBLIC_PORT}"

    @property
    def admin(self) -> str:
        return f"http://{self.host}:{ADMIN_PORT}"


@dataclass
class Fleet:
    """warmgate's replicas, and a record of every replica count the engine Deployment had."""

    lab: Lab
    kubelet: TestKubelet
    http: aiohttp.ClientSession
    scales: list[int] = field(default_factory=list)

    @property
    def coordination(self) -> client.CoordinationV1Api:
        return client.CoordinationV1Api(self.lab.admin)

    def replicas(self) -> list[Replica]:
        """The warmgate pods running now (their processes alive)."""
        out = []
        for w in self.kubelet.workloads.values():
            meta = w.pod["metadata"]
            ours = meta["namespace"] == self.lab.namespace and meta["name"].startswith("warmgate-")
            if ours and w.proc is not None and w.proc.returncode is None:
                out.append(Replica(meta["name"], w.host, w.proc.pid))
        return sorted(out, key=lambda r: r.name)

    async def leader(self) -> str | None:
        try:
            lease = await self.coordination.read_namespaced_lease(
                "warmgate-leader", self.lab.namespace
            )
        except client.ApiException:
            return None
        return lease.spec.holder_identity or None

    async def json(self, url: str) -> Any:
        async with self.http.get(url) as resp:
            return await resp.json()

    async def answering(self, n: int) -> list[Replica]:
        """Wait until ``n`` replicas answer and see each other, with a leader elected."""

        async def ready() -> bool:
            live = self.replicas()
            if len(live) != n or await self.leader() not in {r.name for r in live}:
                return False
            for r in live:
                try:
                    view = await self.json(r.admin + "/replicas")
                except (aiohttp.ClientError, OSError):
                    return False
                peers = [p for p in view["peers"] if p["listed"] and p["reachable"]]
                if len(peers) != n - 1:
                    return False
            return True

        await eventually(ready, within=60)
        return self.replicas()

    async def phase(self, replica: Replica) -> str:
        return str((await self.json(replica.admin + "/targets"))["t"]["phase"])

    async def releases(self, replica: Replica) -> float:
        """The releases a replica counted; a pod still starting (the Deployment's replacement
        for one killed) is waited for: it counted none before it listens."""
        text = ""

        async def answered() -> bool:
            nonlocal text
            try:
                async with self.http.get(replica.admin + "/metrics") as resp:
                    text = await resp.text()
            except aiohttp.ClientConnectionError:
                return False
            return True

        await eventually(answered, within=60)
        found = re.search(r'^warmgate_idle_releases_total\{target="t"\} (\S+)$', text, re.M)
        return float(found.group(1)) if found else 0.0

    def kill(self, replica: Replica) -> None:
        """SIGKILL: no drain, no Lease handed over."""
        os.killpg(replica.pid, signal.SIGKILL)

    @property
    def downs(self) -> int:
        """Scale-downs to zero the engine Deployment went through."""
        return sum(1 for a, b in zip(self.scales, self.scales[1:], strict=False) if a > 0 == b)


async def _record_scales(fleet: Fleet) -> None:
    apps = client.AppsV1Api(fleet.lab.admin)
    while True:
        with contextlib.suppress(asyncio.TimeoutError, aiohttp.ClientError):
            async with watch.Watch().stream(
                apps.list_namespaced_deployment,
                fleet.lab.namespace,
                field_selector="metadata.name=engine",
                timeout_seconds=60,
            ) as events:
                async for event in events:
                    replicas = int(event["object"].spec.replicas or 0)
                    if not fleet.scales or fleet.scales[-1] != replicas:
                        fleet.scales.append(replicas)


@contextlib.asynccontextmanager
async def fleet_of(
    lab: Lab, kubelet: TestKubelet, tmp_path: Path, n: int, config: dict[str, Any]
) -> AsyncIterator[tuple[Fleet, list[Replica]]]:
    config_file = tmp_path / "warmgate.yaml"
    config_file.write_text(yaml.safe_dump(config))
    core, apps = client.CoreV1Api(lab.admin), client.AppsV1Api(lab.admin)
    await core.create_namespaced_service(lab.namespace, PEERS_SERVICE)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        fleet = Fleet(lab, kubelet, http)
        recorder = asyncio.create_task(_record_scales(fleet))
        await apps.create_namespaced_deployment(
            lab.namespace, warmgate_deployment(config_file, n, "scaler_listen" in config)
        )
        try:
            yield fleet, await fleet.answering(n)
        finally:
            recorder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await recorder
            await apps.delete_namespaced_deployment("warmgate", lab.namespace)
            for replica in fleet.replicas():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(replica.pid, signal.SIGTERM)


async def get(fleet: Fleet, url: str) -> int:
    async with fleet.http.get(url) as resp:
        await resp.read()
        return resp.status


async def test_traffic_on_one_replica_keeps_the_target_and_the_release_happens_once(
    lab: Lab, kubelet: TestKubelet, tmp_path: Path
) -> None:
    config = replicas_config(lab, idle_after="3s")
    async with fleet_of(lab, kubelet, tmp_path, 2, config) as (fleet, replicas):
        leader = await fleet.leader()
        (other,) = [r for r in replicas if r.name != leader]
        assert await get(fleet, other.url + "/wake") == 200  # a non-leader scales 0 -> 1
        assert await lab.replicas() == 1
        for _ in range(10):  # 10 s of traffic on the non-leader only: over three idle windows
            assert await get(fleet, other.url + "/slow?s=0.2") == 200
            await asyncio.sleep(0.8)
        assert await lab.replicas() == 1, "the leader saw the other replica's traffic"
        assert fleet.downs == 0
        view = await fleet.json(next(r for r in replicas if r.name == leader).admin + "/replicas")
        assert view["leader"] is True

        await eventually(lambda: _at_zero(lab), within=30)  # idle everywhere: released
        await asyncio.sleep(2)  # time for a second, wrong, release to show
        assert fleet.downs == 1
        releases = [await fleet.releases(r) for r in replicas]
        assert sorted(releases) == [0.0, 1.0], "released once, by the leader"
        assert [await fleet.phase(r) for r in replicas] == ["cold", "cold"]

        assert await get(fleet, other.url + "/again") == 200  # and woken again from either
        assert await lab.replicas() == 1


async def _at_zero(lab: Lab) -> bool:
    return await lab.replicas() == 0


async def test_killing_the_leader_mid_idle_window_hands_over_and_the_release_happens_once(
    lab: Lab, kubelet: TestKubelet, tmp_path: Path
) -> None:
    config = replicas_config(lab, idle_after="4s")
    async with fleet_of(lab, kubelet, tmp_path, 3, config) as (fleet, replicas):
        leader = await fleet.leader()
        dead = next(r for r in replicas if r.name == leader)
        survivors = [r for r in replicas if r is not dead]
        assert await get(fleet, survivors[0].url + "/wake") == 200
        assert await get(fleet, dead.url + "/also") == 200  # the leader saw traffic too
        await asyncio.sleep(1.5)  # mid idle window
        fleet.kill(dead)

        async def handed_over() -> bool:
            return await fleet.leader() in {r.name for r in survivors}

        await eventually(handed_over, within=20)
        await eventually(lambda: _at_zero(lab), within=45)
        await asyncio.sleep(2)
        assert fleet.downs == 1, f"released exactly once, got replica counts {fleet.scales}"
        live = fleet.replicas()  # the survivors and the Deployment's replacement pod
        assert sum([await fleet.releases(r) for r in live]) == 1.0


async def test_killing_a_replica_with_requests_in_flight_loses_only_its_connections(
    lab: Lab, kubelet: TestKubelet, tmp_path: Path
) -> None:
    config = replicas_config(lab, idle_after="30s")
    async with fleet_of(lab, kubelet, tmp_path, 3, config) as (fleet, replicas):
        leader = await fleet.leader()
        victim = next(r for r in replicas if r.name != leader)
        others = [r for r in replicas if r is not victim]
        assert await get(fleet, others[0].url + "/wake") == 200

        async def slow(replica: Replica) -> int | str:
            try:
                return await get(fleet, replica.url + "/slow?s=3")
            except (aiohttp.ClientError, OSError) as exc:
                return type(exc).__name__

        calls = [asyncio.create_task(slow(r)) for r in [victim, *others] for _ in range(4)]
        await asyncio.sleep(1.0)  # all twelve in flight
        fleet.kill(victim)
        results = await asyncio.gather(*calls)
        lost, kept = results[:4], results[4:]
        assert all(r != 200 for r in lost), lost
        assert kept == [200] * 8, kept
        assert await lab.replicas() == 1 and fleet.downs == 0
        for r in others:
            assert await fleet.phase(r) == "ready"


async def test_in_keda_mode_the_connected_replica_answers_for_all(
    lab: Lab, kubelet: TestKubelet, tmp_path: Path
) -> None:
    # The others are read every 8 s; a first hold is pushed to them at once.
    config = replicas_config(lab, idle_after="3s", mode="keda", poll_interval="8s")
    async with fleet_of(lab, kubelet, tmp_path, 2, config) as (fleet, replicas):
        connected, other = replicas
        apps = client.AppsV1Api(lab.admin)
        scaled: list[asyncio.Task[Any]] = []

        def scale(n: int) -> None:  # what KEDA does with its answer
            body = {"spec": {"replicas": n}}
            scaled.append(
                asyncio.create_task(
                    apps.patch_namespaced_deployment_scale("engine", lab.namespace, body)
                )
            )

        address = f"{connected.host}:{SCALER_PORT}"
        async with FakeKeda(address, "t", polling_interval=0.2, cooldown=1.0, scale=scale) as keda:
            assert keda.pushes[-1][1] is False
            loop = asyncio.get_running_loop()
            began = loop.time()
            held = asyncio.create_task(get(fleet, other.url + "/held-on-the-other"))
            async with asyncio.timeout(30):
                while not keda.pushes[-1][1]:
                    await keda.next_push(within=30)
            heard = keda.pushes[-1][0] - began
            assert heard < 4.0, f"active after {heard:.2f}s: pushed, not read at the next poll"
            assert await held == 200, "KEDA scaled it and the held request went out"
            assert await lab.replicas() == 1
            async with asyncio.timeout(40):  # idle on both: inactive, and KEDA scales to 0
                while keda.pushes[-1][1]:
                    await keda.next_push(within=40)
            await eventually(lambda: _at_zero(lab), within=30)
            await asyncio.gather(*scaled)
