"""``warmgate``: check a config, or serve it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from backends.base import BackendError
from router import __version__
from router.config import Config, Environment, load_config, read_environment
from router.errors import ConfigError, ListenError
from router.routing.match import RouteTable
from router.simulate.command import add_command as add_simulate_command
from router.status import add_command as add_status_command

DEFAULT_CONFIG = "deploy/local/warmgate.yaml"
CLOSED_PIPE = 128 + 13
"""Exit status when the reader of our output went away (``| head -1``): a shell's SIGPIPE."""


def _routes(config: Config) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [
        ("HOSTS", "PATH PREFIX", "HEADERS", "TARGET", "BACKEND", "ENGINE")
    ]
    for hosts, prefix, headers, target in RouteTable(config).describe():
        spec = config.targets[target]
        rows.append((hosts, prefix, headers, target, spec.backend.kind, spec.engine))
    return rows


def _models(config: Config) -> list[tuple[str, ...]]:
    """The names on the OpenAI-compatible API, each with its placements in order of
    preference (a local target, or ``<cloud>/<model>``)."""
    rows: list[tuple[str, ...]] = [("MODEL", "KIND", "PLACEMENTS")]
    for name, model in config.models.items():
        rows.append((name, model.kind, ", ".join(p.label for p in model.placements)))
    return rows


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def _check(args: argparse.Namespace, environment: Environment) -> int:
    config = load_config(args.config, environment=environment)
    print(f"{args.config}: ok, {len(config.targets)} targets")
    print(f"listen {config.listen}, admin {config.admin_listen}")
    if config.scaler_listen is not None:
        print(f"KEDA scaler {config.scaler_listen}")
    replicas = config.replicas
    if replicas is not None:
        print(
            f"replicas: peers from Service {replicas.namespace}/{replicas.service} "
            f"(port {replicas.port}), leader Lease {replicas.namespace}/{replicas.lease}"
        )
    print()
    _print_table(_routes(config))
    if config.models:
        print(f"\nOpenAI-compatible API (/v1): {len(config.models)} models")
        _print_table(_models(config))
    return 0


def _serve(args: argparse.Namespace, environment: Environment) -> int:
    overrides = {
        key: value
        for key, value in (
            ("listen", args.listen),
            ("admin_listen", args.admin_listen),
            ("scaler_listen", args.scaler_listen),
        )
        if value
    }
    config = load_config(args.config, overrides, environment)
    from router.server import serve

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; tolerate odd platforms
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
    return 0


def main(argv: list[str] | None = None) -> int:
    environment = read_environment()  # once; the config carries it down from here
    parser = argparse.ArgumentParser(
        prog="warmgate", description="Request router and scale-from-zero proxy for GPU engines."
    )
    parser.add_argument("--version", action="version", version=f"warmgate {__version__}")
    parser.add_argument("--log-level", default=environment.log_level, help="default INFO")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, func, text in (
        ("check", _check, "validate a config file and print the routing table"),
        ("serve", _serve, "run the router"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument(
            "--config", "-c", default=DEFAULT_CONFIG, help=f"default {DEFAULT_CONFIG}"
        )
        command.set_defaults(func=func)
        if name == "serve":
            command.add_argument("--listen", help="HOST:PORT; overrides the config's listen")
            command.add_argument(
                "--admin-listen", help="HOST:PORT; overrides the config's admin_listen"
            )
            command.add_argument(
                "--scaler-listen", help="HOST:PORT; overrides the config's scaler_listen"
            )
    add_status_command(commands)
    add_simulate_command(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    try:
        code = int(args.func(args, environment))
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except BrokenPipeError:
        # Nothing else may reach the closed pipe, not even the interpreter's last flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CLOSED_PIPE
    except ConfigError as exc:
        print(f"warmgate: invalid config\n{exc}", file=sys.stderr)
        return 2
    except (ListenError, BackendError) as exc:
        print(f"warmgate: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
