"""The admin listener's own settings (``admin:``): who may act on the dashboard."""

from __future__ import annotations

from backends.specs import Frozen


class AdminSettings(Frozen):
    token_file: str | None = None
    """A file holding the bearer token that allows the dashboard's actions (``POST
    /targets/<name>/wake|park|release``), relative to the config file; read once, at start.
    Omitted (the default): the dashboard is read-only and the actions answer 403."""
