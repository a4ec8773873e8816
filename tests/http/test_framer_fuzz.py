"""Differential fuzzing of the response framer (router.http.h1.framer) against h11.

Hypothesis generates responses (tests/http/responses.py): Content-Length, chunked bodies with
extensions and trailers, 1xx heads before the final one, HEAD/204/304, bodies that end with the
connection, bytes after the end, heads that are invalid for both, and random bytes changed in
valid ones; each is fed whole and cut into reads where hypothesis chooses (byte by byte, one
case in twenty). Both parsers must agree on every event (Data joined), or both refuse.

The framer is stricter than h11 on purpose in a few places (``responses.STRICTER``: bare LF,
obs-fold, Content-Length with Transfer-Encoding, versions but HTTP/1.x, heads over 64 KiB) and
takes 101 as a final head (it switches protocols, where h11 wants the upgrade proposed): for
those the framer must refuse (or switch). A changed byte may make either; the framer may
refuse what h11 accepts only where one of those is in the bytes.

``make test`` runs the ``fast`` profile (300 examples, derandomized); ``make fuzz`` the ``fuzz``
profile (``HYPOTHESIS_PROFILE=fuzz``, 100,000 examples), and prints how many ran.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import h11
import pytest
from hypothesis import given, settings

from router.http.h1.framer import MAX_HEAD, Data, End, FramingError, Head, Informational
from router.http.h1.framer import ResponseFramer as Framer
from tests.fuzzing import examples
from tests.http.responses import STRICTER, Case, cases

PROFILE = examples(300, 100_000)

EXAMPLES: dict[str, int] = {}
"""Examples run, by kind (tests/http/conftest.py prints them)."""

Fields = list[tuple[bytes, bytes]]


@dataclass
class Outcome:
    events: list[object] = field(default_factory=list)
    refused: bool = False
    ended: bool = False
    must_close: bool = False
    """At the end: the connection carries no other exchange (or bytes came after it)."""


def _fields(items: list[tuple[bytes, bytes]]) -> Fields:
    """As h11 keeps them: one Content-Length (its first, as one number), Transfer-Encoding in
    lower case; names as sent."""
    out: Fields = []
    seen_length = False
    for name, value in items:
        lower = name.lower()
        if lower == b"content-length":
            if seen_length:
                continue
            seen_length = True
            value = value.split(b",")[0].strip(b" \t")
        elif lower == b"transfer-encoding":
            value = value.lower()
        out.append((name, value))
    return out


def _encoded(items: object) -> Fields:
    return [
        (k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape"))
        for k, v in items
    ]  # type: ignore[attr-defined]


def _add(events: list[object], event: object) -> None:
    if isinstance(event, bytes) and events and isinstance(events[-1], bytes):
        events[-1] += event
    elif event != b"":
        events.append(event)


def run_framer(case: Case, pieces: list[bytes]) -> Outcome:
    out = Outcome()
    framer = Framer(case.head_request)
    try:
        for piece in pieces:
            for event in framer.feed(piece):
                _note_framer(out, event)
        if case.eof:
            for event in framer.feed_eof():
                _note_framer(out, event)
    except FramingError:
        out.refused = True
    out.must_close = framer.must_close
    return out


def _note_framer(out: Outcome, event: object) -> None:
    if type(event) is Data:
        _add(out.events, bytes(event.data))
    elif type(event) is Informational:
        reason = event.reason.encode("utf-8", "surrogateescape")
        out.events.append(("info", event.status, reason, _fields(_encoded(event.headers.items()))))
    elif type(event) is Head:
        reason = event.reason.encode("utf-8", "surrogateescape")
        out.events.append(("head", event.status, reason, _fields(_encoded(event.headers.items()))))
    elif type(event) is End:
        trailers = _encoded(event.trailers.items()) if event.trailers is not None else []
        out.events.append(("end", _fields(trailers)))
        out.ended = True


def run_h11(case: Case, pieces: list[bytes]) -> Outcome:
    out = Outcome()
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
    method = b"HEAD" if case.head_request else b"GET"
    conn.send(h11.Request(method=method, target=b"/", headers=[(b"Host", b"upstream")]))
    conn.send(h11.EndOfMessage())
    try:
        for piece in [*pieces, b""] if case.eof else pieces:
            conn.receive_data(piece)
            while not out.ended:
                event = conn.next_event()
                if event is h11.NEED_DATA or event is h11.PAUSED:
                    break
                if isinstance(event, h11.ConnectionClosed):
                    break
                _note_h11(out, event, conn)
                # A body that ended with the connection: nothing else can follow.
                out.must_close = out.must_close or (out.ended and not piece)
    except h11.RemoteProtocolError:
        out.refused = True
    if out.ended:  # bytes after the end: no other exchange on this connection
        out.must_close = out.must_close or bool(conn.trailing_data[0])
    return out


def _note_h11(out: Outcome, event: object, conn: h11.Connection) -> None:
    if isinstance(event, h11.Data):
        _add(out.events, bytes(event.data))
    elif isinstance(event, h11.InformationalResponse):
        headers = _fields(list(event.headers.raw_items()))
        out.events.append(("info", event.status_code, bytes(event.reason), headers))
    elif isinstance(event, h11.Response):
        headers = _fields(list(event.headers.raw_items()))
        out.events.append(("head", event.status_code, bytes(event.reason), headers))
    elif isinstance(event, h11.EndOfMessage):
        out.events.append(("end", _fields(list(event.headers.raw_items()))))
        out.ended = True
        out.must_close = conn.their_state is not h11.DONE


_BARE = re.compile(rb"(?<!\r)\n|\r(?!\n)")


def documented(raw: bytes) -> str | None:
    """The class of :data:`STRICTER` found in ``raw``, if any (for changed bytes)."""
    lower = raw.lower()
    if _BARE.search(raw):
        return "bare-lf"
    if re.search(rb"\r\n[ \t]", raw):
        return "obs-fold"
    if b"content-length" in lower and b"transfer-encoding" in lower:
        return "cl-te"
    if re.search(rb"HTTP/(?!1\.)[0-9]\.[0-9]", raw):
        return "version"
    if len(raw) > MAX_HEAD:
        return "size"
    return None


def _prefix(events: list[object], of: list[object]) -> bool:
    """``events`` begin ``of`` (the last body bytes may be fewer)."""
    if len(events) > len(of):
        return False
    for index, event in enumerate(events):
        other = of[index]
        last = index == len(events) - 1
        if last and isinstance(event, bytes) and isinstance(other, bytes):
            return other.startswith(event)
        if event != other:
            return False
    return True


def check(case: Case) -> None:
    pieces = case.pieces()
    framer = run_framer(case, pieces)
    whole = run_framer(case, [case.raw] if case.raw else [])
    # However it is cut: the same events, or refused (then the events of the read that was
    # refused are not returned: how many came before depends on the cut).
    assert framer.refused == whole.refused, "refused, or not, depending on the cut"
    if not framer.refused:
        assert framer == whole, "the framer's events depend on how the bytes were cut"
    if case.kind in STRICTER:
        assert framer.refused, f"{case.kind}: {STRICTER[case.kind]}"
        return
    if case.kind == "101" or (
        case.kind == "corrupt"
        and any(e[:2] == ("head", 101) for e in framer.events if isinstance(e, tuple))
    ):
        heads = [e for e in framer.events if isinstance(e, tuple) and e[0] == "head"]
        assert framer.refused or (heads[0][1] == 101 and framer.ended and framer.must_close)
        return
    h11_out = run_h11(case, pieces)
    if case.kind == "invalid":
        assert framer.refused and h11_out.refused, (framer, h11_out)
        return
    if case.kind == "corrupt" and documented(case.raw):
        # Where the framer is stricter, it may refuse, or wait for the CRLFs that end a head
        # where h11 took a bare LF: what it saw is never more than h11 saw, nor other.
        assert _prefix(framer.events, h11_out.events), (framer, h11_out)
        return
    if framer.refused and not h11_out.refused and not h11_out.ended and not case.eof:
        # The framer refuses a bad trailer line or a head that cannot be HTTP/1.x at once;
        # h11 when the section ends: the same answer, given the end of the connection.
        h11_out = run_h11(Case(case.raw, case.head_request, True, case.cuts, case.kind), pieces)
    if framer.refused and not h11_out.refused:
        raise AssertionError(("the framer refused what h11 accepts", h11_out))
    if framer.refused or h11_out.refused:
        assert framer.refused and h11_out.refused, ("h11 refused", framer)
        return
    assert framer.events == h11_out.events
    assert framer.ended == h11_out.ended
    if framer.ended:
        assert framer.must_close == h11_out.must_close


@pytest.mark.timeout(0)
@settings(PROFILE)
@given(cases())
def test_the_framer_agrees_with_h11(case: Case) -> None:
    EXAMPLES[case.kind] = EXAMPLES.get(case.kind, 0) + 1
    check(case)
