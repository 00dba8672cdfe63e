"""Pages of ``GET /jobs``: at most ``limit`` jobs in submission order, and a cursor to the next.

A listing is a page because a user's finished jobs are never forgotten: one answer with all of
them (a busy user runs thousands a week) would hold the event loop for seconds while every
other user's request waited. The cursor is the last job's position, (submitted, id), not an
offset: jobs submitted while a client pages through land after it, so no job is skipped or
listed twice, and the database seeks to the position through an index instead of counting
past every earlier row. It is opaque to clients, and carries nothing the caller was not shown
(a forged one only moves where the caller's own listing starts).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass

DEFAULT_LIMIT = 200
MAX_LIMIT = 500
JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")


class PageError(ValueError):
    """A ``limit`` or ``after`` the API cannot use; the message says what to send instead."""


@dataclass(frozen=True)
class Cursor:
    """Where a page ended: the last job listed."""

    submitted: float
    job_id: str

    def encode(self) -> str:
        raw = json.dumps([self.submitted, self.job_id], separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        problem = PageError(
            f"after={text[:80]!r} is not a cursor this API gave: pass the 'next' of the page "
            "before, or leave it out for the first page"
        )
        if len(text) > 200:
            raise problem
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            submitted, job_id = json.loads(raw)
        except (binascii.Error, ValueError, TypeError):
            raise problem from None
        if not isinstance(submitted, (int, float)) or isinstance(submitted, bool):
            raise problem
        if not math.isfinite(submitted) or not isinstance(job_id, str):
            raise problem
        if not JOB_ID.match(job_id):
            raise problem
        return cls(float(submitted), job_id)


@dataclass(frozen=True)
class Page:
    """What one request asks for: up to ``limit`` jobs after ``after`` (None: from the first)."""

    limit: int
    after: Cursor | None

    @classmethod
    def parse(cls, limit: str | None, after: str | None) -> Page:
        """The page of these query arguments (None or "": not given)."""
        if limit in (None, ""):
            count = DEFAULT_LIMIT
        elif re.fullmatch(r"\d{1,6}", limit) and 1 <= int(limit) <= MAX_LIMIT:
            count = int(limit)
        else:
            raise PageError(
                f"limit must be a whole number from 1 to {MAX_LIMIT}, got {limit[:40]!r}; "
                "follow 'next' for the jobs after a page"
            )
        return cls(count, Cursor.decode(after) if after else None)
