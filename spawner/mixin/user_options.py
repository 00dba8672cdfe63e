"""JupyterHub's ``apply_user_options`` hook for the wmla spawners: the pick is checked when the
hub receives it.

JupyterHub (5.3+) calls ``Spawner.apply_user_options`` before ``pre_spawn_hook`` and ``start()``
and logs "Received unhandled user_options" for every spawn with options when it is unset. The
profile's overrides stay where KubeSpawner applies them (its ``load_user_options``, at the start
of ``start()``), so both spawners apply them at the same point; what this hook adds is the check
of the pick against the profile list and the plan key, so a pick outside the list fails the
request with the sentence (HTTP 400) before anything of the spawn begins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from tornado import web

from .errors import AdmissionError

# What the options may hold besides a profile's options: the spawn page's plan pick.
PLAN_KEY = "plan"


class PickChecker(Protocol):
    """The spawner, as far as this hook needs it."""

    async def wmla_check_pick(self) -> None: ...


async def check_user_options(spawner: PickChecker, user_options: Mapping[str, Any]) -> None:
    """The hook: the profile and option choices in ``user_options`` must be in the list, and a
    plan pick must be a string (whether the user may use it is asked of the service at start,
    where the spawn page shows the answer)."""
    # JupyterHub passes spawner.user_options itself, which is what the spawner's pick reads.
    plan = user_options.get(PLAN_KEY)
    if plan is not None and not isinstance(plan, str):
        raise web.HTTPError(
            400, f"the plan must be a plan path such as /project1/dev-team, not {plan!r}"
        )
    try:
        await spawner.wmla_check_pick()
    except AdmissionError as err:
        # JupyterHub passes an HTTPError through as the answer; anything else becomes a bare
        # "Invalid user options".
        raise web.HTTPError(400, str(err).replace("%", "%%")) from None
