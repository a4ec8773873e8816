"""The images deploy/images/ builds, built (``make test-images``: tests/images/build.py, on a
Debian base and stand-in engine sources) and run with podman as deploy/ runs them: as uid 10001,
read-only where deploy/ says so, their entrypoints and commands as they are. warmgate's image
checks deploy/'s own config; the engines' images answer /readyz from warmgate's node and
launcher. tests/kube/test_image_on_kube.py serves with the warmgate image against the real API
server. Run by ``make test-images`` (``WARMGATE_IMAGES=1``), skipped otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_tree import build as build_tree
from tests.deploy_tree import find

from .build import engine, exists, tag

UID = "10001"


def image(name: str) -> str:
    """The built image's tag. Only under ``make test-images`` (``WARMGATE_IMAGES``), which has
    just built it: an image left from an earlier tree is not what this one would build."""
    if not os.environ.get("WARMGATE_IMAGES"):
        pytest.skip("the images are built and run by make test-images (WARMGATE_IMAGES=1)")
    if not exists(tag(name)):
        pytest.fail(f"{tag(name)} not built (make test-images builds it)", pytrace=False)
    return tag(name)


def podman(*args: str, check: bool = True, timeout: float = 120) -> str:
    done = subprocess.run(
        [*engine(), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0 or not check, f"{' '.join(args)}:\n{done.stderr}"
    return done.stdout + done.stderr


class Container:
    """One detached container; removed at the end."""

    def __init__(self, *args: str) -> None:
        self.name = f"warmgate-test-{uuid.uuid4().hex[:8]}"
        podman("run", "-d", "--name", self.name, *args)

    def python(self, code: str, check: bool = True) -> str:
        return podman("exec", self.name, "python", "-c", code, check=check)

    def get(self, url: str) -> tuple[int, str]:
        """An HTTP GET from inside the container, with its own Python."""
        code = (
            "import urllib.request, urllib.error, json\n"
            f"try:\n    r = urllib.request.urlopen({url!r}, timeout=5); s, b = r.status, r.read()\n"
            "except urllib.error.HTTPError as e:\n    s, b = e.code, e.read()\n"
            "print(json.dumps([s, b.decode(errors='replace')]))"
        )
        status, body = json.loads(self.python(code).strip().splitlines()[-1])
        return int(status), str(body)

    def until(self, url: str, status: int = 200, within: float = 60) -> str:
        deadline = time.monotonic() + within
        last: Any = None
        while time.monotonic() < deadline:
            try:
                got, body = self.get(url)
            except (AssertionError, ValueError) as exc:  # not up yet
                last = exc
            else:
                if got == status:
                    return body
                last = (got, body)
            time.sleep(0.3)
        raise AssertionError(f"{url}: never {status}; last {last}\n{self.logs()}")

    def logs(self) -> str:
        return podman("logs", self.name, check=False)

    def remove(self) -> None:
        podman("rm", "-f", "-t", "5", self.name, check=False)


@pytest.fixture
def containers() -> Iterator[list[Container]]:
    made: list[Container] = []
    yield made
    for c in made:
        c.remove()


def test_the_warmgate_image_checks_deploys_config_as_its_user(tmp_path: Path) -> None:
    warmgate = image("warmgate")
    assert podman("run", "--rm", "--entrypoint", "id", warmgate, "-u").strip() == UID
    objects = build_tree("base")
    config = yaml.safe_load(find(objects, "ConfigMap")["data"]["warmgate.yaml"])
    (tmp_path / "config").mkdir()
    (tmp_path / "config/warmgate.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "replicas").mkdir()
    (tmp_path / "replicas/token").write_text("a-shared-token-for-the-replicas\n")
    out = podman(
        "run",
        "--rm",
        "--read-only",
        "--network",
        "none",
        "-v",
        f"{tmp_path / 'config'}:/etc/warmgate:ro",
        "-v",
        f"{tmp_path / 'replicas'}:/etc/warmgate-replicas:ro",
        warmgate,
        "check",
        "--config",
        "/etc/warmgate/warmgate.yaml",
    )
    assert "/etc/warmgate/warmgate.yaml: ok, 2 targets" in out, out
    assert "comfyui" in out and "wan2gp" in out


def test_the_comfyui_image_serves_readyz_from_warmgates_node(
    containers: list[Container],
) -> None:
    comfyui = image("comfyui")
    assert podman("run", "--rm", "--entrypoint", "id", comfyui, "-u").strip() == UID
    c = Container("--network", "none", comfyui)
    containers.append(c)
    body = c.until("http://127.0.0.1:8188/readyz")
    assert json.loads(body)["stage"] == "ready", body
    assert c.get("http://127.0.0.1:8188/system_stats")[0] == 200
    owner = c.python("import os; print(os.stat('/app/custom_nodes/warmgate_readyz').st_uid)")
    assert owner.strip() == UID, "the tree belongs to the user ComfyUI runs as"
    cmdline = c.python("print(open('/proc/1/cmdline').read().replace(chr(0), ' '))")
    assert cmdline.split()[:4] == ["python", "main.py", "--listen", "0.0.0.0"], cmdline


def test_the_wan2gp_image_starts_wgp_through_warmgates_launcher(
    containers: list[Container],
) -> None:
    wan2gp = image("wan2gp")
    assert podman("run", "--rm", "--entrypoint", "id", wan2gp, "-u").strip() == UID
    c = Container("--network", "none", "-e", "EAGER_LOAD_MODEL=0", wan2gp)
    containers.append(c)
    c.until("http://127.0.0.1:7861/readyz")
    assert c.get("http://127.0.0.1:7860/config")[0] == 200, "wgp.py's app on its port"
    cmdline = c.python("print(open('/proc/1/cmdline').read().replace(chr(0), ' '))")
    assert cmdline.split()[:5] == ["python", "-m", "warmgate_wan2gp", "--ready-port", "7861"]
    config = json.loads(c.python("print(open('/app/wgp_config.json').read())"))
    assert "P" not in str(config.get("preload_model_policy", "")), config
    podman("stop", "-t", "30", c.name)
    assert "Exited (0)" in podman("ps", "-a", "--filter", f"name={c.name}"), c.logs()
