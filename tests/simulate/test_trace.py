"""Traces: parsed, sorted, and every bad line named by its line number and field."""

from __future__ import annotations

import io

import pytest

from router.simulate.trace import DEFAULT_START, TraceError, parse, write

GOOD = """time,target,kind,work_seconds,private
10,comfyui,render,4.5,
0,comfyui,page,0.2,no
"""


def test_parses_and_sorts_by_time() -> None:
    trace = parse(GOOD)
    assert [r.at for r in trace.requests] == [0.0, 10.0]
    assert trace.requests[0].kind == "page" and trace.requests[1].work_seconds == 4.5
    assert trace.requests[1].line == 2
    assert trace.start == DEFAULT_START.timestamp()


def test_iso_times_start_at_the_first() -> None:
    trace = parse(
        "time,model,kind,tokens,private\n"
        "2025-03-03T09:00:10Z,qwen,api,200,true\n"
        "2025-03-03T10:00:00+01:00,qwen,api,100,\n"
    )
    assert [r.at for r in trace.requests] == [0.0, 10.0]
    assert trace.requests[1].private and trace.requests[1].tokens == 200


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("time,target,kind,work_seconds\n0,a,render,1\nsoon,a,render,1\n", 3, "time"),
        ("time,target,kind,work_seconds\n0,a,sing,1\n", 2, "kind"),
        ("time,target,kind,work_seconds\n0,a,render,-1\n", 2, "work_seconds"),
        ("time,target,kind,work_seconds\n0,a,render,\n", 2, "work_seconds"),
        ("time,target,model,kind,work_seconds\n0,a,m,render,1\n", 2, "target"),
        ("time,target,kind,tokens\n0,a,api,1.5\n", 2, "tokens"),
        ("time,target,kind,work_seconds,private\n0,a,page,1,maybe\n", 2, "private"),
        ("time,target,kind,work_seconds\n0,a,page\n", 2, "work_seconds"),
        ("time,target,kind,seconds\n", 1, "work_seconds"),  # seconds: read past
        ("time,target,work_seconds\n", 1, "kind"),
        ("time,target,kind,work_seconds\n0,a,page,1\n2025-01-06T00:00:00Z,a,page,1\n", 2, "time"),
    ],
)
def test_a_bad_line_names_its_number_and_field(text: str, line: int, field: str) -> None:
    with pytest.raises(TraceError) as caught:
        parse(text, "day.csv")
    assert (caught.value.line, caught.value.field) == (line, field)
    assert str(caught.value).startswith(f"day.csv: line {line}, field {field!r}:")


def test_written_traces_read_back() -> None:
    trace = parse(GOOD)
    out = io.StringIO()
    write(trace.requests, trace.start, out)
    again = parse(out.getvalue())
    assert [(r.at, r.kind, r.work_seconds) for r in again.requests] == [
        (r.at, r.kind, r.work_seconds) for r in trace.requests
    ]
