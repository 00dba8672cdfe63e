"""A real JupyterHub in a subprocess, from the repository's own jupyterhub_config.py.

It runs with the real configurable-http-proxy and starts the real wmla service as a managed
service; only ports, the runtime folder and a few service traits are changed for the test. Every
process it starts (hub, proxy, service, job workers) is stopped by PID in ``stop()``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import requests

from extension.storage.images import UserImages
from tests.backends.conftest import remove_cgroups_of

REPO = Path(__file__).resolve().parents[2]
PROXY = REPO / "node_modules" / ".bin" / "configurable-http-proxy"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TEST_CONFIG = """
import json
load_subconfig({base!r})
c = get_config()
service = c.JupyterHub.services[0]
extra = json.loads({service_traits!r})
config = json.loads(service["environment"]["WMLA_SERVICE_CONFIG"])
config["WmlaService"].update(extra)
for section, values in json.loads({sections!r}).items():
    config.setdefault(section, {{}}).update(values)
service["environment"]["WMLA_SERVICE_CONFIG"] = json.dumps(config)
c.JupyterHub.services.append({{"name": "tester", "api_token": {token!r}}})
c.JupyterHub.load_roles.append(
    {{
        "name": "tester",
        "scopes": ["admin:users", "admin:groups", "tokens"],
        "services": ["tester"],
    }}
)
for role in c.JupyterHub.load_roles:
    if role["name"] == "wmla-plan-admin":
        role["users"] = sorted(set(role["users"]) | {{"padmin"}})
