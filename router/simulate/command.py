"""``warmgate simulate``: replay a request trace through one or more configurations, side by
side (docs/simulate.md)."""

from __future__ import annotations

import argparse
import datetime
import logging
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from router.config import Environment
from router.simulate.accesslog import convert
from router.simulate.backends import Duration, Measured, measured_cold_starts, measured_wakes
from router.simulate.report import Summary, summarize, table, write_csv
from router.simulate.run import Options, Result, replay
from router.simulate.trace import DEFAULT_START, Trace, TraceError, check_names, read, write
from router.simulate.variants import SWEEP, Variant, auto_idle, fixed_idle, variant

T = TypeVar("T")


def _options(args: argparse.Namespace) -> Options:
    from backends.units import parse_duration

    return Options(
        cold_start=_per_target(args.cold_start, "--cold-start"),
        wake=_per_target(args.wake, "--wake"),
        stop=_given("--stop", args.stop, Duration.parse),
        seed=args.seed,
        tokens_per_second=args.tokens_per_second,
        tail=_given("--tail", args.tail, parse_duration),
    )


def _given(option: str, text: str, parse: Callable[[str], T]) -> T:
    """``parse(text)``; what it cannot read is a ``ValueError`` naming the option."""
    try:
        return parse(text)
    except ValueError as exc:
        raise ValueError(f"{option} {text!r}: {exc}") from None


def _unknown_targets(args: argparse.Namespace, base: Variant) -> str | None:
    """What --cold-start or --wake names that is no target of the config."""
    for option, specs in (("--cold-start", args.cold_start), ("--wake", args.wake)):
        for spec in specs:
            name, sep, _ = spec.rpartition("=")
            if sep and name != "*" and name not in base.config.targets:
                has = ", ".join(base.config.targets)
                return f"{option} {spec!r}: {args.config} has no target {name!r} (it has {has})"
    return None


def _measured(options: Options, base: Variant) -> Options:
    """The cold starts and the wakes the live server kept, for the targets --cold-start (or
    --wake) does not name."""
    from dataclasses import replace

    starts = _kept(measured_cold_starts(base.config), options.cold_start, "a cold start")
    wakes = _kept(measured_wakes(base.config), options.wake, "a wake")
    return replace(options, measured=starts, measured_wake=wakes)


def _kept(
    measured: dict[str, Measured], given: Mapping[str, Duration], what: str
) -> dict[str, Duration]:
    found = {n: m for n, m in measured.items() if n not in given and "*" not in given}
    for name, m in found.items():
        print(
            f"{name}: {what} takes {m.duration} as measured ({m.starts} kept in {m.where})",
            file=sys.stderr,
        )
    return {name: m.duration for name, m in found.items()}


def _per_target(specs: list[str], option: str) -> dict[str, Duration]:
    """``[TARGET=]SPEC`` each: a duration per target, ``*`` for the others."""
    out: dict[str, Duration] = {}
    for spec in specs:
        name, sep, value = spec.rpartition("=")
        out[name if sep else "*"] = _given(option, value, Duration.parse)
    return out


def _trace(args: argparse.Namespace) -> Trace:
    if args.from_access_log:
        with open(args.from_access_log, encoding="utf-8", errors="replace") as handle:
            converted = convert(handle, args.from_access_log, args.log_zone)
        left = ", ".join(f"{n} {why}" for why, n in converted.left_out.items())
        print(
            f"{args.from_access_log}: {len(converted.trace.requests)} requests"
            + (f" ({left} left out)" if left else ""),
            file=sys.stderr,
        )
        return converted.trace
    start = DEFAULT_START
    if args.start:
        iso = args.start.replace("Z", "+00:00")
        start = _given("--start", iso, datetime.datetime.fromisoformat)
        if start.tzinfo is None:
            start = start.replace(tzinfo=datetime.UTC)
    return read(args.trace, start)


def run(args: argparse.Namespace, environment: Environment) -> int:
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:  # a replay's phase changes are
        logging.getLogger("warmgate").setLevel(logging.WARNING)  # news to nobody
    if not args.trace and not args.from_access_log:
        print("warmgate simulate: give --trace FILE or --from-access-log LOG", file=sys.stderr)
        return 2
    try:
        trace = _trace(args)
        options = _options(args)
    except (TraceError, ValueError, OSError) as exc:
        print(f"warmgate simulate: {exc}", file=sys.stderr)
        return 2
    if trace.ignored:
        print(
            f"{trace.source}: columns read past: {', '.join(map(repr, trace.ignored))}",
            file=sys.stderr,
        )
    if args.write_trace:
        try:
            with open(args.write_trace, "w", encoding="utf-8", newline="") as handle:
                write(trace.requests, trace.start, handle)
        except OSError as exc:
            print(f"warmgate simulate: cannot write {args.write_trace}: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.write_trace}", file=sys.stderr)
        if not args.config:
            return 0
    if not args.config:
        print("warmgate simulate: give --config FILE to replay the trace", file=sys.stderr)
        return 2
    base = variant(args.config, args.set)
    variants = _distinct([base] + [variant(path, args.set) for path in args.compare])
    if args.auto:
        variants.append(auto_idle(base))
    try:
        for path, v in zip([args.config, *args.compare], variants, strict=False):
            check_names(trace, v.config.targets, v.config.models, path)
    except TraceError as exc:
        print(f"warmgate simulate: {exc}", file=sys.stderr)
        return 2
    if (unknown := _unknown_targets(args, base)) is not None:
        print(f"warmgate simulate: {unknown}", file=sys.stderr)
        return 2
    options = _measured(options, base)
    results: list[Result] = []
    summaries: list[Summary] = []
    began = time.perf_counter()
    for v in variants:
        result = _replay(v, trace, options, args.config)
        results.append(result)
        summaries.append(summarize(result))
    if args.sweep:
        tried = []
        for seconds in SWEEP:
            result = _replay(fixed_idle(base, seconds), trace, options, args.config)
            tried.append((summarize(result), result))
        best_summary, best_result = min(tried, key=lambda pair: pair[0].total_usd)
        label = f"best fixed ({best_summary.config}, in hindsight)"
        summaries.append(_relabel(best_summary, label))
        best_result.label = label
        results.append(best_result)
        print("sweep of a fixed idle_after (total cost):", file=sys.stderr)
        for summary, _ in tried:
            print(f"  {summary.config}: ${summary.total_usd:.2f}", file=sys.stderr)
    elapsed = time.perf_counter() - began
    days = trace.duration / 86400
    print(
        f"{len(trace.requests)} requests over {days:.2f} days, {len(results)} replays "
        f"in {elapsed:.1f}s\n"
    )
    print(table(summaries))
    return _write_out(args.out, summaries, results) if args.out else 0


