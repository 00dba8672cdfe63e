"""The spawn page's line about the user's storage quota, from 90 % of a limit on."""

from __future__ import annotations

import logging
from urllib.parse import quote

from extension.storage.warning import quota_warning

from .service_client import ServiceCalls


async def storage_note(service: ServiceCalls, user: str, log: logging.Logger) -> str | None:
    """The warning for ``user``'s folder, or None (nothing to say, or the service could not
    say: the spawn goes on without it)."""
    try:
        answer = await service.call("GET", f"storage?user={quote(user)}", what="the quota")
    except Exception as err:  # a nicety: never a reason for a spawn to fail
        log.info("no storage quota line for %s: %s", user, err)
        return None
    rows = answer.get("users") or [] if isinstance(answer, dict) else []
    return quota_warning(rows[0]) if rows else None
