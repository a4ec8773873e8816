"""What each backend kind needs to know, as typed frozen config groups.

Pure data shared by the router's config file and the backends that act on it; no behaviour.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from backends.outside import number
from backends.units import PORT, Duration, integer, real


class Frozen(BaseModel):
    """Base of every config group: immutable, and unknown keys are errors (typos surface)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class StaticSpec(Frozen):
    """An always-on URL: nothing to scale."""

    kind: Literal["static"]
    url: str
    """Base URL of the upstream, ``http://host:port``; a path here prefixes every request."""

    @field_validator("url")
    @classmethod
    def _url_is_http(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s:]+(:\d{1,5})?(/\S*)?$", value):
            raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
        return value.rstrip("/")


class ProcessSpec(Frozen):
    """A local command started and stopped by warmgate: the embedded default for one workstation."""

    kind: Literal["process"]
    command: tuple[str, ...]
    """argv; ``{port}``, ``{host}`` and ``{ready_port}`` (another free port, for a launcher's
    readiness listener: ``readiness.port: "{ready_port}"`` probes it) are replaced at each
    start, here and in ``env``."""
    host: str = "127.0.0.1"
    """Address the child listens on; loopback because only warmgate talks to it."""
    port: Annotated[int, integer(0, 65535)] = 0
    """0: a free port at each start, so a lingering old child can never collide."""
    cwd: str | None = None
    """Relative to the config file's directory; default: the config file's directory."""
    env: Mapping[str, str] = Field(default_factory=dict)
    """Added to warmgate's own environment."""
    stop_grace: Duration = 30.0
    """SIGTERM to the command (then to what is left of its process group once it exited), SIGKILL
    to the group after this long: long enough for an engine to free its GPU cleanly, and longer
    than a launcher's own grace for its engine (the Wan2GP launcher's ``--stop-grace``, 25 s)."""

    @field_validator("command")
    @classmethod
    def _command_not_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or not value[0]:
            raise ValueError("expected a non-empty list such as [python, -m, my.engine]")
        return value


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class KubernetesSpec(Frozen):
    """A Deployment scaled through its scale subresource; readiness from EndpointSlices
    (docs/kubernetes.md). Credentials: in-cluster ServiceAccount when present, else KUBECONFIG."""

    kind: Literal["kubernetes"]
    namespace: str
    """Namespace of the Deployment and its Service."""
    deployment: str
    """Name of the Deployment that runs the engine (kept at 0 replicas while idle)."""
    port: Annotated[int, PORT]
    """The engine's container port: pods are reached at ``http://<pod address>:<port>``."""
    route_to: Literal["pods", "service"] = "pods"
    """``pods``: forward to ready pod addresses, least in-flight first (no kube-proxy hop, and a
    pod that disappears is dropped on the watch event); ``service``: forward to the Service's
    DNS name and let kube-proxy/Cilium balance."""
    service: str | None = None
    """The Service that selects the Deployment's pods (its EndpointSlices carry readiness);
    default: the Deployment's name. Required with ``route_to: service``."""
    service_port: Annotated[int, PORT] | None = None
    """``route_to: service``: the Service's port; default: ``port``."""
    max_replicas: Annotated[int, integer(1, 10_000)] = 1
    """Replicas asked for on a scale-up from zero. 1: one GPU per interactive engine."""
    mode: Literal["direct", "keda"] = "direct"
    """``direct``: warmgate patches ``deployments/<name>/scale`` itself (and refuses to start
    next to an HPA or ScaledObject on the same Deployment); ``keda``: a KEDA ScaledObject owns
    the replica count, and warmgate only watches the Deployment (it is KEDA's scaler)."""
    target_concurrency: Annotated[float, real(0, 1e6, above=True)] = 1.0
    """``mode: keda``: in-flight + held requests per replica that KEDA should aim for (the
    metric's target size). 1: one render per GPU."""

    @field_validator("namespace", "service")
    @classmethod
    def _dns_label(cls, value: str | None) -> str | None:
        if value is not None and not _DNS_LABEL.match(value):
            raise ValueError(
                f"expected a DNS label (lowercase letters, digits, '-'), got {value!r}"
            )
        return value

    @field_validator("deployment")
    @classmethod
    def _dns_subdomain(cls, value: str) -> str:
        if not _DNS_SUBDOMAIN.match(value):
            raise ValueError(f"expected a Kubernetes object name, got {value!r}")
        return value

    @model_validator(mode="after")
    def _service_for_route(self) -> KubernetesSpec:
        if self.route_to == "service" and self.service is None:
            raise ValueError("route_to: service needs service: (the Service's name)")
        if self.service_port is not None and self.route_to != "service":
            raise ValueError("service_port is for route_to: service")
        return self

    @property
    def service_name(self) -> str:
        """The Service whose EndpointSlices say which pods are ready."""
        return self.service or self.deployment


