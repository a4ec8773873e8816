"""``mode: keda`` against the real API server and controllers: warmgate is the external-push
scaler of a real render Deployment, a client that behaves as KEDA does (tests/keda_client.py)
listens to it and scales the Deployment through the real scale subresource, as KEDA's operator
would, and warmgate itself never scales it: its ServiceAccount may not even try (docs/keda.md)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from router.scale.deadline import SLACK
from router.scale.state import Phase
from tests.helpers import warmgate
from tests.keda_client import FakeKeda

from .test_warmgate_on_kube import Lab, _none, eventually, get, phase, readyz
from .test_warmgate_on_kube import lab as lab  # the fixture: a namespace, RBAC, the Deployment
from .workloads import ENGINE_PORT

IDLE_AFTER = 2.0
COOLDOWN = 3.0
"""KEDA's cooldownPeriod here: long enough that the test sees ``draining`` before it ends."""


async def forbid_scaling(lab: Lab) -> None:
    """deploy/'s Role without ``patch`` on deployments/scale, the Role docs/keda.md says
    ``mode: keda`` needs. A scale warmgate tried would be refused, and seen: a failed cold start
    (the request's status) or a scale pending on /readyz."""
    rbac = client.RbacAuthorizationV1Api(lab.admin)
    narrowed = 0
    for role in (await rbac.list_namespaced_role(lab.namespace)).items:
        rules = [r for r in role.rules if "deployments/scale" in (r.resources or ())]
        for rule in rules:
            rule.verbs = [verb for verb in rule.verbs if verb != "patch"]
            narrowed += 1
        if rules:
            await rbac.replace_namespaced_role(role.metadata.name, lab.namespace, role)
    assert narrowed, "deploy/'s Role grants deployments/scale"
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{lab.namespace}:warmgate",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{lab.namespace}"],
            resource_attributes=client.V1ResourceAttributes(
                namespace=lab.namespace,
                verb="patch",
                group="apps",
                resource="deployments",
                subresource="scale",
                name="engine",
            ),
        )
    )
    authz = client.AuthorizationV1Api(lab.admin)

    async def refused() -> bool:  # RBAC's caches catch up within moments
        return not (await authz.create_subject_access_review(review)).status.allowed

    await eventually(refused, within=10)


def keda_config(lab: Lab) -> dict[str, Any]:
    config = lab.config(idle_after=f"{IDLE_AFTER:g}s")
    config["targets"]["t"]["backend"]["mode"] = "keda"
    return {**config, "scaler_listen": "127.0.0.1:0"}


@dataclass
class KedaOperator:
    """What KEDA's operator does with each scale FakeKeda decides: a patch of
    ``deployments/engine/scale`` through the real API, as the admin, in the order asked."""

    lab: Lab
    patched: list[int] = field(default_factory=list)
    """``spec.replicas`` of the Scale each patch returned."""
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __call__(self, replicas: int) -> None:
        """FakeKeda's (synchronous) ``scale`` callback."""
        self._tasks.append(asyncio.get_running_loop().create_task(self._patch(replicas)))

    async def _patch(self, replicas: int) -> None:
        async with self._lock:  # a lock's waiters go in order: the patches land as decided
            body = {"spec": {"replicas": replicas}}
            apps, namespace = self.lab.apps, self.lab.namespace
            scale = await apps.patch_namespaced_deployment_scale("engine", namespace, body)
            self.patched.append(int(scale.spec.replicas or 0))

    async def settled(self) -> list[int]:
        """Every patch asked so far has landed (a failed one raises here)."""
        await asyncio.gather(*self._tasks)
        return self.patched

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def test_keda_wakes_the_real_deployment_and_warmgate_never_scales_it(lab: Lab) -> None:
    await forbid_scaling(lab)
    generation = await lab.generation()
    operator = KedaOperator(lab)
    async with warmgate(keda_config(lab)) as wg, aiohttp.ClientSession() as http:
        runtime, loop = wg.runtime(), asyncio.get_running_loop()
        held_at: list[float] = []
        runtime.on_first_hold.append(lambda: held_at.append(loop.time()))
        address = f"127.0.0.1:{wg.server.scaler_port}"
        try:
            async with FakeKeda(address, "t", cooldown=COOLDOWN, scale=operator) as keda:
                assert keda.active is False and runtime.state.phase is Phase.COLD
                assert await lab.replicas() == 0

                # A request for the cold target is held; KEDA hears ``active`` at once.
                request = loop.create_task(get(http, wg.url + "/hello"))
                pushed_at, active = await keda.next_push()
                assert active
                # Pushed on the hold itself (a few ms), not at a poll (KEDA's default interval
                # is 30 s). The bound is loose, as in tests/cluster/test_keda_scaler.py: a shared
                # machine.
                delay = pushed_at - held_at[0]
                assert delay < 1.0, f"pushed {1000 * delay:.0f} ms after the hold, not at once"

                # KEDA scales the Deployment; the held request goes out once the pod is ready.
                status, body, cold = await request
                assert status == 200 and body.startswith("pid ")
                assert cold is not None and float(cold) > 0, "held through the cold start"
                assert await operator.settled() == [1]
                (pod,) = await lab.pods()
                assert runtime.state.endpoints == (f"http://{pod.status.pod_ip}:{ENGINE_PORT}",)

                # Idle for idle_after: warmgate commits the release and says ``inactive``,
                # never sooner, and waits in draining for KEDA to take the replica away.
                released_at, active = await keda.next_push(within=30)
                assert not active
                finished = runtime.activity.last_request
                assert released_at >= finished + IDLE_AFTER - SLACK, "only after idle_after"
                state = runtime.state
                assert state.phase is Phase.DRAINING and state.stopping, state

                # KEDA's cooldown passes: it scales to 0, and the target is cold.
                await phase(wg, Phase.COLD, within=30)
                assert "KEDA" in runtime.state.reason
                assert await operator.settled() == [1, 0]
                assert await lab.replicas() == 0
                await eventually(lambda: _none(lab.pods()))

                # A new request wakes it again, through KEDA.
                status, _, cold = await get(http, wg.url + "/again")
                assert status == 200 and cold is not None and float(cold) > 0
                assert await operator.settled() == [1, 0, 1]
                pushes = [value for _, value in keda.pushes]
                assert pushes[:4] == [False, True, False, True], "one push per change"
                ready = await readyz(wg)
                assert (ready["code"], ready["status"]) == (200, "ready"), ready
        finally:
            await operator.close()

    # Only KEDA scaled: its three patches each changed spec.replicas (one generation each),
    # and nothing else changed the Deployment.
    assert await lab.generation() == generation + 3
