"""``/.warmgate/status/<target>`` answers only for a target that a route takes for the request's
Host: another host's targets are neither told of (404, as an unknown one) nor kept from being
abandoned by a poll. A poll from the target's own host counts as someone waiting."""

from __future__ import annotations

import aiohttp

from tests.helpers import warmgate


def config() -> dict[str, object]:
    def target(host: str) -> dict[str, object]:
        return {
            "routes": [{"hosts": [host, f"*.{host}"]}],
            "backend": {"kind": "static", "url": "http://127.0.0.1:9"},
        }

    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": {"a": target("a.lab"), "b": target("b.lab")},
    }


async def test_status_answers_only_for_the_hosts_targets() -> None:
    async with warmgate(config()) as wg, aiohttp.ClientSession() as http:
        b = wg.runtime("b")
        before = b.activity.last_wanted
        for host in ("a.lab", "x.a.lab", "elsewhere", "b.lab.evil"):
            async with http.get(wg.url + "/.warmgate/status/b", headers={"Host": host}) as resp:
                assert resp.status == 404, host
        assert b.activity.last_wanted == before, "a poll from another host keeps nothing"
        for host in ("b.lab", "x.b.lab:8080", "B.LAB."):
            async with http.get(wg.url + "/.warmgate/status/b", headers={"Host": host}) as resp:
                assert resp.status == 200, host
                assert (await resp.json())["target"] == "b"
        assert b.activity.last_wanted > before
