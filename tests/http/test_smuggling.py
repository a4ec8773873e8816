"""Request smuggling and bad input against the running server, on raw sockets.

Each bad request is followed on the same connection by a second one, ``GET /smuggled``: a
front end that reads the bad request's framing one way and warmgate another would see it as
part of a body, warmgate as a request of its own. Each bad request gets a 400 and the
connection is closed; the upstream (it records every request head) never sees ``/smuggled``.
The control case shows that it would: a good request followed by the same bytes.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.helpers import Running, static_config, warmgate
from tests.rawserver import RawUpstream, ok, raw_upstream

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n"
POST = b"POST /a HTTP/1.1\r\nHost: t\r\n"

CASES = {
    "Content-Length with Transfer-Encoding": POST
    + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "Transfer-Encoding with Content-Length": POST
    + b"Transfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n0\r\n\r\n",
    "two Content-Lengths": POST + b"Content-Length: 0\r\nContent-Length: 35\r\n\r\n",
    "two equal Content-Lengths": POST + b"Content-Length: 0\r\nContent-Length: 0\r\n\r\n",
    "a Content-Length list": POST + b"Content-Length: 0, 35\r\n\r\n",
    "a signed Content-Length": POST + b"Content-Length: +0\r\n\r\n",
    "obs-fold": b"GET /a HTTP/1.1\r\nHost: t\r\nX-A: b\r\n c\r\n\r\n",
    "obs-fold in Transfer-Encoding": POST
    + b"Transfer-Encoding: identity\r\n chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
    "bare LF line ends": b"GET /a HTTP/1.1\nHost: t\n\n",
    "a bare LF in the head": b"GET /a HTTP/1.1\r\nHost: t\nX: y\r\n\r\n",
    "CR in a header value": b"GET /a HTTP/1.1\r\nHost: t\r\nX: a\rb\r\n\r\n",
    "LF in a header value": b"GET /a HTTP/1.1\r\nHost: t\r\nX: a\nTransfer-Encoding: chunked\r\n"
    b"\r\n",
    "NUL in a header value": b"GET /a HTTP/1.1\r\nHost: t\r\nX: a\x00b\r\n\r\n",
    "a space before the colon": b"GET /a HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n",
    "an oversize head": b"GET /a HTTP/1.1\r\nHost: t\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
    "too many fields": b"GET /a HTTP/1.1\r\nHost: t\r\n"
    + b"".join(b"X-%d: v\r\n" % i for i in range(20_000))
    + b"\r\n",
    "an absolute-form target": b"GET http://evil.example/a HTTP/1.1\r\nHost: t\r\n\r\n",
    "an absolute-form target to the API": b"POST http://t/v1/chat/completions HTTP/1.1\r\n"
    b"Host: t\r\nContent-Length: 0\r\n\r\n",
    "a CONNECT target": b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n",
    "CONNECT to a path": b"CONNECT /a HTTP/1.1\r\nHost: t\r\n\r\n",
    "an asterisk-form target": b"OPTIONS * HTTP/1.1\r\nHost: t\r\n\r\n",
    "an invalid method": b"G@T /a HTTP/1.1\r\nHost: t\r\n\r\n",
    "a lower-case method": b"get /a HTTP/1.1\r\nHost: t\r\n\r\n",
    "an unknown method": b"SMUGGLE /a HTTP/1.1\r\nHost: t\r\n\r\n",
    "Transfer-Encoding: chunked, identity": POST
    + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    "Transfer-Encoding: gzip, chunked": POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    "Transfer-Encoding: identity": POST + b"Transfer-Encoding: identity\r\n\r\n",
    "Transfer-Encoding: xchunked": POST + b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
    "two Transfer-Encodings": POST
    + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "chunked in HTTP/1.0": b"POST /a HTTP/1.0\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\n\r\n",
    "an invalid chunk size": POST + b"Transfer-Encoding: chunked\r\n\r\n0x1\r\nx\r\n0\r\n\r\n",
    "a chunk ended by LF": POST + b"Transfer-Encoding: chunked\r\n\r\n1\r\nx\n0\r\n\r\n",
    "a chunk extension with LF": POST + b"Transfer-Encoding: chunked\r\n\r\n1;a\nx\r\n0\r\n\r\n",
    "HTTP/0.9": b"GET /a\r\n\r\n",
    "HTTP/2.0 in HTTP/1 framing": b"GET /a HTTP/2.0\r\nHost: t\r\n\r\n",
    "two Hosts": b"GET /a HTTP/1.1\r\nHost: t\r\nHost: evil.example\r\n\r\n",
    "a space in the target": b"GET /a b HTTP/1.1\r\nHost: t\r\n\r\n",
    "a control character in the target": b"GET /a\x01b HTTP/1.1\r\nHost: t\r\n\r\n",
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack() -> AsyncIterator[tuple[Running, RawUpstream]]:
    async with (
        raw_upstream(lambda head: ok(head.split(b" ")[1])) as (url, upstream),
        warmgate(static_config(url)) as wg,
    ):
        yield wg, upstream


async def exchange(wg: Running, *writes: bytes, wait: float = 5.0) -> tuple[bytes, bool]:
    """Send ``writes`` on one connection; what came back, and whether warmgate closed it
    (within ``wait`` seconds of the last byte)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", wg.server.public_port)
    received = b""
    try:
        for data in writes:
            writer.write(data)
            await writer.drain()
            await asyncio.sleep(0.05)
        while chunk := await asyncio.wait_for(reader.read(65536), wait):
            received += chunk
        closed = True
    except ConnectionError:
        closed = True
    except TimeoutError:
        closed = False
    finally:
        writer.close()
    return received, closed


