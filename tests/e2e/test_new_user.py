"""A brand-new user of the embedded default, in a real browser, on a real hub run as root.

The hub runs from the repository's jupyterhub_config.py with the local spawner creating real
system accounts (a random prefix, removed in teardown) and the real service, proxy and workers.
Debian's headless Chromium (Playwright) logs in as a user the machine has never seen, waits for
JupyterLab, opens the getting-started notebook the first spawn put in the user's folder, runs
it, and checks the job monitor's live chart once the 2-worker training finished: every named
trace drawn, no two y-axes on one side. Screenshots land in test-artifacts/new-user/.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.service.hub import PROXY, REPO, Hub

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
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
c.Authenticator.allowed_users = set()  # anyone with the shared password, as in make run
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
        hub.password = json.loads((hub.var / "hub-passwords.json").read_text())["user_password"]
        yield hub
    finally:
        hub.stop()
        subprocess.run(["userdel", PREFIX + USER], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def page(hub: Hub):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_a_new_user_logs_in_to_jupyterlab_and_finds_the_getting_started_notebook(
    hub: Hub, page
) -> None:
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", USER)
    page.fill("input[name=password]", hub.password)
    page.click("input[type=submit], button[type=submit]")
    # the spawn page: a notebook size and the plans this user may use
    page.wait_for_selector("input[name=profile][value=cpu]:checked", timeout=60_000)
    plans = page.eval_on_selector_all("input[name=plan]", "els => els.map(e => e.value)")
    assert "/sample-project/notebooks" in plans and "/sample-project/training" in plans, plans
    assert page.is_checked("input[name=plan][value='/sample-project/notebooks']")
    shot(page, "0-spawn-page")
    page.click("#spawn_form input[type=submit], #spawn_form button[type=submit]")
    page.wait_for_url(f"**/user/{USER}/lab**", timeout=150_000)
    page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
    page.locator(".jp-DirListing-item", has_text="getting-started.ipynb").wait_for(timeout=60_000)
    shot(page, "1-jupyterlab")
    folder = hub.storage / USER
    assert (folder / "getting-started.ipynb").is_file()
    assert (folder / "models" / "pytorch_mnist" / "main.py").is_file()
    assert os.stat(folder).st_uid != 0  # the server and the files are the new account's


def test_the_getting_started_notebook_trains_and_its_live_chart_draws_every_series(
    hub: Hub, page
) -> None:
    page.goto(f"{hub.url}/user/{USER}/lab/tree/getting-started.ipynb")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
    select = page.get_by_role("button", name="Select", exact=True)
    try:  # JupyterLab may ask which kernel to start for a notebook it has not run yet
        select.click(timeout=10_000)
    except Exception:
        pass
    # the kernel is up: its status (a hidden label of the toolbar's indicator) says Idle
    page.get_by_text("Kernel status: Idle").first.wait_for(state="attached", timeout=90_000)
    page.click("text=Run >> nth=0")  # the menu bar's Run menu
    page.click("text=Run All Cells")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        states = page.locator(".jp-OutputArea").all_inner_texts()
        text = "\n".join(states)
        if "FINISHED" in text or "FAILED" in text:
            break
        time.sleep(2)
    shot(page, "2-trained")
    assert "FINISHED" in text, text[-3000:]
    time.sleep(3)  # the monitor's last refresh of the chart
    charts = page.evaluate(
        """() => [...document.querySelectorAll('.js-plotly-plot')].map(gd => ({
            traces: (gd.data || []).map(t => ({name: t.name, points: (t.y || []).length})),
            drawn: [...gd.querySelectorAll('.scatterlayer .trace')].map(t => {
                const line = t.querySelector('path.js-line');
                return line ? (line.getAttribute('d') || '').length : 0;
            }),
            yaxes: Object.keys(gd._fullLayout || {}).filter(k => /^yaxis\\d*$/.test(k)).map(k => ({
                name: k, side: gd._fullLayout[k].side,
                overlaying: gd._fullLayout[k].overlaying || null,
                domain: gd._fullLayout[k].domain,
            })),
        }))"""
    )
    training = [c for c in charts if any("loss" in (t["name"] or "") for t in c["traces"])]
    shot(page, "3-chart")
    assert training, charts
    chart = training[0]
    names = [t["name"] for t in chart["traces"] if t["name"]]
    assert {"loss", "accuracy"} <= set(names) or len(names) >= 2, chart
    for trace, drawn in zip(chart["traces"], chart["drawn"]):
        assert trace["points"] >= 2 and drawn > 0, chart  # every named series has a line
    sides = {}
    for axis in chart["yaxes"]:
        key = (axis["side"], tuple(axis["domain"]))
        assert key not in sides, chart  # two y-axes on one side of one panel
        sides[key] = axis["name"]


def test_a_terminal_of_the_new_users_server_runs_wmla_as_the_user(hub: Hub, page) -> None:
    page.goto(f"{hub.url}/user/{USER}/lab")
    page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
    page.locator(".lm-MenuBar-itemLabel", has_text="File").first.click()  # File > New > Terminal
    page.locator(".lm-Menu-itemLabel", has_text="New").first.hover()
    page.locator(".lm-Menu-itemLabel", has_text="Terminal").first.click()
    terminal = page.locator(".jp-Terminal").first
    terminal.wait_for(timeout=60_000)
    terminal.click()
    # what the terminal draws is a canvas: the shell also keeps what it printed in a file
    page.keyboard.type("(id -un; wmla exec-get) 2>&1 | tee seen-in-terminal.txt\n", delay=20)
    seen = hub.storage / USER / "seen-in-terminal.txt"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "pytorch_mnist-main" not in _read(seen):
        time.sleep(1)
    shot(page, "4-terminal")
    text = _read(seen)
    assert PREFIX + USER in text, text  # the shell runs as the new user's account
    assert "pytorch_mnist-main" in text and "FINISHED" in text, text  # the training job
    assert seen.stat().st_uid == pwd.getpwnam(PREFIX + USER).pw_uid


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
