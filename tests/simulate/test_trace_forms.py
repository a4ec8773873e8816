"""Traces as people write them: a spreadsheet's BOM and CRLF, blank lines, columns of their own,
Unix timestamps; a request to a target or a model the config does not have is a bad line; the
config's idle keys in the forms a person writes them; the cold starts ``warmgate serve`` kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.cli import main
from router.config import parse_config
from router.errors import ConfigError
from router.simulate.backends import Duration, measured_cold_starts
from router.simulate.run import Options, cold_start_for, replay
from router.simulate.trace import TraceError, check_names, parse, read


def test_a_spreadsheets_bom_crlf_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "day.csv"
    path.write_bytes(
        b"\xef\xbb\xbftime,target,kind,work_seconds\r\n0,a,page,1\r\n\r\n5,a,render,2\r\n\r\n"
    )
    trace = read(path)
    assert [(r.at, r.kind, r.line) for r in trace.requests] == [
        (0.0, "page", 2),
        (5.0, "render", 4),
    ]


def test_columns_of_their_own_are_read_past() -> None:
    trace = parse("time,user,target,kind,work_seconds,note\n0,ann,a,render,1,first try\n")
    assert trace.ignored == ("user", "note")
    assert trace.requests[0].target == "a" and trace.requests[0].work_seconds == 1.0
    with pytest.raises(TraceError) as caught:
        parse("time,target,kind,work_seconds,target\n0,a,render,1,b\n", "day.csv")
    assert (caught.value.line, caught.value.field) == (1, "target")


def test_unix_timestamps_are_times_not_decades() -> None:
    trace = parse("time,target,kind,work_seconds\n1741000000,a,page,1\n1741000100.5,a,render,1\n")
    assert [r.at for r in trace.requests] == [0.0, 100.5]
    assert trace.start == 1741000000.0
    with pytest.raises(TraceError) as caught:  # seconds from the start and times: which start?
        parse("time,target,kind,work_seconds\n0,a,page,1\n1741000100,a,render,1\n", "day.csv")
    assert (caught.value.line, caught.value.field) == (2, "time")


def test_a_file_that_cannot_be_read_says_so(tmp_path: Path) -> None:
    with pytest.raises(TraceError) as caught:
        read(tmp_path / "none.csv")
    assert str(caught.value).endswith("none.csv: cannot be read: No such file or directory")


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("time,target,kind,work_seconds\n0,a,render,1\n9,b,render,1\n", 3, "target"),
        ("time,model,kind,tokens\n0,qwen,api,100\n", 2, "model"),
    ],
)
def test_an_unknown_target_or_model_is_a_bad_line(text: str, line: int, field: str) -> None:
    with pytest.raises(TraceError) as caught:
        check_names(parse(text, "day.csv"), {"a": 1}, {}, "w.yaml")
    assert (caught.value.line, caught.value.field) == (line, field)
    assert "w.yaml has" in str(caught.value)


def _config(**scaling: Any) -> dict[str, Any]:
    return {
        "targets": {
            "a": {
                "routes": [{"path_prefix": "/"}],
                "backend": {"kind": "process", "command": ["true"], "port": 1},
                "scaling": scaling,
            }
        }
    }


def test_the_command_names_the_line_of_an_unknown_target(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(_config()))
    (tmp_path / "day.csv").write_text("time,target,kind,work_seconds\n0,a,page,1\n1,comfy,page,1\n")
    code = main(["simulate", "-c", str(tmp_path / "w.yaml"), "-t", str(tmp_path / "day.csv")])
    assert code == 2
    assert "day.csv: line 3, field 'target': unknown target 'comfy'" in capsys.readouterr().err


def test_idle_keys_in_the_forms_people_write() -> None:
    written = _config(
        idle_after="Auto", idle_bounds=[120, 3600], keep_warm="Mon-Fri 08:30-18:00 Europe/Berlin"
    )
    scaling = parse_config(written).targets["a"].scaling
    assert scaling.idle_auto and scaling.idle_bounds == (120.0, 3600.0)
    assert scaling.keep_warm == ("Mon-Fri 08:30-18:00 Europe/Berlin",)


@pytest.mark.parametrize(
    ("scaling", "key", "words"),
    [
        ({"idle_bounds": "5m"}, "targets.a.scaling.idle_bounds", "[lower, upper]"),
        ({"idle_bounds": ["2m", "1h", "3h"]}, "targets.a.scaling.idle_bounds", "[lower, upper]"),
        ({"idle_after": "soon"}, "targets.a.scaling.idle_after", "or auto"),
    ],
)
def test_bad_idle_keys_say_what_was_expected(scaling: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_config(**scaling), "w.yaml")
    assert f"{key}: expected" in str(caught.value) and words in str(caught.value)


def test_the_cold_starts_warmgate_serve_kept_are_replayed(tmp_path: Path) -> None:
    state = tmp_path / "warmgate-state"
    state.mkdir()
    (state / "a.cold-start.json").write_text(
        json.dumps({"version": 1, "starts": [41.0, 47.5, 44.0], "stages": {}})
    )
    config = parse_config(
        _config(expected_cold_start="2m"), str(tmp_path / "w.yaml"), str(tmp_path)
    )
    measured = measured_cold_starts(config)
    assert measured["a"].duration == Duration(41.0, 47.5) and measured["a"].starts == 3
    options = Options(measured={"a": measured["a"].duration})
    assert cold_start_for("a", config, options) == Duration(41.0, 47.5)
    given = Options(cold_start={"*": Duration(9.0, 9.0)}, measured=options.measured)
    assert cold_start_for("a", config, given) == Duration(9.0, 9.0)
    assert cold_start_for("a", config, Options()) == Duration(120.0, 120.0)


@pytest.mark.parametrize(
    ("given", "words"),
    [
        (["--cold-start", "soon"], "--cold-start 'soon': expected a duration"),
        (["--cold-start", "comfy=30s"], "--cold-start 'comfy=30s': "),
        (["--wake", "comfy=2s"], "has no target 'comfy' (it has a)"),
        (["--stop", "1x"], "--stop '1x': "),
        (["--start", "Monday"], "--start 'Monday': "),
        (["--set", "targets.comfy.scaling.idle_after=10m"], "targets.comfy: --set: no such entry"),
    ],
)
def test_options_that_cannot_be_used_name_themselves(
    tmp_path: Path, capsys: Any, given: list[str], words: str
) -> None:
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(_config()))
    (tmp_path / "day.csv").write_text("time,target,kind,work_seconds\n0,a,page,1\n")
    code = main(
        ["simulate", "-c", str(tmp_path / "w.yaml"), "-t", str(tmp_path / "day.csv"), *given]
    )
    assert code == 2
    assert words in capsys.readouterr().err


def test_an_out_that_cannot_be_written_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: Any
) -> None:
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(_config()))
    (tmp_path / "day.csv").write_text("time,target,kind,work_seconds\n0,a,page,1\n")
    (tmp_path / "taken").write_text("a file where the folder would go")
    where = str(tmp_path / "taken" / "out")
    code = main(
        [
            "simulate",
            "-c",
            str(tmp_path / "w.yaml"),
            "-t",
            str(tmp_path / "day.csv"),
            "--out",
            where,
        ]
    )
    assert code == 2
    assert f"cannot write {where}" in capsys.readouterr().err


def test_a_models_request_goes_through_the_api_whatever_its_kind() -> None:
    data = _config()
    data["models"] = {"m": {"placements": [{"target": "a"}]}}
    trace = parse("time,model,kind,work_seconds\n0,m,render,1\n60,m,api,1\n")
    options = Options(cold_start={"*": Duration(5.0, 5.0)}, tail=60.0)
    result = replay(parse_config(data), trace, options)
    assert [(o.placement, o.reason) for o in result.outcomes] == [
        ("local", "local_only"),
        ("local", "ready"),
    ]


def test_unix_milliseconds_and_the_ways_to_say_private() -> None:
    trace = parse(
        "time,model,kind,tokens,private\n"
        "1741000000000,m,api,1,on\n1741000100500,m,api,1,off\n1741000200000,m,api,1,Yes\n"
    )
    assert [(r.at, r.private) for r in trace.requests] == [
        (0.0, True),
        (100.5, False),
        (200.0, True),
    ]


def test_two_files_of_one_name_are_two_columns(tmp_path: Path, capsys: Any) -> None:
    for folder, idle in (("a", "30m"), ("b", "5m")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "w.yaml").write_text(yaml.safe_dump(_config(idle_after=idle)))
    (tmp_path / "day.csv").write_text("time,target,kind,work_seconds\n0,a,page,1\n")
    out = tmp_path / "out"
    given = ["-c", str(tmp_path / "a" / "w.yaml"), "--compare", str(tmp_path / "b" / "w.yaml")]
    code = main(["simulate", *given, "-t", str(tmp_path / "day.csv"), "--out", str(out)])
    assert code == 0
    assert "w #1" in capsys.readouterr().out
    rows = (out / "summary.csv").read_text().splitlines()[1:]
    assert [row.split(",")[0] for row in rows] == ["w #1", "w #2"]
