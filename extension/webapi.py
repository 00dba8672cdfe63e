"""The JSON API handler every part of the service's REST API shares (jobs and plans, metering).

Every answer is JSON; every error is ``{"error": message, "status": code}`` (a 503 adds
``retry_after`` and the ``Retry-After`` header). Callers authenticate with a hub token (or the
hub's OAuth cookie for the browser pages); ``caller()`` says who they are and whether they are
a plan admin. It sits outside ``extension.service`` so that metering's handlers use it without
importing the service (tests/scheduler/test_layering.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Protocol

from jupyterhub.services.auth import HubOAuthenticated
from tornado import web

ADMIN_SCOPE = "custom:wmla:admin"
MAX_BODY = 1024 * 1024  # bytes of a JSON body (the HTTP server reads up to 16 MiB to say so)
MAX_DEPTH = 32  # levels of nesting; no valid body has more than 4


class TryLater(RuntimeError):
    """A refusal that did nothing and says when to come back (``Retry-After``)."""

    status = 503

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    @property
    def retry_seconds(self) -> int:
        """``Retry-After``'s whole seconds: at least one."""
        return max(1, math.ceil(self.retry_after))


class Unavailable(TryLater):
    """What a handler raises when the service cannot serve now (its database is down): a 503
    JSON answer with ``Retry-After``; nothing was changed, the client may try again."""


class Throttled(TryLater):
    """The caller made more requests than its rate (``extension.service.request_rate``): a 429
    JSON answer with ``Retry-After``; nothing was done for the request."""

    status = 429


class RequestLimiter(Protocol):
    def take(self, user: str) -> float: ...

    def message(self, user: str, wait: float) -> str: ...


@dataclass(frozen=True)
class Caller:
    """Who is asking: a hub user (or service) name, its hub groups, whether a plan admin."""

    name: str
    groups: frozenset[str] = frozenset()
    admin: bool = False


class APIError(web.HTTPError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, reason=None)
        self.message = message


class BaseHandler(HubOAuthenticated, web.RequestHandler):
    async def prepare(self) -> None:
        """Who is asking, found on the event loop: HubAuth's synchronous path (tornado's
        ``get_current_user``) hands the lookup to a thread of its own and holds the loop until
        it answers, on every request (benchmarks/bench_service.py). What is found here is
        cached where ``get_current_user`` looks first; anything unusual (a user the hub
        refuses) is left to that path and its own handling."""
        try:
            model = await self.hub_auth.get_user(self, sync=False)
        except Exception:  # e.g. the hub unreachable: get_current_user says so as usual
            return
        if not model:
            self._hub_auth_user_cache = None
            return
        try:
            self._hub_auth_user_cache = self.check_hub_user(model)
        except Exception:
            return
        limiter: RequestLimiter | None = self.settings.get("wmla_request_rate")
        if limiter is not None and model.get("kind") != "service":
            wait = limiter.take(model["name"])
            if wait:
                raise Throttled(limiter.message(model["name"], wait), wait)

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, Throttled):  # the request log line says it; a flood logs no more
            return
        super().log_exception(typ, value, tb)

    @property
    def sched(self) -> Any:  # the service's Scheduler
        return self.settings["wmla_scheduler"]

    @property
    def service(self) -> Any:
        return self.settings["wmla_service"]


class APIHandler(BaseHandler):
    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    def get_login_url(self) -> str:  # an API never redirects to a login page
        if self.request.method not in ("GET", "HEAD", "OPTIONS") and self.get_cookie(
            self.hub_auth.cookie_name
        ):
            # HubOAuth ignores the browser's cookie on a change without the _xsrf value, so
            # that no other page can submit or cancel jobs in the user's name
            raise APIError(
                403,
                "a browser request that changes something must send the _xsrf cookie's value "
                "in an X-XSRFToken header",
            )
        raise APIError(
            403,
            "not authenticated: send a hub API token (Authorization: token ...) that may "
            "access the wmla service (scope access:services!service=wmla)",
        )

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, Unavailable):  # said once where it happened; no traceback each
            self.log.warning("503 %s %s: %s", self.request.method, self.request.path, value)
            return
        super().log_exception(typ, value, tb)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message = None
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, TryLater):  # nothing was changed: the client may retry
            status, retry = exc.status, exc.retry_seconds
            self.set_status(status)
            self.set_header("Retry-After", str(retry))
            self.set_header("Content-Type", "application/json; charset=utf-8")
            body = {"error": str(exc), "status": status, "retry_after": retry}
            self.finish(json.dumps(body))
            return
        if isinstance(exc, APIError):
            message = exc.message
        elif isinstance(exc, web.HTTPError):
            message = exc.log_message or exc.reason or self._reason
        if not message:
            message = self._reason if status_code < 500 else "internal error; see the service log"
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"error": message, "status": status_code}))

    def caller(self) -> Caller:
        model = self.current_user
        if not model:
            self.get_login_url()
        scopes = model.get("scopes") or []
        admin = bool(model.get("admin")) or any(
            s == ADMIN_SCOPE or s.startswith(ADMIN_SCOPE + "!") for s in scopes
        )
        return Caller(model["name"], frozenset(model.get("groups") or ()), admin)

    def admin_caller(self) -> Caller:
        caller = self.caller()
        if not caller.admin:
            raise APIError(
                403,
                f"only plan admins may change plans; {caller.name} needs the {ADMIN_SCOPE} "
                f"scope (or hub admin)",
            )
        return caller

    def body(self) -> Any:
        raw = self.request.body or b"null"
        if len(raw) > MAX_BODY:
            raise APIError(
                413, f"the body is {len(raw):,} bytes; at most {MAX_BODY:,} (1 MiB) are accepted"
            )
        try:
            value = json.loads(raw)
        except RecursionError:  # the C scanner recurses per level: '[' x 100,000 ends here
            value = None
            deep = True
        except (ValueError, UnicodeDecodeError) as err:
            raise APIError(400, f"the body is not valid JSON: {err}") from None
        else:
            deep = _deeper_than(value, MAX_DEPTH)
        if deep:
            raise APIError(400, f"the body is nested more than {MAX_DEPTH} levels deep")
        return value

    def reply(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists/objects more than ``limit`` levels (iteratively: a deep
    body must not reach the recursion limit in our own validation either)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False