c.Authenticator.allowed_users = {{"padmin", "user1", "user2"}}
# notebook servers here only prove what the service hands them (token scopes, environment);
# plan admission of notebooks is the spawner's own suite (tests/spawner)
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = {storage!r} + "/{{username}}"
c.JupyterHub.log_level = "INFO"
"""


class Hub:
    def __init__(
        self, tmp: Path, service_traits: dict | None = None, sections: dict | None = None
    ) -> None:
        """``service_traits``: ``c.WmlaService`` values; ``sections``: other sections of the
        service's config (``{"RequestRate": {"per_second": 0}}``)."""
        self.tmp = tmp
        self.var = tmp / "var"
        self.storage = self.var / "storage"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api = f"{self.url}/services/wmla/api/v1"
        self.token = secrets.token_hex(16)
        # the admins' password, set at the hub's first start; every other name's first login
        # sets its own, and the tests' users all choose user_password
        # never starting with "-", which a command line would read as an option
        self.admin_password = "a" + secrets.token_urlsafe(16)
        self.user_password = "u" + secrets.token_urlsafe(12)
        self.env = {
            **os.environ,
            "WMLA_VAR": str(self.var),
            "WMLA_HUB_PORT": str(self.port),
            "WMLA_HUB_API_PORT": str(free_port()),
            "WMLA_PROXY_API_PORT": str(free_port()),
            "WMLA_SERVICE_PORT": str(free_port()),
            "WMLA_ADMIN_USERS": "admin",
            "WMLA_ADMIN_PASSWORD": self.admin_password,
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        }
        self.env.pop("WMLA_SERVICE_CONFIG", None)
        service_traits = dict(service_traits or {})
        # Workers run as the service's own account unless a test says otherwise: as root the
        # default would create a system account per test user (tests/security and
        # tests/spawner are the ones about accounts, with prefixed names they remove).
        # backend_options None: the config's own (e.g. the Kubernetes backend's)
        if "backend_options" in service_traits and service_traits["backend_options"] is None:
            del service_traits["backend_options"]
        else:
            service_traits.setdefault("backend_options", {"run_as_user": False})
        self.config = tmp / "test_jupyterhub_config.py"
        self.config.write_text(
            TEST_CONFIG.format(
                base=str(REPO / "jupyterhub_config.py"),
                service_traits=json.dumps(service_traits),
                sections=json.dumps(sections or {}),
                token=self.token,
                storage=str(self.storage),
            )
        )
        self.proc: subprocess.Popen | None = None
        self.pids: set[int] = set()
        self.log_path = tmp / "hub.log"
        # run in the hub's child before its exec, e.g. a supervisor's ignored signals
        self.preexec: Callable[[], None] | None = None

    # -- processes ---------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(self.config)],
            cwd=self.tmp,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=self.preexec,
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

    def _collect(self) -> None:
        """Remember every descendant of the hub (proxy, service, workers) to stop it by PID."""
        if self.proc is None:
            return
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self.pids.add(child.pid)
        except psutil.Error:
            pass

    def service_pid(self) -> int:
        assert self.proc is not None
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            if "extension.service" in " ".join(child.cmdline()):
                return child.pid
        raise RuntimeError("no wmla service process under the hub")

    def stop(self, keep_workers: bool = False) -> None:
        """Stop the hub (it stops the proxy and the service), then every PID seen under it.

        ``keep_workers``: leave job workers running (they outlive the service, as in a real
        restart); their PIDs are kept and stopped by the final ``stop()``.
        """
        self._collect()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        kept = set()
        for pid in sorted(self.pids):
            try:
                proc = psutil.Process(pid)
                if keep_workers and _is_worker(proc):
                    kept.add(pid)
                    continue
                proc.terminate()
                proc.wait(5)
            except psutil.TimeoutExpired:
                proc.kill()
            except psutil.Error:
                pass
        self.pids = kept
        self.proc = None
        if not keep_workers:
            self._remove_cgroups()
            self._unmount_storage()

    def _unmount_storage(self) -> None:
        """The users' storage images the service mounted (a hub run as root with a quota;
        the mounts outlive the service by design, not a test's hub)."""
        if (self.var / "wmla" / "storage" / "images").is_dir():
            UserImages(self.var / "wmla" / "storage", self.storage).unmount_all()

    def _remove_cgroups(self) -> None:
        """The cgroups of the workers killed above (a test's hub has no next service)."""
        remove_cgroups_of(*self.var.glob("*/backend"))

    def restart(self) -> None:
        self.stop(keep_workers=True)
        self.start()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def password_of(self, user: str) -> str:
        """``user``'s password at the hub's login form (a new name's first login sets it)."""
        return self.admin_password if user == "admin" else self.user_password

    # -- hub API -------------------------------------------------------------------------------
    def hub_api(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {"Authorization": f"token {self.token}"}
        return requests.request(
            method, f"{self.url}/hub/api{path}", headers=headers, timeout=30, **kwargs
        )

    def user_token(self, name: str) -> str:
        r = self.hub_api("POST", f"/users/{name}")
        assert r.status_code in (201, 409), r.text
        r = self.hub_api("POST", f"/users/{name}/tokens", json={"note": "wmla test"})
        assert r.status_code == 201, r.text
        return r.json()["token"]


def _is_worker(proc: psutil.Process) -> bool:
    """A job worker: the backend's launcher or anything under it."""
    for p in [proc, *proc.parents()]:
        try:
            if "worker_launcher" in " ".join(p.cmdline()):
                return True
        except psutil.Error:
            continue
    return False


class Client:
    """requests against the wmla API as one hub user."""

    def __init__(self, hub: Hub, token: str | None) -> None:
        self.hub = hub
        self.headers = {"Authorization": f"token {token}"} if token else {}

    def __call__(self, method: str, path: str, headers=None, **kwargs) -> requests.Response:
        headers = {**self.headers, **(headers or {})}
        return requests.request(method, self.hub.api + path, headers=headers, timeout=30, **kwargs)

    def get(self, path: str, **kwargs) -> requests.Response:
        return self("GET", path, **kwargs)

    def post(self, path: str, **kwargs) -> requests.Response:
        return self("POST", path, **kwargs)

    def patch(self, path: str, **kwargs) -> requests.Response:
        return self("PATCH", path, **kwargs)

    def put(self, path: str, **kwargs) -> requests.Response:
        return self("PUT", path, **kwargs)

    def delete(self, path: str, **kwargs) -> requests.Response:
        return self("DELETE", path, **kwargs)

    def wait_state(self, job_id: str, states: set[str], timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        job: dict = {}
        while time.monotonic() < deadline:
            r = self.get(f"/jobs/{job_id}")
            assert r.status_code == 200, r.text
            job = r.json()
            if job["state"] in states:
                return job
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} never reached {states}: {job}\n{self.hub.log()}")
