"""idle_after: auto: the learned value within its bounds, the fallback before enough gaps, the
histogram kept across a restart; the config keys that ask for it."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Mapping
from typing import Any

import pytest

from router.config import Economics, Scaling, parse_config
from router.config.windows import parse_window
from router.errors import ConfigError
from router.scale.idle_policy import MIN_GAPS, Ask, IdlePolicy, Waits, Windows
from router.scale.idling import IDLE_KEY, IdleRule, window_state

GPU, WAIT = 2.0 / 3600, 0.01


def test_falls_back_to_the_upper_bound_until_enough_gaps() -> None:
    policy = IdlePolicy((120.0, 3600.0), GPU, WAIT)
    for _ in range(MIN_GAPS - 1):
        assert policy.observe(300.0)
    assert not policy.learned and policy.idle_after(60.0) == 3600.0
    assert not policy.observe(30.0)  # within a burst: below the lower bound, not a gap
    policy.observe(300.0)
    assert policy.learned
    assert 300.0 <= policy.idle_after(60.0) < 400.0  # keeps through the pauses it has seen


def test_one_gap_is_enough_to_leave_the_upper_bound() -> None:
    policy = IdlePolicy((120.0, 3600.0), GPU, WAIT)
    assert not policy.learned and policy.idle_after(60.0) == 3600.0
    policy.observe(900.0)  # one pause between two sessions: the next hour is not held blind
    assert policy.learned and 900.0 <= policy.idle_after(60.0) < 1200.0


def test_the_learned_window_keeps_a_slightly_longer_gap_of_the_same_habit() -> None:
    policy = IdlePolicy((120.0, 3600.0), GPU, WAIT)
    for _ in range(10):
        policy.observe(600.0)  # ten-minute pauses, worth keeping the card through
    assert policy.idle_after(60.0) >= 600.0 * 1.08  # the next one, a bin longer, is kept too


def test_long_gaps_alone_release_at_the_lower_bound() -> None:
    policy = IdlePolicy((120.0, 3600.0), GPU, WAIT)
    for _ in range(20):
        policy.observe(50_000.0)  # overnight: nothing is worth keeping the card for
    assert policy.idle_after(60.0) == 120.0


def test_frequent_pauses_within_an_hour_are_kept_through() -> None:
    policy = IdlePolicy((120.0, 3600.0), GPU, WAIT)
    for _ in range(20):
        policy.observe(3000.0)  # a long cold start costs more than 50 idle minutes
    assert 3000.0 <= policy.idle_after(600.0) <= 3600.0


def test_the_answer_is_the_cheapest_candidate() -> None:
    policy = IdlePolicy((120.0, 3600.0), GPU, WAIT)
    for gap in [200.0] * 10 + [1500.0] * 3 + [40_000.0] * 5:
        policy.observe(gap)
    best = policy.idle_after(60.0)
    for other in (120.0, 600.0, 1800.0, 3600.0):
        assert policy.expected_cost(best, 60.0) <= policy.expected_cost(other, 60.0) + 1e-9


def test_json_round_trip_and_unknown_forms() -> None:
    policy = IdlePolicy((120.0, 3600.0), GPU, WAIT)
    for gap in [300.0] * 12:
        policy.observe(gap)
    again = IdlePolicy((120.0, 3600.0), GPU, WAIT)
    assert again.load_json(policy.to_json())
    assert again.learned and again.idle_after(60.0) == policy.idle_after(60.0)
    assert again.describe(60.0)["idle_after"] == round(policy.idle_after(60.0), 3)
    assert not again.load_json({"version": 99})
    assert not again.load_json({"version": 1, "ratio": 1.08, "gaps": 3, "bins": {"x": 1}})


class MemoryStore:
    """The state store's fake twin: documents in a dict."""

    where = "memory"

    def __init__(self) -> None:
        self.documents: dict[str, dict[str, Any]] = {}

    async def load(self, key: str) -> dict[str, Any] | None:
        return self.documents.get(key)

    def name_of(self, key: str) -> str:
        return f"{key} in memory"

    async def save(self, key: str, document: Mapping[str, Any]) -> None:
        self.documents[key] = dict(document)


async def test_the_histogram_survives_a_restart() -> None:
    loop = asyncio.get_running_loop()
    scaling = Scaling(idle_after="auto")
    store = MemoryStore()
    rule = IdleRule(scaling, Economics(), loop)
    await rule.restore(store)
    for _ in range(10):
        rule.resumed(400.0)
    await rule.close()
    assert store.documents[IDLE_KEY]["gaps"] == 10

    after = IdleRule(scaling, Economics(), loop)
    await after.restore(store)
    assert after.policy is not None and after.policy.learned
    assert after.idle_after(60.0) == rule.idle_after(60.0) < 3600.0
    await after.close()


