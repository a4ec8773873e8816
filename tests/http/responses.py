"""Hypothesis strategies for HTTP/1.1 responses as an upstream could send them, for the
framer's differential fuzzing (tests/http/test_framer_fuzz.py).

A :class:`Case` is raw bytes, the request they answer (GET or HEAD), whether the connection
ends after them, where they are cut into reads, and its ``kind``: ``valid`` (both parsers
must accept it and agree on every event), ``invalid`` (both must refuse it), ``corrupt``
(random bytes changed: they must agree, or differ only where the framer is stricter on
purpose), ``101`` (a protocol switch), or one of :data:`STRICTER`: valid for h11, refused by
the framer on purpose."""

from __future__ import annotations

import string
from dataclasses import dataclass

from hypothesis import strategies as st

STRICTER = {
    "bare-lf": "a head or trailer line ending in LF alone: the framer takes CRLF only",
    "obs-fold": "a field line continued on the next (obs-fold): refused, as RFC 9112 5.2 lets",
    "cl-te": "Content-Length and Transfer-Encoding together: refused, not guessed at (smuggling)",
    "version": "HTTP/0.9, 2.0, 3.x in a status line: the framer speaks HTTP/1.x only",
    "size": "a head over 64 KiB: the framer bounds every head, fed whole or in pieces",
}
"""Where the framer is stricter than h11 on purpose: it refuses these, h11 may accept them."""

TOKEN = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
NAMES = ["Content-Type", "X-Custom", "Set-Cookie", "Server", "ETag", "Vary", "x-lower", "A"]
VALUE_PARTS = [b"a", b"Z", b"0", b" ", b"\t", b"\x80", b"\xff", b"=", b";", b",", b'"', b"\x01"]
VALUE_PARTS += [b"\x7f", b"text/html", b"max-age=0", b"%"]
STATUSES = [100, 103, 199, 200, 201, 204, 206, 301, 304, 400, 404, 500, 503, 599, 999]

CRLF = b"\r\n"


@dataclass
class Case:
    raw: bytes
    head_request: bool
    eof: bool
    cuts: list[int]
    kind: str

    def pieces(self) -> list[bytes]:
        return cut(self.raw, self.cuts)


def cut(raw: bytes, cuts: list[int]) -> list[bytes]:
    """``raw`` cut at ``cuts``, as it arrives in reads."""
    out, last = [], 0
    for at in sorted(set(cuts)):
        if 0 < at < len(raw):
            out.append(raw[last:at])
            last = at
    out.append(raw[last:])
    return [piece for piece in out if piece]


values = st.lists(st.sampled_from(VALUE_PARTS), max_size=8).map(b"".join)
names = st.sampled_from(NAMES) | st.text(alphabet=TOKEN, min_size=1, max_size=10)
fields = st.lists(st.tuples(names.map(str.encode), values), max_size=4)
reasons = st.sampled_from([b" OK", b" Not Found", b"", b" ", b" \xe2\x9c\x93 fine\x01", b" a\tb"])


def _head(status_line: bytes, lines: list[bytes]) -> bytes:
    return CRLF.join([status_line, *lines]) + CRLF + CRLF


def _field(name: bytes, value: bytes) -> bytes:
    return name + b":" + value


@st.composite
def chunked_body(draw: st.DrawFn, trailers: bool) -> bytes:
    out = []
    for data in draw(st.lists(st.binary(min_size=1, max_size=40), max_size=4)):
        size = b"%x" % len(data)
        size = draw(st.sampled_from([size, size.upper(), b"0" + size]))
        ext = draw(st.sampled_from([b"", b";name=value", b";x", b'; q="a b"', b" ", b"\t"]))
        out.append(size + ext + CRLF + data + CRLF)
    last = draw(st.sampled_from([b"0", b"000", b"0;end"]))
    out.append(last + CRLF)
    if trailers:
        for name, value in draw(fields):
            out.append(_field(name, value) + CRLF)
    out.append(CRLF)
    return b"".join(out)


@st.composite
def valid(draw: st.DrawFn) -> tuple[bytes, bool, bool, str]:
    """A valid response (after 0-2 informational heads): raw, head_request, eof, framing."""
    head_request = draw(st.booleans())
    parts = []
    for status in draw(st.lists(st.sampled_from([100, 102, 103, 199]), max_size=2)):
        lines = [_field(n, v) for n, v in draw(fields)]
        parts.append(_head(b"HTTP/1.1 %d" % status + draw(reasons), lines))
    status = draw(st.sampled_from(STATUSES[3:]))
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.1", b"1.0"]))
    lines = [_field(n, v) for n, v in draw(fields)]
    connection = draw(st.sampled_from([None, b"close", b"keep-alive", b"Keep-Alive, Close"]))
    if connection is not None:
        lines.append(b"Connection: " + connection)
    big = draw(st.sampled_from([0, 0, 0, 0, 40_000]))
    if big:
        lines.append(b"X-Big: " + b"b" * big)
    body = draw(st.binary(max_size=120))
    framing = draw(st.sampled_from(["length", "length", "chunked", "close"]))
    if framing == "length":
        length = b"%d" % len(body)
        length = draw(st.sampled_from([length, b"0" + length, length + b", " + length]))
        lines.append(b"Content-Length: " + length)
    elif framing == "chunked":
        lines.append(b"Transfer-Encoding: " + draw(st.sampled_from([b"chunked", b"Chunked"])))
    lines = draw(st.permutations(lines))
    parts.append(_head(b"HTTP/" + version + b" %d" % status + draw(reasons), lines))
    bodyless = head_request or status in (204, 304)
    if framing == "chunked" and not bodyless:
        body = draw(chunked_body(draw(st.booleans())))
    if not bodyless:
        parts.append(body)
    eof = framing == "close" or draw(st.booleans())
    if draw(st.integers(0, 9)) == 0:  # bytes after the end of the response
        parts.append(draw(st.sampled_from([b"x", b"HTTP/1.1 200 OK\r\n\r\n", b"\r\n"])))
    return b"".join(parts), head_request, eof, framing


