"""Rollouts of a target, followed and reported, never made: the backend tells the declared
version against what runs (:class:`backends.base.Rollout`, a Kubernetes Deployment's pod
template against its pods); when the declared one changes (a new image applied by Flux or by
hand), it is told (``rollout <target>: declared <image>, running <image>``), and once every pod
asked for runs it and the target is ready through its own readiness probe (weights resident),
verified (``verified: rollout complete, /readyz 200, <n> of <n> pods``). A target scaled to
zero is verified at its next cold start. A rollout that does not converge within
``scaling.rollout_timeout`` of pods running for it is told once, and counted
(``warmgate_rollout_failures_total``).

It follows the backend's observations and the target's state cell; it writes neither.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from prometheus_client import Counter

from backends.base import Observation, Rollout
from router.scale.state import Phase, TargetState

log = logging.getLogger("warmgate.rollout")


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 60}m" if s >= 60 and s % 60 == 0 else f"{s}s"


class RolloutWatch:
    def __init__(
        self,
        name: str,
        loop: asyncio.AbstractEventLoop,
        timeout: float,
        failures: Counter,
        probe: str,
    ) -> None:
        """``failures``: the target's ``warmgate_rollout_failures_total`` child; ``probe``: the
        readiness path its verification names."""
        self.name = name
        self.loop = loop
        self.timeout = timeout
        self.failures = failures
        self.probe = probe
        self.declared: str | None = None
        """The declared version last seen (``None``: none seen yet)."""
        self.following: str | None = None
        """A declared version not verified yet."""
        self.last: Rollout | None = None
        self.state: TargetState | None = None
        self.listeners: list[Callable[[str], None]] = []
        """Told each report, in words (the dashboard's ``rollout`` events)."""
        self._deadline: asyncio.TimerHandle | None = None
        self._late = False

    def observed(self, observation: Observation) -> None:
        """The backend's view changed."""
        r = observation.rollout
        if r is None:
            return
        self.last = r
        if self.declared is None:  # first sight: a rollout under way is followed, else a baseline
            self.declared = r.declared
            if r.replicas > 0 and r.running and r.running != r.declared:
                self._follow(r, r.running)
        elif r.declared != self.declared:
            previous, self.declared = self.declared, r.declared
            self._follow(r, r.running or previous)
        self._check()

    def on_state(self, old: TargetState, new: TargetState) -> None:
        """A state cell's listener: a target ready (again) may verify what it follows."""
        self.state = new
        if new.phase is Phase.READY and old.phase is not Phase.READY:
            self._check()

    def _follow(self, r: Rollout, running: str) -> None:
        self.following, self._late = r.declared, False
        self._disarm()
        if r.replicas == 0:
            self._say(
                f"declared {r.declared}, running {running or '-'} "
                "(scaled to zero: verified at its next cold start)"
            )
        else:
            self._say(f"declared {r.declared}, running {running or '-'}")

    def _check(self) -> None:
        r, state = self.last, self.state
        if self.following is None or r is None or r.declared != self.following:
            return
        ready = state is not None and state.phase is Phase.READY
        if r.settled and ready:
            late = " (after the rollout timeout)" if self._late else ""
            self._say(
                f"verified: rollout complete{late}, {self.probe} 200, "
                f"{r.ready} of {r.replicas} pods"
            )
            self.following = None
            self._disarm()
        elif r.replicas > 0 and self._deadline is None and not self._late:
            self._deadline = self.loop.call_later(self.timeout, self._timed_out)

    def _timed_out(self) -> None:
        self._deadline = None
        r = self.last
        if self.following is None or r is None:
            return
        self._late = True
        self.failures.inc()
        self._say(
            f"not converged within {_duration(self.timeout)}: declared {r.declared}, "
            f"running {r.running or '-'}, {r.ready} of {r.replicas} pods on it"
        )

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _say(self, words: str) -> None:
        text = f"rollout {self.name}: {words}"
        log.info("%s", text)
        for listener in self.listeners:
            try:
                listener(text)
            except Exception:  # a listener never breaks the follower
                log.exception("%s: a rollout listener failed", self.name)

    def close(self) -> None:
        self._disarm()
