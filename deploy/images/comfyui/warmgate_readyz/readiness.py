"""What ``/readyz`` answers, as pure functions of a snapshot: no ComfyUI import, no I/O.

The eager load is a sequence of steps, two per checkpoint: *read* (ComfyUI's checkpoint loader
builds the model, CLIP and VAE from the file) and *resident* (ComfyUI's model management moves
them into VRAM). ``progress`` is the share of steps done. The loader thread replaces the snapshot
whole after every step; the route reads whichever snapshot is current.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

STEPS_PER_CHECKPOINT = 2
"""read from the model share, then moved into VRAM."""

_ON = {"1", "true", "yes", "on"}
_OFF = {"", "0", "false", "no", "off"}


@dataclass(frozen=True)
class Settings:
    """What the environment asks for (read once, by the package's ``__init__``)."""

    eager: bool
    checkpoints: tuple[str, ...]
    error: str | None = None
    """A setting that cannot be honoured: ``/readyz`` stays 503 with it."""


def settings_from(environ: Mapping[str, str]) -> Settings:
    """``EAGER_LOAD_MODEL`` (1/true/yes/on, or unset/0/false/no/off) and ``EAGER_CHECKPOINTS``
    (comma-separated names, as ComfyUI lists them under its ``checkpoints`` model paths)."""
    flag = environ.get("EAGER_LOAD_MODEL", "").strip().lower()
    names = tuple(dict.fromkeys(n.strip() for n in environ.get("EAGER_CHECKPOINTS", "").split(",")))
    names = tuple(n for n in names if n)
    if flag in _OFF:
        return Settings(eager=False, checkpoints=())
    if flag not in _ON:
        error = f"EAGER_LOAD_MODEL={environ['EAGER_LOAD_MODEL']!r}: expected 1 or 0"
        return Settings(eager=True, checkpoints=names, error=error)
    if not names:
        error = "EAGER_LOAD_MODEL=1 but EAGER_CHECKPOINTS names no checkpoint"
        return Settings(eager=True, checkpoints=(), error=error)
    return Settings(eager=True, checkpoints=names)


@dataclass(frozen=True)
class Readiness:
    """One snapshot of the eager load."""

    eager: bool
    checkpoints: tuple[str, ...]
    steps_done: int = 0
    loaded: tuple[str, ...] = ()
    """Checkpoints read and moved into VRAM, in load order."""
    loading: str | None = None
    error: str | None = None
    """Set once a load failed (or the settings were unusable): the answer is 503 from then on."""

    @property
    def stage(self) -> str:
        if self.error is not None:
            return "failed"
        if not self.eager or len(self.loaded) == len(self.checkpoints):
            return "ready"
        return "loading"

    @property
    def progress(self) -> float:
        if not self.eager:
            return 1.0
        total = STEPS_PER_CHECKPOINT * len(self.checkpoints)
        return round(self.steps_done / total, 3) if total else 0.0


def initial(settings: Settings) -> Readiness:
    return Readiness(eager=settings.eager, checkpoints=settings.checkpoints, error=settings.error)


def begin(state: Readiness, name: str) -> Readiness:
    return replace(state, loading=name)


def step_done(state: Readiness) -> Readiness:
    return replace(state, steps_done=state.steps_done + 1)


def resident(state: Readiness, name: str) -> Readiness:
    return replace(state, loaded=(*state.loaded, name), loading=None)


def failed(state: Readiness, error: str) -> Readiness:
    return replace(state, error=error)


def answer(state: Readiness, in_vram: frozenset[str] = frozenset()) -> tuple[int, dict[str, Any]]:
    """HTTP status and JSON body of ``GET /readyz``. ``in_vram``: the loaded checkpoints that
    ComfyUI's model management still holds on the GPU (it may unload them under memory pressure;
    they are reloaded on use, so the answer stays 200)."""
    body: dict[str, Any] = {
        "stage": state.stage,
        "progress": state.progress,
        "loaded": list(state.loaded),
        "eager": state.eager,
    }
    if state.stage == "ready":
        body["resident"] = [name for name in state.loaded if name in in_vram]
        return 200, body
    body["checkpoints"] = list(state.checkpoints)
    if state.loading is not None:
        body["loading"] = state.loading
    if state.error is not None:
        body["error"] = state.error
    return 503, body
