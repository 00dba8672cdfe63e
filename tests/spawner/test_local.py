"""WmlaLocalSpawner through a real JupyterHub, real proxy, the real wmla service and real servers.

The hub runs from the repository's jupyterhub_config.py (as tests/service/hub.py starts it) with
spawner settings added. When this machine runs the tests as root and has useradd, the fixture
creates two system accounts (one per hub user, removed in teardown) and the spawner runs each
server as its account: reading the other user's folder then fails at the OS level (S6). Without
root only the API-level isolation is checked (the spawner runs every server as the hub's account
and says so in the log).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import site
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import requests

from extension.userfs.accounts import Account, account_python, unreachable
from tests.security.raw_signals import PLANTED, RAW, ignore_planted, ignored
from tests.service.hub import PROXY, REPO, Client, Hub
from tests.spawner.helpers import hub_request, notebook_jobs, server_model, wait_for

pytestmark = pytest.mark.skipif(
    not PROXY.exists(), reason="configurable-http-proxy is missing: run `make install`"
)

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("useradd") is not None
PREFIX = f"wt{secrets.token_hex(3)}-"  # unique accounts: other runs on this machine keep theirs

SPAWNER_CONFIG = """
c.JupyterHub.spawner_class = "wmla-local"
c.WmlaLocalSpawner.storage_root = {storage!r}
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0}}
c.WmlaLocalSpawner.system_user_template = {template!r}
c.WmlaLocalSpawner.create_system_users = False
c.WmlaLocalSpawner.user_plans = {{"user1": "/project1/dev-team"}}
c.WmlaLocalSpawner.notebook_cpu = "100m"
c.WmlaLocalSpawner.notebook_memory = "64Mi"
c.WmlaLocalSpawner.admission_poll_interval = 0.3
c.WmlaLocalSpawner.profile_list = [
    {{"slug": "cpu", "display_name": "CPU only", "default": True}},
    {{"slug": "one-gpu", "display_name": "1 GPU", "kubespawner_override": {{"gpus": 1}}}},
    {{"slug": "huge", "display_name": "8 GPUs", "kubespawner_override": {{"gpus": 8}}}},
    {{"slug": "impatient", "display_name": "1 GPU, gives up soon",
      "kubespawner_override": {{"gpus": 1}}}},
]


def _impatient(spawner):  # a spawn that runs out of start_timeout while it waits for room
    if spawner.user_options.get("profile") == "impatient":
        spawner.start_timeout = 4


