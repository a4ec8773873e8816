"""Response heads and trailer fields, parsed strictly: the grammar of RFC 9112 as h11 reads it
(``h11/_abnf.py``, ``h11/_headers.py``), minus what h11 forgives. What h11 rejects is rejected
here too; besides, lines must end in CRLF (no bare LF, no bare CR), obs-fold is an error, only
HTTP/1.x is spoken, and a head with both Content-Length and Transfer-Encoding is refused.

Bytes are decoded as UTF-8 with ``surrogateescape``; every check below is on ASCII
characters, so it means on the text what it means on the bytes.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from multidict import CIMultiDict, CIMultiDictProxy

_TOKEN: Final = r"[-!#$%&'*+.^_`|~0-9a-zA-Z]+"
_STATUS_LINE: Final = re.compile(r"HTTP/1\.([0-9]) ([0-9]{3})(?: (.*))?(?=\n|\Z)")
_FIELDS: Final = re.compile(rf"\n({_TOKEN}):[ \t]*(.*)")
"""Field lines, once a head's CRLFs are LFs: what follows the colon is a valid value (h11's
``field-content``) once the spaces and tabs at its end are stripped, as :func:`_lines` saw to."""
_FIELD: Final = re.compile(rf"({_TOKEN}):[ \t]*(.*)")

Fields = CIMultiDictProxy[str]


class FramingError(Exception):
    """The upstream sent something that is not an HTTP/1.x response: the connection is over."""


class ParsedHead(NamedTuple):
    """One response head, checked: what the framer needs to frame its body."""

    minor: int
    """The x of HTTP/1.x."""
    status: int
    reason: str
    headers: Fields
    length: int | None
    """Content-Length, when sent (and not chunked)."""
    chunked: bool
    close: bool
    """``Connection: close`` (or HTTP/1.0): no other exchange on this connection."""


def parse_head(block: bytes | bytearray) -> ParsedHead:
    """A head without its final blank line (the status line and the field lines, CRLF between).
    Raises :class:`FramingError`."""
    text, lines = _lines(block)
    status_line = _STATUS_LINE.match(text)
    if status_line is None:
        raise FramingError(f"invalid status line {text.partition(chr(10))[0][:80]!r}")
    minor, code, reason = status_line.groups()
    status = int(code)
    if status < 100:
        raise FramingError(f"status {code} is not an HTTP status")
    # Each match starts at a line's start and runs to its end: as many as there are lines
    # after the status line, and every one of them is a valid field.
    fields = _FIELDS.findall(text, status_line.end())
    if len(fields) != lines:
        raise FramingError(_why_invalid(text))
    if " \n" in text or "\t\n" in text or text[-1] in " \t":
        fields = [(name, value.rstrip(" \t")) for name, value in fields]
    headers = CIMultiDict(fields)
    length = content_length(headers)
    chunked = transfer_chunked(headers)
    if chunked and length is not None:
        raise FramingError("Content-Length and Transfer-Encoding together")
    close = minor == "0" or _says_close(headers)
    return ParsedHead(
        int(minor), status, reason or "", CIMultiDictProxy(headers), length, chunked, close
    )


def parse_field(line: bytes | bytearray, headers: CIMultiDict[str]) -> None:
    """Add one field line (a trailer, CRLF cut off) to ``headers``. Raises :class:`FramingError`."""
    text, _ = _lines(line)
    found = _FIELD.fullmatch(text)
    if found is None:
        raise FramingError(_why_invalid("\n" + text))
    name, value = found.groups()
    headers.add(name, value.rstrip(" \t"))


def _lines(block: bytes | bytearray) -> tuple[str, int]:
    """The text of a head, its CRLFs made LFs, and how many there were. Bytes are decoded as
    UTF-8 with ``surrogateescape`` (byte-exact, as aiohttp's parser did). No NUL, vertical
    tab or form feed, and CR and LF only together: then what is left of a line is a valid
    field value."""
    text = block.decode("utf-8", "surrogateescape")
    crlf = text.count("\r\n")
    if text.count("\r") != crlf or text.count("\n") != crlf:
        raise FramingError("a bare CR or LF in a head")
    if "\x00" in text or "\x0b" in text or "\x0c" in text:
        raise FramingError("NUL, vertical tab or form feed in a head")
    return (text.replace("\r\n", "\n") if crlf else text), crlf


def check_fields(headers: CIMultiDict[str]) -> None:
    """The checks every field section gets (trailers too): Content-Length and
    Transfer-Encoding well formed."""
    content_length(headers)
    transfer_chunked(headers)


def content_length(headers: CIMultiDict[str]) -> int | None:
    """The one Content-Length of ``headers``: repeats (as fields or a list) must agree."""
    values = headers.getall("Content-Length", None)
    if values is None:
        return None
    if len(values) == 1:  # the common case, quickly
        value = values[0]
        if value.isdigit() and value.isascii() and len(value) <= 20:
            return int(value)
    seen: str | None = None
    for value in values:
        lengths = {part.strip(" \t") for part in value.split(",")}
        if len(lengths) != 1:
            raise FramingError(f"conflicting Content-Length {value!r}")
        length = lengths.pop()
        if not (length.isdigit() and length.isascii() and len(length) <= 20):
            raise FramingError(f"invalid Content-Length {value!r}")
        if seen is None:
            seen = length
        elif seen != length:
            raise FramingError(f"conflicting Content-Length {seen!r} and {length!r}")
    assert seen is not None
    return int(seen)


def transfer_chunked(headers: CIMultiDict[str]) -> bool:
    """Whether the body is chunked; any Transfer-Encoding but one plain ``chunked`` is refused
    (warmgate decodes no other coding, and so cannot find the end of such a body)."""
    values = headers.getall("Transfer-Encoding", None)
    if values is None:
        return False
    if len(values) > 1:
        raise FramingError("several Transfer-Encoding fields")
    value = values[0]
    if not value.isascii() or value.lower() != "chunked":
        raise FramingError(f"unsupported Transfer-Encoding {value!r}")
    return True


def _says_close(headers: CIMultiDict[str]) -> bool:
    """``Connection: close`` (a token of any Connection field, in any case)."""
    values = headers.getall("Connection", None)
    if values is None:
        return False
    for value in values:
        if "close" in value.lower():  # the common case (keep-alive) is quickly told apart
            for token in value.split(","):
                if token.isascii() and token.strip(" \t").lower() == "close":
                    return True
    return False


def _why_invalid(text: str) -> str:
    """Which field line is wrong (the slow path, for the message only)."""
    for line in text.split("\n")[1:]:
        if line[:1] in (" ", "\t"):
            return "obsolete line folding"
        if _FIELD.fullmatch(line) is None:
            return f"invalid header line {line[:80]!r}"
    return "invalid response head"