def statuses(received: bytes) -> list[bytes]:
    """The status of each response in ``received`` (the bodies here are paths)."""
    return re.findall(rb"HTTP/1\.[01] ([0-9]{3}) ", received)


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.mark.parametrize("request_bytes", CASES.values(), ids=CASES.keys())
async def test_a_bad_request_is_refused_and_nothing_after_it_is_parsed(
    stack: tuple[Running, RawUpstream], request_bytes: bytes
) -> None:
    wg, upstream = stack
    upstream.heads.clear()
    received, closed = await exchange(wg, request_bytes + SMUGGLED)
    assert statuses(received) == [b"400"], received[:300]
    assert closed
    assert not any(b"/smuggled" in head for head in upstream.heads)


ALONE = {
    "HTTP/2.0 with nothing after it": b"GET /a HTTP/2.0\r\nHost: t\r\n\r\n",
    "HTTP/0.9 with nothing after it": b"GET /a\r\n\r\n",
    "HTTP/1.2 with nothing after it": b"GET /a HTTP/1.2\r\nHost: t\r\n\r\n",
    "HTTP/3.0 with nothing after it": b"GET /a HTTP/3.0\r\nHost: t\r\n\r\n",
}


@pytest.mark.parametrize("request_bytes", ALONE.values(), ids=ALONE.keys())
async def test_a_version_but_1_0_and_1_1_is_refused_with_nothing_after_it(
    stack: tuple[Running, RawUpstream], request_bytes: bytes
) -> None:
    wg, upstream = stack
    upstream.heads.clear()
    received, closed = await exchange(wg, request_bytes)
    assert statuses(received) == [b"400"], received[:300]
    assert closed
    assert upstream.heads == []


async def test_bytes_after_a_refused_request_in_a_later_read_are_not_parsed(
    stack: tuple[Running, RawUpstream],
) -> None:
    wg, upstream = stack
    upstream.heads.clear()
    bad = CASES["an absolute-form target"]
    received, closed = await exchange(wg, bad, SMUGGLED)
    assert statuses(received) == [b"400"] and closed
    assert not any(b"/smuggled" in head for head in upstream.heads)


async def test_requests_before_a_refused_one_are_answered_first(
    stack: tuple[Running, RawUpstream],
) -> None:
    wg, upstream = stack
    upstream.heads.clear()
    good = b"GET /first HTTP/1.1\r\nHost: t\r\n\r\n"
    received, closed = await exchange(wg, good + CASES["a CONNECT target"] + SMUGGLED)
    assert statuses(received) == [b"200", b"400"] and closed
    assert [head.split(b" ")[1] for head in upstream.heads] == [b"/first"]


async def test_the_control_a_good_request_lets_the_next_one_through(
    stack: tuple[Running, RawUpstream],
) -> None:
    wg, upstream = stack
    upstream.heads.clear()
    good = b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n"
    received, closed = await exchange(wg, good + SMUGGLED, wait=1.0)
    assert statuses(received) == [b"200", b"200"] and not closed  # kept alive
    assert [head.split(b" ")[1] for head in upstream.heads] == [b"/a", b"/smuggled"]


async def test_a_chunked_requests_trailers_never_reach_the_next_request(
    stack: tuple[Running, RawUpstream],
) -> None:
    """aiohttp's C parser gives a chunked request's trailer fields to the next request on the
    connection (a front end that shares connections would hand one client's fields to
    another's request): the connection closes after a chunked request, nothing after it is
    served, and no request head upstream carries the trailer."""
    wg, upstream = stack
    upstream.heads.clear()
    chunked = POST + b"Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nX-Trailer: evil\r\n\r\n"
    received, closed = await exchange(wg, chunked, SMUGGLED)
    assert statuses(received) == [b"200"] and closed
    assert not any(b"x-trailer" in head.lower() for head in upstream.heads), upstream.heads
    upstream.heads.clear()
    received, closed = await exchange(wg, chunked + SMUGGLED)
    assert statuses(received) == [b"200"] and closed
    assert not any(b"x-trailer" in head.lower() for head in upstream.heads), upstream.heads
