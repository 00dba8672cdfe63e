"""Each hub user's requests to the service, bounded (Slurm's ``SlurmctldParameters=rl_enable``):
a token bucket per user, ``burst`` deep, refilled at ``per_second``. A request past it is
answered 429 with ``Retry-After`` before any work is done for it, so one tenant looping on the
API (a script polling ``GET /jobs`` as fast as it can, a flood of bad submissions) gets its own
rate and no more, and the event loop, the store and the cycle stay the others'. Services (the
hub, the idle culler: operators' own tokens) are not counted; plan admins are, as Slurm counts
every user but its own. The buckets are per hub user, so they are as many as the hub's users."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from traitlets import Float, Int, TraitError, validate
from traitlets.config import LoggingConfigurable


class RequestRate(LoggingConfigurable):
    per_second = Float(
        20.0,
        config=True,
        help="""Requests per second each hub user may make to the service, sustained (the
        bucket's refill). 0: no limit. A notebook's widgets and magics poll about once a
        second; `wmla` retries a 429 after its Retry-After.

        c.RequestRate.per_second = 20
        """,
    )
    burst = Int(
        200,
        config=True,
        help="""Requests a user may make at once before the per-second rate applies (the
        bucket's depth): a page load, a script submitting a batch.

        c.RequestRate.burst = 200
        """,
    )

    @validate("per_second")
    def _check_rate(self, proposal: dict) -> float:
        value = proposal["value"]
        if not value >= 0 or value == float("inf"):
            raise TraitError(
                f"c.RequestRate.per_second must be 0 (no limit) or a positive number of "
                f"requests per second, got {value!r}"
            )
        return value

    @validate("burst")
    def _check_burst(self, proposal: dict) -> int:
        if proposal["value"] < 1:
            raise TraitError(
                f"c.RequestRate.burst must be 1 or more requests, got {proposal['value']!r}"
            )
        return proposal["value"]

    def buckets(self, clock: Callable[[], float] = time.monotonic) -> UserBuckets | None:
        """The buckets these settings describe; None when there is no limit."""
        if not self.per_second:
            return None
        return UserBuckets(self.per_second, self.burst, clock, self.log)


SUMMARY_EVERY = 60.0  # seconds between two log lines counting the refusals


class UserBuckets:
    """One token bucket per user name; ``take`` spends a token or says how long to wait.
    Refusals are logged as a count per user once a minute, not one line each: a flood would
    otherwise fill the disk with the service's log."""

    def __init__(
        self,
        per_second: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        log: logging.Logger | None = None,
    ) -> None:
        self.per_second = per_second
        self.burst = burst
        self.clock = clock
        self.log = log or logging.getLogger(__name__)
        self._tokens: dict[str, tuple[float, float]] = {}  # user -> (tokens, when counted)
        self.refused: Counter[str] = Counter()  # since the last summary
        self._said_at = clock()

    def take(self, user: str) -> float:
        """0.0 when ``user`` may go on (a token spent), else the seconds until a token is back
        (nothing spent: a refused request costs the user nothing more)."""
        now = self.clock()
        tokens, then = self._tokens.get(user, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.per_second)
        if tokens >= 1.0:
            self._tokens[user] = (tokens - 1.0, now)
            return 0.0
        self._tokens[user] = (tokens, now)
        self.refused[user] += 1
        if now - self._said_at >= SUMMARY_EVERY:
            self._summary(now)
        return (1.0 - tokens) / self.per_second

    def _summary(self, now: float) -> None:
        counts = ", ".join(f"{user} {n}" for user, n in self.refused.most_common(10))
        more = len(self.refused) - 10
        self.log.warning(
            "requests refused for the users' rate (c.RequestRate) in the last %.0f s: %s%s",
            now - self._said_at, counts, f" and {more} more users" if more > 0 else "",
        )  # fmt: skip
        self.refused.clear()
        self._said_at = now

    def message(self, user: str, wait: float) -> str:
        return (
            f"{user} made more than {self.burst} requests at once or more than "
            f"{self.per_second:g} a second for a while (c.RequestRate); try again in "
            f"{wait:.1f} s, and poll less often"
        )
