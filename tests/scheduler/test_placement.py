import pytest

from extension.scheduler.placement import fit_count, max_workers_on, place_gang

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
