"""The cursor and limit of ``GET /jobs`` pages: what the API takes, and what it refuses."""

from __future__ import annotations

import base64
import json

import pytest

from extension.service.paging import DEFAULT_LIMIT, MAX_LIMIT, Cursor, Page, PageError


def _raw(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def test_a_cursor_comes_back_as_it_went() -> None:
    for cursor in (Cursor(1_800_000_000.123456, "job-0a1b2c3d4e"), Cursor(0.0, "j")):
        text = cursor.encode()
        assert Cursor.decode(text) == cursor
        assert text.isascii() and "=" not in text and "/" not in text and "+" not in text


def test_no_limit_is_the_default_page_and_the_first() -> None:
    assert Page.parse(None, None) == Page(DEFAULT_LIMIT, None)
    assert Page.parse("", "") == Page(DEFAULT_LIMIT, None)
    assert Page.parse(str(MAX_LIMIT), None).limit == MAX_LIMIT
    assert Page.parse("1", Cursor(5.0, "job-1").encode()) == Page(1, Cursor(5.0, "job-1"))


@pytest.mark.parametrize("limit", ["0", str(MAX_LIMIT + 1), "-1", "1.5", "ten", " 5", "9" * 40])
def test_a_limit_out_of_range_is_refused_naming_the_range(limit: str) -> None:
    with pytest.raises(PageError, match=f"limit must be a whole number from 1 to {MAX_LIMIT}"):
        Page.parse(limit, None)


@pytest.mark.parametrize(
    "after",
    [
        "not-a-cursor",
        "%%%",
        _raw([1.0]),
        _raw({"submitted": 1.0, "id": "job-1"}),
        _raw([True, "job-1"]),
        _raw(["1.0", "job-1"]),
        _raw([1.0, 7]),
        _raw([1.0, "job/../../x"]),
        _raw([1.0, "j" * 65]),
        _raw([1.0, ""]),
        "W05hTiwgImpvYi0xIl0",  # [NaN, "job-1"]: json.loads takes NaN
        "A" * 201,
    ],
)
def test_a_cursor_the_api_did_not_give_is_refused_saying_what_to_pass(after: str) -> None:
    with pytest.raises(PageError, match="is not a cursor this API gave: pass the 'next'"):
        Page.parse(None, after)
