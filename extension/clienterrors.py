"""The one error the wmla client raises, and the sentences it says.

Every failure of :mod:`extension.client` is a :class:`WmlaError` whose message says what went
wrong and what to do, e.g. ``job rejected: /project1/qa-team allows 2 gpu ...``; ``status`` keeps
the HTTP status (0 when the service could not be reached). It lives in a module of its own so
that the logon (:mod:`extension.clientconfig`), the retries (:mod:`extension.retry`) and the
client itself can all raise it without importing each other in a circle.
"""

from __future__ import annotations


class WmlaError(Exception):
    """A failure with a message meant for the person at the keyboard."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def __str__(self) -> str:
        return self.message


def explain(status: int, message: str, what: str) -> str:
    """Turn the service's ``{"error", "status"}`` into a sentence for a data scientist."""
    message = (message or "").strip() or "no details"
    if status == 422:
        if message.startswith("rejected: "):  # the core's own wording already says it
            message = message[len("rejected: ") :]
        return f"{what} rejected: {message}"
    if status == 403:
        if "token" in message or "authenticated" in message:
            return (
                f"the wmla service refused your credentials ({message}); run `wmla logon` "
                f"again or check WMLA_TOKEN / JUPYTERHUB_API_TOKEN"
            )
        return f"not allowed: {message}"
    if status == 404:
        return f"not found: {message}"
    if status == 409:
        return f"{what} refused: {message}"
    if status == 400:
        return f"bad request: {message}"
    if status >= 500:
        return f"the wmla service failed ({status}: {message}); ask your administrator"
    return f"{what} failed ({status}): {message}"
