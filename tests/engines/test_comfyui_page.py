"""ComfyUI's own web page through warmgate, in Chromium (the heavy tier, make test-engines):
a cold start the page continues from by itself, a render run from it, the reads it makes of a
parked engine, and the calm tab across a release, fresh and after a reload."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from router.scale.state import Phase, TargetState
from tests.browser import chromium, needs_chromium
from tests.engines.comfyui_page import GRAPH_LOADED, Tab, comfy, needs_frontend
from tests.helpers import wait_until, warmgate

pytestmark = [needs_chromium, needs_frontend]

READS = ("/api/history?max_items=64", "/api/queue", "/api/object_info", "/api/system_stats")


async def test_the_page_continues_after_a_cold_start_runs_and_reads_a_parked_engine(
    tmp_path: Path, record_property: Any
) -> None:
    async with warmgate(comfy(tmp_path, park_after="1s", idle_after="10m")) as wg:
        runtime = wg.runtime("comfy")
        ready_at: list[float] = []

        def changed(old: TargetState, new: TargetState) -> None:
            if new.phase is Phase.READY and old.phase is not Phase.READY and not ready_at:
                ready_at.append(time.monotonic())

        runtime.cell.subscribe(changed)
        async with chromium() as page:
            tab = Tab(page).watch()
            response = await page.goto(wg.url + "/")
            assert response is not None and response.status == 503, "the waiting page"
            await page.wait_for_function(GRAPH_LOADED, timeout=120_000)
            # The page went on by itself: the waiting page's reload, answered by the engine.
            loads = [(t, status) for t, url, status in tab.documents if url == wg.url + "/"]
            asked = [t for t, status in loads if status is None][1]
            answered = next(t for t, status in loads if status == 200)
            continued, shown = asked - ready_at[0], answered - ready_at[0]
            record_property("ready_to_reload_s", round(continued, 3))
            record_property("ready_to_page_s", round(shown, 3))
            print(f"\nready -> reload asked {continued:.3f} s, -> page answered {shown:.3f} s")

            prompt_id = await tab.run()
            done = await tab.executed(prompt_id)
            image = done["output"]["images"][0]
            assert image["filename"].startswith("ComfyUI_")

            # Parked: the page's reads (and its image) are answered by the parked process.
            await wait_until(
                lambda: runtime.state.phase is Phase.PARKED and not runtime.state.parking,
                timeout=30,
            )
            view = f"/api/view?filename={image['filename']}&type=output&subfolder="
            statuses = await page.evaluate(
                "paths => Promise.all(paths.map(p => fetch(p).then(r => r.status)))",
                [*READS, view],
            )
            assert statuses == [200] * (len(READS) + 1), statuses
            assert runtime.state.phase is Phase.PARKED and not runtime.state.waking


@pytest.mark.parametrize("tab_kind", ["fresh", "reloaded"])
async def test_the_calm_tab_gets_its_render_after_a_release(tmp_path: Path, tab_kind: str) -> None:
    """A fresh tab opened its socket as plain /ws and learned its client id from the first
    status frame; a reloaded one asks with ?clientId=. Either way, after the GPU was released
    under it, the render its Run click wakes the engine for reaches it on the same socket."""
    # idle_after outlasts the page's own load (its reads of a released engine would not wake
    # it: the page would stay half-built), then the tab sits idle past it.
    async with warmgate(comfy(tmp_path, idle_after="8s")) as wg, chromium() as page:
        runtime = wg.runtime("comfy")
        tab = Tab(page).watch()
        await page.goto(wg.url + "/")
        await page.wait_for_function(GRAPH_LOADED, timeout=120_000)
        if tab_kind == "reloaded":
            await page.reload()
            await page.wait_for_function(GRAPH_LOADED, timeout=120_000)
            assert "clientId=" in tab.sockets[-1].url, "a reloaded tab asks for its id"
        socket = len(tab.sockets) - 1
        await wait_until(lambda: tab.seen("status"), timeout=30)

        await wait_until(lambda: runtime.state.phase is Phase.COLD, timeout=60)
        await wait_until(lambda: runtime.activity.held_sockets == 1, timeout=10)
        assert not tab.sockets[socket].is_closed(), "the tab's socket stays open"

        prompt_id = await tab.run()  # held through the cold start
        await tab.executed(prompt_id)
        assert [i for i, _ in tab.seen("executed", prompt_id)] == [socket], "on the same socket"
        assert len(tab.sockets) == socket + 1, "the tab opened no other socket"
        await asyncio.sleep(0)
