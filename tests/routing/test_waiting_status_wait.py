"""The waiting page's status request with ``?wait=``: answered when the target's state changes
(at once once it is ready), so the page continues the moment it can without polling fast. A
real warmgate and a real engine process on 127.0.0.1."""

from __future__ import annotations

import itertools
import sys
from typing import Any

import aiohttp

from tests.helpers import ROOT, one_target, warmgate

PAGE = {"Accept": "text/html", "Sec-Fetch-Mode": "navigate"}


def sleepy(load: float) -> dict[str, Any]:
    command = [sys.executable, "-m", "tests.sleepy_engine", "--port", "{port}"]
    return {
        "routes": [{"path_prefix": "/"}],
        "backend": {
            "kind": "process",
            "command": [*command, "--load", str(load)],
            "cwd": str(ROOT),
            "stop_grace": "2s",
        },
        "readiness": {"path": "/readyz", "interval": "50ms"},
    }


async def test_a_status_that_waits_answers_each_change_and_ready_at_once() -> None:
    async with warmgate(one_target("t", sleepy(load=0.5))) as wg, aiohttp.ClientSession() as http:
        async with http.get(wg.url + "/", headers=PAGE) as page:
            assert page.status == 503  # the waiting page; the start is asked for
        url = wg.url + "/.warmgate/status/t"
        async with http.get(url) as resp:  # no wait: as it is now
            seen = [await resp.json()]
        while not seen[-1]["ready"]:
            async with http.get(url, params={"wait": "5"}) as resp:
                assert resp.headers["Cache-Control"] == "no-store"
                seen.append(await resp.json())
            assert len(seen) < 20, "answered without waiting for a change"
        states = [(s["phase"], s["stage_text"], s["progress"]) for s in seen]
        # every answer that waited brought a change (the start took well under 5 s)
        assert all(a != b for a, b in itertools.pairwise(states)), states
        async with http.get(url, params={"wait": "5"}) as resp:
            assert (await resp.json())["ready"], "ready: answered at once"
