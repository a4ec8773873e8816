"""A tampered learned-ETA document (the same one lives in a Deployment annotation, which anyone
who may annotate it controls) cannot break what shows it: /status and /targets stay valid JSON,
the dashboard renders, and ``warmgate status`` prints its table."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers import ROOT, one_target, warmgate

HUGE = 1.7e308
DOCUMENTS = {
    "huge": {"version": 1, "starts": [HUGE, HUGE, 0.0], "stages": {"loading": [HUGE, HUGE, 0.0]}},
    "large": {"version": 1, "starts": [1e300, 1e300], "stages": {}},
}


def strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("document", DOCUMENTS.values(), ids=DOCUMENTS.keys())
async def test_a_tampered_learned_document_breaks_no_view(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    (tmp_path / "t.cold-start.json").write_text(json.dumps(document))
    (tmp_path / "t.wake.json").write_text(json.dumps({"version": 1, "wakes": [HUGE, HUGE, 0.0]}))
    spec = {
        "routes": [{"path_prefix": "/"}],
        "backend": {"kind": "process", "command": ["true"], "cwd": str(ROOT)},
    }
    config = one_target("t", spec)
    config["state_dir"] = str(tmp_path)
    async with warmgate(config) as wg, aiohttp.ClientSession() as http:
        for path in ("/status", "/targets"):
            async with http.get(wg.admin + path) as resp:
                assert resp.status == 200, path
                strict(await resp.text())
        async with http.get(wg.admin + "/") as resp:
            assert resp.status == 200, await resp.text()
        async with http.get(wg.url + "/.warmgate/status/t") as resp:
            strict(await resp.text())
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "router", "status", "--admin", wg.admin, cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert "t " in out.decode()


def test_a_learned_figure_over_a_day_is_not_read_back() -> None:
    """Bounded when read: a document with a start or a wake over a day was not written by
    warmgate; it is ignored (relearned), so no decision reads a tampered ETA."""
    from router.scale.eta import ColdStarts
    from router.scale.wakes import Wakes

    for document in DOCUMENTS.values():
        starts = ColdStarts(30.0)
        assert starts.restore(document) is False
        assert starts.predicted() == 30.0
    wakes = Wakes(2.0)
    assert wakes.load({"version": 1, "wakes": [90_000.0, 1.0]}) is False
    assert wakes.predicted() == 2.0
    kept = ColdStarts(30.0)
    assert kept.restore({"version": 1, "starts": [40.0, 50.0], "stages": {}}) is True


def test_a_learned_figure_no_float_holds_is_not_read_back() -> None:
    """A 401-digit integer is valid JSON: refused (relearned), not an OverflowError at start."""
    from router.scale.eta import ColdStarts
    from router.scale.wakes import Wakes

    huge = 10**400
    starts = ColdStarts(30.0)
    assert starts.restore({"version": 1, "starts": [huge], "stages": {}}) is False
    assert starts.restore({"version": 1, "starts": [1.0], "stages": {"loading": [huge]}}) is False
    assert starts.restore({"version": 1, "starts": [float("inf")], "stages": {}}) is False
    assert Wakes(2.0).load({"version": 1, "wakes": [huge]}) is False
