"""What a config must say before warmgate opens a door: the replicas' shared token, who may
spend the cloud budget, which of warmgate's own secrets a child process never sees, and that a
URL's query string stays out of the access log unless asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.config import parse_config, read_environment
from router.errors import ConfigError

STATIC = {"routes": [{}], "backend": {"kind": "static", "url": "http://127.0.0.1:9"}}
CLOUD_KEY_ENV = "WARMGATE_TEST_CLOUD_KEY"


def replicas_config(**replicas: Any) -> dict[str, Any]:
    return {
        "targets": {"t": STATIC},
        "replicas": {"namespace": "warmgate", "service": "warmgate-peers", **replicas},
    }


def cloud_config(budget: float, **api: Any) -> dict[str, Any]:
    return {
        "targets": {"t": STATIC},
        "models": {"m": {"placements": [{"cloud": "c", "model": "big"}]}},
        "clouds": {"c": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": CLOUD_KEY_ENV}},
        "policy": {"daily_cloud_budget_usd": budget},
        **({"api": api} if api else {}),
    }


def test_replicas_without_a_token_file_is_an_error_that_says_so() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(replicas_config(), "warmgate.yaml")
    text = str(err.value)
    assert "warmgate.yaml: replicas.token_file:" in text
    assert "shared" in text and "secret" in text.lower()


def test_the_replicas_token_is_read_when_the_config_is_loaded(tmp_path: Path) -> None:
    (tmp_path / "replicas-token").write_text("s3cr3t-between-replicas\n")
    config = parse_config(
        replicas_config(token_file="replicas-token"), "warmgate.yaml", str(tmp_path)
    )
    assert config.replicas is not None and config.replicas.token_file == "replicas-token"
    assert config.replicas_token == "s3cr3t-between-replicas"
    assert "s3cr3t" not in config.model_dump_json(), "a secret is never serialized"


@pytest.mark.parametrize(
    ("content", "expected"),
    [(None, "cannot be read"), ("", "expected one token"), ("two words\n", "expected one token")],
)
def test_a_bad_replicas_token_file_names_the_key(
    tmp_path: Path, content: str | None, expected: str
) -> None:
    if content is not None:
        (tmp_path / "token").write_text(content)
    with pytest.raises(ConfigError) as err:
        parse_config(replicas_config(token_file="token"), "warmgate.yaml", str(tmp_path))
    assert "replicas.token_file" in str(err.value) and expected in str(err.value)


def test_an_open_api_that_can_spend_the_budget_is_an_error() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(cloud_config(5.0), "warmgate.yaml")
    text = str(err.value)
    assert "warmgate.yaml: api.api_keys_file:" in text
    assert "allow_anonymous" in text


def test_an_open_api_is_fine_when_meant_without_budget_or_with_keys(tmp_path: Path) -> None:
    meant = parse_config(cloud_config(5.0, allow_anonymous=True))
    assert meant.api.allow_anonymous is True
    assert parse_config(cloud_config(0.0)).api.allow_anonymous is False  # never paid for
    (tmp_path / "keys").write_text("alice sk-alice\n")
    keyed = parse_config(cloud_config(5.0, api_keys_file="keys"), "w.yaml", str(tmp_path))
    assert keyed.api.api_keys_file == "keys"


def test_the_access_log_leaves_the_query_out_by_default() -> None:
    assert parse_config({"targets": {"t": STATIC}}).server.log_query is False
    config = parse_config({"targets": {"t": STATIC}, "server": {"log_query": True}})
    assert config.server.log_query is True


def test_a_child_process_never_sees_warmgates_secrets(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("tok-between-replicas\n")
    data = cloud_config(5.0, allow_anonymous=True)
    data["replicas"] = {"namespace": "w", "service": "p", "token_file": "token"}
    environ = {
        CLOUD_KEY_ENV: "sk-cloud-123",
        "COPY_OF_THE_TOKEN": "tok-between-replicas",
        "PATH": "/usr/bin",
        "HF_HOME": "/models",
    }
    config = parse_config(data, "w.yaml", str(tmp_path), read_environment(environ))
    child = config.child_environment
    assert dict(child) == {"PATH": "/usr/bin", "HF_HOME": "/models"}
    assert config.environment.api_key(CLOUD_KEY_ENV) == "sk-cloud-123", "warmgate keeps it"
