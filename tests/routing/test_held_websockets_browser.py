"""An open tab stays calm, in a real headless Chromium (Debian's, through Playwright) on the demo
engine's page: its websocket survives the release of the GPU (no "Reconnecting" banner, no
second websocket), the idle tab wakes nothing, and the progress of the next render arrives
over the same socket once a click on Render woke the engine."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from router.scale.state import Phase
from tests.browser import chromium, needs_chromium
from tests.helpers import ROOT, demo_engine, wait_until, warmgate

pytestmark = needs_chromium

WATCH_BANNER = """
window.bannerShown = 0;
document.addEventListener('DOMContentLoaded', () => {
  const banner = document.getElementById('reconnecting');
  if (!banner) return;  // the waiting page
  new MutationObserver(() => { if (!banner.hidden) window.bannerShown += 1; })
    .observe(banner, {attributes: true});
});
"""


def demo(tmp: Path) -> dict[str, Any]:
    command = demo_engine("--steps", "6", render_seconds=2, checkpoint=tmp / "checkpoint.bin")
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": {
            "demo": {
                "engine": "comfyui",
                "routes": [{"path_prefix": "/"}],
                "backend": {"kind": "process", "command": command, "cwd": str(ROOT)},
                "readiness": {"path": "/readyz", "interval": "100ms"},
                "scaling": {
                    "idle_after": "2s",
                    "busy_poll": "200ms",
                    "stream_activity_window": "200ms",
                },
            }
        },
    }


async def test_the_tab_keeps_its_websocket_through_a_release_and_gets_progress_after_the_wake(
    tmp_path: Path,
) -> None:
    async with warmgate(demo(tmp_path)) as wg, chromium() as page:
        runtime = wg.runtime("demo")
        sockets: list[Any] = []
        frames: list[str] = []

        def opened(ws: Any) -> None:
            sockets.append(ws)
            ws.on("framereceived", lambda payload: frames.append(str(payload)))

        page.on("websocket", opened)
        await page.add_init_script(WATCH_BANNER)
        await page.goto(wg.url + "/")  # the waiting page, then the demo UI
        await page.wait_for_function(
            "() => document.getElementById('reconnecting') !== null", timeout=60_000
        )
        await page.wait_for_function(  # the engine's status message came over the socket
            "() => document.getElementById('status').textContent.startsWith('queue')",
            timeout=30_000,
        )
        assert len(sockets) == 1

        # Nobody works: the GPU is released while the tab stays open, and the tab's socket is
        # held by warmgate; it wakes nothing.
        await wait_until(lambda: runtime.state.phase is Phase.COLD, timeout=30)
        await wait_until(lambda: runtime.activity.held_sockets == 1, timeout=5)
        await asyncio.sleep(3)
        assert runtime.state.phase is Phase.COLD, "the idle tab woke the target"
        assert await page.is_hidden("#reconnecting")

        # A click on Render wakes it; the progress comes over the same socket.
        before = len(frames)
        await page.click("#render")
        await page.wait_for_selector("#final[src*='view']", timeout=60_000)
        assert any('"progress"' in frame for frame in frames[before:])
        assert runtime.state.phase is Phase.READY
        assert len(sockets) == 1, "the tab had to open another websocket"
        assert await page.evaluate("window.bannerShown") == 0
        assert await page.is_hidden("#reconnecting")
