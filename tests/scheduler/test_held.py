"""The ledger's rows kept between cycles (held.HoldKept) are what holding every running job
afresh gives: cycle after cycle of random running jobs (many workers and few, terminating or
not, placements that change in place or by a new job of the same id, nodes the instance does
not have, a fraction that makes the ledger hold afresh) with admission's, reclaim's and
growth's writes on the rows in between."""

from __future__ import annotations

import dataclasses
import random
from itertools import chain

import pytest

from extension.scheduler import Instance, Job, JobState, Node, Resources
from extension.scheduler.held import HoldKept
from extension.scheduler.index import NodeFigures, PlanNode
from extension.scheduler.kept import FitCarry
from extension.scheduler.ledger import Ledger

WORKERS = [Resources(1, 4000, 8 << 30), Resources(2, 1000, 1 << 30), Resources(0, 500, 1 << 28)]


def fresh_rows(nodes: NodeFigures, running: list[Job]) -> tuple[list, list]:
    """Capacity less every worker, one at a time: what hold must come to."""
    free = [list(row) for row in nodes.capacity]
    incoming = [[0, 0, 0] for _ in free]
    for job in running:
        for name in job.placement:
            i = nodes.node_at.get(name)
            if i is None:
                continue
            for r in range(3):
                free[i][r] -= job.per_worker[r]
                if job.terminating:
                    incoming[i][r] += job.per_worker[r]
    return free, incoming


def random_job(rng: random.Random, n: int, names: list[str]) -> Job:
    count = rng.choice([1, 2, 3, 8, 40, 90])
    placement = tuple(sorted(rng.choice(names + ["gone"]) for _ in range(count)))
    worker = rng.choice(WORKERS)
    if rng.random() < 0.03:
        worker = Resources(1, 0.5, 0)  # a fraction: held afresh
    return Job(
        f"j{n}",
        "u",
        "/p",
        worker,
        count,
        state=JobState.RUNNING,
        placement=placement,
        terminating=rng.random() < 0.2,
    )


def next_running(rng: random.Random, running: list[Job], names: list[str], n: int) -> list[Job]:
    out = []
    for job in running:
        roll = rng.random()
        if roll < 0.1:
            continue  # it ended
        if roll < 0.2:  # the same job with workers more or fewer: a new Job of the same id
            placement = job.placement + tuple(rng.choice(names) for _ in range(rng.randint(0, 5)))
            placement = placement[rng.randint(0, 3) :] or placement
            n = len(placement)
            job = dataclasses.replace(job, placement=placement, min_workers=n, max_workers=n)
        elif roll < 0.25:
            job.terminating = not job.terminating  # in place
        elif roll < 0.3:
            job.placement = tuple(reversed(job.placement))  # in place, the same nodes
        out.append(job)
    for k in range(rng.randint(0, 3)):
        out.append(random_job(rng, n * 10 + k, names))
    rng.shuffle(out)
    return out


def scribble(rng: random.Random, ledger: Ledger, running: list[Job]) -> None:
    """What admission, reclaim and growth write on the rows after hold, through the verbs."""
    n = len(ledger.free)
    leaf = PlanNode("/x", 1.0, Resources(9, 9, 9), None, True)
    leaf.chain = [leaf]
    for _ in range(rng.randint(0, 4)):
        i = rng.randrange(n)
        verb = rng.choice(["take", "reserve", "claim", "release"])
        w = tuple(rng.choice(WORKERS))
        if verb == "take":
            ledger.take([i, i], w)
        elif verb == "reserve":
            ledger.reserve(i, w)
        elif verb == "claim":
            ledger.claim([i], w, leaf)
        elif running:  # a victim's workers let go: incoming
            release = ledger.release()
            release.add((rng.choice(running), leaf, [i]))
            release.commit()


@pytest.mark.parametrize("seed", range(30))
def test_kept_rows_are_the_rows_held_afresh(seed: int) -> None:
    rng = random.Random(seed)
    count = rng.randint(1, 30)
    inst = Instance(tuple(Node(f"n{i:02d}", Resources(8, 64_000, 512 << 30)) for i in range(count)))
    nodes = NodeFigures(inst)
    names = nodes.names
    free = [list(row) for row in nodes.capacity]
    incoming = [[0, 0, 0] for _ in free]
    pool = [[0, 0, 0] for _ in free]
    kept, carry = HoldKept(), FitCarry()
    running: list[Job] = []
    last = None
    for cycle in range(40):
        running = next_running(rng, running, names, cycle)
        leaf = PlanNode("/p/u", 1.0, Resources(9, 9, 9), None, True)
        ledger = Ledger(nodes, free, incoming, pool, carry, kept)
        ledger.hold(running, [leaf] * len(running), nodes)
        want_free, want_incoming = fresh_rows(nodes, running)
        assert free == want_free and incoming == want_incoming
        total = [sum(column) for column in zip(*want_free)]
        assert ledger.total_free == total
        mark = ledger.mark()
        assert mark[0] == list(chain.from_iterable(want_free))
        assert mark[1] == list(chain.from_iterable(want_incoming))
        if last is not None and ledger.changed is not None:  # every node that changed, named
            moved = {k // 3 for k, (a, b) in enumerate(zip(mark[0], last)) if a != b}
            assert moved <= ledger.changed
        last = mark[0]
        scribble(rng, ledger, running)
        if rng.random() < 0.2:  # Reclaim 6: a rerun from the mark
            ledger.rewind(mark)
            assert free == want_free
            scribble(rng, ledger, running)


def test_after_a_fraction_every_node_is_named_changed() -> None:
    """A cycle held afresh (a fraction) and then one kept again from the capacity: the nodes
    the fractional job held are changed though no job holds them now."""
    inst = Instance((Node("a", Resources(8, 64_000, 1 << 30)), Node("b", Resources(8, 8, 8))))
    nodes = NodeFigures(inst)
    free = [list(row) for row in nodes.capacity]
    incoming, pool = [[0, 0, 0], [0, 0, 0]], [[0, 0, 0], [0, 0, 0]]
    kept, carry = HoldKept(), FitCarry()
    leaf = PlanNode("/p/u", 1.0, Resources(9, 9, 9), None, True)
    whole = Job("w", "u", "/p", Resources(1, 1, 1), 1, state=JobState.RUNNING, placement=("a",))
    part = Job("f", "u", "/p", Resources(1, 0.5, 0), 1, state=JobState.RUNNING, placement=("b",))
    for running, afresh in (([whole], False), ([whole, part], True), ([whole], False)):
        ledger = Ledger(nodes, free, incoming, pool, carry, kept)
        ledger.hold(running, [leaf] * len(running), nodes)
        assert (ledger.changed is None) == afresh
        assert (free, incoming) == fresh_rows(nodes, running)
    assert ledger.changed == {0, 1}
