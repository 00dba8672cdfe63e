"""A spawn's log lines, each led by the server's name as JupyterHub writes it (``alice`` or
``alice:gpu``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SpawnLog:
    """The hub's logger and the server's name that leads every line."""

    log: logging.Logger
    name: str

    def debug(self, message: str, *args: Any) -> None:
        self.log.debug("%s: " + message, self.name, *args)

    def info(self, message: str, *args: Any) -> None:
        self.log.info("%s: " + message, self.name, *args)

    def warning(self, message: str, *args: Any) -> None:
        self.log.warning("%s: " + message, self.name, *args)

    def error(self, message: str, *args: Any) -> None:
        self.log.error("%s: " + message, self.name, *args)
