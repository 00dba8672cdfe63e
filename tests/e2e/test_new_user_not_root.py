"""A brand-new user, in a real browser, on a real hub that does NOT run as root.

The same walk as test_new_user.py (tests/e2e/walk.py: log in, the spawn page, JupyterLab with the
getting-started notebook, Run All to a FINISHED 2-worker job whose live chart draws every
series, a terminal that runs ``wmla exec-get``), on the embedded default started by an
unprivileged system account created for the test (``wmla-e2e-hub-<random>``, removed in
teardown), as an administrator without root would: the system Python of the project's
major.minor version (``/usr/bin/python3.11``) over the project's packages, PYTHONPATH = the
virtualenv's site-packages and the checkout, and the virtualenv's ``bin`` first on PATH as
``make run`` puts it. On this machine the virtualenv's own interpreter lives in a pyenv under
/root (mode 0700), so the hub's account can start neither ``.venv/bin/python`` nor the
``jupyterhub-singleuser`` script PATH finds ("bad interpreter"); the spawner then runs the
server with the hub's own interpreter over the same packages and Jupyter paths (docs/spawner.md,
"Hub not root"). Nothing of root's is opened up for this: the checkout and its virtualenv are
world-readable already; the test skips, saying which folder, where they are not.

Every server, kernel, terminal and job worker then runs as the hub's account: the terminal's
``id -un`` and the owner of the user's folder and files say so, the hub log carries the loud
warning that the OS does not keep users apart, and no process under the hub runs as root. Last,
the README's ``make run`` by the same account brings the embedded hub and its service up (the
recipe's own fallback to the system Python). Screenshots land in
test-artifacts/new-user-not-root/.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests

from extension.userfs.accounts import (
    create_account,
    find_account,
    folder_unreachable,
    system_python,
    unreachable,
)
from tests.e2e.walk import (
    CHROMIUM,
    Visit,
    browser_page,
    log_in_and_spawn,
    terminal_runs_wmla,
    train_and_check_chart,
)
from tests.service.hub import PROXY, REPO, Hub, free_port

ARTIFACTS = REPO / "test-artifacts" / "new-user-not-root"
AS_ROOT = os.geteuid() == 0 and shutil.which("useradd") is not None
HUB_ACCOUNT = f"wmla-e2e-hub-{secrets.token_hex(3)}"
USER = "newbie"
PYTHON = system_python()  # /usr/bin/python3.11: what an account without root can run
SITE = Path(next(p for p in sys.path if p.endswith("site-packages")))  # the venv's packages
pytestmark = [
    pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing"),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (CI installs it)"),
    pytest.mark.skipif(not AS_ROOT, reason="root (useradd) makes the hub's unprivileged account"),
    pytest.mark.skipif(
        PYTHON is None,
        reason=f"no system python{sys.version_info.major}.{sys.version_info.minor} in /usr/bin "
        "or /usr/local/bin for the hub's account (the project's compiled packages need the "
        "same major.minor)",
    ),
]

SPAWNER_CONFIG = """
c.JupyterHub.spawner_class = "wmla-local"  # as in jupyterhub_config.py (tests.service: simple)
c.WmlaLocalSpawner.notebook_cpu = "100m"
c.WmlaLocalSpawner.notebook_memory = "256Mi"
c.Authenticator.allowed_users = set()  # any new name signs up, as in make run
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 90
"""


class UnprivilegedHub(Hub):
    """tests.service.hub.Hub, started as ``account`` with the system Python."""

    def __init__(self, tmp: Path, account, traits: dict) -> None:
        super().__init__(tmp, traits)
        self.account = account
        self.env.update(
            HOME=str(tmp), USER=account.name, LOGNAME=account.name,
            PYTHONPATH=os.pathsep.join([str(SITE), str(REPO)]),
        )  # fmt: skip
        self.env.pop("VIRTUAL_ENV", None)

    def start(self, timeout: float = 90) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "jupyterhub", "-f", str(self.config)],
            cwd=self.tmp,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=self.account.uid,
            group=self.account.gid,
            extra_groups=[],
            umask=0o077,
        )
        log.close()
        self.pids.add(self.proc.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the hub exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if requests.get(self.api + "/health", timeout=2).status_code == 200:
                    self._collect()
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the hub or the wmla service did not come up:\n{self.log()}")

    def processes(self) -> list[psutil.Process]:
        """The hub and everything under it now (proxy, services, servers, kernels, workers)."""
        assert self.proc is not None
        top = psutil.Process(self.proc.pid)
        found = [top, *top.children(recursive=True)]
        self.pids.update(p.pid for p in found)
        return found


def _unreadable_for(account) -> str | None:
    """Why the account cannot use the project's packages as they are, or None."""
    why = unreachable(PYTHON, account)
    for folder in (SITE, REPO, REPO / "node_modules"):
        why = why or folder_unreachable(str(folder), account)
    return why


