"""``engine: http``: any HTTP service. Ready when the configured path answers 200; busy only
through traffic (in-flight requests and live streams, which the router counts itself)."""

from __future__ import annotations

import aiohttp

from backends.base import RequestFacts
from backends.specs import Readiness


class HttpEngine:
    def __init__(self, readiness: Readiness, wake_on: str = "any") -> None:
        self.readiness = readiness
        self.wake_on = wake_on
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.readiness.timeout),
                connector=aiohttp.TCPConnector(limit=4, force_close=True),
                auto_decompress=False,
            )
        return self._session

    async def get_ok(self, base_url: str, path: str) -> bool:
        try:
            async with self._client().get(base_url + path, allow_redirects=False) as response:
                await response.read()
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def probe_ready(self, base_url: str) -> bool:
        return await self.get_ok(base_url, self.readiness.path)

    async def busy(self, base_url: str) -> bool:
        return False

    def wakes(self, facts: RequestFacts) -> bool:
        if facts.is_websocket or self.wake_on == "none":
            return False
        if self.wake_on == "navigation":
            return facts.is_navigation or facts.method not in ("GET", "HEAD", "OPTIONS")
        return True

    def stream_is_activity(self, path: str) -> bool:
        return True

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