c.Spawner.pre_spawn_hook = _impatient
c.Spawner.start_timeout = 120
c.Spawner.poll_interval = 2  # notice a server that died by itself soon
c.Spawner.http_timeout = 90
"""


def account(user: str) -> str:
    return PREFIX + user


def accounts_can_run_servers(name: str) -> bool:
    """Whether the spawner can run a server as this account: the venv's Python, or the system
    Python of the same version over the venv's packages (this machine's venv lives under /root,
    mode 0700, so that fallback, account_python="auto", is what runs here)."""
    entry = pwd.getpwnam(name)
    acct = Account(name, entry.pw_uid, entry.pw_gid)
    singleuser = str(Path(sys.executable).with_name("jupyterhub-singleuser"))
    if unreachable(singleuser, acct) is None:
        return True
    return account_python(acct, "auto", [*site.getsitepackages(), str(REPO)]) is not None


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("spawner-hub")
    # The storage root lies outside pytest's temp folders: those are 0700 (and pytest sets them
    # back to 0700 whenever another session starts), which would lock the accounts out.
    storage = Path(tempfile.mkdtemp(prefix="wmla-spawner-storage-"))
    os.chmod(storage, 0o711)
    created = []
    traits = {"tick": 1, "grace": 1, "device_layout": "1x4", "cpu_oversubscription": 4}
    # notebook jobs get their plans' runtime limits (no plan here sets one but in that test)
    traits["notebook_runtime_limit"] = True
    # jobs run as the same accounts as the notebooks (the backend's and the spawner's templates
    # agree), so a user's job can read the code in the user's own 0700 folder
    traits["backend_options"] = {"account_template": PREFIX + "{username}"}
    # GPU nodes of the test (NVIDIA's major 195): a server's cgroup may open its own only
    devices = Path(tempfile.mkdtemp(prefix="wmla-spawner-dev-"))
    os.chmod(devices, 0o755)
    if AS_ROOT:
        for index in range(4):
            node = devices / f"nvidia{index}"
            os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(195, index))
            os.chmod(node, 0o666)
    traits["backend_options"]["gpu_device_template"] = str(devices / "nvidia{index}")
    hub = Hub(tmp, traits)
    if RAW:  # started as under a supervisor that ignores signals: the servers must not inherit
        hub.preexec = ignore_planted
    hub.env["WMLA_STORAGE_ROOT"] = str(storage)
    hub.env["WMLA_GPU_DEVICE_TEMPLATE"] = str(devices / "nvidia{index}")
    hub.devices = devices
    hub.storage = storage
    hub.os_isolation = AS_ROOT
    with open(hub.config, "a") as f:
        f.write(SPAWNER_CONFIG.format(template=PREFIX + "{username}", storage=str(storage)))
    try:
        if AS_ROOT:
            for user in ("user1", "user2"):
                subprocess.run(
                    [
                        "useradd",
                        "--no-create-home",
                        "--home-dir",  # as the spawner makes it: the backend adopts only such
                        str(storage / user),
                        "--shell",
                        "/usr/sbin/nologin",
                        "--user-group",
                        account(user),
                    ],  # fmt: skip
                    check=True,
                    capture_output=True,
                )
                created.append(account(user))
            if not accounts_can_run_servers(account("user1")):
                # no Python the accounts can run: servers run as root, API-level isolation only
                with open(hub.config, "a") as f:
                    f.write("c.WmlaLocalSpawner.system_users = False\n")
                hub.os_isolation = False
        hub.start()
        users = ("admin", "user1", "user2")
        hub.clients = {name: Client(hub, hub.user_token(name)) for name in users}
        admin = hub.clients["admin"]
        for body in (
            {"path": "/project1", "limit": {"gpu": 2}},
            {"path": "/project1/dev-team", "limit": {"gpu": 2}},
        ):
            r = admin.post("/plans", json=body)
            assert r.status_code == 201, r.text
        yield hub
    finally:
        try:
            for user in ("user1", "user2"):
                hub_request(hub, "DELETE", f"/users/{user}/server", user)
        except Exception:
            pass
        hub.stop()
        for name in created:
            subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(storage, ignore_errors=True)
        shutil.rmtree(devices, ignore_errors=True)


# -- helpers -----------------------------------------------------------------------------------
def spawn(hub: Hub, user: str, profile: str | None = None) -> requests.Response:
    body = {"profile": profile} if profile else {}
    return hub_request(hub, "POST", f"/users/{user}/server", user, json=body)


def wait_ready(hub: Hub, user: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = server_model(hub, user)
        if model and model["ready"]:
            return model
        if model is None or not model.get("pending"):
            raise AssertionError(f"{user}'s server is not starting: {model}\n{hub.log()}")
        time.sleep(0.5)
    raise AssertionError(f"{user}'s server never became ready\n{hub.log()}")


def stop(hub: Hub, user: str, timeout: float = 60) -> None:
    r = hub_request(hub, "DELETE", f"/users/{user}/server", user)
    assert r.status_code in (202, 204), r.text
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server_model(hub, user) is not None:
        time.sleep(0.3)
    assert server_model(hub, user) is None, hub.log()


def progress_events(hub: Hub, user: str):
    """The spawn's progress events as the hub streams them (server-sent events)."""
    token = hub.clients[user].headers["Authorization"]
    with requests.get(
        f"{hub.url}/hub/api/users/{user}/server/progress",
        headers={"Authorization": token},
        stream=True,
        timeout=120,
    ) as r:
        if r.status_code == 400 and "is not starting" in r.text:
            return  # the spawn already ended (a refusal can be that quick)
        assert r.status_code == 200, r.text
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                yield json.loads(line[len("data:") :])


def server_process(hub: Hub, user: str) -> psutil.Process:
    assert hub.proc is not None
    for child in psutil.Process(hub.proc.pid).children(recursive=True):
        try:
            if "singleuser" in " ".join(child.cmdline()):
                if child.environ().get("JUPYTERHUB_USER") == user:
                    return child
        except psutil.Error:
            continue
    raise AssertionError(f"no server process of {user}")


