"""A brand-new user of the embedded default, in a real browser, on a real hub run as root.

The hub runs from the repository's jupyterhub_config.py with the local spawner creating real
system accounts (a random prefix, removed in teardown) and the real service, proxy and workers.
Debian's headless Chromium (Playwright) logs in as a user the machine has never seen, waits for
JupyterLab, opens the getting-started notebook the first spawn put in the user's folder, runs
it, and checks the job monitor's live chart once the 2-worker training finished: every named
trace drawn, no two y-axes on one side; then a terminal runs ``wmla exec-get`` as the account.
The steps are tests/e2e/walk.py's, shared with test_new_user_not_root.py (the same walk on a
hub that does not run as root). Screenshots land in test-artifacts/new-user/.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.walk import (
    CHROMIUM,
    Visit,
    browser_page,
    log_in_and_spawn,
    terminal_runs_wmla,
    train_and_check_chart,
)
from tests.service.hub import PROXY, REPO, Hub

ARTIFACTS = REPO / "test-artifacts" / "new-user"
AS_ROOT = os.geteuid() == 0 and shutil.which("useradd") is not None
pytestmark = [
    pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing"),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (CI installs it)"),
    pytest.mark.skipif(not AS_ROOT, reason="the embedded default as root creates accounts"),
]
PREFIX = f"wn{secrets.token_hex(3)}-"
USER = "newbie"

SPAWNER_CONFIG = """
c.JupyterHub.spawner_class = "wmla-local"
c.WmlaLocalSpawner.storage_root = {storage!r}
c.WmlaLocalSpawner.system_user_template = {template!r}
c.WmlaLocalSpawner.notebook_cpu = "100m"
c.WmlaLocalSpawner.notebook_memory = "256Mi"
c.Authenticator.allowed_users = set()  # any new name signs up, as in make run
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 90
"""


@pytest.fixture(scope="module")
def hub():
    tmp = Path(tempfile.mkdtemp(prefix="wmla-new-user-"))
    os.chmod(tmp, 0o711)
    storage = tmp / "storage"
    storage.mkdir(mode=0o711)
    traits = {"tick": 1, "grace": 1, "device_layout": "1x4", "cpu_oversubscription": 4}
    traits["backend_options"] = {"account_template": PREFIX + "{username}"}
    hub = Hub(tmp, traits)
    hub.env["WMLA_STORAGE_ROOT"] = str(storage)
    hub.storage = storage
    with open(hub.config, "a") as f:
        f.write(SPAWNER_CONFIG.format(storage=str(storage), template=PREFIX + "{username}"))
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        hub.start()
        yield hub
    finally:
        hub.stop()
        subprocess.run(["userdel", PREFIX + USER], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def visit(hub: Hub) -> Iterator[Visit]:
    with browser_page() as page:
        yield Visit(
            page, hub.url, hub.user_password, USER, hub.storage / USER, PREFIX + USER, ARTIFACTS
        )


def test_a_new_user_logs_in_to_jupyterlab_and_finds_the_getting_started_notebook(
    visit: Visit,
) -> None:
    log_in_and_spawn(visit)
    assert visit.uid != 0  # the server and the files are the new account's


def test_the_getting_started_notebook_trains_and_its_live_chart_draws_every_series(
    visit: Visit,
) -> None:
    train_and_check_chart(visit)


def test_a_terminal_of_the_new_users_server_runs_wmla_as_the_user(visit: Visit) -> None:
    terminal_runs_wmla(visit)