BackendSpec = StaticSpec | ProcessSpec | KubernetesSpec
Backend = Annotated[BackendSpec, Field(discriminator="kind")]
BACKEND_KINDS = ("static", "process", "kubernetes")


READY_PORT = "{ready_port}"
"""In a ``process`` command or env: a free port picked at each start, for a launcher's own
readiness listener; as ``readiness.port``: probe there."""


def _readiness_port(value: object) -> object:
    """One readable line for a bad ``readiness.port``, not the names of the union's members."""
    if value is None or value == READY_PORT:
        return value
    if not isinstance(value, int) or number(value, 1, 65535) is None:
        raise ValueError(f'expected a port from 1 to 65535 or "{READY_PORT}", got {value!r:.60}')
    return value


def _service_port(value: object) -> object:
    if isinstance(value, str) and value:
        return value
    if not isinstance(value, int) or number(value, 1, 65535) is None:
        raise ValueError(f"expected a port's name or a number from 1 to 65535, got {value!r:.60}")
    return value


class Readiness(Frozen):
    path: str = "/readyz"
    """Probed with GET until it answers 200: the engine reports its weights resident."""
    port: Annotated[int | Literal["{ready_port}"] | None, BeforeValidator(_readiness_port)] = None
    """Where ``path`` is probed, when not on the port traffic goes to: a number (a Deployment's
    readiness port), or ``{ready_port}``: the port a ``process`` target's command was given as
    ``{ready_port}`` (a launcher that serves ``/readyz`` on a port of its own, as the Wan2GP
    image's). Omitted: the engine's own port."""
    interval: Duration = 0.2
    """Between probes while starting; 200 ms keeps the wake-up latency low at negligible cost."""
    timeout: Duration = 2.0
    """One probe's limit."""


EngineKind = Literal["http", "comfyui", "gradio", "openai"]
ENGINE_KINDS: tuple[EngineKind, ...] = ("http", "comfyui", "gradio", "openai")


class GradioWarmup(Frozen):
    """One call through a Gradio app's API, made at every cold start before the target counts as
    ready, so that an app which loads its model on the first generation (Wan2GP) has it resident
    before the first person waits for it."""

    api_name: str
    """The endpoint's ``api_name`` (``/generate`` or ``generate``), as the app's API page shows."""
    data: tuple[JsonValue, ...] = ()
    """The endpoint's inputs, in order, as JSON values (what ``gradio_client`` would send)."""

    @field_validator("api_name")
    @classmethod
    def _bare_name(cls, value: str) -> str:
        name = value.strip().strip("/")
        if not name or "/" in name or " " in name:
            raise ValueError(f"expected an api_name such as /generate, got {value!r}")
        return name


class EngineCall(Frozen):
    """One HTTP request warmgate makes to a target's engine (to park it, or to wake it)."""

    method: Literal["GET", "POST", "PUT", "DELETE"] = "POST"
    path: str
    """Absolute path on the engine, query included (``/sleep?level=1``)."""
    json_body: JsonValue = Field(default=None, alias="json")
    """A JSON body (written ``json:`` in the config); omitted: no body."""
    timeout: Duration = 120.0
    """Seconds the engine may take to answer: dropping or reloading tens of GiB of weights takes
    seconds, so generous; a call that times out counts as failed (the target is stopped)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"expected an absolute path such as /free, got {value!r}")
        return value


class ParkedCheck(Frozen):
    """How to ask an engine whether it is parked: ``GET path``, a JSON object whose
    ``json_key`` is true while it is (vLLM's ``GET /is_sleeping`` -> ``{"is_sleeping": true}``)."""

    path: str
    json_key: str

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"expected an absolute path such as /is_sleeping, got {value!r}")
        return value


class ParkRequests(Frozen):
    """``park: {request, wake, parked}``: parking spelled out as the engine's own requests, for
    an engine warmgate has no park action for (docs/pools.md)."""

    request: EngineCall
    """Makes the engine drop its weights from the GPU (its process stays)."""
    wake: EngineCall | None = None
    """Makes it load them again; omitted: no call (the engine loads on the next request). The
    target counts as ready once its readiness probe passes (and ``parked`` says it is not)."""
    parked: ParkedCheck | None = None
    """Whether it is parked; asked after a park and before a woken target counts as ready."""


def _park(value: object) -> object:
    """``auto``, ``off``, or the requests, with one plain message for what is wrong."""
    if isinstance(value, str) and value not in ("auto", "off"):
        raise ValueError(
            f"expected auto, off or {{request: ..., wake: ..., parked: ...}}, got {value!r}"
        )
    if isinstance(value, Mapping):
        try:
            return ParkRequests.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            message = str(first["msg"]).removeprefix("Value error, ")
            if first["type"] == "extra_forbidden":
                message = "is not a known key (request, wake, parked)"
            raise ValueError(f"{where}: {message}" if where else message) from None
    return value


