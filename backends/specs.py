"""What each backend kind needs to know, as typed frozen config groups.

Pure data shared by the router's config file and the backends that act on it; no behaviour.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from backends.units import Duration


class Frozen(BaseModel):
    """Base of every config group: immutable, and unknown keys are errors (typos surface)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class StaticBackend(Frozen):
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


class ProcessBackend(Frozen):
    """A local command started and stopped by warmgate: the embedded default for one workstation."""

    kind: Literal["process"]
    command: tuple[str, ...]
    """argv; ``{port}`` and ``{host}`` are replaced at each start."""
    host: str = "127.0.0.1"
    """Address the child listens on; loopback because only warmgate talks to it."""
    port: int = Field(default=0, ge=0, le=65535)
    """0: a free port at each start, so a lingering old child can never collide."""
    cwd: str | None = None
    """Relative to the config file's directory; default: the config file's directory."""
    env: Mapping[str, str] = Field(default_factory=dict)
    """Added to warmgate's own environment."""
    stop_grace: Duration = 30.0
    """SIGTERM, then SIGKILL after this long: long enough for an engine to free its GPU cleanly."""

    @field_validator("command")
    @classmethod
    def _command_not_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or not value[0]:
            raise ValueError("expected a non-empty list such as [python, -m, my.engine]")
        return value


BackendSpec = StaticBackend | ProcessBackend
Backend = Annotated[BackendSpec, Field(discriminator="kind")]
BACKEND_KINDS = ("static", "process")


class Readiness(Frozen):
    path: str = "/readyz"
    """Probed with GET until it answers 200: the engine reports its weights resident."""
    interval: Duration = 0.2
    """Between probes while starting; 200 ms keeps the wake-up latency low at negligible cost."""
    timeout: Duration = 2.0
    """One probe's limit."""
