"""The configuration file: typed, frozen groups, one per concern.

Every field says its unit and why its default was chosen. ``load_config`` is the only way in; a
bad file raises :class:`ConfigError` naming the file, the key path and what was expected.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from backends.specs import (
    BACKEND_KINDS,
    Backend,
    EngineKind,
    EngineSpec,
    Frozen,
    GradioWarmup,
    Readiness,
    ReplicasSpec,
)
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
    engine: EngineKind = "http"
    """Protocol the workload speaks (http, comfyui, gradio, openai); it decides readiness
    probing, busy signals and which requests wake a cold target (docs/engines.md)."""
    warmup_workflow: str | None = None
    """comfyui only: an API-format workflow (JSON file, relative to the config file) queued at
    every cold start; the target counts as ready once it completed, so the checkpoint is in
    VRAM before the first user render. Omitted: ready when ``/system_stats`` answers."""
    warmup: GradioWarmup | None = None
    """gradio only: ``{api_name, data}``, one call through the app's API made at every cold start
    before the target counts as ready (an app that loads its model on first use). Omitted:
    ready when ``/config`` answers."""
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

    @model_validator(mode="before")
    @classmethod
    def _gradio_root_path(cls, data: object) -> object:
        """A Gradio app behind one path prefix builds its file URLs from X-Forwarded-Host plus
        its root path, which only it knows: a ``process`` child gets ``GRADIO_ROOT_PATH`` set to
        the prefix unless its ``env`` names one (docs/engines.md)."""
        if not isinstance(data, Mapping) or data.get("engine") != "gradio":
            return data
        backend, routes = data.get("backend"), data.get("routes")
        if not isinstance(backend, Mapping) or backend.get("kind") != "process":
            return data
        env = backend.get("env") or {}
        if not isinstance(env, Mapping) or "GRADIO_ROOT_PATH" in env:
            return data
        prefixes = {
            str(route.get("path_prefix", "/")).rstrip("/")
            for route in routes or ()
            if isinstance(route, Mapping)
        }
        if len(prefixes) != 1 or prefixes == {""}:
            return data
        root = {"GRADIO_ROOT_PATH": prefixes.pop()}
        return {**data, "backend": {**backend, "env": {**env, **root}}}

    @field_validator("warmup_workflow")
    @classmethod
    def _workflow_for_comfyui(cls, value: str | None, info: ValidationInfo) -> str | None:
        engine = info.data.get("engine")
        if value is not None and engine not in (None, "comfyui"):
            raise ValueError(f"warmup_workflow is for engine: comfyui (this one is {engine})")
        return value

    @field_validator("warmup")
    @classmethod
    def _warmup_for_gradio(
        cls, value: GradioWarmup | None, info: ValidationInfo
    ) -> GradioWarmup | None:
        engine = info.data.get("engine")
        if value is not None and engine not in (None, "gradio"):
            raise ValueError(f"warmup is for engine: gradio (this one is {engine})")
        return value

    def engine_spec(self, base_dir: str) -> EngineSpec:
        """What :func:`backends.registry.make_engine` needs; files resolved against ``base_dir``."""
        workflow = self.warmup_workflow
        return EngineSpec(
            kind=self.engine,
            readiness=self.readiness,
            wake_on=self.scaling.wake_on,
            warmup_workflow=str(Path(base_dir, workflow).resolve()) if workflow else None,
            warmup=self.warmup,
        )


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


# -- the OpenAI-compatible API: models, their placements, clouds and the policy (docs/openai.md)

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Cost(Frozen):
    """What a cloud model charges, in USD."""

    input_per_mtok: float = Field(default=0.0, ge=0)
    """USD per million input (prompt) tokens."""
    output_per_mtok: float = Field(default=0.0, ge=0)
    """USD per million output (completion) tokens."""
    per_image: float = Field(default=0.0, ge=0)
    """USD per generated image."""


class Placement(Frozen):
    """One place a model can run: a local target (``target:``) or a cloud model (``cloud:`` and
    ``model:``). A model lists its placements in order of preference."""

    target: str | None = None
    """Local: the name of a target under ``targets:``."""
    cloud: str | None = None
    """Cloud: the name of a cloud under ``clouds:``."""
    model: str | None = None
    """The name the placement knows the model by. Required for a cloud; local default: the
    public name."""
    cost: Cost = Cost()
    """Cloud: its prices, for the reservation against the daily budget and the spend metric."""
    cost_per_gpu_second: float = Field(default=0.0, ge=0)
    """Local: USD per GPU-second, for reports only; local work is never refused for money."""
    base_path: str = "/v1"
    """Local chat/embeddings: where the target's OpenAI-compatible API lives (vLLM: ``/v1``)."""
    workflow: str | None = None
    """Local images on ComfyUI: an API-format graph (JSON) with ``${prompt}``, ``${seed}``,
    ``${width}``, ``${height}`` placeholders; relative to the config file."""

    @model_validator(mode="after")
    def _one_kind(self) -> Placement:
        if (self.target is None) == (self.cloud is None):
            raise ValueError("a placement has either target: (local) or cloud: (with model:)")
        if self.cloud is not None:
            if not self.model:
                raise ValueError(f"cloud placement {self.cloud!r} needs model: (the cloud's name)")
            if self.workflow is not None or self.cost_per_gpu_second:
                raise ValueError("workflow and cost_per_gpu_second are for local placements")
        elif self.cost != Cost():
            raise ValueError("cost is for cloud placements; use cost_per_gpu_second locally")
        if not self.base_path.startswith("/"):
            raise ValueError(f"base_path must start with '/', got {self.base_path!r}")
        return self

    @property
    def label(self) -> str:
        """How decisions, headers and metrics name this placement."""
        return self.target if self.target is not None else f"{self.cloud}/{self.model}"


