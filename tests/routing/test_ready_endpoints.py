"""A target is never ready without an endpoint to forward to: a pod that goes while its
readiness probe runs leaves the target starting (waiting for one), a ready target whose last
endpoint goes is refreshed back to starting whatever it published, and a request that meets a
ready state without endpoints is a 503, never a division by zero."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from backends.base import Observation
from router.errors import RequestError
from router.scale.scaling import Act, View, decide
from router.scale.state import Phase, TargetState
from tests.rig import GET, Rig
from tests.scale.test_lifecycle import make_rig

pytestmark = pytest.mark.looptime

POD = "http://10.0.0.7:8188"


class PodGoesDuringTheProbe:
    """An engine whose pod disappears (its endpoint leaves the EndpointSlice) while the
    readiness probe that says "ready" is on the wire."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.fired = False

    async def probe_ready(self, base_url: str) -> bool:
        await asyncio.sleep(0.05)
        if not self.fired:
            self.fired = True
            self.rig.backend.set(Observation(running=True, endpoints=()))
        return True


async def test_a_pod_gone_while_the_probe_ran_is_not_published_ready() -> None:
    rig = make_rig()
    rig.backend.endpoint = POD
    engine = PodGoesDuringTheProbe(rig)
    rig.engine.probe_ready = engine.probe_ready  # type: ignore[method-assign]
    seen: list[TargetState] = []
    rig.runtime.cell.subscribe(lambda old, new: seen.append(new))
    await rig.lifecycle.open()
    try:
        held = asyncio.ensure_future(rig.runtime.acquire(GET))
        await rig.until(Phase.STARTING)
        await asyncio.sleep(5)
        assert engine.fired
        assert not [s for s in seen if s.phase is Phase.READY and not s.endpoints], seen
        assert rig.phase is Phase.STARTING and not held.done()
        rig.backend.set(Observation(running=True, endpoints=(POD,)))  # a replacement pod
        result = await asyncio.wait_for(held, 60)
        assert result.state.phase is Phase.READY and result.state.endpoints == (POD,)
    finally:
        await rig.lifecycle.close()


def test_a_ready_state_without_endpoints_is_always_refreshed() -> None:
    rig_config = make_config_view()
    state = TargetState(Phase.READY, 0.0, endpoints=())
    running = Observation(running=True, endpoints=())
    step = decide(dataclasses.replace(rig_config, state=state, observation=running))
    assert step.act is Act.REFRESH
    state = TargetState(Phase.READY, 0.0, endpoints=())
    back = Observation(running=True, endpoints=(POD,))
    step = decide(dataclasses.replace(rig_config, state=state, observation=back))
    assert step.act is Act.REFRESH, "endpoints that came back are published too"


def make_config_view() -> View:
    from router.config import parse_config

    config = parse_config(
        {"targets": {"t": {"routes": [{}], "backend": {"kind": "process", "command": ["e"]}}}}
    )
    return View(
        state=TargetState(Phase.COLD, 0.0),
        observation=Observation(),
        scaling=config.targets["t"].scaling,
        now=100.0,
    )


async def test_a_request_meeting_a_ready_state_without_endpoints_is_a_503() -> None:
    rig = make_rig()
    with pytest.raises(RequestError) as err:
        rig.runtime.pick_endpoint(TargetState(Phase.READY, 0.0, endpoints=()))
    assert err.value.status == 503 and err.value.retry_after is not None
