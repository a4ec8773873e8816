"""router.http.sse, sans-IO: Gradio queue/data streams parsed however they are split, and the
jobs they carry."""

from __future__ import annotations

import json

import pytest

from router.http.sse import MAX_EVENT, EventParser, Jobs, job_message


def message(msg: str, event_id: str | None = None, **more: object) -> bytes:
    return b"data: " + json.dumps({"msg": msg, "event_id": event_id, **more}).encode() + b"\n\n"


# What Gradio 5.29 sends on one queue/data stream: a heartbeat, a job queued and run, another job
# that completes, then close_stream.
STREAM = (
    message("heartbeat")
    + message("estimation", "a", rank=0, queue_size=1)
    + message("process_starts", "a", eta=None)
    + message("progress", "a", progress_data=[{"index": 0, "desc": "rendering"}])
    + message("estimation", "b", rank=1, queue_size=2)
    + message("process_generating", "a", output={"data": ["started"]}, success=True)
    + message("heartbeat")
    + message("process_completed", "a", output={"data": ["done"]}, success=True)
    + message("process_completed", "b", output={"data": ["done"]}, success=True)
    + message("close_stream")
)


def run(pieces: list[bytes]) -> list[tuple[int, int, int]]:
    """(started, finished, running) after each message of the stream fed in ``pieces``."""
    parser, jobs, seen = EventParser(), Jobs(), []
    for piece in pieces:
        for text, cut in parser.feed(piece):
            parsed = job_message(text, cut)
            assert parsed is not None, text
            started, finished = jobs.feed(*parsed)
            seen.append((started, finished, len(jobs.running)))
    return seen


EXPECTED = [
    (0, 0, 0),  # heartbeat: nothing
    (1, 0, 1),  # a queued
    (0, 0, 1),
    (0, 0, 1),
    (1, 0, 2),  # b queued
    (0, 0, 2),
    (0, 0, 2),
    (0, 1, 1),  # a completed
    (0, 1, 0),  # b completed
    (0, 0, 0),  # close_stream: nothing left
]


def test_a_stream_whole() -> None:
    assert run([STREAM]) == EXPECTED


@pytest.mark.parametrize("newline", [b"\r\n", b"\r"])
def test_any_line_ending(newline: bytes) -> None:
    assert run([STREAM.replace(b"\n", newline)]) == EXPECTED


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_split_at_every_byte(newline: bytes) -> None:
    stream = STREAM.replace(b"\n", newline)
    for cut in range(1, len(stream)):
        assert run([stream[:cut], stream[cut:]]) == EXPECTED, cut
    assert run([stream[i : i + 1] for i in range(len(stream))]) == EXPECTED


def test_heartbeats_alone_are_no_job() -> None:
    parser, jobs = EventParser(), Jobs()
    for _ in range(100):
        for text, cut in parser.feed(b'data: {"msg":"heartbeat","event_id":null}\n\n'):
            assert jobs.feed(*(job_message(text, cut) or ("", None))) == (0, 0)
    assert not jobs.running


def test_close_stream_and_the_end_end_every_job() -> None:
    jobs = Jobs()
    assert jobs.feed("estimation", "a") == (1, 0)
    assert jobs.feed("process_starts", "b") == (1, 0)
    assert jobs.feed("close_stream", None) == (0, 2)
    assert jobs.feed("process_starts", "c") == (1, 0)
    assert jobs.feed("unexpected_error", None) == (0, 1)  # the stream failed: it carries none
    assert jobs.feed("process_starts", "d") == (1, 0)
    assert jobs.end() == 1 and not jobs.running
    assert jobs.feed("process_completed", "zz") == (0, 0)  # never seen: nothing to end


def test_comments_other_fields_and_multiline_data() -> None:
    parser = EventParser()
    events = parser.feed(b': keep-alive\nevent: x\nid: 7\nretry: 10\ndata: {"msg":\ndata: "a"}\n\n')
    assert events == [('{"msg":\n"a"}', False)]
    assert parser.feed(b"event: only\n\n") == []  # no data: nothing to say
    assert job_message("not json", False) is None
    assert job_message("[1, 2]", False) is None


def test_an_event_over_the_bound_is_cut_but_still_read() -> None:
    parser = EventParser()
    huge = message("process_completed", "a", output={"data": ["x" * (3 * MAX_EVENT)]})
    (event,) = [e for piece in (huge[:1000], huge[1000:]) for e in parser.feed(piece)]
    text, cut = event
    assert cut and len(text) <= MAX_EVENT
    assert job_message(text, cut) == ("process_completed", "a")
    # and the next event is whole again
    assert parser.feed(message("heartbeat")) == [('{"msg": "heartbeat", "event_id": null}', False)]


def test_where_the_events_fed_end() -> None:
    """A farewell warmgate adds (Gradio's close_stream) goes after a whole event, never inside
    one cut short."""
    parser = EventParser()
    assert parser.between_events
    parser.feed(b'data: {"msg": "heartbeat"}\n')
    assert not parser.between_events
    parser.feed(b"\n")
    assert parser.between_events
    parser.feed(b'data: {"msg": "heart')
    assert not parser.between_events


def test_the_streams_last_word_is_known_and_whether_it_was_close_stream() -> None:
    jobs = Jobs()
    jobs.feed("estimation", "a")
    jobs.feed("heartbeat", None)
    jobs.feed("unexpected_error", "a")  # a job's error: the stream goes on
    assert (jobs.over, jobs.closed) == (False, False)
    jobs.feed("unexpected_error", None)  # Gradio's stream error: its last word
    assert (jobs.over, jobs.closed) == (True, False)
    jobs.feed("close_stream", None)
    assert (jobs.over, jobs.closed) == (True, True)
