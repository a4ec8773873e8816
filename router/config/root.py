"""The top of the configuration file: listeners, server settings, and the groups below them."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from backends.specs import Frozen, ReplicasSpec
from backends.units import Duration, integer
from router.config.admin import AdminSettings
from router.config.api import ApiSettings, CloudSpec, ModelSpec, Policy
from router.config.economics import Economics
from router.config.env import Environment
from router.config.pools import Pool
from router.config.targets import Target

_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})$")
_TARGET_NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")
STATE_DIR = "warmgate-state"
"""``state_dir`` when the config names none: beside the config file."""
ENVIRONMENT = "environment"
"""The validation context's key for the :class:`Environment` a Config carries."""


class HostPort(Frozen):
    host: str
    port: Annotated[int, integer(0, 65535)]

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


class ServerSettings(Frozen):
    drain_grace: Duration = 30.0
    """On SIGTERM, how long in-flight requests may finish before warmgate exits anyway."""
    header_timeout: Duration = 10.0
    """A client must send each full request head within this; cuts off slowloris clients. The
    first head counts from when the connection opens, each later one on a keep-alive connection
    from its first byte (the wait between requests is ``keepalive_timeout``'s)."""
    keepalive_timeout: Duration = 75.0
    """Idle client keep-alive connections are closed after this (browsers use ~60-75 s)."""
    access_log: bool = True
    """One log line per request on the ``warmgate.access`` logger."""
    trust_forwarded: bool = False
    """Behind a trusted gateway: append to an incoming X-Forwarded-For instead of replacing it,
    keep its X-Forwarded-Proto and -Host, and pass its Forwarded and X-Real-IP on. Off, a
    client's Forwarded and X-Real-IP are dropped (an engine would believe a forged address)."""
    log_query: bool = False
    """Write the request's query string in the access log too. Off by default: tokens and
    signed URLs travel in query strings, and a log is read by more people than a Secret."""


def logged_path(raw_path: str, log_query: bool) -> str:
    """A request target as the access log writes it: without its query string unless
    ``server.log_query`` (tokens and signed URLs travel there)."""
    return raw_path if log_query else raw_path.partition("?")[0]


class Config(Frozen):
    listen: HostPort = HostPort(host="127.0.0.1", port=8080)
    """Public listener: render URLs and the OpenAI-compatible API."""
    admin_listen: HostPort = HostPort(host="127.0.0.1", port=9090)
    """/healthz, /readyz, /metrics; never served on the public listener."""
    scaler_listen: HostPort | None = None
    """gRPC: KEDA's external scaler service (docs/keda.md), for render Deployments whose replicas
    KEDA owns. Omitted (the default): not served."""
    server: ServerSettings = ServerSettings()
    targets: Mapping[str, Target]
    models: Mapping[str, ModelSpec] = Field(default_factory=dict)
    """Names on the OpenAI-compatible API (``/v1/*``); none: ``/v1`` is proxied like any path."""
    clouds: Mapping[str, CloudSpec] = Field(default_factory=dict)
    policy: Policy = Policy()
    api: ApiSettings = ApiSettings()
    admin: AdminSettings = AdminSettings()
    """The admin listener's dashboard: who may act on it (``admin.token_file``)."""
    economics: Economics = Economics()
    """What a GPU-hour and a second of someone's wait cost: ``idle_after: auto`` weighs them,
    ``warmgate simulate`` totals them (docs/simulate.md)."""
    replicas: ReplicasSpec | None = None
    """Several warmgate replicas (docs/replicas.md). Omitted: this replica is the only one."""
    state_dir: str | None = None
    """Directory for what warmgate learns and must not forget at a restart (learned cold-start
    figures and wakes, the day's cloud spend), as small JSON files; created on demand, relative
    to this file. Omitted: ``warmgate-state`` beside this file (a config given as data, not as
    a file, keeps nothing unless it names one). A Kubernetes target keeps its figures
    on its Deployment, and several replicas their spend in a ConfigMap, instead
    (docs/operations.md). Unwritable or unreadable: a warning, never a failure."""
    pools: Mapping[str, Pool] = Field(default_factory=dict)
    """GPUs that several targets take turns on (docs/pools.md); a target joins with ``pool:``."""
    source: str = Field(default="<memory>", exclude=True)
    """The file this came from, for messages."""
    base_dir: str = Field(default=".", exclude=True)
    _environment: Environment = PrivateAttr(default_factory=Environment)
    _replicas_token: str | None = PrivateAttr(default=None)

    @property
    def state_path(self) -> str | None:
        """``state_dir`` resolved against the config file's directory; ``None`` for a config
        that came from no file and names no ``state_dir`` (nothing is kept then)."""
        if self.state_dir is None and self.source.startswith("<"):
            return None
        return os.path.join(self.base_dir, self.state_dir or STATE_DIR)

    @property
    def environment(self) -> Environment:
        """The environment as it was when this was loaded (``router.config.env``); not a key of
        the file, never serialized."""
        return self._environment

    @property
    def replicas_token(self) -> str | None:
        """The secret the replicas share (``replicas.token_file``'s contents, read when this
        was loaded); not a key of the file, never serialized."""
        return self._replicas_token

    def set_replicas_token(self, token: str) -> None:
        """Set by the loader once it has read ``replicas.token_file``."""
        self._replicas_token = token

    @property
    def child_environment(self) -> Mapping[str, str]:
        """The base of a ``process`` child's environment: warmgate's own, less every variable a
        cloud's ``api_key_env`` names and any whose value is the replicas' token (an engine and
        its third-party plugins never see warmgate's secrets)."""
        names = {cloud.api_key_env for cloud in self.clouds.values()}
        secrets = {self._replicas_token} if self._replicas_token else set()
        return self._environment.for_children(names, secrets)

    @model_validator(mode="after")
    def _carry_environment(self, info: ValidationInfo) -> Config:
        environment = (info.context or {}).get(ENVIRONMENT)
        if isinstance(environment, Environment):
            self._environment = environment
        return self

    @field_validator("listen", "admin_listen", "scaler_listen", mode="before")
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
        scaler = self.scaler_listen
        if scaler is not None and scaler.port != 0 and scaler in (self.listen, self.admin_listen):
            raise ValueError("scaler_listen must differ from listen and admin_listen")
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
