"""What a user may be called, and what a plan's path segment may be: one definition each.

A user's submissions are charged to the leaf ``<plan>/<user>`` (docs/scheduling.md "Words":
user leaf), so a user name is a plan path segment: letters, digits, '.', '_', '-' and '@'
(JupyterHub logins are often e-mail addresses), not '.' or '..', and at most ``MAX_USER_NAME``
characters (JupyterHub's own bound; a user leaf then fits the store's path columns). Anything
that names a user (a submission, a storage folder, the usage API, a Kubernetes label) starts
from ``user_name_problem``; where a platform needs a narrower form (a DNS label, a Linux
account) it derives it from a name that passed here.
"""

from __future__ import annotations

import re

SEGMENT = re.compile(r"[A-Za-z0-9._@-]+\Z")  # a plan path segment
USER_NAME = re.compile(r"[A-Za-z0-9._@-]{1,255}\Z")
MAX_USER_NAME = 255
ALLOWED = "letters, digits, '.', '_', '-' and '@'"


def is_segment(name: object) -> bool:
    """A plan name: ``SEGMENT`` and not ``.`` or ``..`` (they would read as paths)."""
    return isinstance(name, str) and bool(SEGMENT.match(name)) and name not in (".", "..")


def user_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a user's name, or None."""
    if isinstance(name, str) and len(name) > MAX_USER_NAME:
        return f"user name is {len(name)} characters long; at most {MAX_USER_NAME}"
    if not is_segment(name):
        return f"user name {name!r} is not allowed; use {ALLOWED} only"
    return None


def is_user_name(name: object) -> bool:
    return user_name_problem(name) is None