def leaf(hub: Hub, path: str) -> dict:
    plans = hub.clients["admin"].get("/plans").json()["plans"]
    return next((p for p in plans if p["path"] == path), {})


# -- tests -------------------------------------------------------------------------------------
def test_two_users_each_see_only_their_own_folder(hub: Hub) -> None:
    assert spawn(hub, "user1").status_code in (201, 202)
    assert spawn(hub, "user2").status_code in (201, 202)
    wait_ready(hub, "user1")
    wait_ready(hub, "user2")
    folders = {u: hub.storage / u for u in ("user1", "user2")}
    for user, folder in folders.items():
        info = folder.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700
        proc = server_process(hub, user)
        env = proc.environ()
        plan = "/project1/dev-team" if user == "user1" else "/sample-project/notebooks"
        assert (env["WMLA_PLAN"], env["WMLA_LEAF"]) == (plan, f"{plan}/{user}")
        assert env["WMLA_USER_DIR"] == str(folder) == env["HOME"] == proc.cwd()
        assert env["IPYTHONDIR"] == str(folder / ".ipython")
        assert env["WMLA_URL"].endswith("/services/wmla/")
        assert (folder / ".ipython/profile_default/startup/00-wmla-magics.py").is_file()
        if hub.os_isolation:
            uid = pwd.getpwnam(account(user)).pw_uid
            assert info.st_uid == uid and proc.uids().effective == uid
            startup = folder / ".ipython/profile_default/startup/00-wmla-magics.py"
            assert startup.stat().st_uid == uid
        # the service holds the server as a running, non-preemptible one-worker job
        (job,) = notebook_jobs(hub, user)
        assert (job["state"], job["leaf"]) == ("RUNNING", f"{plan}/{user}")
        assert job["preemptible"] is False and job["workers"]["max"] == 1

    # through the notebook server's API: user1 lists its own folder only
    h1 = {"Authorization": hub.clients["user1"].headers["Authorization"]}
    (folders["user1"] / "mine.txt").write_text("user1's")
    r = requests.get(f"{hub.url}/user/user1/api/contents/", headers=h1, timeout=30)
    assert r.status_code == 200 and "mine.txt" in {c["name"] for c in r.json()["content"]}
    for path in ("../user2", "..%2Fuser2", "%2E%2E/user2"):
        r = requests.get(f"{hub.url}/user/user1/api/contents/{path}", headers=h1, timeout=30)
        assert r.status_code in (400, 403, 404), (path, r.status_code)
    r = requests.get(
        f"{hub.url}/user/user2/api/contents/", headers=h1, timeout=30, allow_redirects=False
    )
    assert r.status_code in (302, 403, 404), r.status_code

    # JupyterLab and a terminal, whatever interpreter the account runs the server with
    r = requests.get(f"{hub.url}/user/user1/lab", headers=h1, timeout=30)
    assert r.status_code == 200 and "jupyter-config-data" in r.text, r.text[:300]
    r = requests.get(f"{hub.url}/user/user1/lab/api/extensions", headers=h1, timeout=30)
    assert r.status_code == 200, r.text[:300]
    names = {e["name"] for e in r.json()}
    assert {"@jupyter-widgets/jupyterlab-manager", "jupyterlab-plotly"} & names, names
    r = requests.post(f"{hub.url}/user/user1/api/terminals", headers=h1, timeout=30)
    assert r.status_code == 200, r.text[:300]
    requests.delete(f"{hub.url}/user/user1/api/terminals/{r.json()['name']}", headers=h1)

    if hub.os_isolation:  # at the OS level: user1's account cannot read user2's folder
        entry = pwd.getpwnam(account("user1"))

        def become() -> None:
            os.setgid(entry.pw_gid)
            os.setgroups([])
            os.setuid(entry.pw_uid)

        for folder, allowed in ((folders["user2"], False), (folders["user1"], True)):
            done = subprocess.run(
                ["ls", str(folder)], preexec_fn=become, capture_output=True, text=True
            )
            assert (done.returncode == 0) is allowed, done
            if not allowed:
                assert "Permission denied" in done.stderr, done.stderr


