"""Differential fuzzing of the request side against h11: what warmgate takes of a client's bytes
(aiohttp's parser, llhttp, as its server runs it, then router.http.intake on each head) and what
h11 takes as a server must be the same requests, the same bodies (chunked ones decoded) and the
same ends, or both refuse; warmgate may refuse more only where it is stricter on purpose
(``requests.STRICTER``) and h11 only where ``requests.LENIENT`` says. A request followed by
another on the same connection is where smuggling would show: both must see the second one, or
neither.

Hypothesis generates requests (tests/http/requests.py): methods, targets, fields, bodies with
Content-Length or chunked (extensions, trailers), HTTP/1.0 and 1.1, a second request after the
first, requests both must refuse, requests warmgate refuses on purpose, and random bytes changed
in valid ones; each is fed whole and cut into reads where hypothesis chooses (byte by byte, one
case in twenty). Trailers are left out of the comparison: aiohttp drops them, and warmgate
forwards none.

``make test`` runs the ``fast`` profile (300 examples); ``make fuzz`` the ``fuzz`` profile
(100,000 examples) and prints how many ran (tests/http/conftest.py).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import h11
import pytest
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import HttpRequestParser
from hypothesis import given, settings

from router.http.intake import MAX_FIELDS, refusal
from tests.http.requests import NEXT, STRICTER, Case, cases
from tests.http.test_framer_fuzz import PROFILE

EXAMPLES: dict[str, int] = {}
"""Examples run, by kind (tests/http/conftest.py prints them)."""

MAX_FIELD = 16384
"""The public listener's ``max_field_size`` (router.app)."""
Fields = list[tuple[bytes, bytes]]


@dataclass
class Outcome:
    heads: list[tuple[bytes, bytes, tuple[int, int], Fields]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    ended: list[bool] = field(default_factory=list)
    refused: bool = False
    closed: bool = False
    """The last request closes the connection: nothing after it is read."""


LOOP: asyncio.AbstractEventLoop | None = None


def _loop() -> asyncio.AbstractEventLoop:
    global LOOP  # one loop for the parser's payloads: nothing runs on it
    if LOOP is None:
        LOOP = asyncio.new_event_loop()
    return LOOP


@pytest.fixture(scope="module", autouse=True)
def _close_the_loop() -> Iterator[None]:
    yield
    if LOOP is not None:
        LOOP.close()


def _fields(items: Fields) -> Fields:
    """As h11 keeps them: names in lower case, Transfer-Encoding's value too, and no whitespace
    around a value (RFC 9110 5.5: it is not part of it; aiohttp 3.12's parser, the floor, keeps
    a value's trailing whitespace when the field is cut across two reads)."""
    return [
        (
            name.lower(),
            (value.lower() if name.lower() == b"transfer-encoding" else value).strip(b" \t"),
        )
        for name, value in items
    ]


def run_warmgate(pieces: list[bytes]) -> Outcome:
    out = Outcome()
    loop = _loop()
    parser = HttpRequestParser(
        BaseProtocol(loop), loop, 2**16, max_line_size=8190, max_field_size=MAX_FIELD
    )
    payloads = []
    closing = False
    try:
        for piece in pieces:  # after a request that closes, only its body is read
            messages, _, _ = parser.feed_data(piece)
            for message, payload in messages:
                if closing:
                    break
                why = refusal(message.method, message.path, message.headers, message.version)
                if why is not None:
                    raise HttpProcessingError(message=why)
                target = message.path.encode("utf-8", "surrogateescape")
                out.heads.append(
                    (
                        message.method.encode(),
                        target,
                        tuple(message.version),
                        _fields(list(message.raw_headers)),
                    )
                )
                payloads.append(payload)
                # answered, then closed; a chunked one too (router.server: its trailer
                # fields would be the next request's)
                closing = out.closed = message.should_close or message.chunked
    except HttpProcessingError:
        # after a request that closes the connection (its body read), what follows it is
        # never answered; within its body, this is a refusal
        out.refused = not closing or not payloads[-1].is_eof()
    for payload in payloads:
        try:
            out.bodies.append(payload.read_nowait(-1))
        except Exception:  # a body the parser broke off (its error is the payload's)
            out.refused = True
            out.bodies.append(b"")
        out.ended.append(payload.is_eof())
    return out


def run_h11(pieces: list[bytes], eof: bool = False) -> Outcome:
    """h11 as a server; ``eof``: the client closes after the last piece."""
    out = Outcome()
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=2**16)
    try:
        for piece in [*pieces, b""] if eof else pieces:
            conn.receive_data(piece)
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA or event is h11.PAUSED:
                    break
                if isinstance(event, h11.ConnectionClosed):
                    return out
                if isinstance(event, h11.Request):
                    version = tuple(int(part) for part in event.http_version.split(b"."))
                    headers = _fields(list(event.headers.raw_items()))
                    out.heads.append((event.method, event.target, version, headers))
                    out.bodies.append(b"")
                    out.ended.append(False)
                elif isinstance(event, h11.Data):
                    out.bodies[-1] += bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    out.ended[-1] = True
                    conn.send(h11.Response(status_code=200, headers=[(b"Content-Length", b"0")]))
                    conn.send(h11.EndOfMessage())
                    if conn.their_state is not h11.DONE or conn.our_state is not h11.DONE:
                        out.closed = True  # the connection closes after this request
                        return out
                    conn.start_next_cycle()
    except h11.RemoteProtocolError:
        out.refused = True
    return out


