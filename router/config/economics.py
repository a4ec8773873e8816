"""``economics:``: what an hour of GPU and a minute of someone's wait cost, for the idle policy
that learns (``idle_after: auto``) and for ``warmgate simulate``'s totals (docs/simulate.md)."""

from __future__ import annotations

from typing import Annotated

from backends.specs import Frozen
from backends.units import MAX_USD, real


class Economics(Frozen):
    """The prices the idle policy weighs against each other. Only their ratio moves
    ``idle_after: auto``: one cold start that makes a person wait ``w`` seconds is worth
    ``w * cold_wait_usd_per_second / gpu_hour_usd`` hours of a warm, idle GPU."""

    gpu_hour_usd: Annotated[float, real(0, MAX_USD, above=True)] = 2.0
    """USD one GPU-hour held costs: the cloud's hourly price of the card, or, on your own cards,
    what an hour of the batch queue is worth to you. 2.0: about a rented data-center GPU."""
    cold_wait_usd_per_second: Annotated[float, real(0, MAX_USD)] = 0.01
    """USD one second of a person waiting for a cold start (or a wake) costs: about their
    hourly cost divided by 3600. 0.01: 36 USD an hour."""

    parked_hour_usd: Annotated[float, real(0, MAX_USD)] = 0.2
    """USD one hour parked costs (the engine's weights off the GPU, its process or pod kept:
    host memory, and on a card the scheduler gave it whole, the card itself). 0.2: a tenth of
    the default GPU-hour, for a workstation or a shared card whose VRAM the others use; set it
    to ``gpu_hour_usd`` where parking frees no GPU. Moves ``park_after: auto`` and
    ``idle_after: auto`` of a target that parks, and ``warmgate simulate``'s totals."""

    @property
    def gpu_second_usd(self) -> float:
        return self.gpu_hour_usd / 3600.0

    @property
    def parked_second_usd(self) -> float:
        return self.parked_hour_usd / 3600.0
