"""The hub API token ``wmla logon`` asks for with a user's password, and when it expires.

A token that never expires outlives the person's access (a copy of the logon file keeps
working after their password changed or they left a group), so ``wmla logon`` asks for one that
expires (JupyterHub's ``expires_in``): ``--days`` (default 30). A hub whose own maximum is
shorter (``c.JupyterHub.token_expires_in_max_seconds``) refuses a longer one; then it is asked
again without an expiry, and the hub gives its maximum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from extension.clienterrors import WmlaError

DEFAULT_DAYS = 30.0
NOTE = "wmla logon"


@dataclass(frozen=True)
class LogonToken:
    """The token and its end as the hub says it (ISO 8601 UTC; None: it never expires)."""

    token: str
    expires_at: str | None


def request_token(hub: str, username: str, password: str, days: float) -> LogonToken:
    """A new token of ``username`` from the hub at ``hub``, valid ``days`` (0: as long as the
    hub allows, maybe forever). Raises WmlaError with a sentence."""
    body: dict[str, Any] = {"auth": {"username": username, "password": password}, "note": NOTE}
    if days > 0:
        body["expires_in"] = max(1, round(days * 86400))
    r = _post(hub, username, body)
    if r.status_code == 400 and "expires_in" in body and "must not exceed" in r.text:
        del body["expires_in"]  # the hub's maximum is shorter: asked without one, it gives it
        r = _post(hub, username, body)
    if r.status_code == 403:
        raise WmlaError(f"the hub at {hub} refused user {username!r} or the password")
    if r.status_code != 201:
        raise WmlaError(f"the hub at {hub} answered {r.status_code}: {r.text[:200]}")
    answer = r.json()
    return LogonToken(answer["token"], answer.get("expires_at"))


def expiry_text(expires_at: str | None) -> str:
    """``expires 2027-01-06 08:10 UTC``, or ``never expires`` (a hub without a maximum asked
    with ``--days 0``)."""
    if not expires_at:
        return "never expires"
    day, _, rest = expires_at.partition("T")
    return f"expires {day} {rest[:5]} UTC" if rest else f"expires {day}"


def _post(hub: str, username: str, body: dict[str, Any]) -> Any:
    import requests  # the CLI's other commands start without it

    try:
        return requests.post(
            f"{hub}/hub/api/users/{quote(username, safe='')}/tokens", json=body, timeout=30
        )
    except requests.RequestException:
        raise WmlaError(f"cannot reach the hub at {hub}; check --url") from None