@pytest.fixture(scope="module")
def hub() -> Iterator[UnprivilegedHub]:
    account = find_account(HUB_ACCOUNT) or create_account(HUB_ACCOUNT, "/nonexistent")
    tmp = Path(tempfile.mkdtemp(prefix="wmla-e2e-not-root-"))
    hub = None
    try:
        why = _unreadable_for(account)
        if why:
            pytest.skip(
                f"the hub's account {account.name} cannot use the project as installed: {why}. "
                "A hub that does not run as root needs the checkout, its virtualenv's "
                "site-packages and node_modules readable by its account (docs/spawner.md)"
            )
        os.chown(tmp, account.uid, account.gid)
        os.chmod(tmp, 0o700)
        traits = {"tick": 1, "grace": 1, "device_layout": "1x4", "cpu_oversubscription": 4}
        hub = UnprivilegedHub(tmp, account, traits)
        with open(hub.config, "a") as f:
            f.write(SPAWNER_CONFIG)
        os.chown(hub.config, account.uid, account.gid)
        shutil.rmtree(ARTIFACTS, ignore_errors=True)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        hub.start()
        yield hub
    finally:
        if hub is not None:
            hub.stop()
        _stop_leftovers(account.uid)
        subprocess.run(["userdel", account.name], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_leftovers(uid: int) -> None:
    """Anything the test's account still runs (it exists only for this test), by PID."""
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real == uid:
                proc.terminate()
                proc.wait(5)
        except psutil.TimeoutExpired:
            proc.kill()
        except psutil.Error:
            pass


@pytest.fixture(scope="module")
def visit(hub: UnprivilegedHub) -> Iterator[Visit]:
    with browser_page() as page:
        yield Visit(
            page, hub.url, hub.user_password, USER, hub.storage / USER, hub.account.name, ARTIFACTS
        )


def test_a_new_user_logs_in_to_jupyterlab_on_a_hub_not_run_as_root(
    hub: UnprivilegedHub, visit: Visit
) -> None:
    log_in_and_spawn(visit)
    assert visit.uid == hub.account.uid  # the hub's own account owns the folder and files
    log = hub.log_path.read_text(errors="replace")
    assert "!!! wmla: the hub does not run as root" in log, log[-4000:]
    assert f"running the server with {PYTHON} over the hub's packages" in log, log[-4000:]


def test_the_getting_started_notebook_trains_on_a_hub_not_run_as_root(visit: Visit) -> None:
    """In a browser that takes 3 s to load plotly's widget module: the charts still draw."""
    train_and_check_chart(visit, module_stall=3.0)


def test_a_terminal_runs_wmla_as_the_hubs_account(visit: Visit) -> None:
    terminal_runs_wmla(visit)


def test_nothing_under_the_hub_runs_as_root(hub: UnprivilegedHub) -> None:
    seen = {}
    for proc in hub.processes():
        try:
            seen[proc.pid] = (proc.uids().real, proc.uids().effective, " ".join(proc.cmdline()))
        except psutil.Error:
            continue
    assert any("jupyterhub.singleuser" in cmd for _, _, cmd in seen.values()), seen
    assert {uid for uid, _, _ in seen.values()} == {hub.account.uid}, seen
    assert {euid for _, euid, _ in seen.values()} == {hub.account.uid}, seen


def test_make_run_starts_the_embedded_hub_as_the_account(hub: UnprivilegedHub) -> None:
    """The README's ``make run``, by the same account on this checkout: the venv's interpreter
    is out of its reach, so the recipe runs the system Python over the venv's packages (the
    stamps are taken as made: only their owner could rebuild the venv)."""
    var = hub.tmp / "make-var"
    var.mkdir()
    os.chown(var, hub.account.uid, hub.account.gid)
    port = free_port()
    health_url = f"http://127.0.0.1:{port}/services/wmla/api/v1/health"
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(hub.tmp), "LANG": "C.UTF-8",
        "USER": hub.account.name, "WMLA_VAR": str(var), "WMLA_HUB_PORT": str(port),
        "WMLA_HUB_API_PORT": str(free_port()), "WMLA_PROXY_API_PORT": str(free_port()),
        "WMLA_SERVICE_PORT": str(free_port()),
    }  # fmt: skip
    log_path = hub.tmp / "make-run.log"
    with open(log_path, "wb") as log:
        make = subprocess.Popen(
            ["make", "-o", ".venv/.installed", "-o", "node_modules/.installed", "run"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            user=hub.account.uid, group=hub.account.gid, extra_groups=[],
        )  # fmt: skip
    seen: set[int] = {make.pid}
    try:
        deadline = time.monotonic() + 90
        up = False
        while time.monotonic() < deadline and make.poll() is None and not up:
            try:
                up = requests.get(health_url, timeout=2).status_code == 200
            except requests.RequestException:
                time.sleep(0.5)
        text = log_path.read_text(errors="replace")
        assert up, text[-4000:]
        if unreachable(str(REPO / ".venv" / "bin" / "python"), hub.account):
            assert f"running {PYTHON} over the venv's packages" in text, text[-4000:]
        under = psutil.Process(make.pid).children(recursive=True)
        seen.update(p.pid for p in under)
        assert {p.uids().real for p in under} == {hub.account.uid}
    finally:
        try:
            seen.update(p.pid for p in psutil.Process(make.pid).children(recursive=True))
        except psutil.Error:
            pass
        for pid in sorted(seen - {make.pid}):  # the hub first: it stops the proxy and service
            try:
                proc = psutil.Process(pid)
                if "jupyterhub" in proc.cmdline():
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(30)
            except psutil.Error:
                pass
        for pid in sorted(seen):
            try:
                proc = psutil.Process(pid)
                proc.terminate()
                proc.wait(5)
            except psutil.TimeoutExpired:
                proc.kill()
            except psutil.Error:
                pass
