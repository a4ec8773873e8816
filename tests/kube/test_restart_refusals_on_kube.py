"""A refusal from an API server that has just come back is not a missing Role.

Current Kubernetes answers 401/403 for a moment after it starts, before its authorizer has its
caches. Here the real API server is restarted with warmgate's RoleBinding taken away, so the
first answers after the restart are real 403s; a request held meanwhile must wait (the
scale-up retried, reported pending) and be answered once the binding is back, not fail with a
missing Role. A steady refusal, from a server that never went away, still is one
(test_warmgate_on_kube.py's forbidden action)."""

from __future__ import annotations

import asyncio
import copy

import aiohttp
from kubernetes_asyncio import client

from router.scale.state import Phase
from tests.deploy_tree import router_rbac
from tests.helpers import warmgate

from .test_warmgate_on_kube import (  # noqa: F401  # lab: the fixture
    Lab,
    _problem,
    eventually,
    get,
    lab,
)


async def test_a_scale_up_refused_right_after_a_restart_waits_for_the_api_server(
    lab: Lab,  # noqa: F811  # the fixture imported above
) -> None:
    rbac = client.RbacAuthorizationV1Api(lab.admin)
    (binding,) = [
        o
        for o in router_rbac({"render": lab.namespace, "warmgate": lab.namespace})
        if o["kind"] == "RoleBinding" and o["metadata"]["name"] == "warmgate-scaler"
    ]
    async with warmgate(lab.config()) as wg, aiohttp.ClientSession() as http:
        assert wg.runtime().state.phase is Phase.COLD
        await rbac.delete_namespaced_role_binding("warmgate-scaler", lab.namespace)
        # The request comes while the API server is away, so that its first answers after the
        # restart are refusals: a request sent well after the restart (the lab's scheduler is
        # started again after it) would meet a server that has answered for a while, whose
        # refusal is RBAC's (refusals.RESTART_WINDOW), and fail as it should.
        await asyncio.to_thread(lab.cluster.stop_apiserver)
        held = asyncio.ensure_future(get(http, wg.url + "/hello"))
        back: asyncio.Future[None] | None = None
        try:
            await eventually(lambda: _problem(wg, "scale to 1 pending"), within=60)
            back = asyncio.ensure_future(asyncio.to_thread(lab.cluster.start_apiserver))
            await eventually(lambda: _problem(wg, "the API server is starting"), within=90)
            assert not held.done(), "the request is held while the scale-up is retried"
        finally:
            if back is not None:
                await back
            await asyncio.to_thread(lab.cluster.start_apiserver)  # (when the test failed first)
            await rbac.create_namespaced_role_binding(lab.namespace, copy.deepcopy(binding))
        status, _, cold = await asyncio.wait_for(held, 90)
        assert status == 200 and cold is not None, "scaled once the refusals stopped"
        assert await lab.replicas() == 1
