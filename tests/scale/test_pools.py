"""The parked tier and GPU pools, their pure parts: whose turn it is on a pool, the lifecycle's
decisions around ``parked``, the policy's view of a parked target and of a busy pool, and the
config's checks. No I/O, no event loop."""

from __future__ import annotations

import math

import pytest

from backends.base import Observation
from router.config import Scaling, parse_config
from router.errors import ConfigError
from router.openai.facts import Ask, CloudOption, LocalOption, Rules, Snapshot
from router.openai.policy import Action, decide
from router.scale import scaling
from router.scale.pools import Member, Wait, plan
from router.scale.scaling import Act, View
from router.scale.state import Phase, TargetState

NOW = 1000.0
YIELD = 30.0


def idle(name: str, for_: float, priority: int = 0, can_park: bool = True) -> Member:
    """A ready resident target idle for ``for_`` seconds."""
    return Member(
        name,
        priority,
        resident=True,
        ready=True,
        idle_since=NOW - for_,
        can_park=can_park,
        doing=f"idle for {for_:.0f}s",
    )


def busy(name: str, doing: str = "rendering", priority: int = 0) -> Member:
    return Member(name, priority, resident=True, ready=True, idle_since=None, doing=doing)


def wanting(name: str, since: float = NOW, priority: int = 0) -> Member:
    return Member(name, priority, wants=True, waiting_since=since, held=0)


# -- whose turn -------------------------------------------------------------------------------


def test_room_left_lets_the_newcomer_go() -> None:
    p = plan([idle("a", 5), wanting("b")], capacity=2, yield_after=YIELD, now=NOW)
    assert p.go == {"b"} and not p.displace and p.turn("b") is None


def test_a_full_pool_displaces_the_lowest_priority_then_the_longest_idle() -> None:
    members = [
        idle("high", 600, priority=10),
        idle("low-recent", 40, priority=1),
        idle("low-old", 300, priority=1),
        wanting("new", priority=0),
    ]
    p = plan(members, capacity=3, yield_after=YIELD, now=NOW, pool="ws")
    assert p.displace == {"low-old": ("new", "park")}
    wait = p.turn("new")
    assert wait is not None and wait.victim == "low-old"
    assert wait.reason == "waiting for the GPU (ws): low-old is being parked to make room"


def test_a_target_that_cannot_park_is_stopped() -> None:
    p = plan([idle("gradio", 60, can_park=False), wanting("c")], 1, YIELD, NOW)
    assert p.displace == {"gradio": ("c", "stop")}


def test_work_in_flight_is_never_displaced_the_newcomer_waits() -> None:
    members = [busy("wan2gp"), idle("qwen", 10), wanting("comfyui")]
    p = plan(members, capacity=2, yield_after=YIELD, now=NOW)
    wait = p.turn("comfyui")
    assert not p.displace and not p.go
    assert wait == Wait(
        "waiting for the GPU: wan2gp is rendering, qwen is idle for 10s", until=NOW - 10 + YIELD
    )


def test_the_first_in_line_gets_the_seat_of_one_leaving() -> None:
    leaving = Member("a", resident=True, leaving=True, doing="being parked")
    p = plan([leaving, wanting("b", since=1.0), wanting("c", since=2.0)], 1, YIELD, NOW)
    assert p.turn("b") == Wait("waiting for the GPU: a is being parked", victim="a")
    assert p.turn("c") is not None and p.turn("c").victim == ""  # type: ignore[union-attr]
    assert not p.displace


def test_waiters_go_by_priority_then_first_come() -> None:
    members = [wanting("late-high", since=50, priority=5), wanting("early", since=10)]
    p = plan(members, capacity=1, yield_after=YIELD, now=NOW)
    assert p.go == {"late-high"} and p.turn("early") is not None


def test_a_parked_member_holds_no_seat() -> None:
    parked = Member("a", resident=False, ready=False, can_park=True, doing="parked")
    assert plan([parked, wanting("b")], 1, YIELD, NOW).go == {"b"}


# -- the lifecycle's decisions ----------------------------------------------------------------

S = Scaling(idle_after=1800, park_after=300, cold_start_timeout=60)
UP = Observation(running=True, endpoints=("http://127.0.0.1:1",))


def ready_view(**kw: object) -> View:
    base: dict[str, object] = {"now": NOW, "idle_since": NOW - 100, "can_park": True}
    base.update(kw)
    return View(TargetState(Phase.READY, 0.0, endpoints=UP.endpoints), UP, S, **base)  # type: ignore[arg-type]


