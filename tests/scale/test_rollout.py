"""Rollouts followed, never made (router/scale/rollout.py, backends/kubernetes/observe.py): a
new pod template is told as declared against what runs; verified once every pod runs it and
the target is ready through its readiness; a target at zero is verified at its next cold start;
one that does not converge within scaling.rollout_timeout is told once and counted. The
Deployment and pods are the JSON the API server serves; time is the loop's (looptime)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from backends.base import Observation
from backends.kubernetes.observe import rollout
from router.scale.rollout import RolloutWatch
from router.scale.state import Phase, TargetState


def deployment(image: str, replicas: int, updated: int, generation: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "spec": {
            "replicas": replicas,
            "template": {"spec": {"containers": [{"name": "engine", "image": image}]}},
        },
        "status": {"observedGeneration": generation, "updatedReplicas": updated},
    }


def pod(image: str, ready: bool = True) -> dict[str, Any]:
    return {
        "spec": {"containers": [{"name": "engine", "image": image}]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_the_deployment_tells_declared_against_running() -> None:
    r = rollout(
        deployment("comfy:2", 2, 1), [pod("comfy:1"), pod("comfy:2"), pod("comfy:2", False)]
    )
    assert r is not None
    assert (r.declared, r.running, r.ready, r.replicas, r.settled) == (
        "comfy:2", "comfy:1 | comfy:2", 1, 2, False,
    )  # fmt: skip
    done = rollout(deployment("comfy:2", 2, 2), [pod("comfy:2"), pod("comfy:2")])
    assert done is not None and done.settled and done.running == "comfy:2"
    unseen = rollout(
        deployment("comfy:2", 1, 1) | {"status": {"observedGeneration": 1}}, [pod("comfy:2")]
    )
    assert unseen is not None and not unseen.settled, "the controller has not seen it yet"
    assert rollout(None, []) is None


class Follow:
    def __init__(self, timeout: float = 600.0) -> None:
        loop = asyncio.get_running_loop()
        self.registry = CollectorRegistry()
        self.counter = Counter("rollout_failures", "", ["target"], registry=self.registry)
        self.watch = RolloutWatch("comfy", loop, timeout, self.counter.labels("comfy"), "/readyz")
        self.said: list[str] = []
        self.watch.listeners.append(self.said.append)
        self.state = TargetState(Phase.COLD, loop.time())

    def see(self, dep: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        self.watch.observed(Observation(running=True, rollout=rollout(dep, pods)))

    def phase(self, phase: Phase) -> None:
        old, self.state = self.state, self.state.with_phase(phase, 0.0)
        self.watch.on_state(old, self.state)

    @property
    def failures(self) -> float:
        value = self.registry.get_sample_value("rollout_failures_total", {"target": "comfy"})
        return value or 0.0


async def test_a_new_image_is_told_and_verified_once_ready() -> None:
    f = Follow()
    f.phase(Phase.READY)
    f.see(deployment("comfy:1", 2, 2, 1), [pod("comfy:1"), pod("comfy:1")])
    assert f.said == [], "the first sight is a baseline"
    f.see(deployment("comfy:2", 2, 0), [pod("comfy:1"), pod("comfy:1")])
    f.see(deployment("comfy:2", 2, 1), [pod("comfy:1"), pod("comfy:2")])
    f.see(deployment("comfy:2", 2, 2), [pod("comfy:2"), pod("comfy:2")])
    assert f.said == [
        "rollout comfy: declared comfy:2, running comfy:1",
        "rollout comfy: verified: rollout complete, /readyz 200, 2 of 2 pods",
    ]
    assert f.failures == 0


async def test_at_zero_replicas_it_is_verified_at_the_next_cold_start() -> None:
    f = Follow()
    f.see(deployment("comfy:1", 0, 0, 1), [])
    f.see(deployment("comfy:2", 0, 0), [])
    assert f.said == [
        "rollout comfy: declared comfy:2, running comfy:1 (scaled to zero: verified at its "
        "next cold start)"
    ]
    f.phase(Phase.STARTING)
    f.see(deployment("comfy:2", 1, 1), [pod("comfy:2")])
    assert len(f.said) == 1, "pods ready, but not the target: its weights are not resident yet"
    f.phase(Phase.READY)
    assert f.said[-1] == "rollout comfy: verified: rollout complete, /readyz 200, 1 of 1 pods"


@pytest.mark.looptime
async def test_a_rollout_that_does_not_converge_is_told_and_counted() -> None:
    f = Follow(timeout=600.0)
    f.phase(Phase.READY)
    f.see(deployment("comfy:1", 1, 1, 1), [pod("comfy:1")])
    f.see(deployment("comfy:3", 1, 1), [pod("comfy:1"), pod("comfy:3", ready=False)])
    await asyncio.sleep(601)
    assert f.said[-1] == (
        "rollout comfy: not converged within 10m: declared comfy:3, running comfy:1, "
        "0 of 1 pods on it"
    )
    assert f.failures == 1
    f.see(deployment("comfy:3", 1, 1), [pod("comfy:3")])
    assert f.said[-1].endswith("verified: rollout complete (after the rollout timeout), "
                               "/readyz 200, 1 of 1 pods")  # fmt: skip
    assert f.failures == 1
    f.watch.close()
