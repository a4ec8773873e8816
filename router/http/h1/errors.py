"""How an exchange with an upstream fails; router.http.failures translates these into
warmgate's error tree (router.errors)."""

from __future__ import annotations


class UpstreamFailure(Exception):
    """An exchange with the upstream failed."""


class ConnectFailed(UpstreamFailure):
    """The TCP (or TLS) connection could not be opened."""


class ConnectTimedOut(UpstreamFailure, TimeoutError):
    """The connection was not open within the connect timeout."""


class HeadTimedOut(UpstreamFailure, TimeoutError):
    """No response head within the response-headers timeout."""


class ConnectionBroken(UpstreamFailure):
    """The upstream closed, reset, or sent something that is not HTTP/1.x."""
