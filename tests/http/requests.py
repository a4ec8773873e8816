"""Hypothesis strategies for HTTP/1.1 requests as a client could send them, for the request
side's differential fuzzing (tests/http/test_request_fuzz.py).

A :class:`Case` is raw bytes, where they are cut into reads, and its ``kind``: ``valid``
(both parsers must accept it and agree on every request, body and end), ``invalid`` (both
must refuse it), ``corrupt`` (random bytes changed: they must agree, or differ only where
warmgate is stricter on purpose, or h11 where :data:`LENIENT` says), or one of
:data:`STRICTER`: valid for h11, refused by warmgate on purpose. A valid request may be
followed by a second one on the same connection (what a smuggled request would be)."""

from __future__ import annotations

import string
from dataclasses import dataclass

from hypothesis import strategies as st

from tests.http.responses import CRLF, VALUE_PARTS, corrupted, cut, cut_points

STRICTER = {
    "cl-te": "Content-Length and Transfer-Encoding together: refused (smuggling)",
    "te": "a Transfer-Encoding but chunked alone, or two: warmgate decodes none",
    "lengths": "two Content-Length fields, or a list: refused, not reconciled",
    "hosts": "two Host fields: which one routes, which one the engine reads?",
    "target": "absolute-form, authority-form (CONNECT) and asterisk-form targets",
    "method": "a method llhttp does not know (h11 takes any token)",
    "version": "HTTP/0.9, 1.2, 2.0, 3.x request lines: HTTP/1.0 and 1.1 only",
    "obs-fold": "a field line continued on the next (obs-fold)",
    "bare-lf": "a line ended by LF alone",
    "fields": "more than 128 header fields",
    "singletons": "Content-Type, User-Agent and the other fields that are one: not twice",
    "ctl": "a control character (0x01, DEL) in a field value: no field-vchar (RFC 9110 5.5)",
    "chunk-ext": "whitespace around a chunk extension's ';' or '=' (BWS, RFC 9112 7.1.1)",
}
"""Where warmgate (llhttp and router.http.intake) is stricter than h11 on purpose."""
LENIENT = {
    "no-host": "HTTP/1.1 without Host: h11 refuses it; warmgate routes it by path alone",
    "empty-line": "an empty line before a request line: ignored, as RFC 9112 2.2 says to",
    "spaces": "two spaces between the request line's words: llhttp reads words (RFC 9112 3)",
    "keep-alive": "HTTP/1.0 with Connection: keep-alive: kept open (RFC 9112 C.2.2), h11 closes",
}
"""Where h11 is stricter: what warmgate accepts and h11 refuses, and why that is harmless."""

