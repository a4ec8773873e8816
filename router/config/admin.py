"""The admin listener's own settings (``admin:``): who may act on the dashboard."""

from __future__ import annotations

from pydantic import field_validator

from backends.specs import Frozen


class AdminSettings(Frozen):
    token_file: str | None = None
    """A file holding the bearer token that allows the dashboard's actions (``POST
    /targets/<name>/wake|park|release``), relative to the config file; read once, at start.
    Omitted (the default): the dashboard is read-only and the actions answer 403."""
    allowed_hosts: tuple[str, ...] = ()
    """Host names the admin listener answers to besides the ones always allowed: loopback
    (``localhost``, ``*.localhost``, ``127.0.0.1``, ``::1``) and the address a request came in
    on (a pod's IP, as the kubelet, Prometheus and the other replicas use). Exact names or
    ``*.suffix`` wildcards, such as a Service's DNS name. Any other Host is answered 421: a
    web page whose name is rebound to 127.0.0.1 cannot read /status, /events or /metrics."""

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts_are_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for host in value:
            bare = host[2:] if host.startswith("*.") else host
            if not bare or "*" in bare or "/" in bare or ":" in bare or " " in bare:
                raise ValueError(
                    f"expected a host name or '*.suffix' wildcard without a port, got {host!r}"
                )
        return tuple(h.lower().rstrip(".") for h in value)
