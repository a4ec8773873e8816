"""The configuration file: typed, frozen groups, one per concern, and their loading.

Every field says its unit and why its default was chosen. ``load_config`` is the only way in; a
bad file raises :class:`ConfigError` naming the file, the key path and what was expected.
"""

from router.config.api import (
    ApiSettings,
    CloudSpec,
    Cost,
    ModelSpec,
    Placement,
    Policy,
    PrivateRule,
)
from router.config.economics import Economics
from router.config.env import Environment, read_environment
from router.config.load import load_config, parse_config
from router.config.root import Config, HostPort, ServerSettings, logged_path
from router.config.targets import Limits, Route, Scaling, Target, Timeouts, Waiting

__all__ = [
    "ApiSettings",
    "CloudSpec",
    "Config",
    "Cost",
    "Economics",
    "Environment",
    "HostPort",
    "Limits",
    "ModelSpec",
    "Placement",
    "Policy",
    "PrivateRule",
    "Route",
    "Scaling",
    "ServerSettings",
    "Target",
    "Timeouts",
    "Waiting",
    "load_config",
    "logged_path",
    "parse_config",
    "read_environment",
]
