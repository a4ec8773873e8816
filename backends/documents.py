"""State documents as every store keeps them: one JSON object, at most :data:`MAX_DOCUMENT`
bytes, encoded and decoded here only (a file under ``state_dir``, a Deployment's annotation and
a ConfigMap's key alike).

What a store reads back came from outside (whoever can write ``state_dir`` or annotate the
Deployment wrote it too): :func:`decode` refuses it whole, with one warning that names it and
says why in one line, when it is too large, not JSON or nested too deep. Its values are each
reader's to check (NaN, infinities, 1e400, huge integers, bools: :mod:`backends.outside`).

Where documents are kept is a :class:`StateStore`: files under ``state_dir``
(:class:`router.scale.persist.FileStore`), or a backend's own place (:class:`KeepsState`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol, runtime_checkable

from backends.outside import one_line

log = logging.getLogger("warmgate.state")

MAX_DOCUMENT: Final = 1024 * 1024
"""Bytes a state document may have, at most (1 MiB). The largest warmgate writes is a target's
day (``timeline``: at most 1,500 changes and 500 marks, about 100 kB); 1 MiB is also what the
API server keeps in one ConfigMap. A larger one was not written by warmgate: it is not read (a
1 GiB file would cost its size and more in memory at every start)."""


class Refused(ValueError):
    """A document that is not one warmgate wrote; its message is the why."""


class Unreadable(Refused):
    """Not JSON at all (or not UTF-8): damaged, or never a document."""


def parse(raw: str | bytes) -> dict[str, Any]:
    """``raw`` as a JSON object; :class:`Refused` with the why otherwise."""
    if len(raw) > MAX_DOCUMENT:
        raise Refused(f"larger than {MAX_DOCUMENT} bytes")
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")  # a lone surrogate is then invalid UTF-8
        if len(raw) > MAX_DOCUMENT:
            raise Refused(f"larger than {MAX_DOCUMENT} bytes")
    try:
        document = json.loads(raw)
    except RecursionError:
        raise Refused("nested too deep") from None
    except ValueError as exc:  # JSON, UTF-8, or an integer of more digits than int() takes
        raise Unreadable(str(exc)) from None
    if not isinstance(document, dict):
        raise Refused("expected a JSON object")
    return document


def decode(raw: str | bytes, where: str) -> dict[str, Any] | None:
    """A stored document, or ``None`` (with one warning naming ``where``) when :func:`parse`
    refuses it: relearned, never a failed start."""
    try:
        return parse(raw)
    except Refused as exc:
        refused(where, str(exc), unreadable=isinstance(exc, Unreadable))
        return None


def refused(where: str, why: str, *, unreadable: bool = False) -> None:
    """The one warning of a document ignored: which one and why, each one line."""
    kind = "unreadable state" if unreadable else "state"
    log.warning("ignoring %s %s: %s", kind, one_line(where), one_line(why))


def decode_kept(raw: object, where: str) -> dict[str, Any] | None:
    """A document kept as text beside others (a Deployment's annotation, a ConfigMap's key):
    ``None`` where there is none, else :func:`decode`'s."""
    return None if raw is None else decode(str(raw), where)


def decode_all(
    kept: Mapping[str, object], prefix: str, name_of: Callable[[str], str]
) -> dict[str, dict[str, Any]]:
    """The documents of ``kept`` (text by key) whose keys start with ``prefix``, by key; one
    that :func:`decode` refuses is left out, its warning naming it by ``name_of(key)``."""
    found = {}
    for key, raw in kept.items():
        if key.startswith(prefix) and (document := decode(str(raw), name_of(key))) is not None:
            found[key] = document
    return found


def encode(document: Mapping[str, Any]) -> str:
    """Compact and sorted; a non-finite number is a ``ValueError`` (it would not read back)."""
    return json.dumps(document, separators=(",", ":"), sort_keys=True, allow_nan=False)


# -- where documents are kept ----------------------------------------------------------------


class StateStore(Protocol):
    """Small JSON documents, by key, that outlive warmgate's process: learned cold-start
    figures, the day's cloud spend. Keys are short names (``cold-start``, ``budget``).
    ``load`` never raises nor blocks the loop: a document missing or unreadable is ``None`` (an
    unreadable one is logged as a warning, :func:`decode`); ``save`` raises
    :class:`backends.base.BackendError` when it could not store it."""

    @property
    def where(self) -> str:
        """Where the documents are kept, for messages."""
        ...

    def name_of(self, key: str) -> str:
        """Where the document ``key`` is kept (a file, an annotation), for messages."""
        ...

    async def load(self, key: str) -> dict[str, Any] | None: ...

    async def load_all(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Every readable document whose key starts with ``prefix``, by key."""
        ...

    async def save(self, key: str, document: Mapping[str, Any]) -> None: ...


@runtime_checkable
class KeepsState(Protocol):
    """What a backend (or a :class:`backends.membership.Membership`) that keeps warmgate's state
    in its own place offers: the Kubernetes backend on its Deployment, the replicas in a
    ConfigMap. Optional; ask through :func:`own_store`."""

    def state_store(self) -> StateStore | None: ...


def own_store(thing: object) -> StateStore | None:
    """``thing``'s own :class:`StateStore`, or ``None`` (the router keeps a file instead)."""
    return thing.state_store() if isinstance(thing, KeepsState) else None