def _write_out(where: str, summaries: list[Summary], results: list[Result]) -> int:
    out = Path(where)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_csv(summaries, out / "summary.csv")
    except OSError as exc:
        print(f"warmgate simulate: cannot write {out}: {exc}", file=sys.stderr)
        return 2
    from router.simulate.plots import draw

    try:
        paths = draw(results, out)
    except RuntimeError as exc:  # no matplotlib
        print(f"\nwrote {out / 'summary.csv'}; {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"warmgate simulate: cannot write {out}: {exc}", file=sys.stderr)
        return 2
    print(f"\nwrote {out / 'summary.csv'}, " + ", ".join(str(p) for p in paths))
    return 0


def _distinct(variants: list[Variant]) -> list[Variant]:
    """Two files of one name (a/warmgate.yaml, b/warmgate.yaml) or one file twice: each column
    told apart by its number."""
    from dataclasses import replace

    labels = [v.label for v in variants]
    return [
        replace(v, label=f"{v.label} #{i + 1}") if labels.count(v.label) > 1 else v
        for i, v in enumerate(variants)
    ]


def _replay(v: Variant, trace: Trace, options: Options, source: str) -> Result:
    return replay(v.config, trace, options, v.label)


def _relabel(summary: Summary, label: str) -> Summary:
    from dataclasses import replace

    return replace(summary, config=label)


def add_command(commands: Any) -> None:
    """``warmgate simulate``, on the CLI's subcommands (``argparse``'s ``add_subparsers()``)."""
    command = commands.add_parser(
        "simulate",
        help="replay a request trace through warmgate's decisions and compare configurations",
        description="Replays a request trace through warmgate's own scaling decisions on a "
        "virtual clock (nothing listens on a port) and prints, per configuration: GPU-hours "
        "held, cold starts met and their waits, the cloud, and the total cost at economics:'s "
        "prices (docs/simulate.md).",
    )
    command.add_argument("--config", "-c", help="the configuration to replay")
    command.add_argument("--trace", "-t", help="the trace: CSV (docs/simulate.md)")
    command.add_argument(
        "--from-access-log", metavar="LOG", help="take the trace from warmgate's access log"
    )
    command.add_argument(
        "--log-zone", default="UTC", help="time zone the access log's times are in; default UTC"
    )
    command.add_argument("--write-trace", metavar="FILE", help="write the trace read as CSV")
    command.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (targets.comfyui.scaling.idle_after=10m; targets.*.… all)",
    )
    command.add_argument(
        "--compare", action="append", default=[], metavar="FILE", help="another config to compare"
    )
    command.add_argument(
        "--auto",
        action="store_true",
        help="also compare idle_after: auto (and park_after: auto where a target parks)",
    )
    command.add_argument(
        "--sweep",
        action="store_true",
        help="also sweep fixed idle_after values and show the best one in hindsight",
    )
    command.add_argument(
        "--cold-start",
        action="append",
        default=[],
        metavar="[TARGET=]SPEC",
        help="a start's duration: 60s, or 45s..90s drawn uniformly; default: the starts "
        "warmgate serve measured (state_dir), else the target's expected cold start, else 60s",
    )
    command.add_argument(
        "--wake",
        action="append",
        default=[],
        metavar="[TARGET=]SPEC",
        help="a wake from parked: 2s, or 1s..3s drawn uniformly; default: the wakes "
        "warmgate serve measured (state_dir), else the target's expected_wake, else 2s",
    )
    command.add_argument("--stop", default="5s", help="a stop's duration (SPEC); default 5s")
    command.add_argument("--seed", type=int, default=1, help="for drawn durations; default 1")
    command.add_argument(
        "--tokens-per-second",
        type=float,
        default=40.0,
        help="an API request's tokens in GPU time when it runs locally; default 40",
    )
    command.add_argument("--tail", default="2h", help="replayed after the last request; default 2h")
    command.add_argument(
        "--start", help="wall clock of a trace written in seconds (ISO 8601); default a Monday"
    )
    command.add_argument("--out", metavar="DIR", help="write summary.csv and two PNG pictures")
    command.set_defaults(func=run)
