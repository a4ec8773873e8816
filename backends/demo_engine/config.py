"""Typed configuration for the demo engine: command-line flags, then environment, then defaults.

The environment is read here and nowhere else in the package.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Device = Literal["cpu", "cuda"]
Frontend = Literal["builtin", "comfyui", "auto"]
"""``builtin``: the engine's own small page; ``comfyui``: ComfyUI's frontend, from its package
(an error without it); ``auto``: ComfyUI's when the package is installed, else the builtin."""

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": KIB,
    "kib": KIB,
    "kb": 1000,
    "m": MIB,
    "mib": MIB,
    "mb": 1000**2,
    "g": GIB,
    "gib": GIB,
    "gb": 1000**3,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


class ConfigError(ValueError):
    """A flag or environment variable holds a value the engine cannot use."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything the engine needs to start; built once by `parse_config`."""

    checkpoint_path: Path
    """Where the synthetic checkpoint lives; created on first use."""
    checkpoint_size: int
    """Checkpoint size in bytes. 256 MiB default: big enough that loading takes visible time."""
    host: str = "127.0.0.1"
    """Interface to bind. Loopback by default because the router sits in front of the engine."""
    port: int = 8188
    """TCP port. 8188 is ComfyUI's default."""
    render_seconds: float = 2.0
    """Wall-clock seconds one render takes, whatever its step count; a typical small GPU job."""
    steps: int = 10
    """Progress steps for a prompt that does not name its own (KSampler.steps)."""
    device: Device = "cpu"
    """Where the checkpoint lives once loaded: host memory or a CUDA tensor."""
    eager_load: bool = True
    """Load the checkpoint at start (True) or on the first prompt (False)."""
    chunk_size: int = 4 * MIB
    """Bytes per read/write while creating or loading the checkpoint; bounds the cancel latency."""
    output_limit: int = 256
    """How many rendered PNGs stay viewable through /view; older ones are forgotten."""
    history_limit: int = 1000
    """How many finished prompts /history remembers."""
    frontend: Frontend = "builtin"
    """The web page at ``/``: the engine's own, or ComfyUI's from ``comfyui-frontend-package``
    (``auto``: ComfyUI's when that package is installed)."""
    load_seconds: float = 0.0
    """The checkpoint load is paced to take at least this long (0: as fast as the disk reads):
    a demo of a large model, and of the load progress /readyz reports meanwhile."""


def parse_size(text: str) -> int:
    """Parse `256MiB`, `1GiB`, `64k`, `10MB` or a plain byte count into bytes."""
    match = _SIZE_RE.match(text)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"invalid size {text!r}: expected e.g. 256MiB, 1GiB, 64KiB or 1048576")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size < 1:
        raise ConfigError(f"invalid size {text!r}: must be at least one byte")
    return size


def format_size(size: int) -> str:
    """The shortest exact binary spelling of a byte count: `256MiB`, `1GiB`, `1000B`."""
    for unit, factor in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size}B"


def parse_bool(name: str, text: str) -> bool:
    """Read an on/off environment variable, naming it when the value is neither."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={text!r}: expected 1/0, true/false, yes/no or on/off")


def default_checkpoint_path(env: Mapping[str, str], size: int) -> Path:
    """`${XDG_CACHE_HOME:-~/.cache}/warmgate/demo-checkpoint-<size>.bin`."""
    cache = env.get("XDG_CACHE_HOME") or ""
    base = Path(cache) if cache else Path(env.get("HOME") or Path.home()) / ".cache"
    return base / "warmgate" / f"demo-checkpoint-{format_size(size)}.bin"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m backends.demo_engine",
        description="warmgate's embedded demo render engine (a ComfyUI-compatible subset).",
        epilog="Environment fallbacks: EAGER_LOAD_MODEL (1: load at start, 0: on first prompt), "
        "DEMO_CHECKPOINT_SIZE, DEMO_RENDER_SECONDS, DEMO_LOAD_SECONDS, XDG_CACHE_HOME.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8188, help="TCP port (default 8188)")
    parser.add_argument("--checkpoint", type=Path, default=None, help="checkpoint file path")
    parser.add_argument("--checkpoint-size", default=None, help="checkpoint size (default 256MiB)")
    parser.add_argument("--render-seconds", default=None, help="seconds per render (default 2.0)")
    parser.add_argument(
        "--load-seconds", default=None, help="load the checkpoint in at least this long (default 0)"
    )
    parser.add_argument("--steps", type=int, default=10, help="default progress steps")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--frontend",
        choices=("builtin", "comfyui", "auto"),
        default="builtin",
        help="the page at /: the engine's own (default), ComfyUI's from comfyui-frontend-package,"
        " or auto (ComfyUI's when that package is installed)",
    )
    return parser


def _render_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"render seconds {text!r}: expected a number") from None
    if not 0 <= value <= 3600:
        raise ConfigError(f"render seconds {text!r}: expected 0..3600")
    return value


def _load_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"load seconds {text!r}: expected a number") from None
    if not 0 <= value <= 3600:
        raise ConfigError(f"load seconds {text!r}: expected 0..3600")
    return value


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> EngineConfig:
    """Build the config from flags, falling back to `env`; exits with status 2 on bad input."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        size = parse_size(args.checkpoint_size or env.get("DEMO_CHECKPOINT_SIZE") or "256MiB")
        seconds = _render_seconds(args.render_seconds or env.get("DEMO_RENDER_SECONDS") or "2.0")
        load = _load_seconds(args.load_seconds or env.get("DEMO_LOAD_SECONDS") or "0")
        eager = parse_bool("EAGER_LOAD_MODEL", env.get("EAGER_LOAD_MODEL", "1"))
        if not 0 <= args.port <= 65535:
            raise ConfigError(f"--port {args.port}: expected 0..65535")
        if not 1 <= args.steps <= 1000:
            raise ConfigError(f"--steps {args.steps}: expected 1..1000")
    except ConfigError as exc:
        parser.error(str(exc))
    path: Path = args.checkpoint or default_checkpoint_path(env, size)
    return EngineConfig(
        checkpoint_path=path.expanduser(),
        checkpoint_size=size,
        host=args.host,
        port=args.port,
        render_seconds=seconds,
        steps=args.steps,
        device=args.device,
        eager_load=eager,
        load_seconds=load,
        frontend=args.frontend,
    )
