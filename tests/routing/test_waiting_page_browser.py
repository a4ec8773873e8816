"""The waiting page in a real headless Chromium: from the cold page to the rendered demo UI."""

from __future__ import annotations

import asyncio

from tests.browser import chromium, needs_chromium
from tests.helpers import ROOT, demo_engine, warmgate

pytestmark = needs_chromium


def demo_config(checkpoint_mib: int) -> dict[str, object]:
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": {
            "demo": {
                "routes": [{"path_prefix": "/"}],
                "backend": {
                    "kind": "process",
                    "command": demo_engine(size=f"{checkpoint_mib}MiB", render_seconds=0.3),
                    "cwd": str(ROOT),
                },
                "readiness": {"path": "/readyz", "interval": "100ms"},
            }
        },
    }


async def test_browser_waits_on_the_page_then_lands_on_the_demo_ui() -> None:
    async with warmgate(demo_config(32)) as wg, chromium() as page:
        response = await page.goto(wg.url + "/")
        assert response is not None and response.status == 503
        assert "Starting" in await page.title()
        assert await page.locator("#state").text_content() in ("cold", "starting")
        # The page follows the phase and reloads itself into the engine's own UI.
        await page.wait_for_function("() => !document.title.startsWith('Starting')", timeout=60_000)
        await page.wait_for_load_state("load")
        assert "Starting" not in await page.content()
        # The demo UI works through warmgate: render one prompt over its websocket.
        await page.fill("#text", "a lighthouse at dusk")
        await page.click("#render")
        await page.wait_for_selector("#final[src*='view']", timeout=30_000)
        await asyncio.sleep(0)


async def test_a_read_opened_in_a_tab_says_it_wakes_nothing_and_starts_nothing() -> None:
    config = demo_config(1)
    target = config["targets"]["demo"]  # type: ignore[index]
    target["engine"] = "comfyui"
    target["readiness"] = {"path": "/system_stats", "interval": "100ms"}
    async with warmgate(config) as wg, chromium() as page:
        response = await page.goto(wg.url + "/object_info")
        assert response is not None and response.status == 503
        # Its script ran at load (it shows the status it was given) and kept the words.
        assert "does not wake it" in (await page.locator("#phase").text_content() or "")
        assert wg.runtime("demo").state.phase.value == "cold"
