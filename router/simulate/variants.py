"""The configurations a simulation compares: a config file with ``--set KEY=VALUE`` overrides
(``targets.comfyui.scaling.idle_after=10m``; ``targets.*.…`` for every target), other files to
compare, and the sweep of fixed ``idle_after`` values that finds the best one in hindsight."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from backends.units import format_duration
from router.config import Config, Scaling, parse_config
from router.errors import ConfigError

_NAMED = ("targets", "models", "pools", "clouds")
"""Top-level keys whose entries are named by the config: ``--set`` goes into one that exists."""
SWEEP = (120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0)
"""Fixed ``idle_after`` values the sweep tries (seconds): 2 minutes to an hour."""


@dataclass(frozen=True, slots=True)
class Variant:
    label: str
    config: Config


def read_yaml(path: str | Path) -> dict[str, Any]:
    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(str(file), [("(file)", f"cannot be read: {exc.strerror}")]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(str(file), [("(file)", f"is not valid YAML: {exc}")]) from exc
    if not isinstance(data, dict):
        raise ConfigError(
            str(file), [("(top level)", "expected a mapping of keys such as targets:")]
        )
    return data


def apply_set(data: dict[str, Any], assignment: str, source: str) -> dict[str, Any]:
    """A copy of ``data`` with one ``KEY.PATH=VALUE`` (the value read as YAML) applied."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(source, [(assignment, "expected --set KEY.PATH=VALUE")])
    value = yaml.safe_load(raw) if raw.strip() else ""
    parts = key.strip().split(".")
    named = data.get(parts[0])
    inside = len(parts) > 2 and parts[0] in _NAMED and parts[1] != "*"
    if inside and isinstance(named, dict) and parts[1] not in named:  # a misspelt name
        has = ", ".join(named) or "none"
        raise ConfigError(source, [(".".join(parts[:2]), f"--set: no such entry (it has {has})")])
    out: dict[str, Any] = _copy(data)

    def put(node: dict[str, Any], i: int) -> None:
        part = parts[i]
        keys = list(node) if part == "*" else [part]
        if part == "*" and not keys:
            raise ConfigError(source, [(key, "'*' matches nothing here")])
        for name in keys:
            if i == len(parts) - 1:
                node[name] = value
                continue
            child = node.get(name)
            if child is None:
                child = node[name] = {}
            if not isinstance(child, dict):
                raise ConfigError(source, [(".".join(parts[: i + 1]), "is not a mapping")])
            put(child, i + 1)

    put(out, 0)
    return out


def _copy(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _copy(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_copy(v) for v in node]
    return node


def variant(path: str | Path, sets: Sequence[str], label: str | None = None) -> Variant:
    file = Path(path)
    data = read_yaml(file)
    for assignment in sets:
        data = apply_set(data, assignment, str(file))
    config = parse_config(data, str(file), str(file.resolve().parent))
    shown = label or file.stem + "".join(f" {s}" for s in sets)
    return Variant(shown, config)


def fixed_idle(base: Variant, seconds: float) -> Variant:
    """``base`` with every target's ``idle_after`` fixed at ``seconds``."""
    return _with_scaling(base, f"idle_after={format_duration(seconds)}", idle_after=seconds)


def auto_idle(base: Variant) -> Variant:
    """``base`` with every target's ``idle_after: auto``, and ``park_after: auto`` where it
    parks (``park_after`` set)."""
    parks = any(t.scaling.park_seconds > 0 for t in base.config.targets.values())
    label = "idle_after=auto" + (" park_after=auto" if parks else "")

    def change(scaling: Scaling) -> dict[str, Any]:
        parked = {"park_after": "auto"} if scaling.park_seconds > 0 else {}
        return {"idle_after": "auto", **parked}

    return _with_scaling(base, label, change)


def _with_scaling(
    base: Variant,
    label: str,
    change: Callable[[Scaling], dict[str, Any]] | None = None,
    **changes: Any,
) -> Variant:
    config = base.config
    targets = {}
    for name, target in config.targets.items():
        update = {**changes, **(change(target.scaling) if change is not None else {})}
        scaling = target.scaling.model_copy(update=update)
        targets[name] = target.model_copy(update={"scaling": scaling})
    return Variant(label, config.model_copy(update={"targets": targets}))


def best_fixed(
    costs: Callable[[Variant], float], base: Variant, values: Sequence[float] = SWEEP
) -> tuple[float, float, list[tuple[float, float]]]:
    """The fixed ``idle_after`` of least total cost: (seconds, cost, every (seconds, cost))."""
    tried = [(value, costs(fixed_idle(base, value))) for value in values]
    best = min(tried, key=lambda pair: pair[1])
    return best[0], best[1], tried
