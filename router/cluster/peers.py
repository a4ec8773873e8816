"""The other warmgate replicas as this one hears them: a record for each one listed, read over
HTTP (``GET /replicas/activity`` on its admin listener) and posted to (fences, reports).

A replica that answers nonsense is a silent replica; a read that fails never ends the reading
of the others. What an answer says is taken in by the caller's ``on_answer``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiohttp

from backends.membership import Membership, Peer
from backends.outside import Refused
from router.cluster.combine import PeerRecord, word_from_json

log = logging.getLogger("warmgate.replicas")

REQUEST_TIMEOUT = 2.0
"""Seconds one read of a peer, a fence or a report may take."""


class Peers:
    def __init__(
        self,
        membership: Membership,
        forget_after: float,
        on_answer: Callable[[str, Mapping[str, Any]], None],
        token: str | None = None,
        on_refused: Callable[[str], None] = lambda field: None,
    ) -> None:
        self.membership = membership
        self.forget_after = forget_after
        """Seconds after which a replica no longer listed and not heard is forgotten."""
        self.on_answer = on_answer
        """Called with (replica, answer) for every answer, before its words are taken; raises
        on nonsense (the answer is then no answer)."""
        self.on_refused = on_refused
        """Called with the field's name when an answer is no answer for a number in it."""
        self.records: dict[str, PeerRecord] = {}
        self._token = token
        """The replicas' shared token, sent as ``Authorization: Bearer`` with every request."""
        self._session: aiohttp.ClientSession | None = None

    @property
    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def open(self, poll_interval: float) -> None:
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=min(REQUEST_TIMEOUT, poll_interval * 2)),
            headers=headers,
            trust_env=False,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def answered(self, name: str) -> bool:
        """The replica of that name has answered this one (since it was last listed anew)."""
        record = self.records.get(name)
        return record is not None and record.last_contact is not None

    def sync(self) -> list[str]:
        """Records for the replicas listed now (new ones start unheard); returns their names."""
        now = self.now
        listed = {peer.name: peer for peer in self.membership.peers()}
        for name, peer in listed.items():
            record = self.records.get(name)
            if record is None or record.peer != peer:
                self.records[name] = PeerRecord(peer, first_seen=now)
            else:
                record.listed = True
        for name, record in list(self.records.items()):
            if name not in listed:
                record.listed = False
                if now - record.heard_at > self.forget_after:
                    del self.records[name]
        return list(listed)

    async def read_all(self) -> None:
        """Read every listed replica once, at the same time; forget long-gone ones."""
        listed = self.sync()
        await asyncio.gather(*(self._read(self.records[name]) for name in listed))

    def counts(self) -> tuple[int, int]:
        """Replicas (listed and answering, not answering)."""
        records = self.records.values()
        reachable = sum(r.reachable for r in records if r.listed)
        return reachable, sum(not r.reachable for r in records)

    async def _read(self, record: PeerRecord) -> None:
        assert self._session is not None
        try:
            async with self._session.get(record.peer.url + "/replicas/activity") as resp:
                resp.raise_for_status()
                body = await resp.json()
            self._heard(record, body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # refused, timed out, or an answer that makes no sense
            if isinstance(exc, Refused):
                self.on_refused(exc.field)
            if record.reachable or record.error is None:
                log.warning("replica %s not answering: %r", record.peer.name, exc)
            record.reachable, record.error = False, repr(exc)

    def _heard(self, record: PeerRecord, body: Any) -> None:
        now = self.now
        targets = body.get("targets") if isinstance(body, dict) else None
        if not isinstance(targets, dict):
            raise ValueError("expected {'targets': {...}}")
        self.on_answer(record.peer.name, body)
        record.leader = body.get("leader") is True
        record.words = {
            name: word_from_json(data, now)
            for name, data in targets.items()
            if isinstance(data, dict)
        }
        if not record.reachable and record.error is not None:
            log.info("replica %s answers again", record.peer.name)
        record.last_contact, record.reachable, record.error = now, True, None

    def heard_from(self, body: Any) -> bool:
        """A report another replica pushed; False when it could not be taken (not listed yet:
        the next read finds it; or nonsense)."""
        name = body.get("replica") if isinstance(body, dict) else None
        record = self.records.get(str(name)) if name else None
        if record is None and name:
            self.sync()  # listed since the last read
            record = self.records.get(str(name))
        if record is None:
            return False
        try:
            self._heard(record, body)
        except Refused as refused:
            self.on_refused(refused.field)
            return False
        except Exception:
            return False
        return True

    async def post(self, peer: Peer, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST to one replica's admin listener: its answer (a JSON object), or ``None``."""
        if self._session is None:
            return None
        try:
            async with self._session.post(peer.url + path, json=body) as resp:
                resp.raise_for_status()
                answer = await resp.json()
                return answer if isinstance(answer, dict) else None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            log.warning("replica %s: POST %s failed: %r", peer.name, path, exc)
            return None

    async def post_all(
        self, peers: Iterable[Peer], path: str, body: dict[str, Any]
    ) -> list[dict[str, Any] | None]:
        return list(await asyncio.gather(*(self.post(peer, path, body) for peer in peers)))
