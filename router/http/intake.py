"""What warmgate refuses of a client's request before dispatching it, where aiohttp's parser
(llhttp) lets it through: a decision on the parsed head, pure; router.server acts on it (a 400
in its turn, the connection closed, nothing after it on that connection dispatched).

aiohttp refuses most of the request-smuggling kit itself (obs-fold, bare LF, CR, LF or NUL in
a field, invalid methods and versions, oversize heads, Content-Length with Transfer-Encoding:
see tests/http/test_smuggling.py); what it accepts and warmgate must not forward is checked here
(targets but origin-form, CONNECT, Transfer-Encoding but chunked), and what only some of its
versions refuse (repeated Content-Length or Host, too many fields) too.
"""

from __future__ import annotations

from typing import Final

from multidict import MultiMapping

MAX_FIELDS: Final = 128
"""Header fields a request may have (aiohttp's own bound since 3.13; 32768 before it)."""
_NONE: Final[tuple[str, ...]] = ()
_VERSIONS: Final = frozenset(((1, 0), (1, 1)))


def refusal(
    method: str, target: str, headers: MultiMapping[str], version: tuple[int, int] = (1, 1)
) -> str | None:
    """Why a request with this head is refused (answered 400, its connection closed), or
    ``None``. ``target``: the request target as sent; ``version``: (major, minor)."""
    if version not in _VERSIONS:
        # llhttp takes HTTP/0.9 and 2.0 lines in HTTP/1 framing when nothing follows them
        return f"HTTP/1.0 and HTTP/1.1 only: HTTP/{version[0]}.{version[1]} is not served"
    if method == "CONNECT":
        return "CONNECT is not served: warmgate is no forward proxy"
    if not target.startswith("/"):
        # absolute-form (a forward proxy's), authority-form (CONNECT's) or asterisk-form:
        # what such a request means depends on who reads it; origin-form means one thing.
        return f"the request target must be a path (origin-form), not {target[:80]!r}"
    codings = headers.getall("Transfer-Encoding", _NONE)
    lengths = headers.getall("Content-Length", _NONE)
    if codings:
        if len(codings) > 1 or codings[0].strip(" \t").lower() != "chunked":
            # gzip, identity or a list: warmgate decodes none, so could not find the body's
            # end as the engine would (and forwards no coding a client chose).
            return "Transfer-Encoding must be chunked alone"
        if lengths:
            return "Content-Length and Transfer-Encoding together"
    if len(lengths) > 1:
        return "more than one Content-Length"
    if len(headers.getall("Host", _NONE)) > 1:
        return "more than one Host"  # which one routes it, and which one the engine reads?
    if len(headers) > MAX_FIELDS:
        return f"more than {MAX_FIELDS} header fields"
    return None
