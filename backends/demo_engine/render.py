"""Procedural "diffusion": a plasma image derived from prompt, seed and the model's weights.

The picture is a sum of sines whose frequencies, phases and palette come from a hash, so the
same prompt and seed always give the same PNG. Each row is built with `bytes.translate`, which
keeps even 2048x2048 renders cheap. A render spreads over a fixed wall-clock budget in steps;
early previews are posterized and sharpen as steps advance, like a sampler converging.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from .png import encode_rgb

PREVIEW_SIDE = 64
"""Longest side of preview frames, in pixels; small like ComfyUI's latent previews."""

StepCallback = Callable[[int, int, bytes | None], Awaitable[None]]
"""Called after each step with (step, total, preview PNG or None)."""


@dataclass(frozen=True, slots=True)
class RenderSpec:
    """What to draw: everything that influences the pixels."""

    text: str
    seed: int
    steps: int
    width: int
    height: int
    salt: bytes = b""
    """A few bytes of checkpoint weights, so the "model" shapes the image."""

    def digest(self) -> bytes:
        h = hashlib.blake2b(digest_size=64)
        for part in (self.text.encode(), str(self.seed).encode(), self.salt):
            h.update(len(part).to_bytes(4, "big"))
            h.update(part)
        return h.digest()


_SHIFT = [bytes((i + k) & 255 for i in range(256)) for k in range(256)]
"""_SHIFT[k] maps byte i to (i + k) mod 256: adds a constant to a whole row in one translate."""
_RANGES = ((0.5, 4.0), (0.0, 2 * math.pi), (2.0, 7.0), (0.0, 2 * math.pi))
"""(low, high) for each wave parameter: frequency a, phase a, frequency b, phase b."""


def _wave(n: int, freq_a: float, phase_a: float, freq_b: float, phase_b: float) -> list[int]:
    """n samples in 0..255 of two summed sines over one normalised axis."""
    out = []
    for i in range(n):
        t = (i + 0.5) / n * 2 * math.pi
        v = math.sin(t * freq_a + phase_a) + 0.6 * math.sin(t * freq_b + phase_b)
        out.append(int((v + 1.6) / 3.2 * 255) & 255)
    return out


def _param(d: bytes, i: int, lo: float, hi: float) -> float:
    return lo + (hi - lo) * d[i] / 255


def _palette(d: bytes, offset: int, levels: int) -> bytes:
    """256-entry channel lookup, quantised to `levels` steps of the palette index."""
    freq = 1 + d[offset] % 2  # whole periods over 256 entries, so the index may wrap seamlessly
    phase = _param(d, offset + 1, 0, 2 * math.pi)
    gain = _param(d, offset + 2, 90, 127)
    step = 256 // levels
    table = []
    for i in range(256):
        q = (i // step) * step + step // 2
        table.append(int(128 + gain * math.sin(q / 256 * 2 * math.pi * freq + phase)))
    return bytes(table)


def plasma_rows(spec: RenderSpec, width: int, height: int, levels: int = 256) -> Iterator[bytes]:
    """Rows of RGB bytes for the spec's image at the given size and palette depth."""
    d = spec.digest()
    channels = []
    for c in range(3):
        base = c * 16
        xs = _wave(width, *(_param(d, base + i, lo, hi) for i, (lo, hi) in enumerate(_RANGES)))
        ys = _wave(height, *(_param(d, base + 4 + i, lo, hi) for i, (lo, hi) in enumerate(_RANGES)))
        channels.append((bytes(xs), ys, _palette(d, base + 8, levels)))
    row = bytearray(width * 3)
    for y in range(height):
        for c, (xs_row, ys, pal) in enumerate(channels):
            row[c::3] = xs_row.translate(_SHIFT[ys[y]]).translate(pal)
        yield bytes(row)


def final_png(spec: RenderSpec) -> bytes:
    """The finished image at full size."""
    return encode_rgb(spec.width, spec.height, plasma_rows(spec, spec.width, spec.height))


def preview_size(width: int, height: int) -> tuple[int, int]:
    scale = PREVIEW_SIDE / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def preview_png(spec: RenderSpec, step: int, total: int) -> bytes:
    """A small, posterised frame: 2 palette levels at the first step, 256 at the last."""
    w, h = preview_size(spec.width, spec.height)
    levels = 1 << max(1, min(8, round(1 + 7 * step / max(1, total))))
    return encode_rgb(w, h, plasma_rows(spec, w, h, levels), level=1)


def preview_every(steps: int) -> int:
    """Send a preview every this many steps: about eight per render, always at least one."""
    return max(1, steps // 8)


async def render(spec: RenderSpec, seconds: float, on_step: StepCallback) -> bytes:
    """Spend `seconds` of loop time over `spec.steps` steps, reporting each; return the PNG."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    every = preview_every(spec.steps)
    for step in range(1, spec.steps + 1):
        await asyncio.sleep(max(0.0, started + seconds * step / spec.steps - loop.time()))
        preview = preview_png(spec, step, spec.steps) if step % every == 0 else None
        await on_step(step, spec.steps, preview)
    return await asyncio.to_thread(final_png, spec)