def test_stopping_a_server_releases_its_plan(hub: Hub) -> None:
    path = "/project1/dev-team/user1"
    held = wait_for(lambda: leaf(hub, path).get("running") == 1 and leaf(hub, path), "a cycle")
    assert held["allocated"]["cpu"] == 100
    stop(hub, "user1")
    assert notebook_jobs(hub, "user1") == [], hub.log()
    cancelled = notebook_jobs(hub, "user1", "CANCELLED")
    assert cancelled and cancelled[0]["leaf"] == path
    freed = wait_for(lambda: leaf(hub, path).get("running") == 0 and leaf(hub, path), "release")
    assert freed["allocated"] == {"gpu": 0, "cpu": 0, "memory": 0}
    stop(hub, "user2")


def test_a_server_that_dies_by_itself_releases_its_job(hub: Hub) -> None:
    """JupyterHub does not call stop() for a server it finds dead; the job is released anyway."""
    assert spawn(hub, "user2").status_code in (201, 202)
    wait_ready(hub, "user2")
    (job,) = notebook_jobs(hub, "user2")
    server_process(hub, "user2").kill()
    wait_for(lambda: server_model(hub, "user2") is None, "the hub to notice", timeout=60)
    wait_for(lambda: notebook_jobs(hub, "user2") == [], "the job to be released")
    assert hub.clients["admin"].get(f"/jobs/{job['id']}").json()["state"] == "CANCELLED"


def test_a_server_whose_job_an_admin_cancels_is_stopped(hub: Hub) -> None:
    """The notebook job is what charges the server to its plan: once an admin cancels it, the
    server goes too (at the hub's next poll) instead of running uncharged."""
    assert spawn(hub, "user2").status_code in (201, 202)
    wait_ready(hub, "user2")
    (job,) = notebook_jobs(hub, "user2")
    process = server_process(hub, "user2")
    cancelled = hub.clients["admin"].delete(f"/jobs/{job['id']}")
    assert cancelled.status_code == 200, cancelled.text
    wait_for(lambda: server_model(hub, "user2") is None, "the hub to stop the server", timeout=60)
    wait_for(lambda: not _alive(process), "the server process to end")
    assert "is CANCELLED in the wmla service: stopping the server" in hub.log()


def test_a_server_at_its_plans_runtime_limit_is_stopped(hub: Hub) -> None:
    """With c.WmlaService.notebook_runtime_limit on, the notebook job gets its plan's
    runtime_default; at that limit the service ends it TIMEOUT and the hub's next poll stops the
    server (spawner/mixin/poll.py: a job that ended is a server that must go). The limit, 3 s,
    runs out while the server is still starting: the poll leaves the spawn alone and stops the
    server once the hub has it, instead of leaving the hub waiting for a server that is gone."""
    admin = hub.clients["admin"]
    plan = "/plans/sample-project/notebooks"  # user2's (the default plan)
    assert admin.patch(plan, json={"runtime_default": "3s"}).status_code == 200
    try:
        assert spawn(hub, "user2").status_code in (201, 202)
        found = wait_for(lambda: notebook_jobs(hub, "user2", "RUNNING,TIMEOUT"), "the job")
        assert found[0]["max_runtime"] == 3
        ended = hub.clients["user2"].wait_state(found[0]["id"], {"TIMEOUT"}, timeout=60)
        assert ended["reason"].startswith("runtime limit of 3s reached (started ")
        wait_for(lambda: server_model(hub, "user2") is None, "the poll to stop it", 60, hub)
        assert "is TIMEOUT in the wmla service: stopping the server" in hub.log()
    finally:
        admin.patch(plan, json={"runtime_default": None})
        if server_model(hub, "user2") is not None:
            stop(hub, "user2")


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_server_that_can_never_fit_fails_at_once_with_the_message(hub: Hub) -> None:
    r = spawn(hub, "user1", "huge")
    if r.status_code >= 400:  # the spawn failed before the hub answered
        message = r.json()["message"]
    else:
        events = list(progress_events(hub, "user1"))
        failed = [e for e in events if e.get("failed")]
        if failed:
            message = failed[-1]["message"]
        else:  # it failed before the progress stream opened: the hub logged why
            wait_for(lambda: server_model(hub, "user1") is None, "the failed spawn to end")
            lines = [x for x in hub.log().splitlines() if "can never hold this server" in x]
            assert lines, (events, hub.log())
            message = "Spawn failed: " + lines[-1]
    assert "Spawn failed" in message or r.status_code >= 400
    assert "/project1" in message and "gpu" in message and "8" in message, message
    assert notebook_jobs(hub, "user1") == [], hub.log()
    assert server_model(hub, "user1") is None


