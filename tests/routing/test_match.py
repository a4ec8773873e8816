"""Route matching: longest prefix across targets, hosts with wildcards, headers, stripping."""

from __future__ import annotations

from router.config import parse_config
from router.routing.match import RouteTable


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
    assert match is not None and match.target == "comfy" and match.redirect == "/comfy/"
    assert table().match("x", "/comfy/", {}) == match.__class__(match.entry, "/")


def test_a_stripped_prefix_without_its_slash_redirects_and_only_then() -> None:
    def target(*routes: dict[str, object]) -> dict[str, object]:
        return {"routes": list(routes), "backend": {"kind": "static", "url": "http://x"}}

    routes = RouteTable(
        parse_config(
            {
                "targets": {
                    "root": target({"path_prefix": "/"}),
                    "ui": target({"path_prefix": "/ui/", "strip_prefix": True}),
                    "kept": target({"path_prefix": "/kept/"}),
                    "only-b": target(
                        {"hosts": ["b"], "path_prefix": "/b-ui/", "strip_prefix": True}
                    ),
                }
            }
        )
    )
    ui = routes.match("x", "/ui", {})
    assert ui is not None and (ui.target, ui.redirect) == ("ui", "/ui/")
    kept = routes.match("x", "/kept", {})  # not stripped: the upstream sees the path it expects
    assert kept is not None and (kept.target, kept.redirect) == ("root", None)
    other_host = routes.match("a", "/b-ui", {})
    assert other_host is not None and (other_host.target, other_host.redirect) == ("root", None)
    on_b = routes.match("b", "/b-ui", {})
    assert on_b is not None and on_b.redirect == "/b-ui/"


def test_hosts_exact_wildcard_and_port() -> None:
    assert target_of("render.lab:8080", "/") == "render"
    assert target_of("a.render.lab", "/") == "render"
    assert target_of("RENDER.LAB", "/x") == "render"
    assert target_of("evil-render.lab", "/") == "root"
    assert target_of("render.lab.evil", "/") == "root"


def test_a_trailing_dot_is_the_same_host_and_an_empty_label_matches_no_wildcard() -> None:
    assert target_of("render.lab.", "/") == "render"
    assert target_of("render.lab.:8080", "/") == "render"
    assert target_of("a.render.lab.", "/") == "render"
    assert target_of(".render.lab", "/") == "root"
    assert target_of("a..render.lab", "/") == "root"
    assert target_of("..render.lab", "/") == "root"
    assert target_of("render.lab..", "/") == "root"


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
