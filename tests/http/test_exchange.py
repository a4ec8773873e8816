"""An exchange driven by hand through its two interfaces: a fake connection (a ``Carrier``) it
is sent on, and the reads a connection hands it (``Receiver``). No socket: what it does with
the connection, the client's transport and the read buffer is what is checked."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from router.http.h1.errors import ConnectionBroken, HeadTimedOut
from router.http.h1.exchange import Exchange


class FakeTransport(asyncio.Transport):
    """Takes what is written; ``queued`` bytes stay "unsent" (as a slow client's would)."""

    def __init__(self, queued: int = 0) -> None:
        super().__init__()
        self.writes: list[bytes | memoryview] = []
        """What was written, as it was (a view stays a view)."""
        self.data = bytearray()
        """What was written, as it was when written."""
        self.queued = queued
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(data if isinstance(data, memoryview) else bytes(data))
        self.data += data

    def writelines(self, list_of_data: object) -> None:
        for data in list_of_data:  # type: ignore[attr-defined]
            self.write(data)

    def get_write_buffer_size(self) -> int:
        return self.queued

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 64 * 1024)

    def is_closing(self) -> bool:
        return self.closing

    def written(self) -> bytes:
        return bytes(self.data)


class FakeCarrier:
    """A connection as an exchange sees it; counts what was asked of it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.transport: asyncio.Transport = FakeTransport()
        self.loop = loop
        self.lost = False
        self.paused = False
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    async def drain(self) -> None:
        if self.lost:
            raise ConnectionBroken("the upstream closed the connection")

    def close(self) -> None:
        self.calls.append("close")

    def discard(self) -> None:
        self.calls.append("discard")

    def release(self) -> None:
        self.calls.append("release")

    def renew_read_buffer(self) -> None:
        self.calls.append("renew")


def feed(exchange: Exchange, buffer: bytearray, data: bytes) -> None:
    buffer[: len(data)] = data
    exchange.received(buffer, len(data))


@pytest.fixture
async def conn() -> FakeCarrier:
    return FakeCarrier(asyncio.get_running_loop())


async def test_a_complete_response_gives_the_connection_back(conn: FakeCarrier) -> None:
    exchange = Exchange(conn, head_only=False)
    exchange.send(b"GET / HTTP/1.1\r\n\r\n", None, False)
    assert isinstance(conn.transport, FakeTransport)
    assert conn.transport.written() == b"GET / HTTP/1.1\r\n\r\n"
    buffer = bytearray(1024)
    feed(exchange, buffer, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
    await exchange.head()
    exchange.check()
    assert (exchange.status, exchange.length, exchange.done) == (200, 5, True)
    assert conn.calls == ["release"] and exchange.conn is None
    assert await exchange.read_all() == b"hello"


@pytest.mark.parametrize(
    "response",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokAND MORE",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ],
)
async def test_a_connection_that_cannot_be_reused_is_not(
    conn: FakeCarrier, response: bytes
) -> None:
    exchange = Exchange(conn, head_only=False)
    exchange.send(b"GET / HTTP/1.1\r\n\r\n", None, False)
    feed(exchange, bytearray(1024), response)
    assert exchange.done and await exchange.read_all() == b"ok"
    assert "release" not in conn.calls
    exchange.close()
    assert conn.calls == ["discard"]


async def test_an_invalid_response_breaks_the_exchange(conn: FakeCarrier) -> None:
    exchange = Exchange(conn, head_only=False)
    exchange.replayable = True
    exchange.send(b"GET / HTTP/1.1\r\n\r\n", None, False)
    feed(exchange, bytearray(1024), b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n")
    await exchange.head()
    with pytest.raises(ConnectionBroken, match="invalid response"):
        exchange.check()
    assert conn.calls == ["close"] and not exchange.retryable()  # it answered: not again


async def test_a_reused_connection_closed_before_any_answer_is_retried(
    conn: FakeCarrier,
) -> None:
    exchange = Exchange(conn, head_only=False)
    exchange.replayable = True
    exchange.send(b"GET / HTTP/1.1\r\n\r\n", None, False)
    exchange.eof_received()
    exchange.connection_lost(None)
    await exchange.head()
    with pytest.raises(ConnectionBroken, match=r"closed the connection$"):
        exchange.check()
    assert exchange.retryable()


async def test_a_head_that_does_not_come_times_out(conn: FakeCarrier) -> None:
    exchange = Exchange(conn, head_only=False)
    exchange.send(b"GET / HTTP/1.1\r\n\r\n", None, False)
    feed(exchange, bytearray(1024), b"HTTP/1.1 200 OK\r\n")  # a head in pieces, never ended
    exchange.timed_out(2.5)
    with pytest.raises(HeadTimedOut, match=r"within 2\.5s"):
        exchange.check()
    assert conn.calls == ["close"]


async def test_a_body_nobody_reads_yet_waits_in_the_socket(conn: FakeCarrier) -> None:
    exchange = Exchange(conn, head_only=False)
    exchange.send(b"GET / HTTP/1.1\r\n\r\n", None, False)
    buffer = bytearray(1024)
    feed(exchange, buffer, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234")
    assert conn.paused
    assert await exchange.read() == b"01234" and not conn.paused
    feed(exchange, buffer, b"56789")
    assert exchange.done and await exchange.read() == b"56789" and await exchange.read() == b""


async def test_a_piped_body_is_written_from_the_read_buffer_without_a_copy(
    conn: FakeCarrier,
) -> None:
    exchange = Exchange(conn, head_only=False)
    exchange.send(b"GET / HTTP/1.1\r\n\r\n", None, False)
    buffer = bytearray(1024)
    feed(exchange, buffer, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    client = FakeTransport()

    async def drain() -> None:
        client.queued = 0

    piping = asyncio.ensure_future(exchange.pipe(client, True, drain))
    await asyncio.sleep(0)
    feed(exchange, buffer, b"5\r\nhello\r\n")
    view = client.writes[1]
    assert isinstance(view, memoryview) and view.obj is buffer  # the read buffer itself
    client.queued = 100_000  # a slow client from now on: copies, a fresh read buffer, paused
    feed(exchange, buffer, b"6\r\n world\r\n")
    assert isinstance(client.writes[4], bytes) and "renew" not in conn.calls
    assert conn.paused
    client.queued = 0
    await asyncio.sleep(0)
    assert not conn.paused
    feed(exchange, buffer, b"0\r\n\r\n")
    assert await piping == 11
    assert client.written() == b"5\r\nhello\r\n6\r\n world\r\n"
    assert conn.calls == ["release"]


async def test_a_piped_view_the_client_could_not_take_renews_the_read_buffer(
    conn: FakeCarrier,
) -> None:
    exchange = Exchange(conn, head_only=False)
    exchange.send(b"GET / HTTP/1.1\r\n\r\n", None, False)
    buffer = bytearray(1024)
    feed(exchange, buffer, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n")

    class Partial(FakeTransport):
        def write(self, data: bytes | bytearray | memoryview) -> None:
            super().write(data)
            self.queued = 1  # some of it stayed behind, as a view of the read buffer

    client = Partial()

    async def drain() -> None:
        pass

    piping = asyncio.ensure_future(exchange.pipe(client, False, drain))
    await asyncio.sleep(0)
    feed(exchange, buffer, b"data")
    assert await piping == 4 and conn.calls == ["renew", "release"]


async def test_a_streamed_request_body_is_sent_before_the_connection_is_reused(
    conn: FakeCarrier,
) -> None:
    go = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield b"abc"
        await go.wait()
        yield b"def"

    exchange = Exchange(conn, head_only=False)
    exchange.send(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", body(), True)
    await asyncio.sleep(0)
    feed(exchange, bytearray(1024), b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert exchange.done and conn.calls == []  # the request is not all sent: not reusable yet
    go.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert isinstance(conn.transport, FakeTransport)
    assert conn.transport.written().endswith(b"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n")
    assert conn.calls == ["release"]
