"""Route matching: longest prefix across targets, hosts with wildcards, headers, stripping."""

from __future__ import annotations

from router.config import parse_config
from router.match import RouteTable


def table() -> RouteTable:
    def target(*routes: dict[str, object]) -> dict[str, object]:
        return {"routes": list(routes), "backend": {"kind": "static", "url": "http://x"}}

    return RouteTable(
        parse_config(
            {
                "targets": {
                    "root": target({"path_prefix": "/"}),
                    "comfy": target({"path_prefix": "/comfy", "strip_prefix": True}),
                    "comfy-api": target({"path_prefix": "/comfy/api/"}),
                    "render": target({"hosts": ["render.lab", "*.render.lab"], "path_prefix": "/"}),
                    "team": target(
                        {"hosts": ["render.lab"], "path_prefix": "/", "headers": {"X-Team": "a"}}
                    ),
                }
            }
        )
    )


def target_of(host: str, path: str, headers: dict[str, str] | None = None) -> str | None:
    match = table().match(host, path, headers or {})
    return match.target if match else None


def test_longest_prefix_wins_on_segment_boundaries() -> None:
    assert target_of("x", "/comfy/api/prompt") == "comfy-api"
    assert target_of("x", "/comfy/view") == "comfy"
    assert target_of("x", "/comfy") == "comfy"
    assert target_of("x", "/comfyx") == "root"


def test_strip_prefix_rewrites_the_path() -> None:
    match = table().match("x", "/comfy/view", {})
    assert match is not None and match.upstream_path == "/view"
    match = table().match("x", "/comfy", {})
    assert match is not None and match.upstream_path == "/"


def test_hosts_exact_wildcard_and_port() -> None:
    assert target_of("render.lab:8080", "/") == "render"
    assert target_of("a.render.lab", "/") == "render"
    assert target_of("RENDER.LAB", "/x") == "render"
    assert target_of("evil-render.lab", "/") == "root"
    assert target_of("render.lab.evil", "/") == "root"


def test_headers_must_all_match() -> None:
    assert target_of("render.lab", "/", {"x-team": "a"}) == "team"
    assert target_of("render.lab", "/", {"x-team": "b"}) == "render"


def test_no_catch_all_means_no_match() -> None:
    config = parse_config(
        {
            "targets": {
                "a": {
                    "routes": [{"path_prefix": "/a", "hosts": ["h"]}],
                    "backend": {"kind": "static", "url": "http://x"},
                }
            }
        }
    )
    assert RouteTable(config).match("h", "/b", {}) is None
    assert RouteTable(config).match("other", "/a", {}) is None
