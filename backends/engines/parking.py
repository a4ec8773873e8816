"""Parking an engine: its weights leave the GPU, its process (or pod) stays (docs/pools.md).

Every park action is a few HTTP requests to the engine, spelled as
:class:`backends.specs.ParkRequests`: the config's own (``park: {request, wake, parked}``), or
the engine kind's for ``park: auto`` (ComfyUI's ``POST /free``, vLLM's sleep mode).
:class:`Parker` makes them; :class:`backends.engines.common.EngineBase` offers it to the router
as :class:`backends.base.Parkable`. Errors are translated here into
:class:`backends.base.ParkError`.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp

from backends.base import ParkError
from backends.specs import EngineCall, ParkedCheck, ParkRequests

log = logging.getLogger("warmgate.engine")

CHECK_TIMEOUT = 10.0
"""Seconds for one ``parked`` question: the engine answers it from memory."""


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return str(exc) or type(exc).__name__


async def call(client: aiohttp.ClientSession, base_url: str, spec: EngineCall) -> None:
    """Make one engine call; any answer but a 2xx, or none in time, is a :class:`ParkError`."""
    kwargs: dict[str, Any] = {} if spec.json_body is None else {"json": spec.json_body}
    timeout = aiohttp.ClientTimeout(total=spec.timeout)
    try:
        async with client.request(
            spec.method, base_url + spec.path, timeout=timeout, allow_redirects=False, **kwargs
        ) as reply:
            text = await reply.text(errors="replace")
            status = reply.status
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        raise ParkError(f"{spec.method} {spec.path}: {_why(exc)}") from exc
    if not 200 <= status < 300:
        raise ParkError(f"{spec.method} {spec.path} answered {status}: {text.strip()[:200]}")


async def ask_parked(
    client: aiohttp.ClientSession, base_url: str, check: ParkedCheck
) -> bool | None:
    """The engine's answer to ``GET check.path`` at ``check.json_key``; ``None`` without one."""
    timeout = aiohttp.ClientTimeout(total=CHECK_TIMEOUT)
    try:
        async with client.get(
            base_url + check.path, timeout=timeout, allow_redirects=False
        ) as reply:
            if reply.status != 200:
                await reply.read()
                return None
            body = await reply.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return None
    value = body.get(check.json_key) if isinstance(body, dict) else None
    return value if isinstance(value, bool) else None


class Parker:
    """Parks and wakes one engine kind's workloads with the requests of ``spec``."""

    def __init__(self, name: str, spec: ParkRequests) -> None:
        self.name = name
        """The engine kind, for the log."""
        self.spec = spec

    async def park(self, client: aiohttp.ClientSession, base_url: str) -> None:
        request = self.spec.request
        log.info("%s at %s: parking (%s %s)", self.name, base_url, request.method, request.path)
        await call(client, base_url, request)
        if await self.is_parked(client, base_url) is False:
            check = self.spec.parked.path if self.spec.parked is not None else "?"
            raise ParkError(
                f"{request.method} {request.path} answered, but {check} says it is not parked"
            )

    async def wake(self, client: aiohttp.ClientSession, base_url: str) -> None:
        wake = self.spec.wake
        if wake is None:
            log.info("%s at %s: waking (it loads on its next request)", self.name, base_url)
            return
        log.info("%s at %s: waking (%s %s)", self.name, base_url, wake.method, wake.path)
        await call(client, base_url, wake)

    async def is_parked(self, client: aiohttp.ClientSession, base_url: str) -> bool | None:
        if self.spec.parked is None:
            return None
        return await ask_parked(client, base_url, self.spec.parked)