def parked_view(state: TargetState | None = None, **kw: object) -> View:
    st = state or TargetState(Phase.PARKED, NOW - 50, endpoints=UP.endpoints)
    return View(st, UP, S, **{"now": NOW, "idle_since": NOW - 100, "can_park": True, **kw})  # type: ignore[arg-type]


def test_ready_and_idle_waits_for_park_after_then_parks() -> None:
    step = scaling.decide(ready_view())
    assert step.act is Act.WAIT and step.until == NOW - 100 + 300
    step = scaling.decide(ready_view(now=NOW + 200))
    assert (step.act, step.idle) == (Act.PARK, 300)


def test_no_park_without_an_action_or_while_active_or_not_leading() -> None:
    assert scaling.decide(ready_view(now=NOW + 500, can_park=False)).act is Act.WAIT
    assert scaling.decide(ready_view(now=NOW + 500, idle_since=None)).act is Act.WAIT
    assert scaling.decide(ready_view(now=NOW + 500, held=1)).act is Act.WAIT
    assert scaling.decide(ready_view(now=NOW + 500, may_release=False)).act is Act.WAIT


def test_idle_after_still_stops_a_ready_target_past_both() -> None:
    assert scaling.decide(ready_view(now=NOW + 1800)).act is Act.DRAIN


def test_asked_to_park_parks_at_once() -> None:
    step = scaling.decide(ready_view(idle_since=NOW - 1, park_asked=True))
    assert (step.act, step.idle) == (Act.PARK, 0.0)


def test_making_room_parks_or_stops() -> None:
    step = scaling.decide(ready_view(make_room=("comfyui", "park"), yield_after=30))
    assert (step.act, step.room_for, step.idle) == (Act.PARK, "comfyui", 30)
    step = scaling.decide(ready_view(make_room=("comfyui", "stop"), yield_after=30))
    assert step.act is Act.YIELD


def test_parked_wakes_for_work_and_is_stopped_after_idle_after() -> None:
    assert scaling.decide(parked_view(held=1)).act is Act.WAKE
    assert scaling.decide(parked_view(wanted=True)).act is Act.WAKE
    step = scaling.decide(parked_view())
    assert step.act is Act.WAIT and step.until == NOW - 100 + 1800
    assert scaling.decide(parked_view(now=NOW + 1700)).act is Act.DRAIN


def test_a_wake_in_a_full_pool_queues_with_what_it_waits_for() -> None:
    wait = Wait("waiting for the GPU: wan2gp is rendering", until=NOW + 5)
    step = scaling.decide(parked_view(held=1, turn=wait))
    assert (step.act, step.reason, step.until) == (Act.QUEUE, wait.reason, NOW + 5)
    cold = View(TargetState(Phase.COLD, 0.0), Observation(), S, now=NOW, held=1, turn=wait)
    assert scaling.decide(cold).act is Act.QUEUE
    cleared = View(TargetState(Phase.COLD, 0.0, waiting_for="x"), Observation(), S, now=NOW)
    step = scaling.decide(cleared)
    assert (step.act, step.reason) == (Act.QUEUE, "")


def test_waking_is_probed_and_stopped_when_it_takes_too_long() -> None:
    waking = TargetState(Phase.PARKED, NOW - 5, endpoints=UP.endpoints, waking=True)
    assert scaling.decide(parked_view(waking, next_probe=NOW)).act is Act.PROBE
    assert scaling.decide(parked_view(waking, now=NOW + 60)).act is Act.STOP
    gone = View(waking, Observation(), S, now=NOW)
    assert scaling.decide(gone).act is Act.LOST


# -- the policy -------------------------------------------------------------------------------

CLOUD = CloudOption(position=1, cloud="managed", model="frontier", available=True, cost=0.01)
FAST_API = Ask(private=False, max_wait=3.0)


def option(phase: Phase, **kw: object) -> LocalOption:
    base: dict[str, object] = {
        "position": 0,
        "target": "qwen",
        "phase": phase,
        "since": NOW - 10,
        "servable": False,
        "max_held": 10,
        "cold_start": 40.0,
        "wake": 1.2,
    }
    base.update(kw)
    return LocalOption(**base)  # type: ignore[arg-type]


def snap(*locals_: LocalOption, cloud: bool = True) -> Snapshot:
    return Snapshot(tuple(locals_), (CLOUD,) if cloud else (), budget_left=25.0, now=NOW)