INVALID_HEADS = [
    b"HTTX/1.1 200 OK\r\n\r\n",
    b"HTTP/1.1 2x0 OK\r\n\r\n",
    b"HTTP/1.1 20 OK\r\n\r\n",
    b"HTTP/1.1 2000 OK\r\n\r\n",
    b"HTTP/1.1 099 Low\r\n\r\n",
    b"HTTP/1.1  200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nName : v\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nNa(me: v\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n: v\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nNo-Colon\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX: a\x0bb\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n X: leading\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1 2\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 123456789012345678901\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"\r\nHTTP/1.1 200 OK\r\n\r\n",
    b"garbage\r\n\r\n",
    b"",
]
INVALID_CHUNKED = [
    b"g\r\nx\r\n0\r\n\r\n",
    b"\r\n",
    b" 1\r\nx\r\n0\r\n\r\n",
    b"-1\r\n",
    b"1\r\nxy\r\n0\r\n\r\n",
    b"1\r\nx\n0\r\n\r\n",
    b"123456789012345678901\r\n",
    b"0\r\nbad trailer\r\n\r\n",
    b"0\r\nContent-Length: x\r\n\r\n",
    b"5\r\nhel",
]


@st.composite
def invalid(draw: st.DrawFn) -> tuple[bytes, bool, bool]:
    """A response both must refuse (cut off by the connection, or not HTTP/1.x at all)."""
    which = draw(st.sampled_from(["head", "chunked", "short", "cut-head"]))
    if which == "head":
        raw = draw(st.sampled_from(INVALID_HEADS))
        return raw + draw(st.binary(max_size=8)), False, True
    if which == "chunked":
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        return head + draw(st.sampled_from(INVALID_CHUNKED)), False, True
    if which == "short":
        body = draw(st.binary(max_size=20))
        return (
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(body) + 1) + body,
            False,
            True,
        )
    raw, head_request, _, _ = draw(valid())
    end = raw.find(b"\r\n\r\n")
    return raw[: draw(st.integers(0, max(0, end + 3)))], head_request, True


@st.composite
def stricter(draw: st.DrawFn) -> tuple[bytes, bool, str]:
    """A response h11 may accept and the framer refuses on purpose (see :data:`STRICTER`)."""
    kind = draw(st.sampled_from(sorted(STRICTER)))
    head_request = False  # (an answer to HEAD has no trailers to be strict about)
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi"
    if kind == "bare-lf":
        raw = draw(
            st.sampled_from(
                [
                    ok.replace(b"OK\r\n", b"OK\n"),
                    ok.replace(b"plain\r\n", b"plain\n"),
                    ok.replace(b"\r\n\r\n", b"\n\n"),
                    b"HTTP/1.1 100 Continue\n\r\n" + ok,
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: y\n\r\n",
                ]
            )
        )
    elif kind == "obs-fold":
        fold = draw(st.sampled_from([b" ", b"\t", b"  "]))
        raw = ok.replace(b"plain\r\n", b"plain\r\n" + fold + b"continued\r\n")
    elif kind == "cl-te":
        raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    elif kind == "version":
        raw = ok.replace(
            b"HTTP/1.1", draw(st.sampled_from([b"HTTP/2.0", b"HTTP/0.9", b"HTTP/3.1"]))
        )
    else:
        raw = ok.replace(b"Content-Type:", b"X-Big: " + b"b" * 70_000 + b"\r\nContent-Type:")
    return raw, head_request, kind


@st.composite
def cases(draw: st.DrawFn) -> Case:
    roll = draw(st.integers(0, 99))
    if roll < 55:
        raw, head_request, eof, _ = draw(valid())
        kind = "valid"
    elif roll < 70:
        raw, head_request, eof = draw(invalid())
        kind = "invalid"
    elif roll < 80:
        raw, head_request, kind = draw(stricter())
        eof = True
    elif roll < 83:
        raw = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n" + draw(
            st.binary(max_size=10)
        )
        head_request, eof, kind = False, draw(st.booleans()), "101"
    else:
        raw, head_request, eof, _ = draw(valid())
        raw, kind = draw(corrupted(raw)), "corrupt"
    return Case(raw, head_request, eof, draw(cut_points(raw)), kind)


@st.composite
def corrupted(draw: st.DrawFn, raw: bytes) -> bytes:
    """``raw`` with one to three bytes changed, put in or taken out."""
    edits = draw(
        st.lists(
            st.tuples(
                st.integers(0, len(raw)),
                st.sampled_from(
                    [b"", b"\r", b"\n", b" ", b":", b"\x00", b"0", b"a", b"\t", b";", b"\r\n"]
                ),
            ),
            min_size=1,
            max_size=3,
        )
    )
    for at, put in edits:
        raw = raw[:at] + put + raw[at + draw(st.integers(0, 1)) :]
    return raw


@st.composite
def cut_points(draw: st.DrawFn, raw: bytes) -> list[int]:
    """Where ``raw`` is cut into reads: byte by byte one case in twenty, else a few places."""
    if draw(st.integers(0, 19)) == 0 and len(raw) < 2000:
        return list(range(1, len(raw)))
    return draw(st.lists(st.integers(1, max(1, len(raw) - 1)), max_size=6))
