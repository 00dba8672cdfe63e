"""Storage quota limits as configured: every bad value refused with what to write instead, and
which limits a user gets from their plans."""

from __future__ import annotations

import pytest

from extension.storage.limits import LimitError, QuotaPolicy, parse_limits

GiB = 2**30


def test_a_bare_size_is_the_hard_limit_with_files_from_mkfs_ratio_and_no_soft_limit() -> None:
    limits = parse_limits("50Gi", "here")
    assert limits.bytes_hard == limits.bytes_soft == 50 * GiB
    assert limits.files_hard == limits.files_soft == 50 * GiB // 16384
    assert limits.grace == 7 * 86400


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"storage": "lots"}, "is not a quantity"),
        ({"storage": "1Mi"}, "below the smallest quota, 16Mi"),
        ({"files": 10}, "'storage' (the hard byte limit"),
        ({"storage": "1Gi", "files": 10}, "at least 64"),
        ({"storage": "1Gi", "files": True}, "a whole number of files"),
        ({"storage": "1Gi", "soft_storage": "2Gi"}, "a soft limit above its hard limit"),
        ({"storage": "1Gi", "grace": "forever"}, "grace"),
        ({"storage": "1Gi", "inodes": 5}, "unknown key(s) inodes; use storage, files"),
        (["1Gi"], "write limits as"),
    ],
)
def test_bad_limits_are_refused_saying_what_to_write(spec: object, words: str) -> None:
    with pytest.raises(LimitError) as err:
        parse_limits(spec, "c.WmlaService.default_storage_quota")  # type: ignore[arg-type]
    assert words in str(err.value)
    assert "c.WmlaService.default_storage_quota" in str(err.value)


def test_a_user_gets_the_nearest_plans_limits_and_the_most_generous_of_their_plans() -> None:
    policy = QuotaPolicy.from_config(
        "1Gi", {"/research": "100Gi", "/research/vision": "20Gi", "/teaching": "5Gi"}
    )
    assert policy.for_leaves(["/research/vision/ann"]).bytes_hard == 20 * GiB
    assert policy.for_leaves(["/research/nlp/ann"]).bytes_hard == 100 * GiB
    assert policy.for_leaves(["/teaching/bob", "/research/vision/bob"]).bytes_hard == 20 * GiB
    assert policy.for_leaves(["/other/cid"]).bytes_hard == GiB  # the default
    assert policy.for_leaves([]).bytes_hard == GiB
    assert QuotaPolicy.from_config("", {"/a": "1Gi"}).for_leaves(["/b/u"]) is None


def test_a_plan_key_that_is_no_plan_path_is_refused() -> None:
    with pytest.raises(LimitError, match="is not a plan path like /team"):
        QuotaPolicy.from_config("", {"research": "1Gi"})