Park = Annotated[Literal["auto", "off"] | ParkRequests, BeforeValidator(_park)]
"""``auto``: the engine's own park action (none for gradio and http); ``off``: never parked."""


def no_auto_park(kind: EngineKind, options: EngineOptions) -> str | None:
    """Why ``park: auto`` has no action for this engine, or ``None`` when it has one."""
    if kind == "comfyui":
        return None
    if kind == "openai":
        if options.sleep_mode:
            return None
        return (
            "engine openai parks through vLLM's sleep mode: set engine_options.sleep_mode: true "
            "(vLLM started with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1), or give park: "
            "{request: ...}"
        )
    return (
        f"engine {kind} has no park action of its own: give park: {{request: {{method, path}}, "
        "wake: ..., parked: ...} (docs/pools.md), or leave park_after unset"
    )


class EngineOptions(Frozen):
    """Options of one engine kind."""

    sleep_mode: bool = False
    """openai: the server is vLLM started with ``--enable-sleep-mode`` and
    ``VLLM_SERVER_DEV_MODE=1``, so ``park: auto`` parks it with ``POST /sleep?level=1`` and wakes
    it with ``POST /wake_up``. Off by default: other OpenAI-compatible servers have no sleep."""


class EngineSpec(Frozen):
    """What one engine needs, gathered by the router from a target's config."""

    kind: EngineKind = "http"
    readiness: Readiness = Readiness()
    """A ``readiness.path`` set explicitly replaces the engine's own probe path."""
    wake_on: Literal["any", "navigation", "none"] = "any"
    """``scaling.wake_on``: ``any`` means the engine's own wake rules (docs/engines.md)."""
    warmup_workflow: str | None = None
    """comfyui: absolute path of an API-format workflow run before the target counts as ready."""
    warmup: GradioWarmup | None = None
    """gradio: an API call made before the target counts as ready."""
    park: Park = "off"
    """How the engine is parked (the target's ``park``): ``auto`` its own action, explicit
    requests, or ``off``."""
    options: EngineOptions = EngineOptions()
    """The target's ``engine_options``."""


class ReplicasSpec(Frozen):
    """Several warmgate replicas in one cluster (docs/replicas.md): they find each other through
    the EndpointSlices of warmgate's own headless Service, read each other's activity from the
    admin listener, and only the holder of a ``coordination.k8s.io/v1`` Lease decides a
    scale-down, once every replica says the target is idle."""

    namespace: str
    """Namespace of warmgate's own Service and of the Lease."""
    service: str
    """The headless Service that selects warmgate's pods; its EndpointSlices list the replicas."""
    port: Annotated[int | str, BeforeValidator(_service_port)] = "admin"
    """The Service's port (its name, or the number) that serves ``admin_listen``."""
    identity: str | None = None
    """This replica's name, as its pod is named in the EndpointSlices' ``targetRef``; default:
    ``$POD_NAME`` (the Downward API), else the host name."""
    lease: str = "warmgate-leader"
    """The Lease whose holder decides scale-downs."""
    lease_duration: Duration = 15.0
    """A leader that stops renewing loses the Lease this long after its last renewal."""
    renew_interval: Duration = 5.0
    """How often the leader renews the Lease (and the others look whether it expired)."""
    poll_interval: Duration = 1.0
    """How often each replica reads the other replicas' activity."""
    peer_grace: Duration = 30.0
    """A replica that cannot be reached (or left the Service) counts as active this long after
    it last answered: a GPU is never released on missing information."""
    fence_timeout: Duration = 10.0
    """A replica told by the leader that a release is coming holds new requests for the target
    at most this long; then, if the release did not happen, it serves again."""
    token_file: str | None = None
    """A file holding the secret the replicas share (one token, mounted from a Secret),
    relative to the config file; read once, when the config is loaded. Every request one
    replica makes of another carries it as ``Authorization: Bearer``, and the endpoints that
    change state (fences, reports) answer 401 without it. Required with ``replicas:``: no
    default, since anyone who reaches the admin port could otherwise fence a target or report
    a spend."""

    @field_validator("namespace", "service", "lease")
    @classmethod
    def _names(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError(
                f"expected a DNS label (lowercase letters, digits, '-'), got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _timing(self) -> ReplicasSpec:
        if self.renew_interval <= 0 or self.poll_interval <= 0:
            raise ValueError("renew_interval and poll_interval must be above 0")
        if self.renew_interval * 2 > self.lease_duration:
            raise ValueError(
                "renew_interval must be at most half of lease_duration (a leader that misses "
                "one renewal must still hold the Lease)"
            )
        return self
