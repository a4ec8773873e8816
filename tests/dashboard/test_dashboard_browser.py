"""The dashboard in a real headless Chromium (Debian's, through Playwright, as the waiting page's
test runs it): it follows a cold start and the idle release without a reload, the wake action
works with the admin token and is refused without it, and a screenshot of two targets and one
model is written under the test's output (docs/dashboard.png, the README's, is the day replayed
by tests/dashboard/test_dashboard_day_browser.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.browser import chromium, needs_chromium
from tests.dashboard.test_dashboard import TOKEN, config, sleepy
from tests.fake_openai import FakeOpenAI
from tests.helpers import serve_app, warmgate
from tests.openai_stack import CLOUD_KEY, KEY_ENV, PRICES, process_target

pytestmark = needs_chromium


def card(name: str, phase: str) -> str:
    return f'#target-{name}[data-phase="{phase}"]'


WATCH_PHASES = """() => {
    window.phases = [];
    const note = () => {
        const card = document.querySelector("#target-sleepy");
        const phase = card && card.dataset.phase;
        if (phase && window.phases[window.phases.length - 1] !== phase) window.phases.push(phase);
    };
    note();
    new MutationObserver(note).observe(document.getElementById("view"), {childList: true});
}"""


async def test_the_dashboard_follows_a_cold_start_and_the_idle_release() -> None:
    data = config(load=2.0, idle_after="2s")
    async with warmgate(data) as wg, chromium() as page, aiohttp.ClientSession() as session:
        await page.goto(wg.admin + "/")
        await page.wait_for_selector(card("sleepy", "cold"))
        await page.wait_for_selector("#live.on")  # following GET /events
        await page.evaluate(WATCH_PHASES)  # what the page shows, in order; lost on a reload

        request = asyncio.create_task(session.get(wg.url + "/hello"))
        await page.wait_for_selector(card("sleepy", "starting"), timeout=10_000)
        await page.wait_for_selector(card("sleepy", "ready"), timeout=20_000)
        response = await request
        assert response.status == 200
        response.release()
        # Idle for idle_after: released; the GPU-seconds it was held for are shown.
        await page.wait_for_selector(card("sleepy", "cold"), timeout=20_000)
        idle = await page.locator("#target-sleepy .gpu-idle").text_content()
        assert idle is not None and int(idle) >= 1
        shown = await page.evaluate("window.phases")  # undefined after a reload
        assert [p for p in shown if p != "draining"] == ["cold", "starting", "ready", "cold"]
        kinds = await page.locator("ol.events li").evaluate_all(
            "items => items.map(item => item.className)"
        )
        assert kinds[:4] == ["ev release", "ev drain", "ev ready", "ev start"], "newest first"


async def test_wake_with_the_token_and_refused_without(tmp_path: Path) -> None:
    (tmp_path / "admin-token").write_text(TOKEN + "\n")
    data = config("admin-token", load=0.3)
    async with warmgate(data, str(tmp_path)) as wg, chromium() as page:
        await page.goto(wg.admin + "/")
        await page.wait_for_selector("#live.on")
        assert await page.locator("#token-form").is_visible(), "the page asks for the token"
        # Without the token: refused, and the page says why.
        await page.click('#target-sleepy button[data-action="wake"]')
        await page.wait_for_selector("#notice.error")
        notice = await page.locator("#notice").text_content()
        assert notice == (
            "wake sleepy refused (401): the admin token is needed (Authorization: Bearer)"
        )
        assert wg.runtime("sleepy").state.phase.value == "cold"
        # A wrong token: refused too.
        await page.fill("#token", "not-the-token")
        await page.click("#token-form button")
        await page.wait_for_function(
            "document.getElementById('notice').textContent.includes('wrong')"
        )
        # The token: kept for the session, the wake goes through and the target starts.
        await page.fill("#token", TOKEN)
        await page.click("#token-form button")
        await page.wait_for_selector("#notice.ok")
        assert await page.locator("#notice").text_content() == "wake sleepy: starting"
        await page.wait_for_selector(card("sleepy", "ready"), timeout=15_000)
        assert await page.evaluate("sessionStorage.getItem('warmgate-admin-token')") == TOKEN
        asked = page.locator("ol.events li.ev:has-text('wake asked')")
        assert await asked.count() == 1
        assert "from the dashboard: starting" in (await asked.text_content() or "")
        # Once given, it is used without asking again.
        await page.click('#target-sleepy button[data-action="park"]')
        await page.wait_for_function(
            "document.getElementById('notice').textContent.includes('parking is not available')"
        )
        assert not await page.locator("#token-form").is_visible()


async def test_a_screenshot_of_two_targets_and_one_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, CLOUD_KEY)
    cloud = FakeOpenAI(api_key=CLOUD_KEY, name="cloud")
    (tmp_path / "admin-token").write_text(TOKEN + "\n")
    async with serve_app(cloud.app()) as cloud_url:
        data = config("admin-token", load=0.5)
        data["targets"] = {
            "comfyui": {**sleepy(load=0.5), "routes": [{"path_prefix": "/"}]},
            "vllm-qwen": process_target(startup_delay=0.5),
        }
        data["models"] = {
            "qwen3-8b": {
                "placements": [
                    {"target": "vllm-qwen"},
                    {"cloud": "managed", "model": "frontier-large", "cost": PRICES},
                ]
            }
        }
        data["clouds"] = {"managed": {"base_url": cloud_url + "/v1", "api_key_env": KEY_ENV}}
        data["policy"] = {"daily_cloud_budget_usd": 25, "max_wait": "0s", "warm_on_cloud": True}
        data["api"] = {"allow_anonymous": True}
        async with warmgate(data, str(tmp_path)) as wg, aiohttp.ClientSession() as session:
            chat = {"model": "qwen3-8b", "messages": [{"role": "user", "content": "hi"}]}
            for _ in range(3):  # cold: to the cloud, warming the local target meanwhile
                async with session.post(wg.url + "/v1/chat/completions", json=chat) as r:
                    assert r.status == 200
            for _ in range(40):
                if wg.runtime("vllm-qwen").state.phase.value == "ready":
                    break
                await asyncio.sleep(0.2)
            for _ in range(5):
                async with session.post(wg.url + "/v1/chat/completions", json=chat) as r:
                    assert r.status == 200
            async with session.get(wg.url + "/") as r:  # comfyui cold-starts for its page
                assert r.status == 200
            async with chromium(1280, 1000) as page:
                await page.goto(wg.admin + "/")
                await page.wait_for_selector("#live.on")
                await page.wait_for_selector(card("comfyui", "ready"))
                await page.wait_for_selector("#model-qwen3-8b ul.bars li")
                out = tmp_path / "dashboard.png"
                await page.screenshot(path=str(out), full_page=True)
                assert out.stat().st_size > 10_000
                bars = page.locator("#model-qwen3-8b ul.bars li")
                wheres = await bars.evaluate_all("items => items.map(item => item.className)")
                assert sorted(wheres) == ["cloud", "local"]
