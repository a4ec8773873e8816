"""A ``process`` target's child (an engine and its third-party plugins) gets warmgate's
environment without warmgate's secrets: no cloud API key, no copy of the replicas' token."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.cluster.test_replicas_budget import table  # noqa: F401 - a fixture
from tests.helpers import ROOT, warmgate

ENGINE = """
import http.server, json, os, sys
with open(sys.argv[2], "w") as out:
    json.dump(dict(os.environ), out)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


async def test_the_child_gets_no_cloud_key_and_no_replicas_token(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    table: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    monkeypatch.setenv("WARMGATE_TEST_CLOUD_KEY", "sk-cloud-never-for-children")
    monkeypatch.setenv("ALSO_THE_TOKEN", "replicas-secret-7f3a")
    monkeypatch.setenv("WARMGATE_TEST_ORDINARY", "kept")
    (tmp_path / "token").write_text("replicas-secret-7f3a\n")
    seen = tmp_path / "child-env.json"
    config = {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": {
            "engine": {
                "routes": [{}],
                "backend": {
                    "kind": "process",
                    "command": [sys.executable, "-c", ENGINE, "{port}", str(seen)],
                    "cwd": str(ROOT),
                    "env": {"FROM_CONFIG": "yes"},
                    "stop_grace": "2s",
                },
                "readiness": {"path": "/", "interval": "50ms"},
            }
        },
        "models": {"m": {"placements": [{"cloud": "c", "model": "big"}]}},
        "clouds": {
            "c": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "WARMGATE_TEST_CLOUD_KEY"}
        },
        "policy": {"daily_cloud_budget_usd": 5},
        "api": {"allow_anonymous": True},
        "replicas": {"namespace": "w", "service": "p", "identity": "me", "token_file": "token"},
    }
    async with warmgate(config, str(tmp_path)) as wg:
        table["me"] = wg.admin
        async with aiohttp.ClientSession() as http, http.get(wg.url + "/") as resp:
            assert resp.status == 200 and await resp.text() == "ok"
    env = json.loads(seen.read_text())
    assert env["WARMGATE_TEST_ORDINARY"] == "kept" and env["FROM_CONFIG"] == "yes"
    assert "WARMGATE_TEST_CLOUD_KEY" not in env
    assert "ALSO_THE_TOKEN" not in env
    assert "sk-cloud-never-for-children" not in json.dumps(env)
