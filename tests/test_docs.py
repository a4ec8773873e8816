"""The docs as a new user follows them: the examples load and say what a first start needs,
and what the docs say clients see is what they see."""

from __future__ import annotations

import re
from pathlib import Path

from backends.specs import ProcessSpec
from router.config import load_config
from tests.helpers import ROOT

DOCS = ROOT / "docs"


def section(text: str, heading: str) -> str:
    """The text under a ``## heading`` up to the next one."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_the_comfyui_example_runs_comfyuis_python_and_waits_for_its_weights(
    tmp_path: Path,
) -> None:
    comfyui = section((DOCS / "engines.md").read_text(), "engine: comfyui")
    example = re.search(r"```yaml\n(.*?)```", comfyui, re.S)
    assert example is not None
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows/warmup.json").write_text('{"1": {"class_type": "X", "inputs": {}}}')
    (tmp_path / "warmgate.yaml").write_text(example.group(1))
    target = load_config(tmp_path / "warmgate.yaml").targets["comfyui"]
    assert isinstance(target.backend, ProcessSpec)
    command = target.backend.command
    assert command[0] not in ("python", "python3"), "warmgate's own interpreter has no torch"
    assert "warmgate's own" in comfyui and "No module named 'torch'" in comfyui
    assert target.readiness.path == "/readyz"  # the node's, not /system_stats
    assert target.backend.env["EAGER_LOAD_MODEL"] == "1"
    node = re.search(r"cp -r (deploy/images/comfyui/\w+) \S*custom_nodes/", comfyui)
    assert node is not None and (ROOT / node.group(1) / "__init__.py").is_file()


def test_the_readme_says_the_engines_reason_for_a_failed_start_reaches_the_response() -> None:
    clients = section((ROOT / "README.md").read_text(), "What clients see")
    row = next(line for line in clients.splitlines() if "the cold start failed" in line)
    assert "never to the response" not in row
    assert "engine's own reason" in row and "docs/engines.md" in row


def test_the_cold_start_header_is_documented_for_images_too() -> None:
    row = next(
        line
        for line in (DOCS / "openai.md").read_text().splitlines()
        if line.startswith("| `X-Warmgate-Cold-Start`")
    )
    assert "images" in row and "chat" in row and "embeddings" in row
