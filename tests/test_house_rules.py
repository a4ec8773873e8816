"""House rules read from the source: requests in flight, held requests, held websockets and open
streams are counted by the blocks of router/scale/activity.py only (``with runtime.in_flight()``,
``with runtime.holding()``, ``with runtime.stream(close)`` ...), so every count up has its count
down by construction. Anywhere else in router/, a count or its gauge moved by hand, an early
``.end()``, a ``rejoin()`` or a block entered or left by hand is a failure, named with its line.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path
from typing import Final

import pytest

from tests.helpers import ROOT

BLOCKS: Final = "router/scale/activity.py"
"""The one module that moves the counts: the blocks themselves."""
GAUGE_MAKERS: Final = frozenset({"router/scale/targets.py"})
"""Where the counts' gauges are labelled for a target (handed to the blocks, never moved)."""

COUNTS: Final = frozenset({"in_flight", "held", "held_sockets", "streams"})
"""The activity's counts (router.scale.activity.Activity)."""
GAUGES: Final = frozenset({"m_in_flight", "m_held", "m_ws_open"})
"""A target's gauges of those counts (router.scale.targets.TargetRuntime)."""
COUNT_METRICS: Final = frozenset(
    {"in_flight", "held_requests", "websockets_open", "websockets_held"}
)
"""The metrics of those counts (router.metrics.Metrics)."""
MUTATORS: Final = frozenset({"pop", "popitem", "setdefault", "clear", "update"})
BY_HAND: Final = frozenset({"__enter__", "__exit__", "__aenter__", "__aexit__"})


def _name(node: ast.expr) -> str | None:
    """The last name of ``x``, ``a.b.x``: what a count or gauge is called."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _count_target(target: ast.expr) -> bool:
    """``x.held``, ``x.streams[k]``: a count, or an entry of the streams."""
    if isinstance(target, ast.Subscript):
        return _name(target.value) == "streams"
    return isinstance(target, ast.Attribute) and target.attr in COUNTS


def _bare_end(node: ast.AST) -> bool:
    """``x.end()`` as a statement of its own: something ended early by hand (an end whose
    value is used, as a regex match's, ends nothing)."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    func = node.value.func
    return isinstance(func, ast.Attribute) and func.attr == "end"


def violations(source: str, module: str) -> list[str]:
    """Where ``source`` (the text of ``module``, a path under the repository) counts by hand."""
    if module == BLOCKS:
        return []
    found: list[str] = []

    def bad(node: ast.AST, what: str) -> None:
        found.append(f"{module}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(ast.parse(source, module)):
        if _bare_end(node):
            bad(node, f"{ast.unparse(node)}: ended by hand, not by its block")
        elif isinstance(node, ast.AugAssign) and _count_target(node.target):
            bad(node, f"{ast.unparse(node.target)} moved by hand")
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in targets:
                init = isinstance(target, ast.Attribute) and _is_self(target.value)
                if _count_target(target) and not (init and not isinstance(node, ast.Delete)):
                    bad(node, f"{ast.unparse(target)} set by hand")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func, receiver = node.func, node.func.value
            if func.attr in MUTATORS and _name(receiver) == "streams":
                bad(node, f"{ast.unparse(func)}(): a stream's entry moved by hand")
            elif func.attr in ("inc", "dec") and _name(receiver) in GAUGES:
                bad(node, f"{ast.unparse(func)}(): a count's gauge moved by hand")
            elif (
                func.attr == "labels"
                and _name(receiver) in COUNT_METRICS
                and module not in GAUGE_MAKERS
            ):
                bad(node, f"{ast.unparse(func)}(): a count's gauge taken to move by hand")
            elif func.attr in ("rejoin", "begin"):
                bad(node, f"{ast.unparse(func)}(): a count moved by hand")
            elif func.attr in BY_HAND:
                bad(node, f"{ast.unparse(func)}(): a block entered or left by hand")
    return found


def scan(root: Path) -> list[str]:
    found: list[str] = []
    for path in sorted((root / "router").rglob("*.py")):
        module = path.relative_to(root).as_posix()
        found += violations(path.read_text(encoding="utf-8"), module)
    return found


def test_counts_move_only_in_their_blocks() -> None:
    assert scan(ROOT) == []


PLANTED: Final = {
    "in flight by hand": "runtime.activity.in_flight += 1",
    "held by hand": "self.activity.held -= 1",
    "held sockets by hand": "rt.activity.held_sockets += 1",
    "held set by hand": "activity.held = 0",
    "a stream's entry set": "activity.streams[key] = close",
    "a stream's entry popped": "rt.activity.streams.pop(key, None)",
    "a stream's entry deleted": "del activity.streams[key]",
    "an early end": "flight.end()",
    "a job's end": "running.pop().end()",
    "a rejoin": "in_flight.rejoin()",
    "a begin": "runtime.activity.begin(now)",
    "a gauge moved": "runtime.m_held.inc(delta)",
    "a websocket gauge moved": "rt.m_ws_open.dec()",
    "a count's gauge labelled": "gauge = rt.metrics.websockets_held.labels(rt.name)",
    "a block left by hand": "flight.__exit__(None, None, None)",
}


@pytest.mark.parametrize("line", PLANTED.values(), ids=PLANTED.keys())
def test_a_count_moved_by_hand_fails(line: str) -> None:
    source = f"def forward(runtime, rt, activity, flight, in_flight, running):\n    {line}\n"
    assert len(violations(source, "router/http/proxy.py")) == 1
    assert violations(source, BLOCKS) == []  # the blocks themselves may


def test_what_is_no_count_passes() -> None:
    source = (
        "def fine(self, activity, m, now):\n"
        "    self.held = 0\n"  # a class's own attribute, as its __init__ sets it
        "    held = activity.held + activity.held_sockets\n"
        "    activity.last_frame = now\n"
        "    return m.end(), len(activity.streams)\n"  # a value, as a regex match's end
    )
    assert violations(source, "router/http/proxy.py") == []


def test_a_violation_planted_in_a_copy_of_the_router_is_found(tmp_path: Path) -> None:
    shutil.copytree(
        ROOT / "router", tmp_path / "router", ignore=shutil.ignore_patterns("__pycache__")
    )
    proxy = tmp_path / "router/http/proxy.py"
    proxy.write_text(
        proxy.read_text(encoding="utf-8")
        + "\n\ndef queued(runtime, delta):\n    runtime.activity.held += delta\n",
        encoding="utf-8",
    )
    (found,) = scan(tmp_path)
    assert found.startswith("router/http/proxy.py:") and "activity.held moved by hand" in found