def test_config_accepts_auto_bounds_windows_and_prices() -> None:
    config = parse_config(
        {
            "economics": {"gpu_hour_usd": 3.0, "cold_wait_usd_per_second": 0.02},
            "targets": {
                "t": {
                    "routes": [{"path_prefix": "/"}],
                    "backend": {"kind": "static", "url": "http://127.0.0.1:1"},
                    "scaling": {
                        "idle_after": "auto",
                        "idle_bounds": ["1m", "30m"],
                        "keep_warm": ["Mon-Fri 08:30-18:00 Europe/Berlin"],
                    },
                }
            },
        }
    )
    scaling = config.targets["t"].scaling
    assert scaling.idle_after == "auto" and scaling.idle_auto
    assert scaling.idle_bounds == (60.0, 1800.0) and scaling.idle_seconds == 1800.0
    assert config.economics.gpu_hour_usd == 3.0
    assert Scaling(idle_after="10m").idle_seconds == 600.0


@pytest.mark.parametrize(
    ("scaling", "key"),
    [
        ({"keep_warm": ["Mon-Fri 25:00-18:00"]}, "targets.t.scaling.keep_warm"),
        ({"keep_warm": ["Mon-Fri 08:00-18:00 Mars/Olympus"]}, "targets.t.scaling.keep_warm"),
        ({"keep_warm": ["weekdays"]}, "targets.t.scaling.keep_warm"),
        ({"idle_after": "auto", "idle_bounds": [0, "1h"]}, "targets.t.scaling.idle_bounds"),
        ({"idle_bounds": ["1h", "2m"]}, "targets.t.scaling.idle_bounds"),
        ({"idle_after": "sometimes"}, "targets.t.scaling.idle_after"),
    ],
)
def test_bad_values_name_their_key(scaling: dict[str, Any], key: str) -> None:
    data = {
        "targets": {
            "t": {
                "routes": [{"path_prefix": "/"}],
                "backend": {"kind": "static", "url": "http://127.0.0.1:1"},
                "scaling": scaling,
            }
        }
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "w.yaml")
    assert key in str(caught.value)


def test_windows_in_their_zone() -> None:
    windows = (parse_window("Mon-Fri 08:30-18:00 Europe/Berlin"),)
    friday_5pm_berlin = datetime.datetime(2025, 3, 7, 16, 0, tzinfo=datetime.UTC).timestamp()
    inside, until = window_state(windows, friday_5pm_berlin)
    assert inside and until == friday_5pm_berlin + 3600
    inside, until = window_state(windows, friday_5pm_berlin + 7200)
    monday = datetime.datetime(2025, 3, 10, 7, 30, tzinfo=datetime.UTC).timestamp()
    assert not inside and until == monday


def test_a_window_begins_a_cold_start_early_and_ends_on_time() -> None:
    windows = (parse_window("Mon-Fri 08:30-18:00 Europe/Berlin"),)
    monday_0830 = datetime.datetime(2025, 3, 10, 7, 30, tzinfo=datetime.UTC).timestamp()
    assert window_state(windows, monday_0830 - 90, lead=120.0) == (True, monday_0830 + 34200)
    assert window_state(windows, monday_0830 - 150, lead=120.0) == (False, monday_0830 - 120)


def test_park_after_auto_parks_early_when_a_wake_is_cheap() -> None:
    policy = IdlePolicy((120.0, 3600.0), GPU, WAIT, parked_second_usd=0.2 / 3600)
    for gap in [300.0] * 10 + [2400.0] * 5:
        policy.observe(gap)
    windows = policy.windows(Ask(60.0, wake=2.0, parks=True))
    assert windows.park_after == 120.0  # a 2 s wake costs less than minutes of a card
    assert windows.idle_after >= 2400.0  # parked is cheap: kept through the long gaps too
    alone = policy.windows(Ask(60.0))
    assert alone.park_after == 0.0 and alone.idle_after < 2400.0  # no parked tier: released


def test_a_slow_wake_is_not_worth_parking_for_short_pauses() -> None:
    policy = IdlePolicy((120.0, 3600.0), GPU, WAIT, parked_second_usd=0.2 / 3600)
    for gap in [200.0] * 20 + [3000.0] * 2:
        policy.observe(gap)
    windows = policy.windows(Ask(600.0, wake=120.0, parks=True))
    assert windows.park_after >= 200.0 or windows.park_after == 0.0


