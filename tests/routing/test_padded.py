"""A held request the engine answers with JSON (router/routing/padded.py): its answer begins
while the target starts, whitespace keeps a client with a short read timeout reading, and the
engine's body follows at ready; what cannot follow a 200 is cut, never ended."""

from __future__ import annotations

import sys

import aiohttp
import pytest

from router.scale.state import Phase
from tests.helpers import ROOT, metric_value, one_target, warmgate

SHORT_READS = aiohttp.ClientTimeout(total=60, sock_read=2.5)
"""A client that gives up after 2.5 s without a byte: less than the 3 s start below."""


def config() -> dict[str, object]:
    command = [sys.executable, "-m", "tests.sleepy_engine", "--port", "{port}", "--load", "3"]
    spec = {
        "engine": "gradio",
        "routes": [{"path_prefix": "/"}],
        "backend": {"kind": "process", "command": command, "cwd": str(ROOT), "stop_grace": "2s"},
        "readiness": {"path": "/readyz", "interval": "50ms"},
        "scaling": {"idle_after": "1h"},
        "waiting_page": "off",
    }
    return one_target("t", spec)


async def test_a_short_read_timeout_gets_its_answer_through_a_longer_start() -> None:
    async with warmgate(config()) as wg, aiohttp.ClientSession() as http:
        async with http.get(wg.url + "/config", timeout=SHORT_READS) as resp:
            assert resp.status == 200 and resp.content_type == "application/json"
            assert "X-Warmgate-Cold-Start" not in resp.headers  # the head went out first
            body = await resp.read()
        assert body.lstrip(b" ").startswith(b"pid ") and body.startswith(b" ")
        assert await metric_value(wg.admin, "warmgate_cold_starts_total", target="t") == 1
        # Ready: answered as any request, with the engine's own head.
        async with http.get(wg.url + "/config", timeout=SHORT_READS) as resp:
            assert resp.status == 200 and (await resp.read()).startswith(b"pid ")


async def test_an_engine_that_answers_no_200_after_the_answer_began_is_cut() -> None:
    async with warmgate(config()) as wg, aiohttp.ClientSession() as http:
        async with http.get(wg.url + "/gradio_api/info", timeout=SHORT_READS) as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
        assert wg.runtime("t").state.phase is Phase.READY
        async with http.get(wg.url + "/gradio_api/info", timeout=SHORT_READS) as resp:
            assert resp.status == 404  # once ready, the engine's own answer


def test_only_a_generic_client_gets_a_padded_answer() -> None:
    from aiohttp.test_utils import make_mocked_request

    from router.routing.padded import may_pad

    def asked(**headers: str) -> bool:
        return may_pad(make_mocked_request("GET", "/config", headers=headers))

    assert asked()  # no Accept: as a bare client sends
    assert asked(Accept="*/*")  # httpx, requests, gradio_client
    assert not asked(Accept="application/json")  # it names what it takes: the hold's status
    assert not asked(Accept="*/*", **{"Sec-Fetch-Mode": "cors"})  # a browser waits
