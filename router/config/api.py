"""The OpenAI-compatible API's config: models, their placements, clouds and the policy
(docs/openai.md)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import field_validator, model_validator

from backends.specs import Frozen
from backends.units import MAX_COUNT, MAX_USD, Duration, Size, integer, real

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Cost(Frozen):
    """What a cloud model charges, in USD."""

    input_per_mtok: Annotated[float, real(0, MAX_USD)] = 0.0
    """USD per million input (prompt) tokens."""
    output_per_mtok: Annotated[float, real(0, MAX_USD)] = 0.0
    """USD per million output (completion) tokens."""
    per_image: Annotated[float, real(0, MAX_USD)] = 0.0
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
    cost_per_gpu_second: Annotated[float, real(0, MAX_USD)] = 0.0
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
    retries: Annotated[int, integer(0, 5)] = 1
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
    daily_cloud_budget_usd: Annotated[float, real(0, MAX_USD)] = 0.0
    """Cloud spend allowed per UTC day. 0 (the default): the cloud is never paid for."""
    private: PrivateRule = PrivateRule()
    overflow_queue_depth: Annotated[int, integer(0, MAX_COUNT)] = 4
    """A ready local target with more than this in progress counts as saturated, and the cloud
    is preferred (``local_busy``): warmgate's own API requests to it, or the jobs in its engine's
    own queue where the engine tells them (ComfyUI's ``queue_remaining``, Gradio's
    ``queue_size``, vLLM's ``vllm:num_requests_waiting``; read at every ``busy_poll``),
    whichever is more. 4: a few renders queued are worth waiting for, a crowd is not. Besides,
    the wait in that queue (its depth x the learned time per job) counts against the latency
    budget like a cold start."""
    warm_on_cloud: bool = True
    """A request sent to the cloud because the local target was cold starts it for next time."""
    assumed_cold_start: Duration = 30.0
    """Predicted cold start of a target never started yet; learned from its starts afterwards."""
    assumed_output_tokens: Annotated[int, integer(1, MAX_COUNT)] = 1024
    """Output tokens reserved against the budget for a request without ``max_tokens``."""


class ApiSettings(Frozen):
    """The OpenAI-compatible API on the public listener (served when ``models:`` is set)."""

    api_keys_file: str | None = None
    """Client keys, one per line (``key`` or ``name key``; ``#`` comments), relative to the config
    file. Set: requests need ``Authorization: Bearer <key>``. Omitted: no client keys."""
    max_body: Size = 10 * 2**20
    """Largest API request body in bytes; bigger -> 413. 10 MiB fits long chat histories."""
    allow_anonymous: bool = False
    """Serve the API without client keys even though it can spend money (a cloud placement and
    ``policy.daily_cloud_budget_usd`` above 0): anyone who reaches the public port then spends
    the budget. Off by default, so that such a config without ``api_keys_file`` is an error
    rather than an open wallet; set it where that is meant (a workstation, a test)."""
