"""The environment is read in one place (``router/config/env.py``), once, and handed down."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from backends.kubernetes.client import resolve_access
from backends.process import ProcessBackend
from backends.registry import make_backend, make_membership
from backends.specs import ReplicasSpec
from router.config import Environment, parse_config, read_environment
from router.openai.credentials import cloud_api_keys
from tests.helpers import ROOT

READS = re.compile(r"\bos\.environb?\b|\bgetenvb?\b|\bfrom os import\b")
"""Reading the process environment: ``os.environ``, ``os.getenv`` (or importing them by name)."""
ALLOWED = {
    "router/config/env.py": None,  # the one reader
    # a setting written for gRPC before it is imported (it reads it itself), not a read
    "router/__init__.py": 'os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")',
}


def _reads(path: Path) -> list[str]:
    return [
        line.strip() for line in path.read_text(encoding="utf-8").splitlines() if READS.search(line)
    ]


def test_only_router_config_env_reads_the_environment() -> None:
    found: dict[str, list[str]] = {}
    for package in ("router", "backends"):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name.startswith("backends/demo_engine/"):
                continue  # the demo engine is a program of its own, with its own environment
            if lines := _reads(path):
                found[name] = lines
    assert set(found) <= set(ALLOWED), {k: v for k, v in found.items() if k not in ALLOWED}
    assert found.get("router/__init__.py") == [ALLOWED["router/__init__.py"]]
    assert "router/config/env.py" in found


def test_read_environment_resolves_each_variable() -> None:
    environ = {
        "WARMGATE_LOG_LEVEL": "debug",
        "KUBECONFIG": "/k/a:/k/b",
        "HOME": "/home/me",
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "POD_NAME": "warmgate-7d9c-abcde",
        "POD_IP": "10.1.2.3",
        "POD_NAMESPACE": "warmgate",
        "OTHER": "x",
    }
    env = read_environment(environ)
    assert env.log_level == "debug"
    assert dict(env.kube) == {
        "KUBECONFIG": "/k/a:/k/b",
        "HOME": "/home/me",
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    }
    assert (env.pod_name, env.pod_ip) == ("warmgate-7d9c-abcde", "10.1.2.3")
    assert dict(env.variables) == environ


def test_defaults_when_nothing_is_set() -> None:
    env = read_environment({})
    assert env == Environment()
    assert (env.log_level, env.pod_name, env.pod_ip) == ("INFO", None, None)
    assert dict(env.kube) == {} and dict(env.variables) == {}


def test_a_snapshot_later_changes_do_not_reach() -> None:
    environ = {"A": "1"}
    env = read_environment(environ)
    environ["A"] = "2"
    assert env.variables["A"] == "1"
    with pytest.raises(TypeError):
        env.variables["A"] = "3"  # type: ignore[index]


def test_read_environment_defaults_to_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POD_NAME", "from-os-environ")
    monkeypatch.delenv("WARMGATE_LOG_LEVEL", raising=False)
    env = read_environment()
    assert env.pod_name == "from-os-environ" and env.log_level == "INFO"


CONFIG: dict[str, Any] = {
    "targets": {"t": {"routes": [{}], "backend": {"kind": "static", "url": "http://x:1"}}},
    "models": {"m": {"placements": [{"cloud": "a", "model": "x"}, {"cloud": "b", "model": "y"}]}},
    "clouds": {
        "a": {"base_url": "https://a.example/v1", "api_key_env": "A_KEY"},
        "b": {"base_url": "https://b.example/v1", "api_key_env": "B_KEY"},
    },
}


def test_the_config_carries_the_environment_it_was_loaded_with() -> None:
    env = read_environment({"A_KEY": " sk-a \n", "B_KEY": "  "})
    config = parse_config(CONFIG, "<test>", environment=env)
    assert config.environment is env
    assert "environment" not in config.model_dump()
    assert config.environment.api_key("A_KEY") == "sk-a"


def test_parse_config_reads_the_process_environment_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("A_KEY", "sk-from-env")
    assert parse_config(CONFIG).environment.api_key("A_KEY") == "sk-from-env"


def test_environment_is_not_a_key_of_the_file() -> None:
    from router.errors import ConfigError

    with pytest.raises(ConfigError, match="environment: is not a known key"):
        parse_config({**CONFIG, "environment": {"log_level": "DEBUG"}}, "f.yaml")


def test_a_cloud_whose_key_variable_is_missing_or_blank_is_unavailable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = parse_config(CONFIG, environment=read_environment({"A_KEY": "sk-a", "B_KEY": " "}))
    assert cloud_api_keys(config.clouds, config.environment) == {"a": "sk-a"}
    assert "cloud 'b': B_KEY is not set; its placements are skipped" in caplog.text
    config = parse_config(CONFIG, environment=read_environment({}))
    assert cloud_api_keys(config.clouds, config.environment) == {}


def test_a_process_child_starts_from_the_environment_handed_down() -> None:
    config = parse_config(
        {
            "targets": {
                "p": {
                    "routes": [{}],
                    "backend": {"kind": "process", "command": ["engine"], "env": {"B": "{port}"}},
                }
            }
        },
        environment=read_environment({"A": "1", "B": "x"}),
    )
    env = config.environment
    backend = make_backend(
        "p", config.targets["p"].backend, ".", environ=env.variables, kube_environ=env.kube
    )
    assert isinstance(backend, ProcessBackend)
    assert dict(backend.environ) == {"A": "1", "B": "x"}


def test_kubernetes_access_is_resolved_from_the_variables_handed_down(tmp_path: Path) -> None:
    env = read_environment({"KUBECONFIG": "/a:/b", "HOME": "/h", "UNRELATED": "1"})
    access = resolve_access(env.kube, serviceaccount_dir=tmp_path)
    assert str(access.kubeconfig) == "/a"
    access = resolve_access(read_environment({"HOME": "/h"}).kube, serviceaccount_dir=tmp_path)
    assert str(access.kubeconfig) == "/h/.kube/config"


@pytest.mark.parametrize(
    ("identity", "pod_name", "expected"),
    [("from-config", "pod-a", "from-config"), (None, "pod-a", "pod-a"), (None, None, None)],
)
def test_a_replica_is_named_by_config_then_pod_name_then_host_name(
    identity: str | None, pod_name: str | None, expected: str | None
) -> None:
    import socket

    spec = ReplicasSpec(namespace="warmgate", service="peers", identity=identity)
    env = read_environment({"POD_NAME": pod_name} if pod_name else {})
    membership = make_membership(
        spec, kube_environ=env.kube, pod_name=env.pod_name, pod_ip=env.pod_ip
    )
    assert membership.identity == (expected or socket.gethostname())