METHODS = [b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH"]
TOKEN = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
NAMES = ["Content-Type", "X-Custom", "Cookie", "Accept", "User-Agent", "x-lower", "A", "Expect"]
PATH = string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@/%"
NEXT = b"GET /next HTTP/1.1\r\nHost: t\r\n\r\n"


@dataclass
class Case:
    raw: bytes
    cuts: list[int]
    kind: str

    def pieces(self) -> list[bytes]:
        return cut(self.raw, self.cuts)


values = st.lists(
    st.sampled_from([p for p in VALUE_PARTS if p not in (b"\x01", b"\x7f")]), max_size=8
).map(b"".join)
names = st.sampled_from(NAMES) | st.text(alphabet=TOKEN, min_size=1, max_size=10)
fields = st.lists(
    st.tuples(names.map(str.encode), values).filter(
        lambda f: (
            f[0].lower()
            not in (b"host", b"content-length", b"transfer-encoding", b"connection", b"upgrade")
        )
    ),
    max_size=4,
    unique_by=lambda f: f[0].lower(),  # a field twice is a case of its own ("singletons")
)
trailers = st.lists(
    st.tuples(st.sampled_from([b"X-Checksum", b"X-Trailer", b"expires"]), values),
    max_size=3,
    unique_by=lambda f: f[0],
)  # a trailer that repeats a head's Content-Type is a case of its own ("singletons")
targets = st.sampled_from([b"/", b"/a", b"/a/b?x=1&y", b"/%41%2f", b"/a?", b"/~u/;p=1"]) | st.text(
    alphabet=PATH, max_size=20
).map(lambda path: b"/" + path.encode())


@st.composite
def chunked_body(draw: st.DrawFn) -> bytes:
    """A chunked body, with extensions and trailers (no space in a size line: "chunk-ext")."""
    out = []
    for data in draw(st.lists(st.binary(min_size=1, max_size=40), max_size=4)):
        size = b"%x" % len(data)
        size = draw(st.sampled_from([size, size.upper(), b"0" + size]))
        ext = draw(st.sampled_from([b"", b";name=value", b";x", b';q="a b"', b";a;b=c"]))
        out.append(size + ext + CRLF + data + CRLF)
    out.append(draw(st.sampled_from([b"0", b"000", b"0;end"])) + CRLF)
    for name, value in draw(trailers):
        out.append(name + b":" + value + CRLF)
    out.append(CRLF)
    return b"".join(out)


def _head(request_line: bytes, lines: list[bytes]) -> bytes:
    return CRLF.join([request_line, *lines]) + CRLF + CRLF


@st.composite
def valid(draw: st.DrawFn) -> bytes:
    """A valid request, its body framed by nothing, Content-Length or chunked; sometimes a
    second request after it."""
    method = draw(st.sampled_from(METHODS))
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.1", b"1.0"]))
    lines = [n + b":" + v for n, v in draw(fields)]
    if version == b"1.1" or draw(st.booleans()):
        lines.append(b"Host: " + draw(st.sampled_from([b"t", b"example.com:8080", b"[::1]"])))
    connection = draw(st.sampled_from([None, None, b"close", b"keep-alive"]))
    if connection is not None:
        lines.append(b"Connection: " + connection)
    framing = draw(st.sampled_from(["none", "length", "length", "chunked"]))
    body = draw(st.binary(max_size=120))
    if framing == "length":
        lines.append(b"Content-Length: %d" % len(body))
    elif framing == "chunked" and version == b"1.1":
        lines.append(b"Transfer-Encoding: " + draw(st.sampled_from([b"chunked", b"Chunked"])))
        body = draw(chunked_body())
    else:
        body = b""
    lines = draw(st.permutations(lines))
    raw = _head(method + b" " + draw(targets) + b" HTTP/" + version, lines) + body
    if draw(st.integers(0, 3)) == 0:
        raw += draw(st.sampled_from([NEXT, b"\r\n" + NEXT, b"x"]))
    return raw


INVALID = [
    b"GET /a HTTP/1.1\r\nHost: t\r\nName : v\r\n\r\n",
    b"GET /a HTTP/1.1\r\nHost: t\r\nNa(me: v\r\n\r\n",
    b"GET /a HTTP/1.1\r\nHost: t\r\n: v\r\n\r\n",
    b"GET /a HTTP/1.1\r\nHost: t\r\nNo-Colon\r\n\r\n",
    b"GET /a HTTP/1.1\r\nHost: t\r\nX: a\x00b\r\n\r\n",
    b"GET /a HTTP/1.1\r\nHost: t\r\nX: a\rb\r\n\r\n",
    b"GET /a HTTP/1.1\r\n X: leading\r\nHost: t\r\n\r\n",
    b"GET /a b HTTP/1.1\r\nHost: t\r\n\r\n",
    b"GET /a\x01 HTTP/1.1\r\nHost: t\r\n\r\n",
    b"GET /a HTTX/1.1\r\nHost: t\r\n\r\n",
    b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n",
    b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n",
    b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 1 2\r\n\r\n",
    b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 123456789012345678901\r\n\r\n",
    b" GET /a HTTP/1.1\r\nHost: t\r\n\r\n",
]
INVALID_CHUNKED = [
    b"g\r\nx\r\n0\r\n\r\n",
    b"\r\n",
    b" 1\r\nx\r\n0\r\n\r\n",
    b"-1\r\n",
    b"1\r\nxy\r\n0\r\n\r\n",
    b"123456789012345678901\r\n",
    b"0x1\r\nx\r\n0\r\n\r\n",
]


@st.composite
def invalid(draw: st.DrawFn) -> bytes:
    """A request both must refuse."""
    if draw(st.booleans()):
        return draw(st.sampled_from(INVALID)) + draw(st.binary(max_size=8))
    head = b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + draw(st.sampled_from(INVALID_CHUNKED))


@st.composite
def stricter(draw: st.DrawFn) -> tuple[bytes, str]:
    """A request h11 may accept and warmgate refuses on purpose (see :data:`STRICTER`)."""
    kind = draw(st.sampled_from(sorted(STRICTER)))
    post = b"POST /a HTTP/1.1\r\nHost: t\r\n"
    choices = {
        "cl-te": [post + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"],
        "te": [
            post + b"Transfer-Encoding: gzip\r\n\r\n",
            post + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
            post + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ],
        "lengths": [
            post + b"Content-Length: 0\r\nContent-Length: 0\r\n\r\n",
            post + b"Content-Length: 0, 0\r\n\r\n",
        ],
        "hosts": [b"GET /a HTTP/1.1\r\nHost: t\r\nHost: u\r\n\r\n"],
        "target": [
            b"GET http://evil.example/a HTTP/1.1\r\nHost: t\r\n\r\n",
            b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\nHost: t\r\n\r\n",
        ],
        "method": [
            b"SMUGGLE /a HTTP/1.1\r\nHost: t\r\n\r\n",
            b"get /a HTTP/1.1\r\nHost: t\r\n\r\n",
        ],
        "version": [
            b"GET /a HTTP/2.0\r\nHost: t\r\n\r\n",
            b"GET /a HTTP/1.2\r\nHost: t\r\n\r\n",
            b"GET /a HTTP/3.1\r\nHost: t\r\n\r\n",
        ],
        "obs-fold": [b"GET /a HTTP/1.1\r\nHost: t\r\nX: a\r\n b\r\n\r\n"],
        "bare-lf": [
            b"GET /a HTTP/1.1\nHost: t\r\n\r\n",
            b"GET /a HTTP/1.1\r\nHost: t\nX: y\r\n\r\n",
            b"GET /a HTTP/1.1\r\nHost: t\r\n\n",
        ],
        "chunk-ext": [
            post + b"Transfer-Encoding: chunked\r\n\r\n1 \r\nx\r\n0\r\n\r\n",
            post + b"Transfer-Encoding: chunked\r\n\r\n1; q=a\r\nx\r\n0\r\n\r\n",
            post + b"Transfer-Encoding: chunked\r\n\r\n1;q = a\r\nx\r\n0\r\n\r\n",
        ],
        "ctl": [
            b"GET /a HTTP/1.1\r\nHost: t\r\nX: a\x7fb\r\n\r\n",
            b"GET /a HTTP/1.1\r\nHost: t\r\nX: a\x01b\r\n\r\n",
        ],
        "singletons": [
            b"GET /a HTTP/1.1\r\nHost: t\r\nContent-Type: a\r\nContent-Type: b\r\n\r\n",
            b"GET /a HTTP/1.1\r\nHost: t\r\nUser-Agent: a\r\nuser-agent: a\r\n\r\n",
        ],
        "fields": [
            b"GET /a HTTP/1.1\r\nHost: t\r\n"
            + b"".join(b"X-%d: v\r\n" % i for i in range(130))
            + b"\r\n"
        ],
    }
    return draw(st.sampled_from(choices[kind])), kind


@st.composite
def cases(draw: st.DrawFn) -> Case:
    roll = draw(st.integers(0, 99))
    if roll < 55:
        raw, kind = draw(valid()), "valid"
    elif roll < 70:
        raw, kind = draw(invalid()), "invalid"
    elif roll < 80:
        raw, kind = draw(stricter())
    else:
        raw, kind = draw(corrupted(draw(valid()))), "corrupt"
    return Case(raw, draw(cut_points(raw)), kind)