def test_a_three_second_budget_holds_for_parked_and_overflows_for_cold() -> None:
    parked = decide(FAST_API, snap(option(Phase.PARKED)), Rules())
    assert (parked.action, parked.reason) == (Action.HOLD, "parked_within_budget")
    cold = decide(FAST_API, snap(option(Phase.COLD)), Rules())
    assert (cold.action, cold.reason) == (Action.CLOUD, "local_cold")
    assert option(Phase.PARKED, waking=True, since=NOW - 1).ready_in(NOW) == pytest.approx(0.2)


def test_a_parked_target_slower_than_the_budget_goes_to_the_cloud_and_is_woken() -> None:
    slow = decide(FAST_API, snap(option(Phase.PARKED, wake=5.0)), Rules())
    assert (slow.action, slow.reason, slow.warm) == (Action.CLOUD, "local_parked", "qwen")


def test_a_busy_pool_is_an_unknown_wait_cloud_if_allowed_else_held() -> None:
    waiting = option(Phase.COLD, pool_wait="waiting for the GPU: wan2gp is rendering")
    assert math.isinf(waiting.ready_in(NOW))
    generous = Ask(private=False, max_wait=600.0)
    to_cloud = decide(generous, snap(waiting), Rules())
    assert (to_cloud.action, to_cloud.reason, to_cloud.warm) == (Action.CLOUD, "pool_busy", None)
    assert "wan2gp is rendering" in to_cloud.detail
    private = decide(Ask(private=True, max_wait=3.0), snap(waiting), Rules())
    assert (private.action, private.reason) == (Action.HOLD, "private")
    local_only = decide(FAST_API, snap(waiting, cloud=False), Rules())
    assert (local_only.action, local_only.reason) == (Action.HOLD, "local_only")


# -- config -----------------------------------------------------------------------------------


def config(target: dict[str, object], **top: object) -> dict[str, object]:
    spec = {"routes": [{}], "backend": {"kind": "static", "url": "http://127.0.0.1:1"}, **target}
    return {"targets": {"t": spec}, **top}


@pytest.mark.parametrize(
    ("target", "top", "key", "words"),
    [
        ({"engine": "gradio", "scaling": {"park_after": "5m"}}, {}, "scaling.park_after",
         "engine gradio has no park action of its own"),
        ({"engine": "http", "scaling": {"park_after": "5m"}}, {}, "scaling.park_after",
         "engine http has no park action of its own"),
        ({"engine": "openai", "scaling": {"park_after": "5m"}}, {}, "scaling.park_after",
         "engine_options.sleep_mode: true"),
        ({"engine": "comfyui", "scaling": {"park_after": "40m"}}, {}, "scaling.park_after",
         "must be shorter than idle_after"),
        ({"engine": "comfyui", "park": "off", "scaling": {"park_after": "1m"}}, {},
         "scaling.park_after", "park: off never parks"),
        ({"engine": "gradio", "engine_options": {"sleep_mode": True}}, {},
         "engine_options.sleep_mode", "is for engine: openai"),
        ({"pool": "gpu"}, {}, "pool", "no pool named 'gpu'"),
        ({"pool": "gpu"}, {"pools": {"gpu": {"capacity": 0}}}, None, "capacity"),
        ({"park": "sometimes"}, {}, "park", "expected auto, off or {request"),
        ({"park": {"request": {"path": "free"}}}, {}, "park", "request.path: expected an absolute"),
    ],
)  # fmt: skip
def test_bad_configs_name_the_key(
    target: dict[str, object], top: dict[str, object], key: str | None, words: str
) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(config(target, **top), "warmgate.yaml")
    text = str(error.value)
    where = f"warmgate.yaml: targets.t.{key}: " if key else "warmgate.yaml: pools.gpu.capacity: "
    assert where in text and words in text, text


def test_a_pool_and_explicit_park_requests_load() -> None:
    park = {
        "request": {"method": "POST", "path": "/sleep?level=1"},
        "wake": {"method": "POST", "path": "/wake_up"},
        "parked": {"path": "/is_sleeping", "json_key": "is_sleeping"},
    }
    loaded = parse_config(
        config(
            {"engine": "http", "park": park, "pool": "ws", "priority": 5,
             "scaling": {"park_after": "5m"}},
            pools={"ws": {"capacity": 1, "yield_after": "30s"}},
        )
    )  # fmt: skip
    target = loaded.targets["t"]
    assert target.scaling.park_after == 300 and target.priority == 5
    assert loaded.pools["ws"].capacity == 1 and loaded.pools["ws"].yield_after == 30
    spec = target.engine_spec(".")
    assert not isinstance(spec.park, str) and spec.park.request.path == "/sleep?level=1"
    assert spec.park.parked is not None and spec.park.parked.json_key == "is_sleeping"
