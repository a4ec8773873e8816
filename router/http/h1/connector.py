"""A target's upstream connections, both kinds under one limit: aiohttp's connector (websockets,
engine calls) and warmgate's own pool for forwarded HTTP exchanges (router.http.h1.pool),
configured and closed together; a target's ``aiohttp.ClientSession`` is made on it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import aiohttp
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

from router.http.h1.errors import ConnectTimedOut
from router.http.h1.pool import UpstreamPool

__all__ = ["UpstreamConnector", "pool_of"]


class UpstreamConnector(aiohttp.TCPConnector):
    """aiohttp's connector (websockets, engine calls) plus warmgate's pool for forwarded HTTP
    exchanges, configured and closed together. ``limit`` (0: none) bounds both together: a
    connection aiohttp opens is counted by the pool while it is open (and, under a limit,
    aiohttp keeps none idle, where it would count for nothing)."""

    def __init__(
        self,
        *,
        limit: int = 0,
        keepalive_timeout: float = 4.0,
        queued: Callable[[], AbstractContextManager[object]] | None = None,
        **kwargs: Any,
    ) -> None:
        if limit or keepalive_timeout <= 0:
            super().__init__(limit=0, force_close=True, **kwargs)
        else:
            super().__init__(limit=0, keepalive_timeout=keepalive_timeout, **kwargs)
        self.pool = UpstreamPool(limit=limit, keepalive_timeout=keepalive_timeout, queued=queued)

    async def connect(
        self,
        req: ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 - aiohttp passes it by this name
    ) -> Connection:
        pool = self.pool
        if not pool.limit:
            return await super().connect(req, traces, timeout)
        try:
            await pool.reserve(timeout.sock_connect or timeout.connect)
        except ConnectTimedOut as exc:
            raise aiohttp.ConnectionTimeoutError(str(exc)) from exc
        try:
            conn = await super().connect(req, traces, timeout)
        except BaseException:
            pool.unreserve()
            raise
        conn.add_callback(pool.unreserve)  # called once, when it is released or closed
        return conn

    async def close(self, *, abort_ssl: bool = False) -> None:
        closing = self.pool.close()
        await super().close(abort_ssl=abort_ssl)
        if closing:
            await asyncio.wait([asyncio.ensure_future(c) for c in closing], timeout=5.0)


def pool_of(session: aiohttp.ClientSession) -> UpstreamPool:
    """The forwarding pool of a target's session (made by ``router.app``)."""
    connector = session.connector
    if not isinstance(connector, UpstreamConnector):
        raise TypeError("a target's session must use router.http.h1.connector.UpstreamConnector")
    return connector.pool
