"""A service (the scheduling loop, a SQLite store, the real LocalBackend) in a process of its
own that dies by SIGKILL at a chosen point between its job's workers' exit and the commit of
the job's end: ``python -m tests.service.crash_rig <folder> <point>`` (test_exactly_once.py).

The points, in the order an end goes through them:
- ``noticed``: the monitor saw every worker exit 0 (``Supervisor._finish`` entered)
- ``kept``: the gang's devices and cgroups given back, its record dealt with (``_remove``)
- ``emitted``: FINISHED handed to the loop, not yet folded
- ``store-down``: the store refused the cycle that ends it twice, then the service died
- ``in-commit``: inside the commit that ends it, before the database has it
- ``committed``: the database has the end, the backend was not told yet
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import exc

from extension.backends.base import EventKind
from extension.backends.local.supervision import Supervisor
from extension.service.scheduling import Scheduler
from extension.service.store import Store, sqlite_url

from .test_runtime_limit import LocalRig

POINTS = ("noticed", "kept", "emitted", "store-down", "in-commit", "committed")
QUICK = "import time\ntime.sleep(0.3)\n"  # every worker exits 0 at once


class QuickRig(LocalRig):
    """``LocalRig`` whose worker ends by itself, 0.3 s after it starts."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp, sqlite_url(tmp / "wmla.sqlite"), grace=5.0)
        (self.storage / "user1" / "models" / "worker.py").write_text(QUICK)

    def kept(self, job_id: str) -> bool:
        """Whether the backend still has a folder (a record) for the job."""
        return (self.tmp / "backend" / "jobs" / job_id).exists()


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _ends(folded: Any) -> bool:
    return any(change.values.get("state") == "FINISHED" for _, change in folded)


def install(point: str) -> None:
    """Make this process SIGKILL itself at ``point``."""
    if point == "noticed":

        async def finish(self: Supervisor, gang: Any) -> None:
            die()

        Supervisor._finish = finish  # type: ignore[method-assign]
    elif point == "kept":
        remove = Supervisor._remove

        def removed(self: Supervisor, gang: Any, *args: Any) -> None:
            remove(self, gang, *args)
            die()

        Supervisor._remove = removed  # type: ignore[method-assign]
    elif point == "emitted":
        emit = Scheduler.emit

        def emitted(self: Scheduler, event: Any) -> None:
            emit(self, event)
            if event.kind is EventKind.FINISHED:
                die()

        Scheduler.emit = emitted  # type: ignore[method-assign]
    else:
        commit = Store.commit_cycle
        refused = []

        def commit_cycle(self: Store, folded: Any, *args: Any) -> Any:
            if not _ends(folded):
                return commit(self, folded, *args)
            if point == "store-down":
                refused.append(1)
                if len(refused) > 2:
                    die()
                raise exc.OperationalError("COMMIT", {}, Exception("database is locked"))
            if point == "in-commit":
                die()
            done = commit(self, folded, *args)
            die()
            return done

        Store.commit_cycle = commit_cycle  # type: ignore[method-assign]


async def crash(tmp: Path, point: str) -> None:
    install(point)
    rig = QuickRig(tmp)
    await rig.start()
    job = await rig.submit("quick")
    (tmp / "job").write_text(job)
    await asyncio.sleep(60)  # SIGKILL comes long before
    sys.exit(f"{point}: never reached")


if __name__ == "__main__":
    asyncio.run(crash(Path(sys.argv[1]), sys.argv[2]))
