"""The config contract: good files load frozen; bad ones name the file, key and expectation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from router.cli import main
from router.config import load_config, parse_config
from router.errors import ConfigError

GOOD = """
listen: 127.0.0.1:8080
admin_listen: 127.0.0.1:9090
targets:
  comfyui:
    engine: http
    routes:
      - hosts: [render.example.internal, "*.render.example.internal"]
        path_prefix: /
        strip_prefix: false
        headers: {X-Team: render}
    backend:
      kind: static
      url: http://127.0.0.1:8188
    timeouts: {connect: 5s, response_headers: 300s}
    limits: {max_body: 100MiB}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "warmgate.yaml"
    path.write_text(text)
    return path


def test_the_documented_example_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    target = config.targets["comfyui"]
    assert config.listen.host == "127.0.0.1" and config.listen.port == 8080
    assert target.timeouts.connect == 5.0 and target.timeouts.response_headers == 300.0
    assert target.limits.max_body == 100 * 2**20
    assert target.routes[0].hosts == ("render.example.internal", "*.render.example.internal")
    assert target.backend.kind == "static"
    with pytest.raises(Exception, match="frozen"):
        target.timeouts.connect = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("listen: 127.0.0.1\ntargets: {}", "listen", "expected host:port"),
        ("listen: 127.0.0.1:99999\ntargets: {a: {}}", "listen", "out of range"),
        ("targets: {}", "targets", "at least one target"),
        ("targets:\n  Bad Name!: {}", "targets", "lowercase"),
        ("targets:\n  a:\n    routes: [{}]\n", "targets.a.backend", "is required"),
        (
            "targets:\n  a:\n    routes: [{}]\n    backend: {kind: ftp}",
            "targets.a.backend",
            "kind must be one of static, process",
        ),
        (
            "targets:\n  a:\n    routes: [{}]\n    backend: {kind: static, url: ftp://x}",
            "targets.a.backend.url",
            "http:// or https:// URL",
        ),
        (
            "targets:\n  a:\n    routes: [{path_prefix: comfy}]\n"
            "    backend: {kind: static, url: http://x}",
            "targets.a.routes[0].path_prefix",
            "must start with '/'",
        ),
        (
            "targets:\n  a:\n    routes: [{}]\n    backend: {kind: static, url: http://x}\n"
            "    timeouts: {connect: soon}",
            "targets.a.timeouts.connect",
            "expected a duration",
        ),
        (
            "targets:\n  a:\n    routes: [{}]\n    backend: {kind: static, url: http://x}\n"
            "    limits: {max_body: 10 parsecs}",
            "targets.a.limits.max_body",
            "expected a size",
        ),
        (
            "targets:\n  a:\n    routes: [{}]\n    backend: {kind: static, url: http://x}\n"
            "    timeout: {connect: 1s}",
            "targets.a.timeout",
            "not a known key",
        ),
        (
            "targets:\n  a:\n    routes: []\n    backend: {kind: static, url: http://x}",
            "targets.a.routes",
            "at least one route",
        ),
        (
            "targets:\n  a:\n    routes: [{hosts: []}]\n    backend: {kind: static, url: http://x}",
            "targets.a.routes[0].hosts",
            "at least one host",
        ),
        (
            "targets:\n  a:\n    routes: [{}]\n    backend: {kind: process, command: []}",
            "targets.a.backend.command",
            "non-empty list",
        ),
        (
            "targets:\n  a:\n    routes: [{}]\n    backend: {kind: static, url: http://x}\n"
            "  b:\n    routes: [{}]\n    backend: {kind: static, url: http://y}",
            "(top level)",
            "same route",
        ),
        (
            "listen: 127.0.0.1:80\nadmin_listen: 127.0.0.1:80\ntargets:\n  a:\n"
            "    routes: [{}]\n    backend: {kind: static, url: http://x}",
            "(top level)",
            "must differ",
        ),
        ("targets: [a, b]", "targets", "valid dictionary"),
        ("- just\n- a list", "(top level)", "expected a mapping"),
        ("targets:\n  a: {routes: [}", "line 2", "not valid YAML"),
        (
            "targets:\n  a:\n    routes: [{}]\n    backend: {kind: static, url: http://x}\n"
            "    scaling: {max_held: 0}",
            "targets.a.scaling.max_held",
            "an integer from 1 to",
        ),
    ],
)
def test_bad_configs_name_file_key_and_expectation(
    tmp_path: Path, text: str, key: str, expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert str(path) in message
    assert f": {key}" in message, message
    assert expected in message, message


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: \(file\): cannot be read"):
        load_config(tmp_path / "nope.yaml")


def test_units() -> None:
    config = parse_config(
        {
            "targets": {
                "a": {
                    "routes": [{}],
                    "backend": {"kind": "static", "url": "http://x"},
                    "timeouts": {"connect": "200ms", "response_headers": "1h"},
                    "limits": {"max_body": "1.5GiB"},
                    "scaling": {"idle_after": "1800s", "cold_start_timeout": 90},
                }
            }
        }
    )
    target = config.targets["a"]
    assert target.timeouts.connect == pytest.approx(0.2)
    assert target.timeouts.response_headers == 3600
    assert target.limits.max_body == int(1.5 * 2**30)
    assert target.scaling.idle_after == 1800 and target.scaling.cold_start_timeout == 90


def test_check_command_prints_the_routing_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--config", str(write(tmp_path, GOOD))]) == 0
    out = capsys.readouterr().out
    assert "ok, 1 targets" in out
    assert "render.example.internal, *.render.example.internal" in out
    assert "x-team=render" in out and "comfyui" in out and "static" in out


def test_check_command_names_the_replicas_service_and_lease(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "replicas-token").write_text("shared-between-replicas\n")
    text = GOOD + "replicas: {namespace: wg, service: wg-peers, token_file: replicas-token}\n"
    assert main(["check", "--config", str(write(tmp_path, text))]) == 0
    out = capsys.readouterr().out
    assert "replicas: peers from Service wg/wg-peers (port admin)" in out
    assert "leader Lease wg/warmgate-leader" in out


def test_check_command_fails_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--config", str(write(tmp_path, "targets: {}"))]) == 2
    assert "targets: at least one target" in capsys.readouterr().err


def test_output_to_a_closed_pipe_prints_no_traceback(tmp_path: Path) -> None:
    """``warmgate check --config F | head -1``: the reader is gone before the output is."""
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # as head does after its first line, here before the first write
    try:
        done = subprocess.run(
            [sys.executable, "-m", "router", "check", "--config", str(write(tmp_path, GOOD))],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    stderr = done.stderr.decode()
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
    assert done.returncode == 141, "as a command killed by SIGPIPE, what a shell expects"


HUGE = "1" + "0" * 400  # a 401-digit integer: valid YAML, beyond any float
TARGET = "targets:\n  a:\n    routes: [{}]\n    backend: {kind: static, url: http://x}\n"
NUMBER_KEYS = [
    (TARGET + "    timeouts: {connect: %s}", "targets.a.timeouts.connect"),
    (TARGET + "    scaling: {idle_after: %s}", "targets.a.scaling.idle_after"),
    (TARGET + "    scaling: {idle_bounds: [%s, 10]}", "targets.a.scaling.idle_bounds[0]"),
    (TARGET + "    scaling: {cold_start_timeout: %s}", "targets.a.scaling.cold_start_timeout"),
    (TARGET + "    readiness: {interval: %s}", "targets.a.readiness.interval"),
    (TARGET + "    limits: {max_body: %s}", "targets.a.limits.max_body"),
    (TARGET + "    limits: {max_connections: %s}", "targets.a.limits.max_connections"),
    (TARGET + "    scaling: {max_held: %s}", "targets.a.scaling.max_held"),
    (TARGET + "    waiting: {release_rate: %s}", "targets.a.waiting.release_rate"),
    (TARGET + "    priority: %s", "targets.a.priority"),
    (TARGET + "server: {drain_grace: %s}", "server.drain_grace"),
    (TARGET + "policy: {max_wait: %s}", "policy.max_wait"),
    (TARGET + "policy: {daily_cloud_budget_usd: %s}", "policy.daily_cloud_budget_usd"),
    (TARGET + "economics: {gpu_hour_usd: %s}", "economics.gpu_hour_usd"),
]


@pytest.mark.parametrize(("template", "key"), NUMBER_KEYS)
@pytest.mark.parametrize("value", [HUGE, "-" + HUGE, ".nan", ".inf", "true"])
def test_a_number_key_out_of_every_range_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], template: str, key: str, value: str
) -> None:
    path = write(tmp_path, template % value)
    assert main(["check", "--config", str(path)]) == 2
    head, *problems = capsys.readouterr().err.strip().splitlines()
    assert head == "warmgate: invalid config" and len(problems) == 1, problems
    assert problems[0].startswith(f"{path}: {key}: "), problems
    assert "Input should be" not in problems[0], problems


@pytest.mark.parametrize("value", ["true", "0", "65536", "-1", "1.5", '"http"', HUGE])
def test_a_readiness_port_is_a_port_or_ready_port_said_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    path = write(tmp_path, TARGET + f"    readiness: {{port: {value}}}")
    assert main(["check", "--config", str(path)]) == 2
    head, *problems = capsys.readouterr().err.strip().splitlines()
    assert head == "warmgate: invalid config" and len(problems) == 1, problems
    assert problems[0].startswith(f"{path}: targets.a.readiness.port: expected a port from 1 to"), (
        problems
    )
    assert "{ready_port}" in problems[0] and "constrained-int" not in problems[0], problems
    good = write(tmp_path, TARGET + "    readiness: {port: 8001}")
    assert main(["check", "--config", str(good)]) == 0
