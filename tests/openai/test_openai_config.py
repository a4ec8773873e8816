"""models:, clouds:, policy: and api: in the config file: the documented example loads, and
mistakes name the key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.cli import main
from router.config import load_config, parse_config
from router.errors import ConfigError
from tests.helpers import ROOT

EXAMPLE = """
targets:
  vllm-local:
    routes: [{path_prefix: /llm}]
    backend: {kind: static, url: "http://127.0.0.1:8000"}
  comfyui:
    routes: [{path_prefix: /}]
    backend: {kind: static, url: "http://127.0.0.1:8188"}
models:
  qwen3-8b:
    placements:
      - target: vllm-local              # an engine: openai target
        cost_per_gpu_second: 0.0008
      - cloud: managed
        model: frontier-large
        cost: {input_per_mtok: 3.0, output_per_mtok: 15.0}
  flux-dev:
    kind: images
    placements:
      - target: comfyui
        workflow: deploy/local/workflows/flux_dev.json
      - cloud: managed
        model: image-large
        cost: {per_image: 0.04}
clouds:
  managed: {base_url: "https://cloud.example/v1", api_key_env: MANAGED_API_KEY, timeout: 120s}
policy:
  max_wait: 10s
  daily_cloud_budget_usd: 25
  private: {header: X-Warmgate-Private, api_keys: [lab-private]}
  overflow_queue_depth: 4
  warm_on_cloud: true
api:
  allow_anonymous: true
"""


def test_check_lists_the_models_of_the_api_with_their_placements(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MANAGED_API_KEY", "sk-test")
    path = tmp_path / "warmgate.yaml"
    path.write_text(EXAMPLE.replace("deploy/", f"{ROOT}/deploy/"))
    assert main(["check", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "OpenAI-compatible API (/v1): 2 models" in out
    lines = [line.split() for line in out.splitlines()]
    assert ["qwen3-8b", "chat", "vllm-local,", "managed/frontier-large"] in lines
    assert ["flux-dev", "images", "comfyui,", "managed/image-large"] in lines


def test_the_issue_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "warmgate.yaml"
    path.write_text(EXAMPLE.replace("deploy/", f"{ROOT}/deploy/"))
    config = load_config(path)
    qwen = config.models["qwen3-8b"]
    assert qwen.kind == "chat" and qwen.max_wait is None
    assert [p.label for p in qwen.placements] == ["vllm-local", "managed/frontier-large"]
    assert qwen.placements[1].cost.output_per_mtok == 15.0
    assert config.models["flux-dev"].placements[1].cost.per_image == 0.04
    assert config.clouds["managed"].timeout == 120.0 and config.clouds["managed"].retries == 1
    policy = config.policy
    assert policy.max_wait == 10.0 and policy.daily_cloud_budget_usd == 25
    assert policy.private.api_keys == ("lab-private",) and policy.warm_on_cloud


def test_without_models_nothing_changes() -> None:
    config = parse_config(
        {"targets": {"t": {"routes": [{}], "backend": {"kind": "static", "url": "http://x:1"}}}}
    )
    assert config.models == {} and config.policy.daily_cloud_budget_usd == 0.0


BASE = {
    "targets": {"llm": {"routes": [{}], "backend": {"kind": "static", "url": "http://x:1"}}},
    "clouds": {"managed": {"base_url": "https://c.example/v1", "api_key_env": "K"}},
}


@pytest.mark.parametrize(
    ("models", "key", "expected"),
    [
        (
            {"m": {"placements": [{"target": "nope"}]}},
            "models.m.placements[0].target",
            "no target named 'nope'",
        ),
        (
            {"m": {"placements": [{"target": "llm"}, {"cloud": "other", "model": "x"}]}},
            "models.m.placements[1].cloud",
            "no cloud named 'other'",
        ),
        ({"m": {"placements": [{"cloud": "managed"}]}}, "models.m.placements[0]", "needs model:"),
        (
            {"m": {"placements": [{"target": "llm", "cloud": "managed", "model": "x"}]}},
            "models.m.placements[0]",
            "either target:",
        ),
        ({"m": {"placements": []}}, "models.m.placements", "at least one placement"),
        (
            {"m": {"kind": "images", "placements": [{"target": "llm"}]}},
            "models.m.placements[0].workflow",
            "needs a workflow",
        ),
        (
            {
                "m": {
                    "kind": "images",
                    "placements": [{"target": "llm", "workflow": "missing.json"}],
                }
            },
            "models.m.placements[0].workflow",
            "cannot be read",
        ),
        (
            {"m": {"placements": [{"target": "llm", "workflow": "w.json"}]}},
            "models.m.placements[0].workflow",
            "only models of kind: images",
        ),
        (
            {"m": {"placements": [{"target": "llm", "cost": {"per_image": 1}}]}},
            "models.m.placements[0]",
            "cost is for cloud placements",
        ),
        ({"m": {"kind": "audio", "placements": [{"target": "llm"}]}}, "models.m.kind", "chat"),
        ({"m m": {"placements": [{"target": "llm"}]}}, "models.m m", "expected a model name"),
    ],
)
def test_mistakes_name_the_key_path(
    tmp_path: Path, models: dict[str, object], key: str, expected: str
) -> None:
    (tmp_path / "w.json").write_text('{"1": {"class_type": "KSampler", "inputs": {}}}')
    with pytest.raises(ConfigError) as info:
        parse_config({**BASE, "models": models}, "f.yaml", str(tmp_path))
    assert f"f.yaml: {key}: " in str(info.value)
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("section", "key", "expected"),
    [
        (
            {"clouds": {"c": {"base_url": "ftp://x", "api_key_env": "K"}}},
            "clouds.c.base_url",
            "http",
        ),
        (
            {"clouds": {"c": {"base_url": "https://x", "api_key_env": "sk-123"}}},
            "clouds.c.api_key_env",
            "environment variable name",
        ),
        ({"policy": {"max_wait": "soon"}}, "policy.max_wait", "duration"),
        ({"policy": {"daily_cloud_budget_usd": -1}}, "policy.daily_cloud_budget_usd", "0"),
        ({"policy": {"private": {"headr": "X"}}}, "policy.private.headr", "not a known key"),
        ({"api": {"api_keys_file": "nope.txt"}}, "api.api_keys_file", "not a readable file"),
    ],
)
def test_clouds_policy_and_api_are_checked(
    tmp_path: Path, section: dict[str, object], key: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({**BASE, **section}, "f.yaml", str(tmp_path))
    assert f"f.yaml: {key}: " in str(info.value)
    assert expected in str(info.value)