def fill_dev_team(hub: Hub) -> requests.Response:
    """An admin's notebook job for user2 that takes all of dev-team's 2 GPUs."""
    blocker = hub.clients["admin"].post(
        "/jobs",
        json={
            "plan": "/project1/dev-team",
            "kind": "notebook",
            "user": "user2",
            "resources": {"gpu": 2, "cpu": "100m", "memory": "64Mi"},
        },  # fmt: skip
    )
    assert blocker.status_code == 201, blocker.text
    return blocker


def test_a_server_waits_for_room_with_the_reason_then_starts(hub: Hub) -> None:
    admin = hub.clients["admin"]
    blocker = fill_dev_team(hub)
    admin.wait_state(blocker.json()["id"], {"RUNNING"})
    assert spawn(hub, "user1", "one-gpu").status_code in (201, 202)
    messages = []
    released = False
    for event in progress_events(hub, "user1"):
        messages.append(event.get("message", ""))
        if not released and "at its gpu limit: 2 of 2 in use" in messages[-1]:
            assert "/project1" in messages[-1]
            assert server_model(hub, "user1")["pending"] == "spawn"
            r = admin.delete(f"/jobs/{blocker.json()['id']}")
            assert r.status_code == 200, r.text
            released = True
        if event.get("ready") or event.get("failed"):
            break
    assert released, messages
    assert not event.get("failed"), messages
    wait_ready(hub, "user1")
    assert any(m.startswith("admitted to /project1/dev-team/user1") for m in messages), messages
    assert server_process(hub, "user1").environ()["WMLA_LEAF"] == "/project1/dev-team/user1"
    stop(hub, "user1")
    assert notebook_jobs(hub, "user1") == [], hub.log()


def test_a_spawn_that_gives_up_waiting_releases_its_job(hub: Hub) -> None:
    """start_timeout cuts a waiting start short; JupyterHub then does not call stop(), so the
    spawner itself must cancel the pending notebook job."""
    admin = hub.clients["admin"]
    blocker = fill_dev_team(hub)
    try:
        admin.wait_state(blocker.json()["id"], {"RUNNING"})
        assert spawn(hub, "user1", "impatient").status_code in (201, 202)
        events = list(progress_events(hub, "user1"))
        assert any("at its gpu limit" in e.get("message", "") for e in events), events
        assert events[-1].get("failed"), events
        wait_for(lambda: notebook_jobs(hub, "user1") == [], "the pending job to be cancelled")
        cancelled = notebook_jobs(hub, "user1", "CANCELLED")
        assert any(j["reason"].startswith("cancelled") for j in cancelled), cancelled
    finally:
        admin.delete(f"/jobs/{blocker.json()['id']}")


async def test_the_kube_spawner_is_admitted_by_the_real_service(hub: Hub, tmp_path: Path) -> None:
    """WmlaKubeSpawner's admission against this module's real service; only the Kubernetes API
    is missing (the pod is built offline, as in test_kube.py)."""
    pytest.importorskip("kubespawner")
    from kubernetes_asyncio.config import kube_config

    from tests.spawner.test_kube import KUBECONFIG, make_spawner

    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    old = kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(tmp_path / "kubeconfig")
    try:
        spawner = make_spawner(
            "user1",
            service_url=hub.api,
            service_token=hub.clients["admin"].headers["Authorization"].split()[1],
            user_plans={"user1": "/project1/dev-team"},
            gpus=1,
        )
        await spawner.load_user_options()  # admission happens here, after profile overrides
        job_id = spawner.wmla_job_id
        assert job_id and spawner.wmla_leaf == "/project1/dev-team/user1"
        pod = spawner.api.api_client.sanitize_for_serialization(await spawner.get_pod_manifest())
        assert pod["metadata"]["annotations"]["wmla.jupyter.org/job-id"] == job_id
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == "1"
        # the pod asks for and is held to the service's answer (its limit range's default)
        assert {k: resources["limits"][k] for k in ("cpu", "memory")} == resources["requests"]
        assert [j["id"] for j in notebook_jobs(hub, "user1")] == [job_id]
        await spawner.wmla_release()
        assert notebook_jobs(hub, "user1") == []
    finally:
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = old


