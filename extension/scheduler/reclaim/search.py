"""How much to take (docs/scheduling.md "Reclaim 5: room search and least loss").

Steps are taken in the order of loss until the reclaimer's gang of ``k`` workers fits, node by
node; if even all of them do not make room for its minimum gang, nothing is preempted. Then
every whole-gang victim that is not needed is dropped again, newest choice first. The steps
stay a tentative ``Release`` throughout; the driver commits the one left.
"""

from __future__ import annotations

from ..ledger import Ledger, Release


def take_until_room(ledger: Ledger, steps: list[tuple], w: tuple, k: int) -> Release:
    """The first steps, in order, after which ``k`` workers of ``w`` fit: in the totals and
    node by node (all of the steps when they never do)."""
    release = ledger.release()
    want = [w[r] * k for r in range(3)]
    base = ledger.pool_room(w, k)
    for step in steps:
        release.add(step)
        if ledger.within_totals(want, release.gained) and release.room(w, k, base) >= k:
            break
    return release


def most_that_fit(ledger: Ledger, release: Release, w: tuple, k: int, low: int) -> int:
    """The most workers, from ``k`` down to ``low``, that ``release`` makes room for; below
    ``low`` when not even the minimum gang fits."""
    target = k
    while target >= low:
        if (
            release.covers(w, target)
            and release.room(w, target, ledger.pool_room(w, target)) >= target
        ):
            break
        target -= 1
    return target


def least_loss(ledger: Ledger, release: Release, w: tuple, target: int) -> Release:
    """Drop any whole-gang victim, newest choice first, that ``target`` workers do not need
    (shrink steps and a stop of the same job first become the stop alone)."""
    release = release.merged()
    base = ledger.pool_room(w, target)
    for step in reversed(list(release.steps)):
        trial = release.without(step)
        if trial.covers(w, target) and trial.room(w, target, base) >= target:
            release = trial
    return release
