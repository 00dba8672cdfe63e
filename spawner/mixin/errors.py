"""The error a spawn fails with: its message is what the spawn page shows."""

from __future__ import annotations


class AdmissionError(RuntimeError):
    """The notebook cannot be admitted; the message is what the spawn page shows."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.jupyterhub_message = message