# -- the plan picked on the spawn page ----------------------------------------------------------
def test_a_server_starts_only_in_a_plan_its_user_may_use(hub: Hub) -> None:
    admin = hub.clients["admin"]
    r = admin.post("/plans", json={"path": "/members-only", "members": {"users": ["user1"]}})
    assert r.status_code == 201, r.text
    # what the spawn page offers each user, asked as the spawner does (a plan admin)
    offers = {
        u: admin.get("/", params={"user": u, "groups": ""}).json()["plans"]
        for u in ("user1", "user2")
    }
    assert "/members-only" in offers["user1"] and "/members-only" not in offers["user2"]
    # a parent plan is never offered: a user leaf beside its child plans would take a part of
    # their shares (issue 38)
    assert (
        "/sample-project/notebooks" in offers["user2"] and "/sample-project" not in offers["user2"]
    )
    assert hub.clients["user2"].get("/", params={"user": "user1"}).status_code == 403
    for user in ("user1", "user2"):
        if server_model(hub, user) is not None:
            stop(hub, user)
    # user2 sends the pick straight to the hub API: refused, nothing charged
    r = hub_request(hub, "POST", "/users/user2/server", "user2", json={"plan": "/members-only"})
    if r.status_code in (201, 202):
        wait_for(lambda: server_model(hub, "user2") is None, "the refused spawn to end", 60)
    assert notebook_jobs(hub, "user2") == []
    assert "may not start a server in plan '/members-only'" in hub.log() or r.status_code >= 400
    # user1 may: the server is charged to /members-only/user1
    r = hub_request(hub, "POST", "/users/user1/server", "user1", json={"plan": "/members-only"})
    assert r.status_code in (201, 202), r.text
    wait_ready(hub, "user1")
    (job,) = notebook_jobs(hub, "user1")
    assert job["leaf"] == "/members-only/user1"
    stop(hub, "user1")
    # the hub remembers a spawn's options: the next tests spawn with their mapped plans again
    for user, plan in (("user1", "/project1/dev-team"), ("user2", "/sample-project/notebooks")):
        r = hub_request(hub, "POST", f"/users/{user}/server", user, json={"plan": plan})
        assert r.status_code in (201, 202), r.text
        wait_ready(hub, user)
        stop(hub, user)


# -- what a new user finds: the getting-started files, a terminal with `wmla` -------------------
def test_a_first_spawn_offers_the_getting_started_files_once_and_never_over_the_users(
    hub: Hub,
) -> None:
    if server_model(hub, "user2") is None:
        assert spawn(hub, "user2").status_code in (201, 202)
    wait_ready(hub, "user2")
    folder = hub.storage / "user2"
    notebook, example = folder / "getting-started.ipynb", folder / "models/pytorch_mnist/main.py"
    cells = json.loads(notebook.read_text())["cells"]
    sources = "".join("".join(c["source"]) for c in cells)
    assert "%wmla_train --plan /sample-project/training --workers 2" in sources
    assert "%wmla_usage" in sources and "%wmla_plans" in sources
    assert example.read_text() == (REPO / "examples/pytorch_mnist/main.py").read_text()
    if hub.os_isolation:  # written as the user's account, not by root
        uid = pwd.getpwnam(account("user2")).pw_uid
        assert notebook.stat().st_uid == uid == example.stat().st_uid
    # the user changes the example and deletes the notebook; the next spawn keeps it so
    example.write_text("# mine\n")
    notebook.unlink()
    stop(hub, "user2")
    assert spawn(hub, "user2").status_code in (201, 202)
    wait_ready(hub, "user2")
    assert example.read_text() == "# mine\n" and not notebook.exists()
    example.write_text((REPO / "examples/pytorch_mnist/main.py").read_text())


