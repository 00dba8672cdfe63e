"""The fit indexes kept between cycles (kept.FitCarry) answer as indexes built afresh: after any
change of the free rows from one cycle to the next, and after admission's takes in a cycle."""

from __future__ import annotations

import random
from itertools import chain

import pytest

from extension.scheduler.kept import KEPT_SHAPES, FitCarry
from extension.scheduler.placement import FitIndex

SHAPES = [(1, 1000, 1 << 30), (2, 500, 1 << 29), (0, 2000, 1 << 28), (8, 100, 1 << 20)]


def flat(free: list[list[float]]) -> list[float]:
    return list(chain.from_iterable(free))


def same(a: FitIndex, b: FitIndex) -> bool:
    return a.order == b.order and a.fit == b.fit


@pytest.mark.parametrize("seed", range(20))
def test_kept_indexes_follow_the_rows_cycle_after_cycle(seed: int) -> None:
    rng = random.Random(seed)
    names = [f"node{i:02d}" for i in range(rng.randint(1, 40))]
    cap = [8, 32000, 256 << 30]
    free = [[rng.randint(0, 8), rng.randint(0, 32000), rng.randint(0, 256) << 30] for _ in names]
    carry = FitCarry()
    held: list[list[int]] = []
    for _cycle in range(15):
        changed = None  # hold's changes found by comparing the rows, or named by hold
        if held and rng.random() < 0.5:
            changed = {i for i, (a, b) in enumerate(zip(free, held)) if a != b}
        touched: set[int] = set()  # what the ledger writes on after hold, from here
        carry.begin(flat(free), changed, touched)
        held = [row[:] for row in free]
        for w in carry.kept:  # brought up to the rows hold left
            assert same(carry.kept[w], FitIndex(free, names, w))
        for _run in range(rng.randint(1, 2)):  # Reclaim 6: a rerun from the rows after hold
            free[:] = [row[:] for row in held]
            given = []
            for w in rng.sample(SHAPES, rng.randint(1, len(SHAPES))):
                for i in rng.sample(range(len(names)), rng.randint(0, len(names))):
                    if rng.random() < 0.3:  # admission took or reserved on node i
                        free[i] = [max(0, v - rng.randint(0, c // 4)) for v, c in zip(free[i], cap)]
                        touched.add(i)
                        for index in given:  # the ledger's take keeps its indexes in step
                            index.update(i)
                index = carry.index(w, free, names, touched)
                assert same(index, FitIndex(free, names, w))  # what admission starts from
                given.append(index)
            for i in range(len(names)):  # reclaim and growth, its indexes no longer in step
                if rng.random() < 0.1:
                    free[i] = [max(0, v - rng.randint(0, c // 4)) for v, c in zip(free[i], cap)]
                    touched.add(i)
        # the next cycle's hold: some nodes' rows change, the others stay as hold left them
        free[:] = [row[:] for row in held]
        for i in range(len(names)):
            if rng.random() < 0.2:
                free[i] = [rng.randint(0, c) for c in (8, 32000, 256)]
                free[i][2] <<= 30


def test_a_change_in_the_number_of_nodes_starts_afresh() -> None:
    names = ["a", "b"]
    free = [[4, 4000, 1 << 32], [2, 2000, 1 << 31]]
    carry = FitCarry()
    carry.begin(flat(free))
    carry.index(SHAPES[0], free, names, ())
    carry.begin(flat(free))
    assert SHAPES[0] in carry.kept
    names, free = ["a"], [[4, 4000, 1 << 32]]
    carry.begin(flat(free))
    assert not carry.kept


def test_the_shapes_asked_for_last_are_kept() -> None:
    names = ["a", "b"]
    free = [[4, 4000, 1 << 32], [2, 2000, 1 << 31]]
    carry = FitCarry()
    carry.begin(flat(free))
    for w in SHAPES:
        carry.index(w, free, names, ())
    carry.begin(flat(free))
    assert set(carry.kept) == set(SHAPES)
    carry.index(SHAPES[0], free, names, ())
    carry.begin(flat(free))
    carry.begin(flat(free))
    assert set(carry.kept) == set(SHAPES)  # kept while not asked for
    many = [(1, c, 0) for c in range(KEPT_SHAPES)]
    for w in many:
        carry.index(w, free, names, ())
    carry.index(SHAPES[2], free, names, ())
    carry.begin(flat(free))
    assert set(carry.kept) == {SHAPES[2], *many[1:]}  # at most KEPT_SHAPES, the last asked
    for w in carry.kept:
        assert same(carry.kept[w], FitIndex(free, names, w))
