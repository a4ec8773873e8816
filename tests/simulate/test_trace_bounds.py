"""What a trace may say is bounded, each bound with a one-line error naming the line and the
field: a span the virtual clock can count to the nanosecond (asyncio's resolution), times
between 1970 and 2100, a request's GPU time and tokens, and the file's size and number of
requests (read in bounded memory: a file over the size is refused before it is read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from router.cli import main
from router.simulate import trace as traces
from router.simulate.accesslog import convert
from router.simulate.trace import MAX_BYTES, MAX_SPAN, TraceError, parse, read

HEAD = "time,target,kind,work_seconds\n"
BEYOND = int(MAX_SPAN) + 1


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        (HEAD + f"0,a,render,1\n{2**24 + 10},a,render,1\n", 3, "time"),  # past 2^24 s: hung
        (HEAD + f"0,a,render,1\n{BEYOND},a,render,1\n", 3, "time"),
        (HEAD + "0,a,render,1e300\n", 2, "work_seconds"),
        (HEAD + "0,a,render,100000000\n", 2, "work_seconds"),
        ("time,model,kind,tokens\n0,m,api,1e15\n", 2, "tokens"),
        (HEAD + "0001-01-01T00:00:00Z,a,render,1\n", 2, "time"),
        (HEAD + "9999-12-31T00:00:00Z,a,render,1\n", 2, "time"),
        (HEAD + "2025-01-06T00:00:00Z,a,render,1\n2025-09-06T00:00:00Z,a,render,1\n", 3, "time"),
        (HEAD + "2025-01-06T00:00:00Z,a,render,1\n1970-01-01T00:00:00Z,a,render,1\n", 2, "time"),
    ],
)
def test_what_a_trace_may_say_is_bounded(text: str, line: int, field: str) -> None:
    with pytest.raises(TraceError) as caught:
        parse(text, "long.csv")
    assert (caught.value.line, caught.value.field) == (line, field), str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_trace_at_the_bounds_is_read() -> None:
    text = HEAD + f"0,a,render,86400\n{MAX_SPAN},a,render,0\n"
    assert parse(text).duration == MAX_SPAN


def test_more_requests_than_the_bound_are_refused_at_the_first_too_many(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(traces, "MAX_REQUESTS", 3)
    text = HEAD + "".join(f"{i},a,render,1\n" for i in range(5))
    with pytest.raises(TraceError) as caught:
        parse(text, "big.csv")
    assert caught.value.line == 5 and "3 requests" in str(caught.value)


def test_a_file_over_the_size_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.csv"
    with path.open("wb") as handle:  # sparse: costs no disk, and is never read
        handle.write(HEAD.encode())
        handle.truncate(MAX_BYTES + 1)
    with pytest.raises(TraceError) as caught:
        read(path)
    assert caught.value.line == 0 and "MiB" in str(caught.value)


def _config() -> dict[str, Any]:
    return {
        "targets": {
            "a": {
                "routes": [{"path_prefix": "/"}],
                "backend": {"kind": "process", "command": ["true"], "port": 1},
            }
        }
    }


def test_the_command_ends_with_one_line_on_a_trace_past_two_to_the_24_seconds(
    tmp_path: Path, capsys: Any
) -> None:
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(_config()))
    (tmp_path / "long.csv").write_text(HEAD + f"0,a,render,1\n{2**24 + 10},a,render,1\n")
    code = main(["simulate", "-c", str(tmp_path / "w.yaml"), "-t", str(tmp_path / "long.csv")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 3, field 'time'" in err


def test_an_access_log_over_the_span_names_its_last_line() -> None:
    line = '{} INFO warmgate.access 127.0.0.1 "POST /prompt" 200 target=a 1.000s'
    log = [line.format("2025-01-06 09:00:00,000"), line.format("2025-09-06 09:00:00,000")]
    with pytest.raises(TraceError) as caught:
        convert(log, "warmgate.log")
    assert (caught.value.line, caught.value.field) == (2, "time")
    assert convert(log[:1], "warmgate.log").trace.requests  # the control: one line is read