async def run_in_terminal(hub: Hub, user: str, command: str, timeout: float = 60) -> str:
    """Type ``command`` in a new terminal of ``user``'s server (JupyterLab's terminado
    websocket) and return what it printed up to the end marker."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    token = hub.clients[user].headers["Authorization"]
    base = f"{hub.url}/user/{user}"
    r = requests.post(f"{base}/api/terminals", headers={"Authorization": token}, timeout=30)
    assert r.status_code == 200, r.text
    name = r.json()["name"]
    url = f"{base}/terminals/websocket/{name}".replace("http://", "ws://", 1)
    conn = await websocket_connect(HTTPRequest(url, headers={"Authorization": token}))
    marker = f"END{secrets.token_hex(4)}"
    conn.write_message(json.dumps(["stdin", f"{command}; echo {marker[:3]}''{marker[3:]}\r"]))
    out = ""
    deadline = time.monotonic() + timeout
    try:
        while marker not in out:
            assert time.monotonic() < deadline, f"no end marker in {timeout} s: {out}"
            raw = await conn.read_message()
            assert raw is not None, f"the terminal closed: {out}"
            kind, *data = json.loads(raw)
            if kind == "stdout":
                out += data[0]
        return out
    finally:
        conn.close()
        requests.delete(f"{base}/api/terminals/{name}", headers={"Authorization": token})


async def test_wmla_works_in_the_users_own_terminal_without_a_logon(hub: Hub) -> None:
    if server_model(hub, "user1") is None:
        assert spawn(hub, "user1").status_code in (201, 202)
    wait_ready(hub, "user1")
    out = await run_in_terminal(
        hub, "user1", "id -u; wmla exec-get; python3 -c 'import extension; print(\"py ok\")'"
    )
    assert "command not found" not in out and "Permission denied" not in out, out
    assert "py ok" in out, out
    if hub.os_isolation:
        assert str(pwd.getpwnam(account("user1")).pw_uid) in out, out
    # exec-get reached the service as user1: their running notebook job is listed
    assert "JOB" in out and "notebook (running)" in out and "/project1/dev-team" in out, out


# -- a kernel of the spawned server (issue 5's end-to-end path) ----------------------------------
async def run_in_kernel(hub: Hub, user: str, code: str, timeout: float = 240) -> str:
    """Execute ``code`` in a new kernel of ``user``'s spawned server, over the server's own
    REST + websocket API (what JupyterLab does); return the text it printed. Fails on an error."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    token = hub.clients[user].headers["Authorization"]
    base = f"{hub.url}/user/{user}"
    r = requests.post(f"{base}/api/kernels", headers={"Authorization": token}, json={}, timeout=60)
    assert r.status_code == 201, r.text
    kernel = r.json()["id"]
    url = f"{base}/api/kernels/{kernel}/channels".replace("http://", "ws://", 1)
    conn = await websocket_connect(HTTPRequest(url, headers={"Authorization": token}))
    msg_id = secrets.token_hex(8)
    conn.write_message(
        json.dumps(
            {
                "header": {
                    "msg_id": msg_id,
                    "username": user,
                    "session": secrets.token_hex(8),
                    "msg_type": "execute_request",
                    "version": "5.3",
                },
                "parent_header": {},
                "metadata": {},
                "content": {"code": code, "silent": False, "store_history": True},
                "channel": "shell",
                "buffers": [],
            }
        )
    )
    printed: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            raw = await conn.read_message()
            assert raw is not None, "the kernel's websocket closed"
            if not isinstance(raw, str):
                continue  # binary frames (widget buffers)
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                printed.append(content["text"])
            elif kind == "error":
                raise AssertionError("\n".join(content["traceback"]) + "".join(printed))
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(printed)
        raise AssertionError(f"the cell did not finish in {timeout} s: {''.join(printed)}")
    finally:
        conn.close()
        requests.delete(
            f"{base}/api/kernels/{kernel}", headers={"Authorization": token}, timeout=30
        )


async def test_a_kernel_of_a_spawned_server_trains_with_the_magics_already_loaded(hub: Hub) -> None:
    if server_model(hub, "user2") is None:
        assert spawn(hub, "user2").status_code in (201, 202)
    wait_ready(hub, "user2")
    token = hub.clients["user2"].headers["Authorization"]
    example = (REPO / "examples" / "pytorch_mnist" / "main.py").read_text()
    for path, body in (
        ("models", {"type": "directory"}),
        ("models/mnist", {"type": "directory"}),
        ("models/mnist/main.py", {"type": "file", "format": "text", "content": example}),
    ):
        r = requests.put(
            f"{hub.url}/user/user2/api/contents/{path}",
            headers={"Authorization": token},
            json=body,
            timeout=30,
        )
        assert r.status_code in (200, 201), r.text
    # no %load_ext: the spawner's startup file loaded the magics into every kernel
    out = await run_in_kernel(
        hub,
        "user2",
        "%wmla_train --plan /sample-project/training --workers 2 --cpus 100m --memory 512Mi "
        "--model-dir models/mnist --model-main main.py --wait -- --batch-size 64 --epochs 2\n"
        "print('state:', wmla_last_job['state'], wmla_last_job['id'])",
    )
    assert "state: FINISHED" in out, out
    job_id = out.rsplit("state: FINISHED", 1)[1].split()[0]
    job = hub.clients["user2"].get(f"/jobs/{job_id}").json()
    assert job["leaf"] == "/sample-project/training/user2" and job["workers"]["max"] == 2
    model = Path(job["workdir"]) / "model.pt"
    assert model.is_file() and str(model).startswith(str(hub.storage / "user2"))
    if hub.os_isolation:  # the workers ran as user2's account: its files are its own
        assert model.stat().st_uid == pwd.getpwnam(account("user2")).pw_uid


