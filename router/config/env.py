"""The environment: every variable warmgate reads, read here and nowhere else.

:func:`read_environment` takes one snapshot of a mapping (``os.environ`` unless one is given, so
tests inject their own) when the configuration is loaded; the :class:`Environment` is carried on
the :class:`~router.config.root.Config` (never serialized) and its plain values are handed down:
the log level to the command line, a cloud's API key to the OpenAI API, the Kubernetes access
variables and the pod's name and address to the backends, the snapshot less warmgate's secrets
(:meth:`Environment.for_children`) to a ``process`` target's child. No other module of
``router/`` or ``backends/`` reads the environment (``router/__init__.py`` only sets a default
for gRPC before it is imported; the demo engine in ``backends/demo_engine/`` is a program of its
own and reads its own).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

LOG_LEVEL = "WARMGATE_LOG_LEVEL"
KUBE_VARIABLES = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "KUBECONFIG", "HOME")
"""What the Kubernetes backend and the replicas find their credentials with: in a pod, the
service host and port (with the ServiceAccount token mounted); else ``KUBECONFIG``'s first file;
else ``$HOME/.kube/config``."""
POD_NAME = "POD_NAME"
POD_IP = "POD_IP"


def _frozen(values: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(values))


@dataclass(frozen=True, slots=True)
class Environment:
    """The variables as they were when the configuration was loaded."""

    log_level: str = "INFO"
    """``WARMGATE_LOG_LEVEL``: the default of ``--log-level``."""
    kube: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    """Those of :data:`KUBE_VARIABLES` that are set (``backends.kubernetes.client.resolve_access``
    reads them)."""
    pod_name: str | None = None
    """``POD_NAME`` (the Downward API): a replica's identity when the config names none."""
    pod_ip: str | None = None
    """``POD_IP`` (the Downward API): keeps a replica from counting itself among its peers."""
    variables: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    """Every variable: where a cloud's ``api_key_env`` is looked up, and, less warmgate's
    secrets (:meth:`for_children`), the base of a ``process`` target's environment (its
    ``env`` is added)."""

    def api_key(self, variable: str) -> str:
        """The value of a cloud's ``api_key_env``, stripped; ``""`` when unset or blank (the
        cloud is then unavailable and its placements skipped)."""
        return self.variables.get(variable, "").strip()

    def for_children(self, names: Collection[str], secrets: Collection[str]) -> Mapping[str, str]:
        """The variables a child process (an engine and its plugins) gets: all but those in
        ``names`` (the clouds' ``api_key_env``) and any whose value, stripped, is one of
        ``secrets`` (the replicas' token, under whatever name it was also put)."""
        return _frozen(
            {
                name: value
                for name, value in self.variables.items()
                if name not in names and value.strip() not in secrets
            }
        )


def read_environment(environ: Mapping[str, str] | None = None) -> Environment:
    """One snapshot of ``environ`` (default: ``os.environ``), resolved."""
    values = _frozen(os.environ if environ is None else environ)
    return Environment(
        log_level=values.get(LOG_LEVEL, "INFO"),
        kube=_frozen({name: values[name] for name in KUBE_VARIABLES if name in values}),
        pod_name=values.get(POD_NAME),
        pod_ip=values.get(POD_IP),
        variables=values,
    )