_BARE = re.compile(rb"(?<!\r)\n|\r(?!\n)")
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
SINGLETONS = (
    b"content-length", b"content-location", b"content-range", b"content-type", b"etag",
    b"host", b"max-forwards", b"server", b"transfer-encoding", b"user-agent",
)  # fmt: skip
"""Fields aiohttp takes once only in a request (its SINGLETON_HEADERS)."""
SINCE = frozenset(("singletons",))
"""Kinds of STRICTER that only newer aiohttp versions refuse: on an older one (make
test-aiohttp-floor) they are compared with h11 like any other."""
_KNOWN = (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE")


def documented(raw: bytes) -> str | None:
    """The class of :data:`STRICTER` found in ``raw``, if any (for changed bytes)."""
    lower = raw.lower()
    if _BARE.search(raw):
        return "bare-lf"
    if re.search(rb"\r\n[ \t]", raw):
        return "obs-fold"
    if b"transfer-encoding" in lower:
        return "te"  # with Content-Length, another coding, or a second one
    if lower.count(b"content-length") > 1 or re.search(rb"content-length:[^\r\n]*,", lower):
        return "lengths"
    if lower.count(b"\nhost") > 1:
        return "hosts"
    if re.search(rb"HTTP/(?!1\.[01]\r)", raw):
        return "version"
    if not re.match(rb"(?:\r\n)?[A-Z]+ /", raw):
        return "target"  # or a method llhttp does not know, or none
    method = raw.lstrip(b"\r\n").split(b" ", 1)[0]
    if method not in _KNOWN:
        return "method"
    if raw.count(b"\r\n") > MAX_FIELDS:
        return "fields"
    if _CONTROL.search(raw.split(b"\r\n\r\n", 1)[0]):
        return "ctl"
    if re.search(rb"\n[0-9a-fA-F]+(?:;[^\r\n]*)?[ \t]", raw):
        return "chunk-ext"
    names = [line.split(b":", 1)[0].lower() for line in raw.split(b"\r\n") if b":" in line]
    if any(names.count(name) > 1 for name in SINGLETONS):
        return "singletons"
    return None


def _lenient(ours: Outcome, raw: bytes) -> bool:
    """A reason of LENIENT's is in ``raw``: a request without Host, two spaces in a request
    line, an empty line before one."""
    no_host = any(
        version == (1, 1) and not any(name == b"host" for name, _ in fields)
        for _, _, version, fields in ours.heads
    )
    spaces = re.search(rb"(?:^|\n)(?:[A-Za-z]+  |[^\r\n]*  +HTTP/)", raw) is not None
    empty = raw.startswith(b"\r\n") or b"\r\n" + NEXT in raw  # before a request line
    return no_host or spaces or empty


def _prefix_of(ours: Outcome, theirs: Outcome) -> bool:
    """What warmgate took before it refused is what h11 took (the last body may be shorter)."""
    count = len(ours.heads)
    if ours.heads != theirs.heads[:count]:
        return False
    for index in range(len(ours.bodies)):
        if not theirs.bodies[index].startswith(ours.bodies[index]):
            return False
    return True


def _closed_then_refused(refused: Outcome, served: Outcome) -> bool:
    """Bytes after a request that closes the connection: llhttp refuses them when they come
    in the same read ("data after Connection: close"), and the server reads no more when
    they come later. Either way nothing after that request is served."""
    return refused.refused and served.closed and served.heads[: len(refused.heads)] == refused.heads


def check(case: Case) -> None:
    pieces = case.pieces()
    ours = run_warmgate(pieces)
    whole = run_warmgate([case.raw])
    if ours.refused != whole.refused:
        served, refused = (whole, ours) if ours.refused else (ours, whole)
        assert _closed_then_refused(refused, served), "refused, or not, depending on the cut"
        ours = served
    elif not ours.refused:
        assert ours == whole, "warmgate's requests depend on how the bytes were cut"
    if case.kind in STRICTER and (ours.refused or case.kind not in SINCE):
        assert ours.refused, f"{case.kind}: {STRICTER[case.kind]}"
        return
    theirs = run_h11(pieces)
    if case.kind == "invalid":
        assert ours.refused and theirs.refused, (ours, theirs)
        return
    why = documented(case.raw)
    if ours.refused and not theirs.refused and not theirs.closed:
        # llhttp refuses bytes no request begins with at once (and the requests parsed in
        # the same read with them); h11 once the client is done sending: the same refusal.
        theirs = run_h11(pieces, eof=True)
    if ours.refused and not theirs.refused:
        if _closed_then_refused(ours, theirs):
            return
        assert case.kind == "corrupt" and why is not None, ("refused what h11 takes", theirs)
        assert _prefix_of(ours, theirs), (ours, theirs)
        return
    if (
        theirs.refused
        and not ours.refused
        and (ours.heads, ours.bodies, ours.ended)
        == (
            theirs.heads,
            theirs.bodies,
            theirs.ended,
        )
    ):
        return  # h11 refused what follows the requests both took: llhttp skips empty lines
    if theirs.refused and not ours.refused:
        # h11 refuses a request warmgate takes only for a reason of LENIENT's, or one that is
        # a documented difference in the other direction too (a version h11 reads differently)
        assert _lenient(ours, case.raw) or (case.kind == "corrupt" and why is not None), (
            "h11 refused what warmgate takes",
            ours,
        )
        return
    if ours.refused and theirs.refused:
        return
    if ours.closed and len(theirs.heads) > len(ours.heads):  # after a chunked request
        count = len(ours.heads)
        theirs = Outcome(theirs.heads[:count], theirs.bodies[:count], theirs.ended[:count])
    if theirs.closed and len(ours.heads) > len(theirs.heads) and theirs.heads[-1][2] == (1, 0):
        # HTTP/1.0 with Connection: keep-alive: warmgate keeps the connection (RFC 9112
        # C.2.2), h11 closes it; what came before is the same
        count = len(theirs.heads)
        ours = Outcome(ours.heads[:count], ours.bodies[:count], ours.ended[:count])
    assert ours.heads == theirs.heads
    assert ours.bodies == theirs.bodies
    assert ours.ended == theirs.ended


@pytest.mark.timeout(0)
@settings(PROFILE)
@given(cases())
def test_the_request_side_agrees_with_h11(case: Case) -> None:
    EXAMPLES[case.kind] = EXAMPLES.get(case.kind, 0) + 1
    check(case)
