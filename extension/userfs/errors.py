"""The one error of a user's files: an operation refused or failed, with why."""

from __future__ import annotations


class UserFileError(Exception):
    """An operation on a user's files was refused or failed; the message says why."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing  # the path did not exist
