"""Which flags each control-plane binary takes, by its version (Kubernetes 1.20 to current).

Pure functions, tested without the binaries (tests/kube/test_flags.py). Flags that every version
from 1.20 on accepts stay in cluster.py; only the ones that came or went are chosen here."""

from __future__ import annotations

import re
from dataclasses import dataclass

OLDEST = (1, 20)


@dataclass(frozen=True, order=True)
class KubeVersion:
    major: int
    minor: int
    patch: int = 0
    text: str = ""
    """As the binary says it (``v1.20.2``), for messages and for the server's /version."""

    @classmethod
    def parse(cls, said: str) -> KubeVersion:
        """From ``kube-apiserver --version`` (``Kubernetes v1.36.2``) or a ``gitVersion``."""
        m = re.search(r"v?(\d+)\.(\d+)(?:\.(\d+))?\S*", said)
        if m is None:
            raise ValueError(f"no Kubernetes version in {said!r}")
        return cls(int(m[1]), int(m[2]), int(m[3] or 0), m[0] if m[0][0] == "v" else f"v{m[0]}")

    def at_least(self, major: int, minor: int) -> bool:
        return (self.major, self.minor) >= (major, minor)


def apiserver_flags(version: KubeVersion, advertise_address: str | None) -> list[str]:
    flags = []
    if not version.at_least(1, 24):
        # Insecure serving is off only when asked before 1.24; the flag is gone from 1.24.
        flags.append("--insecure-port=0")
    if advertise_address is not None:
        # The `kubernetes` Service's endpoint: with pods on a pod network in a network
        # namespace, the API server has no other interface to take an address from.
        flags.append(f"--advertise-address={advertise_address}")
    return flags


def controller_manager_flags(version: KubeVersion) -> list[str]:
    # Its insecure port is off by default from 1.22 and the flag is gone from 1.24.
    return [] if version.at_least(1, 22) else ["--port=0"]


def scheduler_flags(version: KubeVersion) -> list[str]:
    # The same for the scheduler, whose --port is a no-op from 1.23 and then removed.
    return [] if version.at_least(1, 22) else ["--port=0"]


def makes_token_secrets(version: KubeVersion) -> bool:
    """Whether the controller-manager makes a token Secret for every ServiceAccount (until
    1.24); after that, tokens come only from the TokenRequest API."""
    return not version.at_least(1, 24)


def pdb_api_version(served: set[str]) -> str:
    """policy/v1 where served (1.21+), else policy/v1beta1 (removed in 1.25)."""
    return "policy/v1" if "policy/v1" in served else "policy/v1beta1"
