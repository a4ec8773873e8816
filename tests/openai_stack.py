"""Shared parts of the OpenAI API tests: configs with a local target and a cloud, both fake
OpenAI-compatible servers on loopback, and warmgate in-process between them."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from router.openai.api import OPENAI_API, OpenAIApi
from tests.fake_openai import FakeOpenAI
from tests.helpers import ROOT, Running, metric_value, serve_app, warmgate

CLOUD_KEY = "sk-cloud-SECRET-4f1c9a0b7e"
KEY_ENV = "WARMGATE_TEST_CLOUD_KEY"
PRICES = {"input_per_mtok": 3.0, "output_per_mtok": 15.0}


def base_config(local_url: str | None, cloud_url: str, **policy: Any) -> dict[str, Any]:
    targets: dict[str, Any] = {
        "vllm-local": {
            "routes": [{"path_prefix": "/llm"}],
            "backend": {"kind": "static", "url": local_url or "http://127.0.0.1:9"},
        }
    }
    cloud = {"cloud": "managed", "model": "frontier-large", "cost": PRICES}
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": True},
        "targets": targets,
        "models": {
            "qwen3-8b": {"placements": [{"target": "vllm-local"}, cloud]},
            "frontier": {"placements": [cloud]},
            "local-only": {"placements": [{"target": "vllm-local", "model": "served-name"}]},
            "embed": {
                "kind": "embeddings",
                "placements": [{"target": "vllm-local"}],
            },
            "embed-cloud": {
                "kind": "embeddings",
                "placements": [{"cloud": "managed", "model": "embed-large", "cost": PRICES}],
            },
            "image-cloud": {
                "kind": "images",
                "placements": [
                    {"cloud": "managed", "model": "image-large", "cost": {"per_image": 0.04}}
                ],
            },
        },
        "clouds": {
            "managed": {"base_url": cloud_url + "/v1", "api_key_env": KEY_ENV, "timeout": "2s"}
        },
        "policy": {"daily_cloud_budget_usd": 25, **policy},
        "api": {"allow_anonymous": True},  # the tests' clients carry no keys unless they set some
    }


def process_target(startup_delay: float = 0.3, idle_after: str = "10m") -> dict[str, Any]:
    """A local OpenAI-compatible server that warmgate starts itself: it cold-starts for real."""
    command = [sys.executable, "-m", "tests.fake_openai", "--port", "{port}"]
    return {
        "routes": [{"path_prefix": "/llm"}],
        "backend": {
            "kind": "process",
            "command": [*command, "--startup-delay", str(startup_delay)],
            "cwd": str(ROOT),
            "stop_grace": "2s",
        },
        "readiness": {"path": "/v1/models", "interval": "50ms"},
        "scaling": {"idle_after": idle_after, "cold_start_timeout": "30s"},
    }


@dataclass
class Stack:
    wg: Running
    local: FakeOpenAI
    cloud: FakeOpenAI

    @property
    def api(self) -> OpenAIApi:
        assert self.wg.server.apps is not None
        return self.wg.server.apps.public[OPENAI_API]

    def client(self, key: str = "client-key", **kwargs: Any) -> openai.AsyncOpenAI:
        kwargs.setdefault("max_retries", 0)
        return openai.AsyncOpenAI(base_url=self.wg.url + "/v1", api_key=key, **kwargs)

    def sync_client(self, key: str = "client-key", **kwargs: Any) -> openai.OpenAI:
        kwargs.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.wg.url + "/v1", api_key=key, **kwargs)

    async def decisions(self, **labels: str) -> float:
        return await metric_value(self.wg.admin, "warmgate_decisions_total", **labels)


@asynccontextmanager
async def stack(
    *, local: FakeOpenAI | None = None, cloud: FakeOpenAI | None = None, **kwargs: Any
) -> AsyncIterator[Stack]:
    """warmgate with a static local target and the cloud; ``tweak(config)`` may edit the config;
    ``base_dir`` is where relative files are found."""
    local = local or FakeOpenAI(name="local")
    cloud = cloud or FakeOpenAI(api_key=CLOUD_KEY, name="cloud")
    tweak = kwargs.pop("tweak", None)
    base_dir = kwargs.pop("base_dir", str(ROOT))
    async with serve_app(local.app()) as local_url, serve_app(cloud.app()) as cloud_url:
        config = base_config(local_url, cloud_url, **kwargs)
        if tweak is not None:
            tweak(config)
        async with warmgate(config, base_dir=base_dir) as wg:
            yield Stack(wg, local, cloud)


def seen_anywhere(fake: FakeOpenAI, secret: str) -> bool:
    return any(
        secret in value for r in fake.requests for value in [*r.headers.values(), r.body.decode()]
    )


@pytest.fixture
def cloud_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """The cloud's API key, in the environment only (as warmgate expects it)."""
    monkeypatch.setenv(KEY_ENV, CLOUD_KEY)
    return CLOUD_KEY
