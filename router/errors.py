"""warmgate's one error tree. Library errors are translated at the boundary (``raise ... from``)
and mapped to an HTTP status here, in one place."""

from __future__ import annotations

from collections.abc import Sequence


class WarmgateError(Exception):
    """Base of every error warmgate raises on purpose."""


class ConfigError(WarmgateError):
    """A config file that cannot be used; names the file, each key path and what was expected."""

    def __init__(self, source: str, problems: Sequence[tuple[str, str]]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = [f"{source}: {key}: {what}" for key, what in self.problems]
        super().__init__("\n".join(lines))


class ListenError(WarmgateError):
    """A listener could not be bound (address in use, permission denied)."""


class RequestError(WarmgateError):
    """An error answered to one client. ``status`` and ``code`` go on the wire; the message is
    for people and never carries secrets or upstream internals."""

    status = 500
    code = "internal_error"

    def __init__(
        self, message: str, *, target: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.target = target
        self.retry_after = retry_after


class BadRequest(RequestError):
    status = 400
    code = "bad_request"


class NoRoute(RequestError):
    status = 404
    code = "no_route"


class BodyTooLarge(RequestError):
    status = 413
    code = "body_too_large"


class UpstreamError(RequestError):
    """The upstream refused, reset or broke the exchange."""

    status = 502
    code = "upstream_error"


class Shedding(RequestError):
    """Too much is waiting already; come back later."""

    status = 503
    code = "overloaded"


class TargetFailed(RequestError):
    """The target could not be started (crash loop, bad command): held requests get this."""

    status = 503
    code = "target_failed"


class UpstreamTimeout(RequestError):
    """No response headers within the target's timeout."""

    status = 504
    code = "upstream_timeout"


class HoldTimeout(RequestError):
    """A held request's deadline passed before its target became ready."""

    status = 504
    code = "cold_start_timeout"


class ShuttingDown(RequestError):
    """warmgate is draining (SIGTERM): no cold start begins, so a request that would wait for
    one is answered at once; another replica, or this one restarted, serves it."""

    status = 503
    code = "shutting_down"


class NoEndpoint(RequestError):
    """The target counts as ready but has no endpoint to forward to (its last pod just went):
    come back in a moment, once a replacement is ready."""

    status = 503
    code = "no_ready_endpoint"


class TargetAsleep(RequestError):
    """The target is scaled to zero and this request may not wake it (an idle tab's websocket)."""

    status = 503
    code = "target_cold"
