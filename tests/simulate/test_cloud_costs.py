"""What the replay's cloud charges: an image per request of an images model at its
``per_image``, a chat request's tokens at ``output_per_mtok``, and for a request that gives only
its work time (an access log's) the tokens that time makes at ``--tokens-per-second``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.config import parse_config
from router.simulate.backends import Duration
from router.simulate.run import Options, replay
from router.simulate.trace import parse

WORKFLOW = Path(__file__).parents[2] / "deploy" / "local" / "workflows" / "flux_dev.json"


def _config(kind: str, cost: dict[str, float]) -> dict[str, Any]:
    local: dict[str, Any] = {"target": "local"}
    if kind == "images":
        local["workflow"] = str(WORKFLOW)
    return {
        "targets": {
            "local": {
                "engine": "comfyui" if kind == "images" else "openai",
                "routes": [{"path_prefix": "/local"}],
                "backend": {"kind": "process", "command": ["true"], "port": 1},
                "scaling": {"idle_after": "5m"},
            }
        },
        "models": {
            "m": {
                "kind": kind,
                "placements": [
                    local,
                    {"cloud": "managed", "model": "big", "cost": cost},
                ],
            }
        },
        "clouds": {"managed": {"base_url": "https://cloud.example/v1", "api_key_env": "NONE"}},
        "policy": {"max_wait": "1s", "daily_cloud_budget_usd": 100, "warm_on_cloud": False},
        "api": {"allow_anonymous": True},
    }


@pytest.mark.parametrize(
    ("kind", "cost", "line", "usd"),
    [
        ("images", {"per_image": 0.04}, "0,m,api,,12", 0.04),
        ("chat", {"output_per_mtok": 10.0}, "0,m,api,2000,", 0.02),
        ("chat", {"output_per_mtok": 10.0}, "0,m,api,,50", 50 * 40 * 10.0 / 1e6),
    ],
)
def test_the_cloud_charges_what_the_request_used(
    kind: str, cost: dict[str, float], line: str, usd: float
) -> None:
    trace = parse(f"time,model,kind,tokens,work_seconds\n{line}\n")
    options = Options(cold_start={"*": Duration(60.0, 60.0)}, tail=60.0, tokens_per_second=40.0)
    result = replay(parse_config(_config(kind, cost)), trace, options)
    [outcome] = result.outcomes
    assert outcome.placement == "cloud"
    assert outcome.cloud_usd == pytest.approx(usd)
