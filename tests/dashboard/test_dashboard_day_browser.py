"""The day section of the dashboard in a real headless Chromium (tests/browser.py): the strip
follows a cold start and a park as they happen, a rollout is told among the events, and a day
recorded in ``state_dir`` is drawn whole after a restart (strips, GPU-hours stacked, the waits
histogram, the spend per model). Screenshots go under the test's tmp path;
``WARMGATE_DASHBOARD_PNG=docs/dashboard.png`` also copies the replayed day there, for the
README."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from backends.base import Observation, Rollout
from router.dashboard.day import midnight
from router.scale.state import Phase
from router.scale.timeline import KEY
from tests.browser import chromium, needs_chromium
from tests.dashboard.test_dashboard import config, sleepy
from tests.helpers import ROOT, wait_until, warmgate
from tests.openai_stack import CLOUD_KEY, KEY_ENV, PRICES
from tests.scale.test_parked import config as parked_config
from tests.scale.test_parked import demo, parked, prompt, rendered

pytestmark = needs_chromium

WAIT = 60_000
"""Milliseconds a page waits for what the dashboard should come to show (a loaded machine)."""


def strip(name: str, scope: str = "day") -> str:
    return f"#timeline-{name} svg.strip.{scope}"


async def labels(page: Any, name: str, scope: str = "day") -> list[str]:
    shown: list[str] = await page.locator(f"{strip(name, scope)} rect.seg").evaluate_all(
        "rects => rects.map(r => r.dataset.label)"
    )
    return shown


async def test_the_strip_follows_a_cold_start(tmp_path: Path) -> None:
    data = config(load=0.5)
    data["state_dir"] = str(tmp_path / "state")
    async with warmgate(data) as wg, chromium() as page, aiohttp.ClientSession() as session:
        await page.goto(wg.admin + "/")
        await page.wait_for_selector("#live.on")
        assert await labels(page, "sleepy") == ["cold"]
        assert await page.locator("svg.waits rect.wait[data-count='1']").count() == 0

        async with session.get(wg.url + "/hello") as response:
            assert response.status == 200
        await page.wait_for_selector('#target-sleepy[data-phase="ready"]', timeout=WAIT)
        mark = f'{strip("sleepy", "hour")} path.mark[data-kind="cold start"]'
        await page.wait_for_selector(mark, timeout=WAIT)
        # ready is drawn busy or idle once the accounting tick (about a second) has looked
        last = f"{strip('sleepy', 'hour')} rect.seg:last-of-type"
        await page.wait_for_function(
            f"() => ['busy', 'idle'].includes(document.querySelector({json.dumps(last)})"
            "?.dataset.label)",
            timeout=WAIT,
        )
        shown = await labels(page, "sleepy", "hour")
        assert shown[0] == "cold" and shown[1].startswith("starting")
        assert shown[-1] in ("busy", "idle")
        title = await page.locator(mark).text_content()
        assert title is not None and "1 held, ready after" in title
        starting = "svg.gpu-hours rect.hours[data-target='sleepy'][data-kind='starting']"
        assert await page.locator(starting).count() == 1
        counts = await page.locator("svg.waits rect.wait").evaluate_all(
            "rects => rects.map(r => Number(r.dataset.count))"
        )
        assert sum(counts) == 1, "one wait, in one bar"
        await page.screenshot(path=str(tmp_path / "cold-start.png"), full_page=True)


async def test_the_strip_shows_a_park(tmp_path: Path) -> None:
    data = parked_config({"comfy": demo("comfy", tmp_path, park_after="1s")})
    data["state_dir"] = str(tmp_path / "state")
    async with warmgate(data) as wg, chromium() as page, aiohttp.ClientSession() as client:
        runtime = wg.runtime("comfy")
        await page.goto(wg.admin + "/")
        await page.wait_for_selector("#live.on")
        prompt_id, cold = await prompt(client, wg.url + "/comfy")
        assert cold is not None
        await rendered(client, wg.url + "/comfy", prompt_id)
        await wait_until(lambda: parked(runtime), timeout=60)
        await page.wait_for_selector('#target-comfy[data-phase="parked"]', timeout=WAIT)
        await page.wait_for_selector(
            f'{strip("comfy", "hour")} rect.seg[data-label="parked"]', timeout=WAIT
        )
        shown = await labels(page, "comfy", "hour")
        assert shown[0] == "cold" and shown[-1] == "parked"
        assert "busy" in shown or "idle" in shown, "ready before it parked"
        parked_hours = "svg.gpu-hours rect.hours[data-target='comfy'][data-kind='parked']"
        await page.wait_for_selector(parked_hours, state="attached", timeout=WAIT)
        await page.screenshot(path=str(tmp_path / "parked.png"), full_page=True)


def rollout(declared: str, running: str, ready: int, replicas: int) -> Observation:
    settled = replicas > 0 and ready == replicas and running == declared
    return Observation(
        rollout=Rollout(declared, running, ready, ready, replicas, settled), running=replicas > 0
    )


async def test_a_rollout_is_told_and_verified_at_the_cold_start(tmp_path: Path) -> None:
    """The rollout as a Kubernetes backend observes it, handed to the target's follower (a
    process target has no Deployment); the cold start is real."""
    async with (
        warmgate(config(load=0.3)) as wg,
        chromium() as page,
        aiohttp.ClientSession() as session,
    ):
        runtime = wg.runtime("sleepy")
        await page.goto(wg.admin + "/")
        await page.wait_for_selector("#live.on")
        runtime.rollout.observed(rollout("render:1", "", 0, 0))  # the baseline, at zero
        runtime.rollout.observed(rollout("render:2", "", 0, 0))  # a new image applied
        declared = "ol.events li.ev.rollout:has-text('declared render:2')"
        await page.wait_for_selector(declared, timeout=WAIT)
        text = await page.locator(declared).text_content()
        assert text is not None and "verified at its next cold start" in text

        async with session.get(wg.url + "/hello") as response:
            assert response.status == 200
        assert runtime.state.phase is Phase.READY
        runtime.rollout.observed(rollout("render:2", "render:2", 1, 1))
        verified = "ol.events li.ev.rollout:has-text('verified: rollout complete')"
        await page.wait_for_selector(verified, timeout=WAIT)
        text = await page.locator(verified).text_content()
        assert text is not None and "/readyz 200, 1 of 1 pods" in text
        await page.screenshot(path=str(tmp_path / "rollout.png"), full_page=True)


# -- a day replayed ---------------------------------------------------------------------------

TARGETS = {
    # name: (parks, busy hours UTC, minutes between sessions)
    "comfyui-flux": (True, range(7, 20), (20, 90)),
    "wan-video": (True, range(9, 23), (60, 180)),
    "vllm-qwen": (False, range(0, 24), (30, 120)),
    "sdxl-batch": (False, range(1, 6), (90, 240)),
}


def day_of(name: str, now: float, rng: random.Random) -> dict[str, Any]:
    """A target's recorded day: sessions of busy and idle after a cold start (or a wake, for
    one that parks), released (or parked) after them, as a timeline document."""
    parks, hours, gaps = TARGETS[name]
    t = now - 24 * 3600
    segments: list[list[Any]] = [[t, "cold"]]
    marks: list[dict[str, Any]] = []
    resting = "cold"
    while True:
        t += 60 * rng.uniform(*gaps)
        if t > now - 900:
            break
        if time.gmtime(t).tm_hour not in hours:
            continue
        if resting == "parked":
            took = rng.uniform(4, 12)
            segments.append([t, "starting:waking"])
            marks.append({"at": t, "kind": "wake", "held": rng.randint(1, 3), "seconds": took})
        else:
            pull, load = rng.uniform(5, 50), rng.uniform(20, 140)
            segments += [[t, "starting:scheduling"], [t + 3, "starting:pulling"]]
            segments.append([t + 3 + pull, "starting:loading"])
            took = 3 + pull + load
            held = rng.randint(1, 4)
            marks.append({"at": t, "kind": "cold start", "held": held, "seconds": took})
        t += took
        for _ in range(rng.randint(1, 5)):
            segments.append([t, "busy"])
            t += 60 * rng.uniform(2, 25)
            segments.append([t, "idle"])
            t += 60 * rng.uniform(1, 8)
        if parks and rng.random() < 0.7:
            segments.append([t, "parked"])
            resting = "parked"
            if rng.random() < 0.3:  # parked long enough to be released
                t += 60 * rng.uniform(30, 60)
                segments += [[t, "draining"], [t + 8, "cold"]]
                t += 8
                resting = "cold"
        else:
            segments += [[t, "draining"], [t + 6, "cold"]]
            t += 6
            resting = "cold"
        if rng.random() < 0.05:  # a start that failed, retried at the next request
            segments += [[t + 60, "starting:pulling"], [t + 90, "failed"], [t + 400, "cold"]]
            t += 400
    segments = [[round(at, 1), label] for at, label in segments if at <= now - 60]
    marks = [{**m, "at": round(m["at"], 1)} for m in marks if m["at"] <= now - 60]
    return {"v": 1, "until": round(now - 30, 1), "segments": segments, "marks": marks}


def busy_since(document: dict[str, Any], since: float) -> bool:
    """The recorded day was busy at some time after ``since``."""
    segments = document["segments"]
    ends = [at for at, _ in segments[1:]] + [document["until"]]
    return any(
        label == "busy" and end > since for (_, label), end in zip(segments, ends, strict=True)
    )


def spend_of_day(now: float, rng: random.Random) -> dict[str, Any]:
    """Today's cloud spend as the budget keeps it: two models' lines since midnight."""
    start = midnight(now)
    lines: dict[str, list[list[float]]] = {}
    for model, rate in (("qwen3-8b", 0.15), ("flux-dev", 0.4)):
        usd, line, t = 0.0, [], start
        while t < now - 300:
            t += rng.uniform(600, 2400)
            usd += rate * rng.uniform(0.2, 1.5)
            line.append([round(min(t, now - 300), 1), round(usd, 6)])
        lines[model] = line
    spent = sum(line[-1][1] for line in lines.values() if line)
    return {
        "day": time.strftime("%Y-%m-%d", time.gmtime(now)),
        "spent": round(spent, 6),
        "reserved": 0.0,
        "open_reservations": 0,
        "by_model": lines,
    }


def day_config(tmp_path: Path) -> dict[str, Any]:
    data = config(load=0.3)
    targets: dict[str, Any] = {}
    for name, (parks, _, _) in TARGETS.items():
        spec = demo(name, tmp_path, park_after="5m") if parks else sleepy()
        spec["routes"] = [{"path_prefix": f"/{name}", "strip_prefix": True}]
        targets[name] = spec
    targets["comfyui-flux"]["pool"] = targets["wan-video"]["pool"] = "workstation"
    data["targets"] = targets
    data["pools"] = {"workstation": {"capacity": 2}}
    data["models"] = {
        model: {
            "placements": [
                {"target": "vllm-qwen"},
                {"cloud": "managed", "model": "frontier-large", "cost": PRICES},
            ]
        }
        for model in ("qwen3-8b", "flux-dev")
    }
    data["clouds"] = {"managed": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": KEY_ENV}}
    data["policy"] = {"daily_cloud_budget_usd": 25}
    data["api"] = {"allow_anonymous": True}
    data["state_dir"] = str(tmp_path / "state")
    return data


async def test_a_recorded_day_is_drawn_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, CLOUD_KEY)
    now, rng = time.time(), random.Random(25)
    state = tmp_path / "state"
    state.mkdir()
    days = {name: day_of(name, now, rng) for name in TARGETS}
    for name, document in days.items():
        (state / f"{name}.{KEY}.json").write_text(json.dumps(document))
    spend = spend_of_day(now, rng)
    (state / "budget.json").write_text(json.dumps(spend))

    async with warmgate(day_config(tmp_path)) as wg, chromium(1280, 1000) as page:
        await page.goto(wg.admin + "/")
        await page.wait_for_selector("#live.on")
        for name, document in days.items():
            shown = await labels(page, name)
            kept = [label for _, label in document["segments"]]
            assert shown[: len(kept)] == kept, f"{name}: the day as recorded"
            assert shown[len(kept) :] == ["unknown", "cold"], "the restart's gap, then now"
            marks = page.locator(f"{strip(name)} path.mark")
            assert await marks.count() == len(document["marks"])
        today = midnight(now)
        waits = sum(
            1 for d in days.values() for m in d["marks"] if m["at"] >= today and m["seconds"]
        )
        counts = await page.locator("svg.waits rect.wait").evaluate_all(
            "rects => rects.map(r => Number(r.dataset.count))"
        )
        assert sum(counts) == waits
        kinds = await page.locator("svg.gpu-hours rect.hours").evaluate_all(
            "rects => rects.map(r => r.dataset.target + ' ' + r.dataset.kind)"
        )
        assert {k.split()[0] for k in kinds if k.endswith(" busy")} == {
            name for name, document in days.items() if busy_since(document, today)
        }
        assert await page.locator("svg.occupancy[data-pool='workstation'] polyline").count() == 1
        lines = page.locator("svg.spend-chart polyline.spend")
        models = await lines.evaluate_all("lines => lines.map(l => l.dataset.model)")
        assert models == sorted(m for m, line in spend["by_model"].items() if line)
        assert await page.locator("svg.spend-chart line.budget").count() == 1
        out = tmp_path / "dashboard.png"
        await page.screenshot(path=str(out), full_page=True)
        assert out.stat().st_size > 10_000
        copy = os.environ.get("WARMGATE_DASHBOARD_PNG")
        if copy:
            shutil.copyfile(out, ROOT / copy)


SMALL_TEXT = """() => {
    const small = [];
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        const el = node.parentElement;
        const text = node.textContent.trim();
        if (!text || !el || el.closest("title, script, style, noscript")) continue;
        if (!el.getClientRects().length) continue;  // not drawn (hidden, a closed details)
        let size = parseFloat(getComputedStyle(el).fontSize);
        if (el instanceof SVGElement) size *= el.getScreenCTM().a;  // scaled with its drawing
        if (size < 10) small.push(size.toFixed(1) + "px " + el.tagName + ": " + text.slice(0, 30));
    }
    return small;
}"""

TICKS = """() => [...document.querySelectorAll(".ticks span")].map(span => {
    const box = span.parentElement.getBoundingClientRect(), r = span.getBoundingClientRect();
    return {text: span.textContent, inside: r.left >= box.left - 0.5 && r.right <= box.right + 0.5};
})"""


async def test_on_a_phone_every_word_is_at_least_10px_and_no_clock_is_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, CLOUD_KEY)
    now, rng = time.time(), random.Random(31)
    state = tmp_path / "state"
    state.mkdir()
    for name in TARGETS:
        (state / f"{name}.{KEY}.json").write_text(json.dumps(day_of(name, now, rng)))
    (state / "budget.json").write_text(json.dumps(spend_of_day(now, rng)))
    async with warmgate(day_config(tmp_path)) as wg, chromium(390, 844) as page:
        for width in (390, 1280):
            await page.set_viewport_size({"width": width, "height": 844})
            await page.goto(wg.admin + "/")
            await page.wait_for_selector("#live.on")
            assert await page.evaluate(SMALL_TEXT) == [], f"at {width} px"
            ticks = await page.evaluate(TICKS)
            assert len(ticks) > 4 * 14, "each strip (day and hour), the pool's, the spend's"
            assert all(re.fullmatch(r"\d\d:\d\d", t["text"]) for t in ticks)
            assert [t for t in ticks if not t["inside"]] == [], f"at {width} px"
            await page.screenshot(path=str(tmp_path / f"day-{width}.png"), full_page=True)
