"""The pure parts of a start on a busy cluster: its stage read from the pods, the decisions that
publish it, give it up or fail it fast, the policy that sends API work to the cloud while no
GPU is free, the ETA learned per stage, and what is kept across restarts (corrupt or missing:
a warning, never fatal)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from backends.base import Observation
from backends.engines.common import message_of, progress_of
from backends.kubernetes.observe import observe
from backends.kubernetes.stages import (
    label_selector,
    pod_stage,
    start_stage,
    unready_addresses,
)
from backends.outside import ERROR_CHARS
from backends.specs import KubernetesSpec
from router.config import Scaling
from router.openai.budget import Budget, kept
from router.openai.facts import Ask, CloudOption, LocalOption, Rules, Snapshot
from router.openai.policy import Action, decide
from router.scale.eta import ColdStarts
from router.scale.persist import FileStore, Writer
from router.scale.scaling import Act, View, abandon_at, stage_now
from router.scale.scaling import decide as decide_step
from router.scale.state import Phase, TargetState

GPU_BUSY = "0/5 nodes are available: 5 Insufficient nvidia.com/gpu."


def pod(
    *,
    node: str | None = None,
    conditions: list[dict[str, Any]] | None = None,
    statuses: list[dict[str, Any]] | None = None,
    nominated: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "comfyui-7d9f-x2", "labels": {"app": "comfyui"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": "Pending" if node is None else "Running"}
    if conditions is not None:
        status["conditions"] = conditions
    if statuses is not None:
        status["containerStatuses"] = statuses
    if nominated:
        status["nominatedNodeName"] = nominated
    spec: dict[str, Any] = {"containers": [{"name": "engine", "image": "ghcr.io/x/comfyui:1"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": status}


def container(state: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"name": "engine", "image": "ghcr.io/x/comfyui:1", "imageID": "", "state": state, **kw}


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": GPU_BUSY,
}


# -- stages from the pods -----------------------------------------------------------------------


def test_each_stage_of_a_pod() -> None:
    assert pod_stage(pod()).stage == "scheduling"
    unschedulable = pod_stage(pod(conditions=[UNSCHEDULABLE]))
    assert (unschedulable.stage, unschedulable.message) == ("unschedulable", GPU_BUSY)
    preempting = pod_stage(pod(conditions=[UNSCHEDULABLE], nominated="gpu-node-3"))
    assert preempting.stage == "preempting" and "gpu-node-3" in preempting.message
    assert pod_stage(pod(node="n")).stage == "pulling"  # bound, the kubelet not heard yet
    creating = container({"waiting": {"reason": "ContainerCreating"}})
    assert pod_stage(pod(node="n", statuses=[creating])).stage == "pulling"
    started = container({"running": {"startedAt": "t"}}, started=False, imageID="sha256:1")
    assert pod_stage(pod(node="n", statuses=[started])).stage == "starting"
    running = container({"running": {"startedAt": "t"}}, started=True, imageID="sha256:1")
    not_ready = [{"type": "Ready", "status": "False"}]
    assert pod_stage(pod(node="n", statuses=[running], conditions=not_ready)).stage == "loading"
    ready = [{"type": "Ready", "status": "True"}]
    assert pod_stage(pod(node="n", statuses=[running], conditions=ready)).stage is None


@pytest.mark.parametrize(
    "reason",
    ["ErrImagePull", "ImagePullBackOff", "CrashLoopBackOff", "CreateContainerConfigError"],
)
def test_waits_that_never_end_are_failures(reason: str) -> None:
    waiting = container({"waiting": {"reason": reason, "message": "back-off 10s"}})
    found = pod_stage(pod(node="n", statuses=[waiting]))
    assert found.failure_reason == reason and found.message == "back-off 10s"


def test_the_start_as_a_whole() -> None:
    assert start_stage([]).stage == "scheduling"  # no pod yet: the ReplicaSet is making it
    furthest = start_stage([pod(conditions=[UNSCHEDULABLE]), pod(node="n")])
    assert furthest.stage == "pulling"
    crash = container({"waiting": {"reason": "CrashLoopBackOff", "message": "m"}})
    assert start_stage([pod(node="n"), pod(node="n", statuses=[crash])]).failure_reason
    assert start_stage([pod(node="n", deleting=True)]).stage == "scheduling"  # going: ignored


def test_the_observation_carries_the_stage_and_fails_fast() -> None:
    spec = KubernetesSpec(kind="kubernetes", namespace="render", deployment="comfyui", port=8188)
    deployment = {"metadata": {"generation": 1}, "spec": {"replicas": 1}, "status": {}}
    obs = observe(spec, deployment, [], pods=[pod(conditions=[UNSCHEDULABLE])])
    assert (obs.stage, obs.stage_message, obs.failure) == ("unschedulable", GPU_BUSY, None)
    bad = container({"waiting": {"reason": "ErrImagePull", "message": "not found"}})
    obs = observe(spec, deployment, [], pods=[pod(node="n", statuses=[bad])])
    assert obs.failure == "ErrImagePull: not found" and obs.failure_reason == "ErrImagePull"
    stopped = {**deployment, "spec": {"replicas": 0}}
    assert observe(spec, stopped, [], pods=[pod(conditions=[UNSCHEDULABLE])]).stage is None
    assert observe(spec, deployment, []).stage is None  # pods not watched: unknown


def test_a_running_pod_not_ready_is_probed_on_its_own_address_never_served() -> None:
    spec = KubernetesSpec(kind="kubernetes", namespace="render", deployment="comfyui", port=8188)
    deployment = {"metadata": {"generation": 1}, "spec": {"replicas": 1}, "status": {}}
    running = container({"running": {"startedAt": "t"}}, started=True, imageID="sha256:1")

    def at(ip: object, conditions: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
        found = pod(node="n", statuses=[running], conditions=conditions, **kw)
        found["status"]["podIP"] = ip
        return found

    not_ready = [{"type": "Ready", "status": "False"}]
    loading = at("10.244.0.7", not_ready)
    obs = observe(spec, deployment, [], pods=[loading])
    assert obs.stage == "loading" and obs.endpoints == ()
    assert obs.probe_only == ("http://10.244.0.7:8188",)
    assert (
        observe(spec, {**deployment, "spec": {"replicas": 0}}, [], pods=[loading]).probe_only == ()
    )
    for unfit in (
        at("10.244.0.8", [{"type": "Ready", "status": "True"}]),  # ready: served, not this
        at("10.244.0.9", not_ready, deleting=True),  # going
        at("", not_ready),  # no address yet
        at("10.0.0.1:80/x?", not_ready),  # not an address: never a URL to connect to
        pod(node="n", statuses=[container({"waiting": {"reason": "ContainerCreating"}})]),
    ):
        assert unready_addresses([unfit]) == [], unfit
    assert unready_addresses([at("fd00::7", not_ready)]) == ["fd00::7"]
    service = spec.model_copy(update={"route_to": "service", "service": "comfyui"})
    assert observe(service, deployment, [], pods=[loading]).probe_only == (
        "http://10.244.0.7:8188",
    )  # the pod's own address, as the kubelet probes it, whatever requests go through
    ready = [{"endpoints": [{"addresses": ["10.244.0.8"], "conditions": {"ready": True}}]}]
    assert observe(spec, deployment, ready, pods=[loading]).probe_only == ()  # one serves


def test_a_deployment_selector_as_a_label_selector() -> None:
    assert label_selector({"matchLabels": {"b": "2", "a": "1"}}) == "a=1,b=2"
    expressions = [
        {"key": "tier", "operator": "In", "values": ["gpu", "cpu"]},
        {"key": "canary", "operator": "DoesNotExist"},
    ]
    assert label_selector({"matchExpressions": expressions}) == "tier in (gpu,cpu),!canary"
    assert label_selector(None) is None


# -- the lifecycle's decisions ------------------------------------------------------------------

S = Scaling(idle_after=1800, cold_start_timeout=300, abandon_after=120)
PENDING = Observation(running=True, stage="unschedulable", stage_message=GPU_BUSY)


def starting(**kw: Any) -> TargetState:
    return TargetState(Phase.STARTING, 0.0, **kw)


def test_a_new_stage_is_published_then_waited_in() -> None:
    view = View(starting(), PENDING, S, now=1.0, idle_since=0.0)
    assert decide_step(view).act is Act.STAGE
    assert stage_now(view) == ("unschedulable", GPU_BUSY, None)
    published = starting(stage="unschedulable", stage_message=GPU_BUSY)
    step = decide_step(View(published, PENDING, S, now=1.0, idle_since=0.0, abandonable=True))
    assert step.act is Act.WAIT and step.until == 120.0  # until it would be abandoned


def test_progress_shows_only_while_loading() -> None:
    loading = Observation(running=True, endpoints=("http://p:1",), progress=0.4)
    assert stage_now(View(starting(), loading, S, now=1))[0::2] == ("loading", 0.4)
    pulling = Observation(running=True, stage="pulling", progress=0.4)
    assert stage_now(View(starting(), pulling, S, now=1))[0::2] == ("pulling", None)


def test_the_engines_words_stand_while_the_backend_has_none_in_the_same_stage() -> None:
    said = starting(stage="loading", stage_message="loading wan.safetensors")
    up = Observation(running=True, endpoints=("http://p:1",), stage="loading")
    assert stage_now(View(said, up, S, now=1))[1] == "loading wan.safetensors"
    step = decide_step(View(said, up, S, now=1, next_probe=2, idle_since=0.0))
    assert step.act is Act.WAIT, "no flapping between the engine's words and the backend's none"
    early = dataclasses.replace(said, stage="starting")  # the launcher answered before its port
    assert stage_now(View(early, up, S, now=1))[1] == "", "a new stage: the engine says again"
    assert stage_now(View(said, PENDING, S, now=1))[1] == GPU_BUSY


def test_a_start_nobody_waits_for_is_abandoned_after_abandon_after() -> None:
    state = starting(stage="unschedulable", stage_message=GPU_BUSY)

    def view(now: float, **changes: Any) -> View:
        facts: dict[str, Any] = {"idle_since": 0.0, "last_wanted": 30.0, "abandonable": True}
        return View(state, PENDING, S, now=now, **{**facts, **changes})

    assert abandon_at(view(100.0)) == 150.0  # 2 minutes after the last one who waited
    assert decide_step(view(150.0)).act is Act.ABANDON
    for busy in (
        {"held": 1},
        {"in_flight": 1},
        {"kept_warm": True},
        {"idle_since": None},  # activity elsewhere (other replicas)
        {"abandonable": False},  # adopted, or other replicas may be served by it
    ):
        assert abandon_at(view(1e6, **busy)) == math.inf, busy
    assert abandon_at(dataclasses.replace(view(1e6), scaling=Scaling(abandon_after=0))) == math.inf


def test_a_pod_not_ready_is_probed_for_the_engines_words_while_starting() -> None:
    unready = Observation(running=True, stage="loading", probe_only=("http://10.244.0.7:8188",))
    state = starting(stage="loading")
    assert decide_step(View(state, unready, S, now=1.0, next_probe=0.0)).act is Act.PROBE
    later = decide_step(View(state, unready, S, now=1.0, next_probe=3.0))
    assert later.act is Act.WAIT and later.until == 3.0
    nothing = Observation(running=True, stage="loading")  # pods not watched: nothing to ask
    assert decide_step(View(state, nothing, S, now=1.0)).act is Act.WAIT


def test_a_terminal_wait_fails_the_start_at_once() -> None:
    bad = Observation(running=True, failure="ErrImagePull: no", failure_reason="ErrImagePull")
    step = decide_step(View(starting(), bad, S, now=1.0))
    assert step.act is Act.FAIL and step.reason == "ErrImagePull: no"


# -- the API policy -----------------------------------------------------------------------------


def local(**kw: Any) -> LocalOption:
    return LocalOption(0, "vllm-local", Phase.STARTING, 0.0, False, **kw)


CLOUD = CloudOption(1, "managed", "frontier-large", True, 0.01)


def test_unschedulable_goes_to_the_cloud_at_once() -> None:
    snap = Snapshot((local(unschedulable=GPU_BUSY, cold_start=5.0),), (CLOUD,), 10.0, 1.0)
    assert snap.locals[0].ready_in(1.0) == math.inf
    decision = decide(Ask(private=False, max_wait=600.0), snap, Rules())
    assert decision.action is Action.CLOUD and decision.reason == "local_unschedulable"
    assert GPU_BUSY in decision.detail


def test_private_work_holds_for_a_gpu_until_its_deadline() -> None:
    snap = Snapshot((local(unschedulable=GPU_BUSY),), (CLOUD,), 10.0, 1.0)
    decision = decide(Ask(private=True, max_wait=10.0), snap, Rules())
    assert decision.action is Action.HOLD and decision.reason == "local_unschedulable"
    broke = Snapshot((local(unschedulable=GPU_BUSY),), (CLOUD,), 0.0, 1.0)
    decision = decide(Ask(private=False, max_wait=10.0), broke, Rules())
    assert decision.action is Action.HOLD and decision.reason == "local_unschedulable"


# -- the ETA --------------------------------------------------------------------------------------


def test_the_first_eta_is_the_expected_one_then_learned() -> None:
    starts = ColdStarts(expected=8.0)
    assert starts.predicted() == 8.0 and starts.remaining(None, 0.0, 3.0) == 5.0
    starts.record(40.0, {"pulling": 30.0, "loading": 10.0})
    assert starts.predicted() == 40.0
    assert starts.remaining("pulling", 10.0, 10.0) == 30.0  # 20 s of pulling + 10 s loading
    assert starts.remaining("unschedulable", 1.0, 1.0) is None  # nobody can tell
    assert starts.describe()["by_stage"]["pulling"] == 30.0


def test_learned_starts_round_trip_and_nonsense_is_ignored() -> None:
    starts = ColdStarts(expected=60.0)
    for seconds in (8.0, 9.0, 8.5):
        starts.record(seconds, {"starting": 1.0, "loading": seconds - 1.0})
    again = ColdStarts(expected=60.0)
    assert again.restore(json.loads(json.dumps(starts.to_json())))
    assert again.predicted() == starts.predicted()
    assert again.stage_predicted("loading") == starts.stage_predicted("loading")
    for nonsense in ({}, {"version": 99}, {"version": 1, "starts": "x", "stages": {}}):
        fresh = ColdStarts(expected=60.0)
        assert not fresh.restore(nonsense) and fresh.predicted() == 60.0
    inf = {"version": 1, "starts": [float("inf")], "stages": {}}
    assert not ColdStarts(expected=60.0).restore(inf)


# -- what survives restarts ---------------------------------------------------------------------


async def test_a_file_store_round_trips_and_ignores_what_it_cannot_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStore(tmp_path / "state", "comfyui.")
    assert await store.load("cold-start") is None  # missing: nothing, no error
    writer = Writer(store, "cold-start")
    writer.put({"starts": [1.0]})
    writer.put({"starts": [1.0, 2.0]})  # the newer one replaces the first, unwritten or not
    await writer.close()
    assert await store.load("cold-start") == {"starts": [1.0, 2.0]}
    assert not list((tmp_path / "state").glob(".*.tmp"))  # written by rename, nothing left
    (tmp_path / "state" / "comfyui.cold-start.json").write_text("{not json")
    assert await store.load("cold-start") is None
    assert "ignoring unreadable state" in caplog.text
    (tmp_path / "state" / "comfyui.budget.a.json").write_text('{"day": "x"}')
    assert await store.load_all("budget.") == {"budget.a": {"day": "x"}}


async def test_a_store_that_cannot_be_written_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("")
    writer = Writer(FileStore(tmp_path / "file" / "state"), "budget")  # a file in the way
    writer.put({"spent": 1.0})
    await writer.close()
    assert writer.writes == 0 and "cannot keep budget" in caplog.text


def test_the_budget_reads_back_its_day_open_reservations_as_spent() -> None:
    now = datetime.datetime(2026, 3, 2, 15, 0, tzinfo=datetime.UTC).timestamp()
    before = Budget(10.0, clock=lambda: now)
    held = before.reserve(1.5, "managed")
    assert held is not None
    before.settle(before.reserve(2.0, "managed"), 0.75)  # type: ignore[arg-type]
    record = json.loads(json.dumps(before.record()))
    assert record["open_reservations"] == 1
    after = Budget(10.0, clock=lambda: now)
    assert after.restore(record)
    assert after.left() == pytest.approx(before.left())  # 10 - 0.75 - 1.5
    tomorrow = Budget(10.0, clock=lambda: now + 86400)
    assert not tomorrow.restore(record) and tomorrow.left() == 10.0
    assert not Budget(10.0, clock=lambda: now).restore({"day": "2026-03-02", "spent": "-1"})


def test_a_readiness_body_carries_the_load_progress() -> None:
    assert progress_of(b'{"status": "loading", "progress": 0.25}') == 0.25
    for body in (b"{}", b"oops", b'{"progress": 2}', b'{"progress": true}', b"[0.5]"):
        assert progress_of(body) is None


def test_a_readiness_body_carries_the_engines_words_as_one_bounded_line() -> None:
    assert message_of(b'{"stage": "loading", "message": "loading a.safetensors"}') == (
        "loading a.safetensors"
    )
    for body in (b"{}", b"oops", b'{"message": 3}', b'{"message": " "}', b'["message"]'):
        assert message_of(body) == ""
    hostile = message_of(b'{"message": "a\\nb\\u0000' + b"x" * 5000 + b'"}')
    assert "\n" not in hostile and "\x00" not in hostile and len(hostile) <= ERROR_CHARS


async def test_a_replica_reads_its_own_spend_back_and_counts_the_others_of_today(
    tmp_path: Path,
) -> None:
    now = datetime.datetime(2026, 3, 2, 15, 0, tzinfo=datetime.UTC).timestamp()
    store = FileStore(tmp_path)
    await store.save("budget.warmgate-a", {"day": "2026-03-02", "spent": 1.0, "reserved": 0.5})
    await store.save("budget.warmgate-b", {"day": "2026-03-02", "spent": 2.0, "reserved": 0.0})
    await store.save("budget.warmgate-c", {"day": "2026-03-01", "spent": 9.0, "reserved": 0.0})
    budget = Budget(10.0, clock=lambda: now)
    heard: list[tuple[str, datetime.date, float]] = []
    keep = kept(budget, store, "budget.warmgate-a", lambda *said: heard.append(said))
    running = keep(web.Application())
    await running.__anext__()  # started
    assert budget.spent == 1.5  # its own day, the open reservation counted as spent
    assert heard == [("warmgate-b", datetime.date(2026, 3, 2), 2.0)]  # yesterday's is no one's
    budget.settle(budget.reserve(0.25, "managed"), 0.25)  # type: ignore[arg-type]
    with pytest.raises(StopAsyncIteration):
        await running.__anext__()  # stopped: the last record written
    assert (await store.load("budget.warmgate-a") or {})["spent"] == 1.75
