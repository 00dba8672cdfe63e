"""The hub the fair-share tests share the shape of (tests/service/test_shares.py,
tests/cli/test_shares.py, tests/admin/test_shares_page.py): the service with a 10-minute
half-life on 4 devices, and a sleeper script in each named user's models folder. Each module
starts its own (module scope): the usage each one checks is only its own jobs'."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .hub import Hub

HALF_LIFE = 600.0  # seconds: "10m"
TRAITS = {"tick": 1, "grace": 1, "device_layout": "1x4", "cpu_oversubscription": 2,
          "fair_share_half_life": "10m"}  # fmt: skip
SLEEPER = "import sys, time\ntime.sleep(float(sys.argv[1]))\n"


@contextmanager
def shares_hub(tmp: Path, users: Iterable[str], model: str) -> Iterator[Hub]:
    """A started hub with ``models/<model>/main.py`` (the sleeper) for each of ``users``;
    stopped by its PIDs whatever happens."""
    hub = Hub(tmp, dict(TRAITS))
    try:
        hub.start()
        for user in users:
            folder = hub.storage / user / "models" / model
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "main.py").write_text(SLEEPER)
        yield hub
    finally:
        hub.stop()
