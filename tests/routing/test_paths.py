"""Dot segments never climb out of a route: the path is normalized (RFC 3986 remove_dot_segments,
``%2e`` read as a dot) before any route matches it, and a dot segment hidden behind an encoded
slash or a backslash is refused. Examples, a property over generated paths (``make fuzz`` runs
it at the fuzz profile), and the same requests against a real upstream behind warmgate."""

from __future__ import annotations

import asyncio
import os
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.config import parse_config
from router.routing.match import RouteTable
from router.routing.paths import normalize_path
from tests.helpers import one_target, warmgate
from tests.rawserver import ok, raw_upstream

EXAMPLES = {
    "/demo/../secret": "/secret",
    "/demo/%2e%2e/secret": "/secret",
    "/demo/%2E%2e/secret": "/secret",
    "/demo/./../secret": "/secret",
    "/demo/.%2e/secret": "/secret",
    "/demo/a/../b": "/demo/b",
    "/demo/./b": "/demo/b",
    "/demo/b/.": "/demo/b/",
    "/demo/b/..": "/demo/",
    "/../../x": "/x",
    "/..": "/",
    "/a//../b": "/a/b",
    "/demo/a%2fb": "/demo/a%2fb",
    "/demo/.hidden/..x/x..": "/demo/.hidden/..x/x..",
    "/demo/%41": "/demo/%41",
}
REFUSED = [
    "/demo/..%2fsecret",
    "/demo/%2e%2e%2Fsecret",
    "/demo/..\\secret",
    "/demo/%2e%2e%5csecret",
]


@pytest.mark.parametrize(("raw", "normalized"), EXAMPLES.items())
def test_dot_segments_are_removed(raw: str, normalized: str) -> None:
    assert normalize_path(raw) == normalized


@pytest.mark.parametrize("raw", REFUSED)
def test_a_dot_segment_behind_an_encoded_slash_or_a_backslash_is_refused(raw: str) -> None:
    assert normalize_path(raw) is None


def table() -> RouteTable:
    def target(url: str, *routes: dict[str, object]) -> dict[str, object]:
        return {"routes": list(routes), "backend": {"kind": "static", "url": url}}

    return RouteTable(
        parse_config(
            {
                "targets": {
                    "demo": target("http://x/base", {"path_prefix": "/demo", "strip_prefix": True}),
                    "api": target("http://x", {"path_prefix": "/api/"}),
                }
            }
        )
    )


TABLE = table()
BASES = {"demo": "/base", "api": ""}
PREFIXES = {"demo": "/base/", "api": "/api/"}


def engine_view(path: str) -> str:
    """The path as the most lenient engine reads it: percent-decoded once, a backslash as a
    slash, dot segments removed."""
    stack: list[str] = []
    for segment in unquote(path).replace("\\", "/").split("/")[1:]:
        if segment == "..":
            if stack:
                stack.pop()
        elif segment != ".":
            stack.append(segment)
    return "/" + "/".join(stack)


SEGMENTS = st.one_of(
    st.sampled_from(
        [
            ".",
            "..",
            "%2e",
            "%2E%2e",
            ".%2e",
            "%2e.",
            "",
            "demo",
            "api",
            "a",
            "..%2f",
            "%2f..",
            "%5c..",
            "..\\",
            "%2e%2e%5C",
            "%252e%252e",
            ".a",
            "a.",
            "%2",
        ]
    ),
    st.text(alphabet="./%25eEcCfF\\a", max_size=8),
)
PATHS = st.lists(SEGMENTS, max_size=10).map(lambda segments: "/" + "/".join(segments))
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "fast")


@settings(
    max_examples=100_000 if PROFILE == "fuzz" else 2_000,
    deadline=None,
    database=None,
    derandomize=PROFILE != "fuzz",
    suppress_health_check=[HealthCheck.too_slow],
)
@given(PATHS)
def test_no_accepted_path_leaves_its_routes_prefix(raw: str) -> None:
    path = normalize_path(raw)
    if path is None:
        return  # refused with 400
    assert path.startswith("/")
    match = TABLE.match("x", path, {})
    if match is None or match.redirect is not None:
        return
    upstream = engine_view(BASES[match.target] + match.upstream_path + "/")
    assert upstream.startswith(PREFIXES[match.target]), (raw, path, upstream)


async def test_an_upstream_below_a_base_path_never_sees_a_dot_segment() -> None:
    async with raw_upstream(lambda head: ok(head.split(b" ")[1])) as (url, upstream):
        spec = {
            "routes": [{"path_prefix": "/demo", "strip_prefix": True}],
            "backend": {"kind": "static", "url": url + "/base"},
        }
        async with warmgate(one_target("demo", spec)) as wg:
            for raw in [*EXAMPLES, *REFUSED]:
                reader, writer = await asyncio.open_connection("127.0.0.1", wg.server.public_port)
                writer.write(
                    b"GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n" % raw.encode()
                )
                answer = await reader.read()
                writer.close()
                status = answer.split(b" ")[1]
                if raw in REFUSED:
                    assert status == b"400", (raw, answer[:200])
                elif EXAMPLES[raw].startswith("/demo"):
                    assert status == b"200", (raw, answer[:200])
                else:
                    assert status == b"404", (raw, answer[:200])
    seen = [head.split(b" ")[1].decode() for head in upstream.heads]
    assert seen and all(engine_view(p).startswith("/base/") for p in seen), seen
    segments = {unquote(s) for p in seen for s in p.split("/")}
    assert not segments & {".", ".."}, seen
