import pytest

from extension.scheduler.shares import dominant_ratio, water_fill

from .builders import nodes, pending, run_cycle, tree


@pytest.mark.parametrize(
    "amount, caps, weights, expected",
    [
        (8, [8, 8, 8], [4, 2, 2], [4, 2, 2]),
        (8, [4, 2, 2], [4, 2, 2], [4, 2, 2]),
        (8, [1, 8, 8], [1, 1, 1], [1, 3.5, 3.5]),  # idle share flows to siblings
        (8, [0, 8, 8], [4, 2, 2], [0, 4, 4]),  # no demand, no share
        (4, [10, 10], [1, 1], [2, 2]),
        (10, [2, 3], [1, 1], [2, 3]),  # never more than asked
        (0, [3, 3], [1, 1], [0, 0]),
    ],
    ids=["4-2-2", "caps-equal-shares", "idle-flows", "no-demand", "even", "under-demand", "none"],
)
def test_water_fill(amount, caps, weights, expected):
    assert water_fill(amount, caps, weights) == pytest.approx(expected)


@pytest.mark.parametrize(
    "alloc, deserved, expected",
    [
        ([2, 0, 0], [4, 0, 0], 0.5),
        ([2, 1000, 0], [4, 500, 0], 2.0),
        ([1, 0, 0], [0, 0, 0], float("inf")),
        ([0, 0, 0], [0, 0, 0], 0.0),
    ],
)
def test_dominant_ratio(alloc, deserved, expected):
    assert dominant_ratio(alloc, deserved) == expected


def test_deserved_is_hierarchical_and_capped_by_limits_and_demand():
    plans = tree(
        {
            "/project1": (3, None),
            "/project1/dev": (4, 4),
            "/project1/qa": (2, 2),
            "/project1/support": (2, 2),
            "/other": (1, None),
        }
    )
    jobs = [pending(f"d{i}", "/project1/dev") for i in range(10)]
    jobs += [pending(f"q{i}", "/project1/qa") for i in range(10)]
    jobs += [pending("s0", "/project1/support")]
    jobs += [pending(f"o{i}", "/other") for i in range(10)]
    result = run_cycle(plans, nodes(2), jobs)  # 16 GPUs
    deserved = {p: f.deserved.gpu for p, f in result.plans.items()}
    # /project1 : /other = 3 : 1 of 16 -> 12 : 4, but /project1 can use only 4 + 2 + 1 = 7,
    # so the idle 5 flow to /other (demand 10) -> 9.
    assert deserved["/project1"] == pytest.approx(7)
    assert deserved["/other"] == pytest.approx(9)
    assert deserved["/project1/dev"] == pytest.approx(4)
    assert deserved["/project1/qa"] == pytest.approx(2)
    assert deserved["/project1/support"] == pytest.approx(1)
    assert deserved["/project1/dev/u1"] == pytest.approx(4)