# -- grants held by the kernel (issue 27) ------------------------------------------------------
PROBE = """
import errno, json, os, sys
out = {}
for index in range(4):
    try:
        os.close(os.open(sys.argv[1].format(index=index), os.O_RDWR))
        out[str(index)] = "opened"
    except OSError as err:
        out[str(index)] = errno.errorcode[err.errno]
print(json.dumps(out))
"""


def cgroups_of(pid: int) -> dict[str, str]:
    """hierarchy -> the process's cgroup path in it (cgroup v1)."""
    out = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(","):
            out[name] = path
    return out


def probe_in(cgroup_procs: list[str], account_name: str, template: str) -> dict:
    """What a process of the account opens of the GPU nodes from inside the server's cgroup."""
    from extension.confine import enter

    entry = pwd.getpwnam(account_name)

    def join_then_drop() -> None:
        enter(cgroup_procs)
        os.setgroups([])
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)

    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", PROBE, template],
        preexec_fn=join_then_drop,
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(
    not AS_ROOT or not Path("/sys/fs/cgroup/devices").is_dir(),
    reason="servers are confined by a hub run as root (cgroup v1's devices fence here)",
)
@pytest.mark.parametrize("profile, gpus", [("one-gpu", 1), ("cpu", 0)], ids=["1 GPU", "CPU only"])
def test_a_server_is_held_to_its_grant_by_a_cgroup_of_its_own(hub: Hub, profile, gpus) -> None:
    if server_model(hub, "user1") is not None:  # an earlier test's server
        stop(hub, "user1")
    r = spawn(hub, "user1", profile)
    assert r.status_code in (201, 202), r.text
    wait_ready(hub, "user1")
    server = server_process(hub, "user1")
    groups = cgroups_of(server.pid)
    assert "/wmla/notebooks/" in groups["memory"], groups
    memory = Path(f"/sys/fs/cgroup/memory{groups['memory']}")
    limit = int((memory / "memory.limit_in_bytes").read_text())
    assert limit == 4 * 2**30  # mem_limit "4G" of jupyterhub_config.py (JupyterHub: 1024-based)
    pids = Path(f"/sys/fs/cgroup/pids{groups['pids']}")
    assert (pids / "pids.max").read_text().strip() == "1024"
    quota = Path(f"/sys/fs/cgroup/cpu{groups['cpu']}") / "cpu.cfs_quota_us"
    assert int(quota.read_text()) == 200_000  # cpu_limit 2 of jupyterhub_config.py
    assert int(Path(f"/proc/{server.pid}/oom_score_adj").read_text()) > 0
    if RAW:  # the hub ignores 32 (Python cannot undo it); the server was started without it
        assert 32 in ignored(hub.proc.pid)
        assert not set(PLANTED) & ignored(server.pid), ignored(server.pid)
    visible = server.environ().get("CUDA_VISIBLE_DEVICES")
    procs = [f"/sys/fs/cgroup/{h}{groups[h]}/cgroup.procs" for h in ("devices", "pids")]
    seen = probe_in(procs, account("user1"), str(hub.devices / "nvidia{index}"))
    if gpus:
        assert visible is not None and visible.isdigit(), visible
        assert seen.pop(visible) == "ENXIO"  # its own: allowed (no driver behind it)
    assert set(seen.values()) == {"EPERM"}, seen
    stop(hub, "user1")
    wait_for(lambda: not memory.exists() and not pids.exists(), "the server's cgroup to go")
