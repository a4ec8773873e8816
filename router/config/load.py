"""Loading the configuration file: YAML, validation, cross-references, and errors that name the
file, the key path and what was expected."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from backends.specs import BACKEND_KINDS
from router.config.api import MODEL_NAME
from router.config.env import Environment, read_environment
from router.config.pools import park_problems, pool_problems
from router.config.root import ENVIRONMENT, Config
from router.errors import ConfigError


def _model_problems(config: Config) -> list[tuple[str, str]]:
    """Cross-references of ``models:`` (names of targets, clouds, files) as (key path, problem)."""
    problems: list[tuple[str, str]] = []
    targets, clouds = sorted(config.targets), sorted(config.clouds)
    for name, spec in config.models.items():
        if not MODEL_NAME.match(name):
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


def _access_problems(config: Config) -> list[tuple[str, str]]:
    """Who may act: the replicas' shared token (read here, once) and an API that can spend."""
    problems: list[tuple[str, str]] = []
    replicas = config.replicas
    if replicas is not None and replicas.token_file is None:
        problems.append(
            (
                "replicas.token_file",
                "is required with replicas: a file holding the shared secret the replicas send "
                "each other (mounted from a Secret); without it anyone who reaches the admin "
                "port could fence targets or report spend",
            )
        )
    elif replicas is not None and replicas.token_file is not None:
        path = Path(config.base_dir, replicas.token_file)
        try:
            token = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            problems.append(
                ("replicas.token_file", f"{str(path)!r} cannot be read: {exc.strerror}")
            )
        else:
            if not token or len(token.split()) != 1:
                problem = f"{str(path)!r}: expected one token (no spaces) on one line"
                problems.append(("replicas.token_file", problem))
            else:
                config.set_replicas_token(token)
    api, policy = config.api, config.policy
    pays = any(p.cloud is not None for m in config.models.values() for p in m.placements)
    spends = pays and policy.daily_cloud_budget_usd > 0
    if spends and api.api_keys_file is None and not api.allow_anonymous:
        problems.append(
            (
                "api.api_keys_file",
                "is required when a cloud placement can spend policy.daily_cloud_budget_usd: "
                "without client keys anyone who reaches the public port spends it (set "
                "api.allow_anonymous: true if that is meant)",
            )
        )
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


def parse_config(
    data: object,
    source: str = "<memory>",
    base_dir: str = ".",
    environment: Environment | None = None,
) -> Config:
    """Validate parsed YAML; the Config carries ``environment`` (default: read now)."""
    if not isinstance(data, dict):
        raise ConfigError(source, [("(top level)", "expected a mapping of keys such as targets:")])
    context = {ENVIRONMENT: environment if environment is not None else read_environment()}
    try:
        config = Config.model_validate(
            {**data, "source": source, "base_dir": base_dir}, context=context
        )
    except ValidationError as exc:
        problems = [(_key_path(err["loc"]), _describe(err)) for err in exc.errors()]
        raise ConfigError(source, problems) from exc
    problems = _model_problems(config) + _engine_problems(config) + _access_problems(config)
    problems += pool_problems(config.pools, config.targets) + park_problems(config.targets)
    if model_problems := problems:
        raise ConfigError(source, model_problems)
    return config


def load_config(
    path: str | Path,
    overrides: Mapping[str, object] | None = None,
    environment: Environment | None = None,
) -> Config:
    """Read, parse and validate one YAML file; ``overrides`` replace top-level keys (the
    command line's ``--listen``/``--admin-listen``: each pod of a Deployment binds its own);
    ``environment``: what the command line read (default: read now)."""
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
    return parse_config(data, str(file), str(file.resolve().parent), environment)
