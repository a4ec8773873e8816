"""The sans-IO response framer (router.http.h1.framer): every case fed whole, in two pieces
split at every byte boundary, and byte by byte; the events must not depend on the split."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest

from router.http.h1.framer import (
    MAX_HEAD,
    Data,
    End,
    Event,
    FramingError,
    Head,
    Informational,
    ResponseFramer,
)

Seen = tuple[object, ...] | bytes


def _seen(events: Iterable[Event]) -> list[Seen]:
    out: list[Seen] = []
    for event in events:
        if isinstance(event, Data):
            data = bytes(event.data)
            assert data, "no empty Data events"
            if out and isinstance(out[-1], bytes):
                out[-1] += data  # how a body is cut into Data depends on the split
            else:
                out.append(data)
        elif isinstance(event, Informational):
            out.append(("info", event.status, event.reason, list(event.headers.items())))
        elif isinstance(event, Head):
            items = list(event.headers.items())
            framing = (event.keep_alive, event.length, event.framing)
            out.append(("head", event.status, event.reason, items, *framing))
        else:
            trailers = None if event.trailers is None else list(event.trailers.items())
            out.append(("end", trailers))
    return out


def _run(pieces: Sequence[bytes], head_request: bool, eof: bool) -> tuple[list[Seen], bool]:
    framer = ResponseFramer(head_request)
    events: list[Event] = []
    for piece in pieces:
        events += framer.feed(piece)
    if eof:
        events += framer.feed_eof()
    return _seen(events), framer.must_close


def _splits(raw: bytes, every: int = 1) -> Iterable[list[bytes]]:
    yield [raw]
    for i in range(1, len(raw), every):
        yield [raw[:i], raw[i:]]
    if every == 1:
        yield [raw[i : i + 1] for i in range(len(raw))]


def frame(
    raw: bytes, *, head_request: bool = False, eof: bool = False, every: int = 1
) -> tuple[list[Seen], bool]:
    """The events of ``raw`` (Data joined) and ``must_close``, the same however it is split."""
    whole = _run([raw], head_request, eof)
    for pieces in _splits(raw, every):
        assert _run(pieces, head_request, eof) == whole, pieces
    return whole


def fails(raw: bytes, *, head_request: bool = False, eof: bool = False, every: int = 1) -> None:
    """``raw`` is refused however it is split (before or at the end of the connection)."""
    for pieces in _splits(raw, every):
        with pytest.raises(FramingError):
            _run(pieces, head_request, eof)


def head(
    status: int = 200,
    reason: str = "OK",
    headers: list[tuple[str, str]] | None = None,
    *,
    keep_alive: bool = True,
    length: int | None = None,
    framing: str = "length",
) -> tuple[object, ...]:
    return ("head", status, reason, headers or [], keep_alive, length, framing)


END = ("end", None)


# -- heads ------------------------------------------------------------------------------------


def test_a_head_with_its_headers_in_order() -> None:
    raw = (
        b"HTTP/1.1 200 Fine thanks\r\nContent-Length: 2\r\nSet-Cookie: a=1\r\n"
        b"X-Empty:\r\nset-cookie:  b=2 ;  c \t\r\nX-Ctl: \x01\xc3\xa9\xff\r\n\r\nok"
    )
    events, must_close = frame(raw)
    fields = [
        ("Content-Length", "2"),
        ("Set-Cookie", "a=1"),
        ("X-Empty", ""),
        ("set-cookie", "b=2 ;  c"),
        ("X-Ctl", "\x01\u00e9\udcff"),  # bytes kept exactly (surrogateescape), controls let through
    ]
    assert events == [head(reason="Fine thanks", headers=fields, length=2), b"ok", END]
    assert not must_close


@pytest.mark.parametrize(
    ("status_line", "reason"),
    [(b"HTTP/1.1 200", ""), (b"HTTP/1.1 200 ", ""), (b"HTTP/1.1 404 Not \tFound ", "Not \tFound ")],
)
def test_the_reason_is_optional_and_kept_as_sent(status_line: bytes, reason: str) -> None:
    events, _ = frame(status_line + b"\r\nContent-Length: 0\r\n\r\n")
    status = int(status_line[9:12])
    assert events == [head(status, reason, [("Content-Length", "0")], length=0), END]


def test_http_1_0_and_connection_close_end_the_connection() -> None:
    for raw in (
        b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 1\r\n\r\nx",
    ):
        events, must_close = frame(raw)
        assert events[0][4] is False and events[1:] == [b"x", END]
        assert must_close


def test_a_head_of_max_head_bytes_is_the_largest() -> None:
    start, end = b"HTTP/1.1 204 No Content\r\nX-Big: ", b"\r\n\r\n"
    fits = start + b"a" * (MAX_HEAD - len(start) - len(end)) + end
    assert len(fits) == MAX_HEAD
    events, _ = frame(fits, every=4099)
    assert events[0][1] == 204 and events[-1] == END
    fails(fits[:-4] + b"a" + end, every=4099)
    fails(fits[:-4] + b"a" * MAX_HEAD, every=4099)  # never ends: refused once it cannot fit


@pytest.mark.parametrize(
    "raw",
    [
        b"SPDY/9 nonsense\r\n\r\n",
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/2.0 200 OK\r\n\r\n",
        b"http/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1  200 OK\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 099 Low\r\n\r\n",
        b"HTTP/1.1 200OK\r\n\r\n",
        b"HTTP/1.1 200 O\x00K\r\n\r\n",
        b"\r\nHTTP/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nName : space before the colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n: no name\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX(y): not a token\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: folded\r\n  value\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded: first\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: bare\rCR\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: bare LF\nY: z\r\n\r\n",
        b"HTTP/1.1 200 OK\nX: LF line ends\n\n\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: N\x00L\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: vertical\x0btab\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1,\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 123456789012345678901\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: \xd9\xa1\r\n\r\n",  # an Arabic-Indic one
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 01\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chun\xe2\x84\xaaed\r\n\r\n",  # a Kelvin sign
        b"HTTP/1.1 100 Continue\r\nContent-Length: x\r\n\r\n",
    ],
)
def test_invalid_heads_are_refused(raw: bytes) -> None:
    fails(raw + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")


def test_the_same_content_length_repeated_is_one() -> None:
    for fields in (b"Content-Length: 3, 3\r\n", b"Content-Length: 3\r\ncontent-length:3\r\n"):
        events, _ = frame(b"HTTP/1.1 200 OK\r\n" + fields + b"\r\nabc")
        assert events[0][5] == 3 and events[1:] == [b"abc", END]


def test_transfer_encoding_is_case_insensitive() -> None:
    events, _ = frame(b"HTTP/1.1 200 OK\r\nTransfer-Encoding:  ChUnKeD \r\n\r\n0\r\n\r\n")
    assert events == [
        head(headers=[("Transfer-Encoding", "ChUnKeD")], framing="chunked"),
        END,
    ]


# -- bodies -----------------------------------------------------------------------------------


def test_a_content_length_body_and_an_empty_one() -> None:
    events, must_close = frame(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world")
    assert events == [head(headers=[("Content-Length", "11")], length=11), b"hello world", END]
    assert not must_close
    events, _ = frame(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert events == [head(headers=[("Content-Length", "0")], length=0), END]


def test_a_content_length_body_cut_off_by_the_connection() -> None:
    fails(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", eof=True)


def test_a_chunked_body_with_extensions_and_no_trailers() -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;name=value;other\r\nhello\r\n1 \t\r\n \r\n"
        b'00000000000000000a;x="q;"\r\n0123456789\r\n0\r\n\r\n'
    )
    events, must_close = frame(raw)
    assert events == [
        head(headers=[("Transfer-Encoding", "chunked")], framing="chunked"),
        b"hello 0123456789",
        END,
    ]
    assert not must_close


def test_chunked_trailers_are_parsed_and_reported() -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\nA\r\n0123456789\r\n0;last\r\nX-Checksum: 42\r\nX-Other:  y \r\n\r\n"
    )
    events, _ = frame(raw)
    assert events[1:] == [b"abc0123456789", ("end", [("X-Checksum", "42"), ("X-Other", "y")])]


@pytest.mark.parametrize(
    "body",
    [
        b"x\r\nabc\r\n0\r\n\r\n",  # not hex
        b"0x3\r\nabc\r\n0\r\n\r\n",
        b"-3\r\nabc\r\n0\r\n\r\n",
        b"\r\nabc\r\n0\r\n\r\n",  # no size
        b" 3\r\nabc\r\n0\r\n\r\n",
        b"3 ;ext\r\nabc\r\n0\r\n\r\n",
        b"3;a\rb\r\nabc\r\n0\r\n\r\n",  # a bare CR in an extension
        b"123456789012345678901\r\n",  # over 20 digits
        b"3\r\nabcX\r\n0\r\n\r\n",  # no CRLF after the chunk's data
        b"3\r\nabc\rX0\r\n\r\n",
        b"3\r\nabc\n0\r\n\r\n",
        b"3\r\nabc\r\n0\r\nbad trailer\r\n\r\n",
        b"3\r\nabc\r\n0\r\nX: folded\r\n more\r\n\r\n",
        b"3\r\nabc\r\n0\r\nContent-Length: x\r\n\r\n",
    ],
)
def test_invalid_chunked_bodies_are_refused(body: bytes) -> None:
    fails(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body)


def test_chunk_size_lines_and_trailers_are_bounded() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    fails(chunked + b"1;" + b"e" * MAX_HEAD + b"\r\nx\r\n0\r\n\r\n", every=9973)
    trailers = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(70))
    fails(chunked + b"0\r\n" + trailers + b"\r\n", every=9973)


def test_a_chunked_body_cut_off_by_the_connection() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for body in (b"", b"5\r\nhel", b"5\r\nhello", b"5\r\nhello\r\n", b"0\r\n", b"0\r\nX: y\r\n"):
        fails(chunked + body, eof=True)


def test_a_body_until_the_connection_ends() -> None:
    events, must_close = frame(b"HTTP/1.1 200 OK\r\nX: y\r\n\r\nuntil close", eof=True)
    assert events == [
        head(headers=[("X", "y")], keep_alive=False, framing="close"),
        b"until close",
        END,
    ]
    assert must_close
    events, _ = frame(b"HTTP/1.0 200 OK\r\n\r\n", eof=True)
    assert events == [head(keep_alive=False, framing="close"), END]
    framer = ResponseFramer()
    framer.feed(b"HTTP/1.1 200 OK\r\n\r\nsome")
    assert not framer.done
    assert framer.feed_eof() == [End()] and framer.done


def test_the_connection_ending_before_a_response() -> None:
    framer = ResponseFramer()
    with pytest.raises(FramingError, match="before any response"):
        framer.feed_eof()
    framer = ResponseFramer()
    framer.feed(b"HTTP/1.1 200 OK\r\n")
    assert framer.started
    with pytest.raises(FramingError, match="before the response head ended"):
        framer.feed_eof()
    fails(b"HTTP/1.1 100 Continue\r\n\r\n", eof=True)


# -- informational heads and responses without a body -----------------------------------------


def test_informational_heads_come_before_the_final_one() -> None:
    raw = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    )
    events, must_close = frame(raw)
    assert events == [
        ("info", 100, "Continue", []),
        ("info", 103, "Early Hints", [("Link", "</style.css>; rel=preload")]),
        head(headers=[("Content-Length", "2")], length=2),
        b"ok",
        END,
    ]
    assert not must_close


def test_each_informational_head_has_its_own_bound() -> None:
    hints = b"HTTP/1.1 103 Early Hints\r\nLink: " + b"l" * 40_000 + b"\r\n\r\n"
    events, _ = frame(hints * 2 + b"HTTP/1.1 204 No Content\r\n\r\n", every=7919)
    assert [event[1] for event in events] == [103, 103, 204, None]


def test_101_switches_protocols_and_nothing_after_it_is_ours() -> None:
    raw = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x05hello"
    events, must_close = frame(raw)
    assert events == [
        head(
            101, "Switching Protocols", [("Upgrade", "websocket")], keep_alive=False, framing="none"
        ),
        END,
    ]
    assert must_close


@pytest.mark.parametrize(
    ("raw", "head_request", "length"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n", True, 1234),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", True, None),
        (b"HTTP/1.1 200 OK\r\n\r\n", True, None),
        (b"HTTP/1.1 204 No Content\r\n\r\n", False, None),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n", False, 99),
        (b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n", False, None),
    ],
)
def test_responses_without_a_body(raw: bytes, head_request: bool, length: int | None) -> None:
    events, must_close = frame(raw, head_request=head_request)
    assert len(events) == 2 and events[1] == END
    assert events[0][4:] == (True, length, "none")
    assert not must_close


# -- after the end ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "extra"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"EXTRA"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b"HTTP/1.1 200 OK\r\n\r\n"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", b"\r\n"),
    ],
)
def test_bytes_after_a_complete_response_end_the_connection(response: bytes, extra: bytes) -> None:
    events, must_close = frame(response + extra)
    assert events == frame(response)[0] and events[-1] == END and must_close
    framer = ResponseFramer()
    framer.feed(response)
    assert framer.done and not framer.must_close
    assert framer.feed(extra) == [] and framer.must_close  # later: only flagged


def test_a_framer_that_failed_fails_again() -> None:
    framer = ResponseFramer()
    with pytest.raises(FramingError):
        framer.feed(b"nonsense\r\n\r\n")
    with pytest.raises(FramingError, match="invalid already"):
        framer.feed(b"HTTP/1.1 200 OK\r\n\r\n")
    with pytest.raises(FramingError, match="invalid already"):
        framer.feed_eof()


# -- no copies --------------------------------------------------------------------------------


def test_body_data_is_a_view_of_the_buffer_fed() -> None:
    buffer = bytearray(1024)
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234"
    buffer[100 : 100 + len(raw)] = raw
    framer = ResponseFramer()
    events = framer.feed(buffer, 100, 100 + len(raw))
    data = events[1]
    assert isinstance(data, Data) and data.data.obj is buffer and bytes(data.data) == b"01234"
    buffer[0:5] = b"56789"
    (data,) = framer.feed(buffer, 0, 5)[:1]
    assert isinstance(data, Data) and data.data.obj is buffer
    chunked = bytearray(b"1a\r\n" + b"c" * 26 + b"\r\n")
    framer = ResponseFramer()
    framer.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    (data,) = framer.feed(chunked)
    assert isinstance(data, Data) and data.data.obj is chunked


def test_empty_feeds_change_nothing() -> None:
    framer = ResponseFramer()
    assert framer.feed(b"") == [] and not framer.started
    assert framer.feed(b"HTTP/1.1 200 OK\r\n\r\n", 5, 5) == []
