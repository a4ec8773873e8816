"""Route matching: (host, path, headers) -> the target and how to rewrite the path.

The longest ``path_prefix`` wins across all targets; among equal prefixes, the route with more
conditions (hosts, headers) wins; exact hosts beat wildcards. The table is compiled once.

A stripped prefix asked for without its trailing slash (``/comfy`` for ``/comfy/``) is redirected
to it, as nginx does: a UI served at ``/`` upstream resolves its relative URLs against the
browser's address, so ``/comfy`` itself must never be served.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from router.config import Config, Route


@dataclass(frozen=True, slots=True)
class RouteEntry:
    target: str
    prefix: str
    strip_prefix: bool
    exact_hosts: frozenset[str] | None
    wildcard_suffixes: tuple[str, ...]
    headers: tuple[tuple[str, str], ...]

    def matches_host(self, host: str) -> bool:
        if self.exact_hosts is None and not self.wildcard_suffixes:
            return True
        if self.exact_hosts is not None and host in self.exact_hosts:
            return True
        return any(under(host, suffix) for suffix in self.wildcard_suffixes)

    def matches_path(self, path: str) -> bool:
        prefix = self.prefix
        if prefix == "/":
            return True
        if not path.startswith(prefix):
            return False
        return prefix.endswith("/") or len(path) == len(prefix) or path[len(prefix)] == "/"

    def rewrite(self, path: str) -> str:
        if not self.strip_prefix or self.prefix == "/":
            return path
        rest = path[len(self.prefix.rstrip("/")) :]
        return rest if rest.startswith("/") else "/" + rest


@dataclass(frozen=True, slots=True)
class Match:
    entry: RouteEntry
    upstream_path: str
    redirect: str | None = None
    """Answer with a redirect to this path instead (the stripped prefix's trailing slash)."""

    @property
    def target(self) -> str:
        return self.entry.target


def _entry(target: str, route: Route) -> tuple[tuple[int, int, int], RouteEntry]:
    exact = [h for h in route.hosts or () if not h.startswith("*.")]
    wild = tuple(h[1:] for h in route.hosts or () if h.startswith("*."))
    entry = RouteEntry(
        target=target,
        prefix=route.path_prefix,
        strip_prefix=route.strip_prefix,
        exact_hosts=frozenset(exact) if route.hosts is not None else None,
        wildcard_suffixes=wild,
        headers=tuple((k.lower(), v) for k, v in route.headers.items()),
    )
    host_rank = 2 if exact and not wild else (1 if route.hosts else 0)
    return (len(route.path_prefix.rstrip("/")), host_rank, len(route.headers)), entry


def under(host: str, suffix: str) -> bool:
    """``host`` matches the wildcard ``*`` + ``suffix`` (``*.w.example.com``): one label or
    more before the suffix, none of them empty."""
    if not host.endswith(suffix):
        return False
    labels = host[: -len(suffix)]
    return bool(labels) and "" not in labels.split(".")


def normalize_host(host: str | None) -> str:
    """Lowercase, without the port and without the root's trailing dot (``a.example.com.`` is
    ``a.example.com``); ``[::1]:8080`` -> ``::1``."""
    if not host:
        return ""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return host[:-1] if host.endswith(".") else host


class RouteTable:
    def __init__(self, config: Config) -> None:
        ranked = [
            _entry(name, route)
            for name, target in config.targets.items()
            for route in target.routes
        ]
        ranked.sort(key=lambda pair: pair[0], reverse=True)
        self.entries: tuple[RouteEntry, ...] = tuple(entry for _, entry in ranked)
        self._slashless = frozenset(
            e.prefix.rstrip("/") for e in self.entries if e.strip_prefix and e.prefix != "/"
        )

    def match(self, host: str | None, path: str, headers: Mapping[str, str]) -> Match | None:
        if self._slashless and path in self._slashless:
            slashed = self._match(host, path + "/", headers)
            if slashed is not None and slashed.entry.prefix.rstrip("/") == path:
                return Match(slashed.entry, "/", redirect=path + "/")
        return self._match(host, path, headers)

    def _match(self, host: str | None, path: str, headers: Mapping[str, str]) -> Match | None:
        bare = normalize_host(host)
        for entry in self.entries:
            if not entry.matches_path(path) or not entry.matches_host(bare):
                continue
            if entry.headers and any(headers.get(k) != v for k, v in entry.headers):
                continue
            return Match(entry, entry.rewrite(path))
        return None

    def serves_host(self, target: str, host: str | None) -> bool:
        """Some route of ``target`` takes requests for ``host`` (whatever their path)."""
        bare = normalize_host(host)
        return any(e.target == target and e.matches_host(bare) for e in self.entries)

    def describe(self) -> list[tuple[str, str, str, str]]:
        """Rows of (hosts, path prefix, headers, target) in match order, for ``warmgate check``."""
        rows = []
        for e in self.entries:
            hosts = sorted(e.exact_hosts or ()) + ["*" + s for s in e.wildcard_suffixes]
            prefix = e.prefix + (" (stripped)" if e.strip_prefix else "")
            headers = ", ".join(f"{k}={v}" for k, v in e.headers) or "-"
            rows.append((", ".join(hosts) or "*", prefix, headers, e.target))
        return rows
