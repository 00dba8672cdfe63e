import pytest

from extension.scheduler.resources import (
    NO_LIMIT,
    QuantityError,
    Resources,
    format_amount,
    parse_quantity,
)


@pytest.mark.parametrize(
    "resource, value, expected",
    [
        ("cpu", 2, 2000),
        ("cpu", "500m", 500),
        ("cpu", "0.5", 500),
        ("cpu", 1.5, 1500),
        ("memory", "4Gi", 4 * 2**30),
        ("memory", "800Mi", 800 * 2**20),
        ("memory", "1G", 10**9),
        ("memory", 1024, 1024),
        ("gpu", 4, 4),
        ("gpu", "2", 2),
    ],
    ids=lambda v: str(v),
)
def test_quantities_are_read_in_the_resource_unit(resource, value, expected):
    assert parse_quantity(resource, value) == expected


@pytest.mark.parametrize(
    "resource, value, message",
    [
        ("gpu", 1.5, "whole devices"),
        ("gpu", "1k", "whole devices"),
        ("cpu", -1, "must not be negative"),
        ("memory", "4Gx", "is not a quantity"),
        ("memory", "lots", "512Mi"),
        ("cpu", True, "must be a number"),
        ("disk", 1, "unknown resource"),
    ],
)
def test_bad_quantities_say_what_is_wrong(resource, value, message):
    with pytest.raises(QuantityError, match=message):
        parse_quantity(resource, value)


def test_from_mapping_fills_defaults_and_refuses_unknown_keys():
    assert Resources.from_mapping({"gpu": 1}) == Resources(1, 0, 0)
    assert Resources.from_mapping(None, default=7) == Resources(7, 7, 7)
    with pytest.raises(QuantityError, match="unknown resource 'gpus'"):
        Resources.from_mapping({"gpus": 1}, where="per_worker")


def test_vector_arithmetic_and_description():
    a, b = Resources(1, 500, 2**30), Resources(2, 1500, 2**30)
    assert a.plus(b) == Resources(3, 2000, 2**31)
    assert b.minus(a) == Resources(1, 1000, 0)
    assert a.times(4) == Resources(4, 2000, 2**32)
    assert a.fits_in(b) and not b.fits_in(a)
    assert a.fits_in(NO_LIMIT)
    assert b.describe() == "2 gpu, 1.5 cpu, 1Gi memory"
    assert Resources().describe() == "nothing"
    assert NO_LIMIT.to_dict() == {}
    assert format_amount("cpu", 250) == "250m cpu"
