"""Who is asking, and whether their work is private; the cloud API keys.

Client API keys come from ``api.api_keys_file``; cloud API keys from the environment as the
config carries it (``router.config.env`` reads it). Keys are compared by digest and never logged.

The private rule fails closed: a header value that is not plainly false, or any trouble while
evaluating the rule, makes the request private.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from multidict import CIMultiDictProxy

from router.config import CloudSpec, Config, Environment, PrivateRule
from router.errors import ConfigError

log = logging.getLogger("warmgate.api")

_FALSE = frozenset({"0", "false", "no", "off"})


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Client:
    """An authenticated caller: the key's name (the file's first column) and the key's digest."""

    name: str | None
    digest: str | None


@dataclass(frozen=True, slots=True)
class ClientKeys:
    names: Mapping[str, str]
    """Key digest -> name."""
    required: bool

    def identify(self, authorization: str | None) -> Client | None:
        """The caller, or ``None`` when keys are required and this one is missing or unknown."""
        key = None
        if authorization:
            scheme, _, value = authorization.strip().partition(" ")
            if scheme.lower() == "bearer" and value.strip():
                key = value.strip()
        if key is None:
            return None if self.required else Client(None, None)
        digest = _digest(key)
        name = self.names.get(digest)
        if name is None and self.required:
            return None
        return Client(name, digest)


def load_client_keys(config: Config) -> ClientKeys:
    path = config.api.api_keys_file
    if path is None:
        return ClientKeys({}, required=False)
    file = Path(config.base_dir, path)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(config.source, [("api.api_keys_file", str(exc.strerror))]) from exc
    names: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        if len(parts) > 2:
            where = f"api.api_keys_file ({file.name} line {number})"
            raise ConfigError(config.source, [(where, "expected 'key' or 'name key'")])
        name, key = (parts[0], parts[1]) if len(parts) == 2 else (f"key{number}", parts[0])
        names[_digest(key)] = name
    if not names:
        raise ConfigError(config.source, [("api.api_keys_file", f"{file} lists no keys")])
    return ClientKeys(names, required=True)


@dataclass(frozen=True, slots=True)
class Privacy:
    """``policy.private``, prepared: key names and key digests that make a request private."""

    header: str
    names: frozenset[str]
    digests: frozenset[str]

    @classmethod
    def from_rule(cls, rule: PrivateRule) -> Privacy:
        keys = frozenset(rule.api_keys)
        return cls(rule.header, keys, frozenset(_digest(k) for k in keys))

    def reason(self, headers: CIMultiDictProxy[str], client: Client) -> str | None:
        """Why this request is private (``header``, ``api_key``, ``unevaluable``), or ``None``."""
        try:
            for value in headers.getall(self.header, ()):
                if value.strip().lower() not in _FALSE:
                    return "header"
            if client.name is not None and client.name in self.names:
                return "api_key"
            if client.digest is not None and client.digest in self.digests:
                return "api_key"
            return None
        except Exception:  # fail closed: a rule that cannot be evaluated keeps the work inside
            log.exception("the private rule could not be evaluated; the request is private")
            return "unevaluable"


def cloud_api_keys(clouds: Mapping[str, CloudSpec], environment: Environment) -> dict[str, str]:
    """Cloud name -> API key, for the clouds whose variable is set; the others are logged."""
    keys: dict[str, str] = {}
    for name, spec in clouds.items():
        value = environment.api_key(spec.api_key_env)
        if value:
            keys[name] = value
        else:
            log.warning(
                "cloud %r: %s is not set; its placements are skipped", name, spec.api_key_env
            )
    return keys