class ModelSpec(Frozen):
    """A name on the OpenAI-compatible API and where it may run."""

    kind: Literal["chat", "images", "embeddings"] = "chat"
    """Which endpoint serves it: /v1/chat/completions, /v1/images/generations, /v1/embeddings."""
    placements: tuple[Placement, ...]
    max_wait: Duration | None = None
    """This model's latency budget (longest wait for a cold local target); default
    ``policy.max_wait``. A request's ``X-Warmgate-Max-Wait`` header overrides both."""

    @field_validator("placements")
    @classmethod
    def _has_placements(cls, value: tuple[Placement, ...]) -> tuple[Placement, ...]:
        if not value:
            raise ValueError("a model needs at least one placement (target: or cloud:)")
        return value


class CloudSpec(Frozen):
    """A managed OpenAI-compatible service, reached through the ``openai`` SDK."""

    base_url: str
    """Its API root, e.g. ``https://cloud.example/v1``."""
    api_key_env: str
    """Name of the environment variable holding its API key (never the key itself). Unset at
    start: the cloud is unavailable and its placements are skipped."""
    timeout: Duration = 120.0
    """Seconds for one cloud call; long answers stream, so this bounds a stuck call."""
    retries: int = Field(default=1, ge=0, le=5)
    """warmgate's own retries of a failed call (5xx, timeout) before it falls back; the SDK's
    retries are off so that one place owns them."""

    @field_validator("base_url")
    @classmethod
    def _url_is_http(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+(/\S*)?$", value):
            raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str) -> str:
        if not _ENV_NAME.match(value):
            raise ValueError(f"expected an environment variable name, got {value!r}")
        return value


class PrivateRule(Frozen):
    """What makes a request private: private work never leaves the building."""

    header: str = "X-Warmgate-Private"
    """A request carrying this header is private unless its value is false/0/no."""
    api_keys: tuple[str, ...] = ()
    """Client API keys (by name in ``api.api_keys_file``, or the key itself) whose requests are
    always private."""


class Policy(Frozen):
    """How a request is placed: local or cloud, within a latency budget and a money budget."""

    max_wait: Duration = 10.0
    """Default latency budget: the longest a request may wait for a cold local target before
    the cloud is preferred. 10 s: an interactive chat user still waits; a 2-minute load does not."""
    daily_cloud_budget_usd: float = Field(default=0.0, ge=0)
    """Cloud spend allowed per UTC day. 0 (the default): the cloud is never paid for."""
    private: PrivateRule = PrivateRule()
    overflow_queue_depth: int = Field(default=4, ge=0)
    """A ready local target with more API requests than this in progress counts as saturated,
    and the cloud is preferred."""
    warm_on_cloud: bool = True
    """A request sent to the cloud because the local target was cold starts it for next time."""
    assumed_cold_start: Duration = 30.0
    """Predicted cold start of a target never started yet; learned from its starts afterwards."""
    assumed_output_tokens: int = Field(default=1024, ge=1)
    """Output tokens reserved against the budget for a request without ``max_tokens``."""


