"""The configuration file: typed, frozen groups, one per concern.

Every field says its unit and why its default was chosen. ``load_config`` is the only way in; a
bad file raises :class:`ConfigError` naming the file, the key path and what was expected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from backends.specs import BACKEND_KINDS, Backend, Frozen, Readiness
from backends.units import Duration, Size
from router.errors import ConfigError

_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})$")
_TARGET_NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")


class HostPort(Frozen):
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _parse_host_port(value: object) -> object:
    if isinstance(value, str):
        match = _HOST_PORT.match(value.strip())
        if not match:
            raise ValueError(f"expected host:port such as 127.0.0.1:8080, got {value!r}")
        port = int(match.group("port"))
        if port > 65535:
            raise ValueError(f"port {port} is out of range 0-65535")
        host = match.group("v6") or match.group("host") or "0.0.0.0"
        return {"host": host, "port": port}
    return value


class Route(Frozen):
    """What sends a request to a target. The longest matching ``path_prefix`` wins across all
    targets; among equal prefixes, a route with hosts or headers beats one without."""

    hosts: tuple[str, ...] | None = None
    """Exact names or ``*.suffix`` wildcards, matched without the port; omitted: any host."""
    path_prefix: str = "/"
    """Matched on path segments: ``/comfy`` matches ``/comfy`` and ``/comfy/x``, not ``/comfyx``."""
    strip_prefix: bool = False
    """Remove the prefix before forwarding (an engine that serves its UI at ``/``)."""
    headers: Mapping[str, str] = Field(default_factory=dict)
    """All must match exactly (header names are case-insensitive)."""

    @field_validator("path_prefix")
    @classmethod
    def _prefix_is_absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must start with '/', got {value!r}")
        if value.startswith("/.warmgate"):
            raise ValueError("/.warmgate/ is reserved for warmgate's own pages")
        return value

    @field_validator("hosts")
    @classmethod
    def _hosts_are_names(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must list at least one host, or be omitted to match any host")
        for host in value:
            bare = host[2:] if host.startswith("*.") else host
            if not bare or "*" in bare or "/" in bare or " " in bare:
                raise ValueError(f"expected a host name or '*.suffix' wildcard, got {host!r}")
        return tuple(h.lower() for h in value)


class Timeouts(Frozen):
    connect: Duration = 5.0
    """Seconds to open a TCP connection to a ready upstream; loopback or LAN, so short."""
    response_headers: Duration = 300.0
    """Seconds from sending the request to the upstream's status line. Long: a render engine
    may answer only when the work is done."""


class Limits(Frozen):
    max_body: Size = 100 * 2**20
    """Largest request body in bytes; bigger -> 413. 100 MiB fits image and video uploads."""
    max_connections: int = Field(default=0, ge=0)
    """Upstream connections per target (0: unlimited). Keep-alive pooled."""


class Scaling(Frozen):
    idle_after: Duration = 1800.0
    """No activity this long -> scale to zero and release the GPU. 30 minutes: a person reading
    their render does not lose the warm model; an abandoned tab frees the card within the hour."""
    cold_start_timeout: Duration = 300.0
    """Longest a request is held for a cold start; heavy render images take ~2 minutes."""
    max_held: int = Field(default=1000, ge=1)
    """Requests held at once per target; beyond: 503 with Retry-After (shedding)."""
    stream_activity_window: Duration = 60.0
    """A websocket or SSE stream counts as activity if it carried a frame this recently."""
    wake_on: Literal["any", "navigation", "none"] = "any"
    """What wakes a cold target: any request that is not a websocket upgrade (``any``),
    only browser page loads and non-GET requests (``navigation``), or nothing (``none``)."""
    busy_poll: Duration = 2.0
    """How often a ready target's engine is asked whether it is busy (a render in its queue)."""
    failure_backoff: Duration = 10.0
    """First wait after a failed cold start; doubles per failure up to ``failure_backoff_max``."""
    failure_backoff_max: Duration = 300.0


