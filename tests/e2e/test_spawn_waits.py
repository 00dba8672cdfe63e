"""The spawn page of a notebook that must wait shows its position and an estimate.

A real hub (the repository's jupyterhub_config.py, as tests/service/hub.py starts it) with the
local spawner, the real proxy and the real wmla service; Debian's headless Chromium (Playwright)
logs in as user1, whose notebooks go to /waitroom, a plan of one GPU that a job with a 5-minute
runtime limit holds. The spawn pending page must say that the notebook is first in line there,
starts in about 5 minutes (when the holder's limit is up), on what assumption, and why it waits:
the job's ``queue`` object (docs/service.md "Why a job waits, and until when") as the spawner's
progress events carry it (spawner/mixin/admission.py). Stopping the pending spawn then cancels
the notebook job. The hub, proxy, service and workers are stopped by PID whatever happens.
Screenshots land in test-artifacts/spawn-waits/.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator

import pytest

from tests.e2e.walk import CHROMIUM, browser_page
from tests.service.hub import PROXY, REPO, Client, Hub
from tests.spawner.helpers import hub_request, notebook_jobs, server_model, wait_for

pytestmark = [
    pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing"),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (CI installs it)"),
]
ARTIFACTS = REPO / "test-artifacts" / "spawn-waits"
PLAN = "/waitroom"
HOLD = 300  # the holder's runtime limit, seconds: the notebook's estimated start

SPAWNER_CONFIG = """
c.JupyterHub.spawner_class = "wmla-local"
c.WmlaLocalSpawner.storage_root = {storage!r}
# the check is the spawn page, not accounts (tests/spawner/test_local.py is about those)
c.WmlaLocalSpawner.system_users = False
c.WmlaLocalSpawner.user_plans = {{"user1": {plan!r}}}
c.WmlaLocalSpawner.plan_choice = False
c.WmlaLocalSpawner.profile_list = [
    {{"slug": "gpu", "display_name": "1 GPU", "kubespawner_override": {{"gpus": 1}}}},
]
c.WmlaLocalSpawner.notebook_cpu = "100m"
c.WmlaLocalSpawner.notebook_memory = "64Mi"
c.WmlaLocalSpawner.admission_poll_interval = 0.3
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 90
"""
SLEEPER = "import sys, time\ntime.sleep(float(sys.argv[1]))\n"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    tmp = tmp_path_factory.mktemp("spawn-waits")
    hub = Hub(tmp, {"tick": 1, "grace": 1, "device_layout": "1x4", "cpu_oversubscription": 4})
    hub.env["WMLA_STORAGE_ROOT"] = str(hub.storage)
    with open(hub.config, "a") as f:
        f.write(SPAWNER_CONFIG.format(storage=str(hub.storage), plan=PLAN))
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        hub.start()
        hub.clients = {name: Client(hub, hub.user_token(name)) for name in ("admin", "user1")}
        r = hub.clients["admin"].post("/plans", json={"path": PLAN, "limit": {"gpu": 1}})
        assert r.status_code == 201, r.text
        folder = hub.storage / "admin" / "models" / "sleep"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "main.py").write_text(SLEEPER)
        yield hub
    finally:
        try:
            hub_request(hub, "DELETE", "/users/user1/server", "user1")
        except Exception:
            pass
        hub.stop()


def test_the_spawn_page_of_a_notebook_that_must_wait_shows_its_position_and_an_estimate(
    hub: Hub,
) -> None:
    admin = hub.clients["admin"]
    holder = admin.post(
        "/jobs",
        json={
            "plan": PLAN, "workers": 1, "max_runtime": HOLD,
            "resources": {"gpu": 1, "cpu": "100m", "memory": "64Mi"},
            "command": {"model_dir": "models/sleep", "model_main": "main.py",
                        "args": [str(HOLD + 60)]},
        },
    )  # fmt: skip
    assert holder.status_code == 201, holder.text
    try:
        admin.wait_state(holder.json()["id"], {"RUNNING"})
        with browser_page() as page:
            page.goto(f"{hub.url}/hub/login?next=%2Fhub%2Fspawn")
            page.fill("input[name=username]", "user1")
            page.fill("input[name=password]", hub.user_password)
            page.click("input[type=submit], button[type=submit]")
            page.wait_for_url(re.compile(r".*/hub/spawn.*"))  # the form, or the pending page
            page.wait_for_load_state()  # under load the form is not there yet otherwise
            if page.locator("#spawn_form").count():  # the profile form, when the hub shows it
                page.click("#spawn_form input[type=submit], #spawn_form button[type=submit]")
            page.wait_for_url(re.compile(r".*/hub/spawn-pending/user1.*"))
            message = page.locator("#progress-message")
            # the line that says it all, short: place, estimate, the reason's first clauses
            page.wait_for_function(
                "() => /starts in about/.test(document.querySelector('#progress-message')"
                ".textContent)",
                timeout=60_000,
            )
            text = message.inner_text()
            page.screenshot(path=str(ARTIFACTS / "spawn-pending.png"), full_page=True)
            assert text.startswith(f"1st in line in {PLAN} (1st for you) — "), text
            assert re.search(r"— starts in about [45] minutes \(estimated\) — ", text), text
            assert "at its gpu limit" in text or "deserved" in text, text  # the reason's start
            assert len(text) <= 160 and "assumes" not in text, text  # one short line
            page.click("#progress-details summary")  # the event log: every line so far
            log = page.locator("#progress-log").inner_text()
            assert "asking plan /waitroom for room" in log and "1st in line" in log, log
            assert server_model(hub, "user1")["pending"] == "spawn"
        # stopping the waiting server cancels its notebook job: nothing is left holding room
        r = hub_request(hub, "DELETE", "/users/user1/server", "user1")
        assert r.status_code in (202, 204), r.text
        wait_for(lambda: notebook_jobs(hub, "user1") == [], "the notebook job to go", hub=hub)
    finally:
        admin.delete(f"/jobs/{holder.json()['id']}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and server_model(hub, "user1") is not None:
        time.sleep(0.3)
    assert server_model(hub, "user1") is None, hub.log()
