"""One service per database: a lease in the store, and a service that leaves when its hub does.

Two services deciding on one database would start every job twice. After a ``kill -9`` of the
hub its managed service lives on (its parent is gone, nobody stops it) while the new hub starts
a second one on the same database. So:

- a service takes the lease (a row in ``meta``, compare-and-set) before it reads or recovers
  anything, renews it every ``ttl / 3`` seconds and gives it back when it stops; a service that
  finds the lease held by a live holder waits up to ``ttl`` seconds (a crashed holder's lease
  runs out by then), then exits naming the holder;
- a service that finds another holder at renewal (it was frozen longer than ``ttl``) stops at
  once, before its next decision;
- a service whose parent (the hub that started it) is gone stops cleanly: its workers go on
  and the next service re-adopts them. The watch is one ``getppid()`` per second.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable

from .store import Store
from .storecalls import StoreCalls, StoreUnavailable

log = logging.getLogger(__name__)


class LeaseHeld(RuntimeError):
    """Another service holds the database."""


class Lease:
    def __init__(
        self,
        store: Store,
        db: StoreCalls,
        ttl: float = 15.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.db = db
        self.ttl = ttl
        self.clock = clock
        self.owner = secrets.token_hex(8)
        self.holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": clock()}
        self.held = False

    async def take(self, wait: float | None = None) -> None:
        """Take the lease, waiting up to ``wait`` seconds (default: ``ttl`` plus a little, so a
        crashed holder's lease runs out meanwhile); LeaseHeld when it cannot."""
        deadline = time.monotonic() + (self.ttl + 2 if wait is None else wait)
        said = False
        while True:
            try:
                other = await self.db.write(
                    self.store.take_lease, self.owner, self.holder, self.clock(), self.ttl,
                    probe=True,
                )  # fmt: skip
            except StoreUnavailable as err:
                other = {"error": str(err)}
            if other is None:
                self.held = True
                return
            if time.monotonic() >= deadline:
                raise LeaseHeld(describe(other, self.clock()))
            if not said:
                log.warning("wmla: waiting for the database: %s", describe(other, self.clock()))
                said = True
            await asyncio.sleep(0.5)

    async def renew(self) -> bool:
        """False when another service holds the lease now; a store that cannot answer is not
        a loss (nothing is decided while it is down, and the renewal after it tells)."""
        try:
            return await self.db.write(
                self.store.renew_lease, self.owner, self.clock(), self.ttl, probe=True
            )
        except StoreUnavailable:
            return True

    def release(self) -> None:
        if self.held:
            self.held = False
            try:
                self.store.release_lease(self.owner)
            except Exception as err:  # it runs out by itself
                log.warning("wmla: could not give the database lease back: %s", err)


def describe(other: dict, now: float) -> str:
    if "error" in other:
        return other["error"]
    left = max(0.0, float(other.get("until", now)) - now)
    return (
        f"another wmla service (pid {other.get('pid', '?')} on {other.get('host', '?')}) holds "
        f"this database for {left:.0f} s more; one service per database: stop that one (or "
        f"give this one its own c.WmlaService.db_url)"
    )


async def watch(
    lease: Lease, stop: asyncio.Event, parent: int | None, every: float = 1.0
) -> str | None:
    """Until ``stop`` is set: renew the lease every ``ttl / 3`` s and look for the parent every
    ``every`` s. Sets ``stop`` and returns why when the service must go."""
    renew_at = time.monotonic() + lease.ttl / 3
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
            return None
        except asyncio.TimeoutError:
            pass
        if parent is not None and os.getppid() != parent:
            why = f"the hub that started this service (pid {parent}) is gone"
        elif time.monotonic() >= renew_at:
            renew_at = time.monotonic() + lease.ttl / 3
            if await lease.renew():
                continue
            lease.held = False  # someone else's now: do not delete it at the end
            why = "another wmla service took this database over"
        else:
            continue
        log.error("wmla: %s: stopping (running jobs go on; the next service adopts them)", why)
        stop.set()
        return why
    return None