class Target(Frozen):
    engine: Literal["http"] = "http"
    """Protocol the workload speaks; it decides readiness probing and busy signals."""
    routes: tuple[Route, ...]
    backend: Backend
    timeouts: Timeouts = Timeouts()
    limits: Limits = Limits()
    readiness: Readiness = Readiness()
    scaling: Scaling = Scaling()
    waiting_page: Literal["auto", "off"] = "auto"
    """``auto``: a browser page load to a cold target gets the waiting page at once."""

    @field_validator("routes")
    @classmethod
    def _has_routes(cls, value: tuple[Route, ...]) -> tuple[Route, ...]:
        if not value:
            raise ValueError("a target needs at least one route, e.g. [{path_prefix: /}]")
        return value


class ServerSettings(Frozen):
    drain_grace: Duration = 30.0
    """On SIGTERM, how long in-flight requests may finish before warmgate exits anyway."""
    header_timeout: Duration = 10.0
    """A client must send its full request head within this; cuts off slowloris clients."""
    keepalive_timeout: Duration = 75.0
    """Idle client keep-alive connections are closed after this (browsers use ~60-75 s)."""
    access_log: bool = True
    """One log line per request on the ``warmgate.access`` logger."""
    trust_forwarded: bool = False
    """Append to an incoming X-Forwarded-For instead of replacing it (behind a trusted gateway)."""


class Config(Frozen):
    listen: HostPort = HostPort(host="127.0.0.1", port=8080)
    """Public listener: render URLs and the OpenAI-compatible API."""
    admin_listen: HostPort = HostPort(host="127.0.0.1", port=9090)
    """/healthz, /readyz, /metrics; never served on the public listener."""
    server: ServerSettings = ServerSettings()
    targets: Mapping[str, Target]
    source: str = Field(default="<memory>", exclude=True)
    """The file this came from, for messages."""
    base_dir: str = Field(default=".", exclude=True)

    @field_validator("listen", "admin_listen", mode="before")
    @classmethod
    def _host_port(cls, value: object) -> object:
        return _parse_host_port(value)

    @field_validator("targets", mode="before")
    @classmethod
    def _target_names(cls, value: object) -> object:
        if not isinstance(value, Mapping):
            return value  # the type check reports it
        if not value:
            raise ValueError("at least one target is needed")
        for name in value:
            if not _TARGET_NAME.match(name):
                raise ValueError(
                    f"target name {name!r}: expected lowercase letters, digits, '-', '_' or '.'"
                )
        return value

    @model_validator(mode="after")
    def _distinct(self) -> Config:
        if self.listen.port != 0 and self.listen == self.admin_listen:
            raise ValueError("listen and admin_listen must differ: /metrics is never public")
        seen: dict[tuple[Any, ...], str] = {}
        for name, target in self.targets.items():
            for route in target.routes:
                key = (route.hosts, route.path_prefix, tuple(sorted(route.headers.items())))
                if key in seen:
                    raise ValueError(
                        f"targets {seen[key]!r} and {name!r} have the same route "
                        f"(hosts={route.hosts}, path_prefix={route.path_prefix!r})"
                    )
                seen[key] = name
        return self


def _key_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for i, item in enumerate(loc):
        # Pydantic adds the discriminator value of a tagged union to the path; users never wrote it.
        if i > 0 and loc[i - 1] == "backend" and item in BACKEND_KINDS:
            continue
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def _describe(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a known key (check its spelling and indentation)"
    if kind == "union_tag_invalid":
        return f"kind must be one of {', '.join(BACKEND_KINDS)}, got {error['input']!r}"
    if kind == "union_tag_not_found":
        return f"needs a 'kind' ({', '.join(BACKEND_KINDS)})"
    message = str(error["msg"])
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    return f"{message} (got {error['input']!r})" if kind.endswith("_type") else message


def parse_config(data: object, source: str = "<memory>", base_dir: str = ".") -> Config:
    if not isinstance(data, dict):
        raise ConfigError(source, [("(top level)", "expected a mapping of keys such as targets:")])
    try:
        return Config.model_validate({**data, "source": source, "base_dir": base_dir})
    except ValidationError as exc:
        problems = [(_key_path(err["loc"]), _describe(err)) for err in exc.errors()]
        raise ConfigError(source, problems) from exc


def load_config(path: str | Path) -> Config:
    """Read, parse and validate one YAML file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(file), [("(file)", f"cannot be read: {exc.strerror}")]) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f"line {where.line + 1}, column {where.column + 1}" if where else "(file)"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(str(file), [(at, f"is not valid YAML: {problem}")]) from exc
    return parse_config(data, str(file), str(file.resolve().parent))
