"""The error of a gang start that cannot happen; its message says why and what to do."""

from __future__ import annotations


class StartError(Exception):
    """The gang could not be started; the message says why and what to do."""