class ApiSettings(Frozen):
    """The OpenAI-compatible API on the public listener (served when ``models:`` is set)."""

    api_keys_file: str | None = None
    """Client keys, one per line (``key`` or ``name key``; ``#`` comments), relative to the config
    file. Set: requests need ``Authorization: Bearer <key>``. Omitted: no client keys."""
    max_body: Size = 10 * 2**20
    """Largest API request body in bytes; bigger -> 413. 10 MiB fits long chat histories."""


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
    replicas: ReplicasSpec | None = None
    """Several warmgate replicas (docs/replicas.md). Omitted: this replica is the only one."""
    source: str = Field(default="<memory>", exclude=True)
    """The file this came from, for messages."""
    base_dir: str = Field(default=".", exclude=True)

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


def _model_problems(config: Config) -> list[tuple[str, str]]:
    """Cross-references of ``models:`` (names of targets, clouds, files) as (key path, problem)."""
    problems: list[tuple[str, str]] = []
    targets, clouds = sorted(config.targets), sorted(config.clouds)
    for name, spec in config.models.items():
        if not _MODEL_NAME.match(name):
            problems.append((f"models.{name}", "expected a model name of letters, digits, ._:/@+-"))
        for i, placement in enumerate(spec.placements):
            at = f"models.{name}.placements[{i}]"
            if placement.target is not None and placement.target not in config.targets:
                problems.append(
                    (f"{at}.target", f"no target named {placement.target!r} (targets: {targets})")
                )
            if placement.cloud is not None and placement.cloud not in config.clouds:
                problems.append(
                    (f"{at}.cloud", f"no cloud named {placement.cloud!r} (clouds: {clouds})")
                )
            if placement.target is None:
                continue
            if spec.kind == "images" and placement.workflow is None:
                problems.append((f"{at}.workflow", "a local images placement needs a workflow"))
            if spec.kind != "images" and placement.workflow is not None:
                problems.append((f"{at}.workflow", "only models of kind: images have workflows"))
            if placement.workflow is not None:
                problem = _workflow_problem(Path(config.base_dir, placement.workflow))
                if problem:
                    problems.append((f"{at}.workflow", problem))
    keys = config.api.api_keys_file
    if keys is not None and not Path(config.base_dir, keys).is_file():
        problems.append(("api.api_keys_file", f"{keys!r} is not a readable file"))
    return problems


def _workflow_problem(path: Path) -> str | None:
    try:
        graph = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return f"{str(path)!r} cannot be read: {exc.strerror}"
    except ValueError as exc:
        return f"{str(path)!r} is not JSON: {exc}"
    if not isinstance(graph, dict) or not graph:
        return f"{str(path)!r}: expected an API-format graph (an object of nodes)"
    return None


def _engine_problems(config: Config) -> list[tuple[str, str]]:
    """Engine files: a comfyui ``warmup_workflow`` must be an API-format graph."""
    problems: list[tuple[str, str]] = []
    for name, target in config.targets.items():
        if target.warmup_workflow is None:
            continue
        path = Path(config.base_dir, target.warmup_workflow)
        problem = _workflow_problem(path)
        if problem is None:
            graph = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(graph.get("nodes"), list):
                problem = (
                    f"{str(path)!r} is a UI-format workflow; export it with "
                    "'Save (API Format)' (an object of node id -> {class_type, inputs})"
                )
            elif not all(isinstance(n, dict) and "class_type" in n for n in graph.values()):
                problem = f"{str(path)!r}: every node needs a class_type (API format)"
        if problem:
            problems.append((f"targets.{name}.warmup_workflow", problem))
    return problems


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
        config = Config.model_validate({**data, "source": source, "base_dir": base_dir})
    except ValidationError as exc:
        problems = [(_key_path(err["loc"]), _describe(err)) for err in exc.errors()]
        raise ConfigError(source, problems) from exc
    if model_problems := _model_problems(config) + _engine_problems(config):
        raise ConfigError(source, model_problems)
    return config


def load_config(path: str | Path, overrides: Mapping[str, object] | None = None) -> Config:
    """Read, parse and validate one YAML file; ``overrides`` replace top-level keys (the
    command line's ``--listen``/``--admin-listen``: each pod of a Deployment binds its own)."""
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
    if overrides and isinstance(data, dict):
        data = {**data, **overrides}
    return parse_config(data, str(file), str(file.resolve().parent))
