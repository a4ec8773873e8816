"""People of a trace (``warmgate simulate``'s format) replayed through warmgate's public listener
as a browser and the API clients do, on a compressed clock, and what they met.

- a ``page`` is a browser opening the UI: a navigation; on a cold target warmgate answers the
  waiting page (503, ``Retry-After``) and the page asks again until the UI itself answers 200:
  the time to the UI, and a cold start met;
- a ``render`` is ComfyUI's ``POST /prompt``: warmgate holds it through a cold start; the time to
  its response's first byte (headers), and a cold start met when ``X-Warmgate-Cold-Start`` says so.

Anything else (a 5xx that is not the waiting page, a connection broken, no UI within the bound)
is a request lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from router.simulate.trace import Request

PAGE = {"Accept": "text/html,application/xhtml+xml", "Sec-Fetch-Mode": "navigate"}
GIVE_UP = 180.0
"""Seconds a person waits for the UI before the request counts as lost."""


def prompt(seed: int) -> dict[str, object]:
    """ComfyUI's default text-to-image workflow in API format, small."""
    return {
        "3": {"class_type": "KSampler", "inputs": {"seed": seed, "steps": 2, "positive": ["6", 0],
              "negative": ["7", 0], "model": ["4", 0], "latent_image": ["5", 0]}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "demo.safetensors"}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 32, "height": 32,
              "batch_size": 1}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red fox", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "d", "images": ["8", 0]}},
    }  # fmt: skip


@dataclass
class Met:
    """One request's outcome (seconds are compressed, as measured)."""

    target: str
    kind: str
    at: float
    """When it was sent (wall clock, ``time.time()``)."""
    wait: float
    """To the UI (a page) or to the first byte (a render)."""
    cold: bool
    lost: str | None = None
    """Why it was lost (``None``: answered)."""


@dataclass
class People:
    url: str
    compression: float
    met: list[Met] = field(default_factory=list)

    async def replay(self, trace: Sequence[Request], began: float | None = None) -> None:
        """Every request at its time (``at / compression`` after ``began``, wall clock)."""
        began = time.time() if began is None else began
        timeout = aiohttp.ClientTimeout(total=GIVE_UP, sock_connect=10)
        connector = aiohttp.TCPConnector(limit=0)
        async with (
            aiohttp.ClientSession(timeout=timeout, connector=connector) as http,
            asyncio.TaskGroup() as tasks,
        ):
            for i, r in enumerate(trace):
                await asyncio.sleep(max(0.0, began + r.at / self.compression - time.time()))
                tasks.create_task(self._one(http, r, i))

    async def _one(self, http: aiohttp.ClientSession, r: Request, seed: int) -> None:
        target, at = r.target or "", time.time()
        try:
            if r.kind == "page":
                cold = await self._page(http, target, at)
                wait = time.time() - at
            else:
                cold, wait = await self._render(http, target, seed, at)
            self.met.append(Met(target, r.kind, at, wait, cold))
        except (aiohttp.ClientError, TimeoutError, _Lost) as e:
            why = f"{type(e).__name__}: {e}"
            self.met.append(Met(target, r.kind, at, time.time() - at, False, why))

    async def _page(self, http: aiohttp.ClientSession, target: str, at: float) -> bool:
        """The waiting page, then the UI: whether the first answer was the waiting page."""
        first = True
        while True:
            async with http.get(f"{self.url}/{target}/", headers=PAGE) as resp:
                await resp.read()
                if resp.status == 200:
                    return not first
                if resp.status != 503 or "Retry-After" not in resp.headers:
                    raise _Lost(f"page answered {resp.status}")
            first = False
            if time.time() - at > GIVE_UP:
                raise _Lost("no UI within the bound")
            await asyncio.sleep(0.25)  # the waiting page polls every ~second; a bit sooner here

    async def _render(
        self, http: aiohttp.ClientSession, target: str, seed: int, at: float
    ) -> tuple[bool, float]:
        """Whether it met a cold start, and the time to its first byte (the headers)."""
        body = {"prompt": prompt(seed), "client_id": f"day-{seed}"}
        async with http.post(f"{self.url}/{target}/prompt", json=body) as resp:
            first_byte = time.time() - at
            cold = float(resp.headers.get("X-Warmgate-Cold-Start") or 0) > 0
            await resp.read()
            if resp.status != 200:
                raise _Lost(f"render answered {resp.status}")
            return cold, first_byte


class _Lost(Exception):
    pass
