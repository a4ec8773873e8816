"""Gradio's own page in a real headless Chromium, through warmgate, against a real Gradio app
shaped like Wan2GP (tests/gradio_app.py: it launches with Gradio's ``HEAD /`` check), on the
version Wan2GP pins (5.29) and on the current one.

- A tab whose ``queue/data`` stream was left open with no job (as Gradio 5.29's page often leaves
  it) and cut by the release: its next click, held through a new cold start, is served. Gradio's
  page marks its stream closed only on ``{"msg": "close_stream"}``, and opens a new one for its
  next job only if it did.
- Eight tabs opened during a cold start, each on the waiting page, all continue by themselves
  to the app's page (a page as heavy to build as Wan2GP's), let through two a second.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from router.scale.state import Phase
from tests.backends.engines.test_gradio_queue import config as queue_config
from tests.backends.engines.test_gradio_queue import gradio529_python
from tests.browser import chromium, needs_chromium
from tests.helpers import gradio_app, metric_value, wait_until, warmgate

pytestmark = needs_chromium

START = 120_000
"""Milliseconds a page may wait for a cold start of the Gradio app here (a bound, not a figure)."""


@pytest.fixture(params=["5.29", "current"])
def python(request: pytest.FixtureRequest) -> str:
    return gradio529_python() if request.param == "5.29" else sys.executable


def config(tmp_path: Path, python: str, **env: str) -> dict[str, Any]:
    """tests/backends/engines/test_gradio_queue.py's target at ``/``, with the waiting page,
    idle after 3 s."""
    data = queue_config(tmp_path, python)
    wan = data["targets"]["wan"]
    wan.update(routes=[{"path_prefix": "/"}], waiting_page="auto")
    wan["backend"] = gradio_app(tmp_path, python, **env)
    wan["scaling"].update(idle_after="3s", cold_start_timeout="120s")
    return data


async def test_a_stale_tabs_click_is_served_after_the_cold_start(
    tmp_path: Path, python: str
) -> None:
    data = config(tmp_path, python, GRADIO_APP_OPEN_STREAMS="1")
    async with warmgate(data, str(tmp_path)) as wg, chromium() as page:
        runtime = wg.runtime("wan")
        # The waiting page, then Gradio's own page once the app is up.
        await page.goto(wg.url + "/")
        await page.wait_for_function("() => document.title === 'wan2gp-like'", timeout=START)
        await page.wait_for_selector("#list-events", timeout=START)

        # A job that leaves the tab's queue/data stream open with nothing behind it.
        await page.click("#list-events")
        await wait_until(lambda: runtime.activity.streams and not runtime.activity.in_flight)
        # Released at idle_after: the open stream is closed with the GPU.
        await wait_until(lambda: runtime.state.phase is Phase.COLD, timeout=60)

        # The stale tab clicks: its job is held through a new cold start, then served.
        await page.fill("#prompt textarea", "a lighthouse")
        await page.click("#generate")
        await page.wait_for_function(
            "() => document.querySelector('#status textarea').value.startsWith('rendered')",
            timeout=START,
        )
        assert runtime.state.phase is Phase.READY
        value = await page.input_value("#status textarea")
        assert value == "rendered a lighthouse (#1 in this session)"


PAGE_WEIGHT = 5_000
"""Hidden values in the app's config: each ``GET /`` (and Gradio's own launch check, ``HEAD /``)
copies them, about as long as Wan2GP takes to build its page."""


async def test_eight_held_tabs_all_continue_to_the_app(tmp_path: Path, python: str) -> None:
    data = config(tmp_path, python, GRADIO_APP_PAGE_WEIGHT=str(PAGE_WEIGHT))
    data["targets"]["wan"]["scaling"]["idle_after"] = "10m"
    async with warmgate(data, str(tmp_path)) as wg, chromium() as first:
        runtime = wg.runtime("wan")
        browser = first.context.browser
        pages = [first, *[await browser.new_page() for _ in range(7)]]
        for page in pages:  # each gets the waiting page at once
            response = await page.goto(wg.url + "/")
            assert response is not None and response.status == 503
        # Ready: every tab continues by itself, at the pace the app survives, to its page.
        for page in pages:
            await page.wait_for_selector("#generate", timeout=START)
        assert runtime.state.phase is Phase.READY
        assert await metric_value(wg.admin, "warmgate_cold_starts_total", target="wan") == 1
