"""The images deploy/ runs are the ones deploy/images/ builds: every tag, command, port, user and
variable of the Deployments matches its Dockerfile and what the image's code reads. Plain file
reads (no container engine, no kubectl): the Dockerfiles themselves are linted by hadolint in
``make check``."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "deploy/images"
BASE = ROOT / "deploy/base"


def module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded
    try:
        spec.loader.exec_module(loaded)
    finally:
        del sys.modules[name]
    return loaded


class Dockerfile:
    def __init__(self, path: Path) -> None:
        self.text = path.read_text()
        lines = re.sub(r"\\\n", " ", self.text).splitlines()
        self.instructions = [line.strip().split(None, 1) for line in lines if line.strip()]
        self.instructions = [i for i in self.instructions if not i[0].startswith("#")]

    def all(self, keyword: str) -> list[str]:
        return [
            rest for word, *rest_list in self.instructions if word == keyword for rest in rest_list
        ]

    def last(self, keyword: str) -> str:
        return self.all(keyword)[-1]

    def exec_form(self, keyword: str) -> list[str]:
        value = json.loads(self.last(keyword))
        assert isinstance(value, list)
        return value

    def arg(self, name: str) -> str:
        (value,) = [a.split("=", 1)[1] for a in self.all("ARG") if a.startswith(name + "=")]
        return value


def deployment(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((BASE / path).read_text()) if d]
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def image_tag(container: dict[str, Any]) -> tuple[str, str]:
    name, tag = container["image"].rsplit(":", 1)
    return name, tag


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def ports_of(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def test_the_router_image() -> None:
    dockerfile = Dockerfile(IMAGES / "warmgate/Dockerfile")
    pod, container = deployment("router/deployment.yaml")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert image_tag(container) == ("ghcr.io/warmgate/warmgate", version)
    assert dockerfile.exec_form("ENTRYPOINT") == ["warmgate"]
    assert (
        dockerfile.exec_form("CMD")
        == container["args"]
        == [
            "serve",
            "--config",
            "/etc/warmgate/warmgate.yaml",
        ]
    )
    assert dockerfile.last("USER") == str(pod["securityContext"]["runAsUser"])
    assert set(dockerfile.last("EXPOSE").split()) == {str(p) for p in ports_of(container).values()}
    assert dockerfile.last("FROM").startswith("${PYTHON_IMAGE}")
    assert "python:3.11-slim" in dockerfile.arg("PYTHON_IMAGE")
    # The build context is the repository root: .dockerignore lets through what it copies.
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    for copied in ("pyproject.toml", "setup.py", "README.md", "router/", "backends/"):
        assert f"!{copied}" in ignore


def test_the_comfyui_image() -> None:
    dockerfile = Dockerfile(IMAGES / "comfyui/Dockerfile")
    _pod, container = deployment("render/comfyui.yaml")
    version = dockerfile.arg("COMFYUI_VERSION")
    assert image_tag(container) == ("ghcr.io/warmgate/comfyui", version)
    assert dockerfile.last("ADD") == "${COMFYUI_SOURCE} /tmp/comfyui.tar.gz"
    assert dockerfile.arg("COMFYUI_SOURCE").endswith(
        "ComfyUI/archive/refs/tags/v${COMFYUI_VERSION}.tar.gz"
    ), "by default the release's tarball"
    assert "--chown=comfy:comfy warmgate_readyz /app/custom_nodes/warmgate_readyz" in (
        dockerfile.all("COPY")
    )
    assert dockerfile.exec_form("ENTRYPOINT") == ["python", "main.py"]
    ports = ports_of(container)
    assert container["args"][container["args"].index("--port") + 1] == str(ports["http"])
    assert dockerfile.last("EXPOSE") == str(ports["http"])
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    # What the custom node reads from these variables: an eager load of named checkpoints.
    readiness = module(IMAGES / "comfyui/warmgate_readyz/readiness.py", "warmgate_readyz_settings")
    settings = readiness.settings_from(env_of(container))
    assert settings.eager and settings.checkpoints and settings.error is None


def test_the_wan2gp_image() -> None:
    dockerfile = Dockerfile(IMAGES / "wan2gp/Dockerfile")
    _pod, container = deployment("render/wan2gp.yaml")
    assert image_tag(container) == ("ghcr.io/warmgate/wan2gp", dockerfile.arg("WAN2GP_VERSION"))
    commit = dockerfile.arg("WAN2GP_COMMIT")
    assert re.fullmatch(r"[0-9a-f]{40}", commit), "pinned to a commit"
    assert dockerfile.last("ADD") == "${WAN2GP_SOURCE} /tmp/wan2gp.tar.gz"
    assert dockerfile.arg("WAN2GP_SOURCE").endswith("Wan2GP/archive/${WAN2GP_COMMIT}.tar.gz")
    entrypoint = dockerfile.exec_form("ENTRYPOINT")
    assert entrypoint[:3] == ["python", "-m", "warmgate_wan2gp"]
    assert entrypoint[entrypoint.index("--") :] == ["--", "python", "wgp.py"]
    ready_port = int(entrypoint[entrypoint.index("--ready-port") + 1])
    ports = ports_of(container)
    assert ports == {"http": 7860, "ready": ready_port}
    assert set(dockerfile.last("EXPOSE").split()) == {"7860", str(ready_port)}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ready"}
    args = container["args"]
    assert "--listen" in args and args[args.index("--server-port") + 1] == str(ports["http"])
    # What the launcher reads from these variables: the preload, from the read-only share.
    sys.path.insert(0, str(IMAGES / "wan2gp"))
    try:
        from warmgate_wan2gp import wgpconfig
    finally:
        sys.path.remove(str(IMAGES / "wan2gp"))
    settings = wgpconfig.settings_from(env_of(container))
    assert settings.eager and settings.model
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert settings.checkpoints[0].startswith(mounts["models"]["mountPath"] + "/")
    assert mounts["models"]["readOnly"] is True


def test_every_image_has_a_readme_and_the_docs_say_how_to_build_it() -> None:
    docs = (ROOT / "docs/kubernetes.md").read_text()
    for folder in ("warmgate", "comfyui", "wan2gp"):
        assert (IMAGES / folder / "README.md").is_file()
        assert (IMAGES / folder / "Dockerfile").is_file()
        assert re.search(rf"(docker|podman) build .*deploy/images/{folder}", docs), folder
    assert "images:" in docs and "newName:" in docs, "a kustomize image override"
