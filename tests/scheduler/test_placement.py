import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extension.scheduler.placement import FitIndex, fit_count, max_workers_on, place_gang

NAMES = ["n1", "n2", "n3"]


@pytest.mark.parametrize(
    "free, worker, count, expected",
    [
        ([[8, 0, 0], [8, 0, 0], [4, 0, 0]], [8, 0, 0], 2, [0, 1]),  # 2 x 8 needs two whole nodes
        ([[8, 0, 0], [4, 0, 0], [4, 0, 0]], [8, 0, 0], 2, None),  # 16 free but scattered
        ([[8, 0, 0], [2, 0, 0], [3, 0, 0]], [1, 0, 0], 2, [1, 1]),  # tightest node that holds all
        ([[1, 0, 0], [1, 0, 0], [2, 0, 0]], [1, 0, 0], 3, [2, 2, 0]),  # biggest holes first
        ([[4, 100, 0], [4, 2000, 0], [0, 0, 0]], [1, 1000, 0], 2, [1, 1]),  # cpu bounds it
        ([[0, 0, 0], [0, 0, 0], [0, 0, 0]], [0, 0, 0], 2, [0, 0]),  # asks nothing: fits
    ],
    ids=["whole-nodes", "scattered", "best-fit", "spread", "cpu-bound", "zero-request"],
)
def test_place_gang(free, worker, count, expected):
    snapshot = [row[:] for row in free]
    assert place_gang(free, NAMES, worker, count) == expected
    assert free == snapshot  # tentative: nothing is taken


def test_prefer_keeps_an_elastic_job_on_its_nodes():
    free = [[2, 0, 0], [1, 0, 0], [8, 0, 0]]
    assert place_gang(free, NAMES, [1, 0, 0], 1, prefer=frozenset({0})) == [0]


def test_counts():
    assert fit_count([8, 4000, 0], [2, 1000, 0]) == 4
    assert max_workers_on([[8, 0, 0], [8, 0, 0]], [3, 0, 0]) == 4


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 8), st.integers(0, 16), st.integers(0, 4)), min_size=1, max_size=10
    ),
    worker=st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(0, 2)),
    changes=st.lists(st.tuples(st.integers(0, 9), st.integers(-2, 3)), max_size=10),
    count=st.integers(1, 6),
    data=st.data(),
)
def test_fit_index_gives_what_place_gang_gives_after_any_changes(
    rows, worker, changes, count, data
):
    free = [list(r) for r in rows]
    names = data.draw(st.permutations([f"node{i:02d}" for i in range(len(rows))]))
    index = FitIndex(free, names, worker)
    for node, k in changes:  # take (k > 0) or give back (k < 0) k workers' worth on one node
        i = node % len(free)
        for r in range(3):
            free[i][r] = max(0, free[i][r] - k * worker[r])
        index.update(i)
        expected = place_gang(free, names, worker, count)
        assert index.place(count) == expected
        whole = index.tightest(count)
        if whole is None:  # no node takes it whole: place_gang spreads it or finds no room
            assert expected is None or len(set(expected)) > 1
        else:
            assert expected == [whole] * count
