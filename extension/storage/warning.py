"""The sentence that warns a user about their folder's quota (the spawn page, the metering
widget), from one row of ``GET api/v1/storage``; None when there is nothing to say."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from extension.tables import format_seconds, size_text

from .quotas import WARN_AT  # the state's NEAR and this sentence start at the same figure


def quota_warning(row: Mapping[str, Any]) -> str | None:
    if not row.get("enforced"):
        return None
    used, soft, hard = row["used_bytes"], row["soft_storage"], row["storage"]
    files, soft_files = row["used_files"], row["soft_files"]
    state = row.get("state", "")
    where = f"Your folder {row.get('folder', '')}".rstrip()
    if state == "at hard limit":
        return (
            f"{where} is full ({size_text(used)} of {size_text(row['held_bytes'])}, "
            f"{files} files of {row['held_files']}): writes fail until you delete some."
        )
    if state == "over soft limit, grace expired":
        return (
            f"{where} is over its soft limit ({size_text(used)} of {size_text(soft)}) and "
            "its grace period has ended: writes fail until you delete down to it."
        )
    if state == "over soft limit, in grace":
        left = row.get("grace_left")
        when = f"in {format_seconds(left)}" if left is not None else "soon"
        return (
            f"{where} is over its soft limit ({size_text(used)} of {size_text(soft)}): "
            f"delete down to it, or writes fail {when} (hard limit {size_text(hard)})."
        )
    if used >= WARN_AT * soft or files >= WARN_AT * soft_files:
        pct = max(used / soft if soft else 0, files / soft_files if soft_files else 0)
        return (
            f"{where} holds {size_text(used)} of its {size_text(soft)} quota and {files} "
            f"files of {soft_files} ({pct:.0%}): free space, or ask an admin for more."
        )
    return None
