"""The quota warning a user reads on the spawn page and in the metering widget."""

from __future__ import annotations

from extension.storage.warning import quota_warning

MiB = 2**20


def row(used: int, state: str, files: int = 3, grace_left: float | None = None) -> dict:
    return {"enforced": True, "folder": "/s/ann", "used_bytes": used, "used_files": files,
            "storage": 100 * MiB, "soft_storage": 80 * MiB, "files": 1000, "soft_files": 800,
            "held_bytes": 100 * MiB, "held_files": 1000, "state": state,
            "grace_left": grace_left}  # fmt: skip


def test_nothing_under_ninety_percent_and_nothing_where_quotas_are_not_held() -> None:
    assert quota_warning(row(70 * MiB, "under")) is None
    assert quota_warning({"enforced": False}) is None


def test_from_ninety_percent_of_the_soft_limit_it_says_how_full_and_what_to_do() -> None:
    text = quota_warning(row(73 * MiB, "near"))
    assert text == ("Your folder /s/ann holds 73 MiB of its 80 MiB quota and 3 files of 800 "
                    "(91%): free space, or ask an admin for more.")  # fmt: skip
    assert "(95%)" in quota_warning(row(MiB, "near", files=760))


def test_over_the_soft_limit_it_says_when_writes_will_fail() -> None:
    text = quota_warning(row(90 * MiB, "over soft limit, in grace", grace_left=7200))
    assert "over its soft limit (90 MiB of 80 MiB)" in text and "writes fail in 2.0h" in text
    text = quota_warning(row(90 * MiB, "over soft limit, grace expired"))
    assert "grace period has ended: writes fail until you delete down to it" in text
    assert "is full (100 MiB of 100 MiB" in quota_warning(row(100 * MiB, "at hard limit"))