def test_park_after_auto_falls_back_to_the_lower_bound_and_respects_a_fixed_idle_after() -> None:
    policy = IdlePolicy((120.0, 3600.0), GPU, WAIT)
    assert policy.windows(Ask(60.0, parks=True)) == Windows(3600.0, 120.0)
    assert policy.windows(Ask(60.0, parks=True, idle_after=900.0)) == Windows(900.0, 120.0)
    for gap in [300.0] * 10:
        policy.observe(gap)
    fixed = policy.windows(Ask(60.0, parks=True, idle_after=900.0))
    assert fixed.idle_after == 900.0 and 120.0 <= fixed.park_after < 900.0
    pinned = policy.windows(Ask(60.0, parks=True, park_after=60.0))  # under the lower bound
    assert pinned.park_after == 60.0 and pinned.idle_after >= 300.0  # parked: cheap to keep


def test_several_people_waiting_make_a_start_dearer() -> None:
    policy = IdlePolicy((120.0, 3600.0), GPU, WAIT)
    for gap in [900.0] * 6 + [20_000.0] * 6:
        policy.observe(gap)
    alone = policy.windows(Ask(60.0)).idle_after
    crowd = policy.windows(Ask(60.0, waiters=3.0)).idle_after
    assert alone == 120.0 and crowd >= 900.0  # three people waiting: keep through the pauses


def test_waits_are_learned_per_second_of_start() -> None:
    waits = Waits()
    assert waits.waiters == 1.0  # before any start: one person
    waits.page(100.0)
    waits.page(130.0)
    waits.start(60.0, now=160.0)  # two pages waited 60 s and 30 s
    waits.wait(40.0)  # and a held render 40 s
    assert waits.waiters == pytest.approx(130.0 / 60.0, abs=0.01)
    waits.page(0.0)
    waits.start(60.0, now=1000.0, limit=300.0)  # a page left long ago is not counted
    assert waits.waiters < 130.0 / 60.0


async def test_the_runtime_learns_waits_from_its_holds_and_pages() -> None:
    loop = asyncio.get_running_loop()
    rule = IdleRule(Scaling(idle_after="auto"), Economics(), loop)
    rule.waits.start(30.0, loop.time())
    rule.waits.wait(90.0)
    assert rule.describe(30.0)["learned"]["waiters"] == 3.0


def test_config_accepts_park_after_auto_and_expected_wake() -> None:
    config = parse_config(
        {
            "economics": {"parked_hour_usd": 0.5},
            "targets": {
                "t": {
                    "engine": "comfyui",
                    "routes": [{"path_prefix": "/"}],
                    "backend": {"kind": "static", "url": "http://127.0.0.1:1"},
                    "scaling": {"idle_after": "30m", "park_after": "auto", "expected_wake": "4s"},
                }
            },
        }
    )
    scaling = config.targets["t"].scaling
    assert scaling.park_auto and scaling.park_seconds == 120.0 and scaling.expected_wake == 4.0
    assert config.economics.parked_second_usd == pytest.approx(0.5 / 3600)
    assert not Scaling(park_after="5m").park_auto and Scaling(park_after="5m").park_seconds == 300


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ({"engine": "comfyui", "scaling": {"idle_after": "2m", "park_after": "auto"}}, "no time"),
        ({"engine": "gradio", "scaling": {"park_after": "auto"}}, "park_after"),
        ({"engine": "comfyui", "park": "off", "scaling": {"park_after": "auto"}}, "park: off"),
        ({"engine": "comfyui", "scaling": {"park_after": "later"}}, "park_after"),
    ],
)
def test_bad_park_after_auto_names_its_key(target: dict[str, Any], words: str) -> None:
    data = {
        "targets": {
            "t": {
                "routes": [{"path_prefix": "/"}],
                "backend": {"kind": "static", "url": "http://127.0.0.1:1"},
                **target,
            }
        }
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "w.yaml")
    assert "targets.t.scaling.park_after" in str(caught.value) and words in str(caught.value)


@pytest.mark.parametrize(
    "kept",
    [
        {"gaps": float("inf")},  # what json.loads makes of 1e400
        {"gaps": 10**400},
        {"gaps": True},
        {"gaps": -3},
        {"bins": {"3": 10**400}},
        {"bins": {"3": float("nan")}},
        {"bins": [1, 2]},
    ],
)
def test_a_kept_histogram_out_of_range_is_refused(kept: dict[str, Any]) -> None:
    policy = IdlePolicy((120.0, 3600.0), GPU, WAIT)
    for _ in range(MIN_GAPS):
        policy.observe(300.0)
    document = {**policy.to_json(), **kept}
    before = policy.to_json()
    assert policy.load_json(document) is False
    assert policy.to_json() == before, "a refused document changes nothing"
