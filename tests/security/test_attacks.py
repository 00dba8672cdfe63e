"""Attacks of a hub user on the embedded default, against a real hub run as root (docs/security.md).

The hub runs from the repository's jupyterhub_config.py with the real proxy, the real service and
the real LocalBackend, as root, with two real system accounts (a random prefix, removed in
teardown). Each attack is what a user with a terminal and a hub account can do: their job's
code runs as their account and changes their own folder while the service works in it. The
secret is a root-only file in the hub's state folder; no answer of the service may ever carry it.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.security.accounts import accounts_with_code, remove_accounts
from tests.service.hub import PROXY, Client, Hub

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("useradd") is not None
pytestmark = [
    pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing"),
    pytest.mark.skipif(not AS_ROOT, reason="the attacks are on a hub run as root (useradd)"),
]
PREFIX = f"wa{secrets.token_hex(3)}-"
USERS = ("user1", "user2")

# What a job of an attacker runs; argv[1] names the attack. It signals "ready" by a file.
ATTACK = r"""
import json, os, sys, time
mode, target = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
job = os.environ["WMLA_JOB_DIR"]
log = os.path.join(job, "logs", "worker-0.log")
metrics = os.path.join(job, "metrics.jsonl")
print("before the attack", flush=True)
if mode == "link-log":
    os.remove(log); os.symlink(target, log)
elif mode == "link-metrics":
    os.symlink(target, metrics)
elif mode == "fifo-log":
    os.remove(log); os.mkfifo(log)
elif mode == "hardlink-log":
    os.remove(log)
    try:
        os.link(target, log)
    except OSError as err:
        print("hard link refused:", err, flush=True)
elif mode == "whoami":
    info = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
            "groups": os.getgroups(), "env": dict(os.environ), "exe": sys.executable}
    json.dump(info, open(os.path.join(job, "whoami.json"), "w"))
elif mode == "probe":  # what this account can read of the paths given after the mode
    seen = {}
    for path in sys.argv[2:]:
        try:
            with open(path, "rb") as f:
                f.read(1)
            seen[path] = "read"
        except OSError as err:
            seen[path] = type(err).__name__
    json.dump(seen, open(os.path.join(job, "probe.json"), "w"))
open(os.path.join(job, "ready"), "w").close()
if mode == "fail-with-link":
    os.remove(log); os.symlink(target, log)
    sys.exit(3)
time.sleep(float(os.environ.get("HOLD", "0")))
"""


def account(user: str) -> str:
    return PREFIX + user


@pytest.fixture(scope="module")
def hub():
    # Outside pytest's 0700 temp folders, as `make run`'s var/ lies in the open checkout: the
    # accounts reach their own folders, and what keeps them from the state files is the
    # files' own modes, not a closed folder above them.
    tmp = Path(tempfile.mkdtemp(prefix="wmla-attack-hub-"))
    os.chmod(tmp, 0o711)
    storage = Path(tempfile.mkdtemp(prefix="wmla-attack-storage-"))
    os.chmod(storage, 0o711)
    traits = {"tick": 1, "grace": 1, "device_layout": "1x4", "cpu_oversubscription": 4}
    traits["backend_options"] = {"account_template": PREFIX + "{username}"}
    hub = Hub(tmp, traits)
    hub.env["WMLA_STORAGE_ROOT"] = str(storage)
    hub.storage = storage
    created = []
    try:
        created = accounts_with_code(storage, USERS, account, "attack.py", ATTACK)
        hub.start()
        names = ("admin", *USERS, "user3")
        hub.clients = {name: Client(hub, hub.user_token(name)) for name in names}
        hub.secret = "TOPSECRET-" + secrets.token_hex(8)
        hub.secret_file = hub.var / "root-only-secret.jsonl"
        hub.secret_file.write_text(json.dumps({"secret": hub.secret}) + "\n")
        hub.secret_file.chmod(0o600)
        r = hub.clients["admin"].post("/plans", json={"path": "/attack", "limit": {"gpu": 1}})
        assert r.status_code == 201, r.text
        yield hub
    finally:
        hub.stop()
        remove_accounts({*created, account("user3")})
        shutil.rmtree(storage, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def body(*args: str, plan: str = "/sample-project/training", env: dict | None = None) -> dict:
    return {
        "plan": plan,
        "resources": {"gpu": 0, "cpu": "100m", "memory": "64Mi"},
        "command": {"model_dir": "code", "model_main": "attack.py", "args": list(args)},
        "env": env or {},
    }


def submit(client: Client, job: dict) -> dict:
    r = client.post("/jobs", json=job)
    assert r.status_code == 201, r.text
    return r.json()


def wait_ready(hub: Hub, job: dict, timeout: float = 60) -> None:
    ready = Path(job["workdir"]) / "ready"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not ready.exists():
        time.sleep(0.2)
    assert ready.exists(), f"job {job['id']} never got ready\n{hub.log()}"


def as_user(user: str, script: str) -> None:
    """Run a shell snippet as the user's account (what they do in their terminal)."""
    entry = pwd.getpwnam(account(user))
    subprocess.run(
        ["/bin/sh", "-c", script],
        user=entry.pw_uid,
        group=entry.pw_gid,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
        check=True,
    )


def no_secret(hub: Hub, *texts: str) -> None:
    for text in texts:
        assert hub.secret not in text
        assert "root:" not in text  # /etc/shadow's first line


# -- reading root's files through the job's own files ------------------------------------------
@pytest.mark.parametrize(
    "mode, endpoint",
    [
        ("link-log", "logs"),
        ("fifo-log", "logs"),
        ("hardlink-log", "logs"),
        ("link-metrics", "metrics"),
    ],
    ids=["symlinked log", "fifo log", "hard-linked log", "symlinked metrics"],
)
def test_a_job_file_replaced_by_the_user_is_never_read_as_root(hub: Hub, mode, endpoint) -> None:
    user1 = hub.clients["user1"]
    job = submit(user1, body(mode, str(hub.secret_file), env={"HOLD": "30"}))
    wait_ready(hub, job)
    started = time.monotonic()
    whole = user1.get(f"/jobs/{job['id']}/{endpoint}")
    one = user1.get(f"/jobs/{job['id']}/{endpoint}", params={"worker": "0"})
    assert time.monotonic() - started < 20  # a FIFO does not hang the reader
    no_secret(hub, whole.text, one.text)
    assert whole.status_code in (200, 403), whole.text
    if mode == "link-log":
        assert one.status_code == 403 and "symbolic link" in one.json()["error"]
        assert "symbolic link" in whole.json()["logs"]  # the refusal, inline, for that worker
    if mode == "fifo-log":
        assert one.status_code == 403 and "not a regular file" in one.json()["error"]
    if mode == "link-metrics":
        assert whole.status_code == 403 and "symbolic link" in whole.json()["error"]
    # the link re-pointed after the job ended reads no better
    r = user1.delete(f"/jobs/{job['id']}")
    assert r.status_code == 200, r.text
    user1.wait_state(job["id"], {"CANCELLED", "FAILED", "FINISHED"})
    name = "metrics.jsonl" if endpoint == "metrics" else "logs/worker-0.log"
    as_user("user1", f"rm -f {job['workdir']}/{name} && ln -s /etc/shadow {job['workdir']}/{name}")
    again = user1.get(f"/jobs/{job['id']}/{endpoint}")
    no_secret(hub, again.text)


def test_a_failing_job_whose_log_links_to_a_secret_does_not_report_it(hub: Hub) -> None:
    user1 = hub.clients["user1"]
    job = submit(user1, body("fail-with-link", str(hub.secret_file)))
    ended = user1.wait_state(job["id"], {"FAILED", "FINISHED"})
    assert ended["state"] == "FAILED" and ended["exit_code"] == 3, ended
    no_secret(hub, ended["reason"], json.dumps(user1.get(f"/jobs/{job['id']}/history").json()))
    assert "not read" in ended["reason"]


# -- writing root's files through a path planted before the start -----------------------------
@pytest.mark.parametrize(
    "plant",
    [
        "mkdir -p {jobs}/{id}/logs && ln -s {target} {jobs}/{id}/logs/worker-0.log",
        "mkdir -p {jobs} && ln -s {target_dir} {jobs}/{id}",
        "mkdir -p {jobs}/{id} && ln -s {target_dir} {jobs}/{id}/logs",
    ],
    ids=["log is a link", "job dir is a link", "logs dir is a link"],
)
def test_a_path_planted_while_the_job_waits_is_not_written_by_root(hub: Hub, plant) -> None:
    user1 = hub.clients["user1"]
    target_dir = hub.var / f"root-dir-{secrets.token_hex(3)}"
    target_dir.mkdir(mode=0o755)
    target = target_dir / "worker-0.log"  # a root file where the planted link points
    target.write_text("ORIGINAL\n")
    blocker = submit(user1, {**body("sleep", plan="/attack", env={"HOLD": "60"}),
                             "resources": {"gpu": 1, "cpu": "100m", "memory": "64Mi"}})  # fmt: skip
    wait_ready(hub, blocker)
    victim = submit(user1, {**body("whoami", plan="/attack"),
                            "resources": {"gpu": 1, "cpu": "100m", "memory": "64Mi"}})  # fmt: skip
    assert user1.get(f"/jobs/{victim['id']}").json()["state"] == "PENDING"
    jobs = Path(victim["workdir"]).parent
    as_user(
        "user1",
        f"mkdir -p {jobs} && mv {jobs} {jobs}.old-{victim['id']} && "
        + plant.format(jobs=jobs, id=victim["id"], target=target, target_dir=target_dir),
    )
    assert user1.delete(f"/jobs/{blocker['id']}").status_code == 200
    ended = user1.wait_state(victim["id"], {"FAILED", "FINISHED"})
    assert ended["state"] == "FAILED", ended  # it could not start as planted
    assert target.read_text() == "ORIGINAL\n"
    assert os.stat(target).st_uid == 0 and os.stat(target_dir).st_uid == 0
    assert sorted(os.listdir(target_dir)) == ["worker-0.log"]


# -- code as root through the job's env ----------------------------------------------------------
REFUSED = [
    "LD_AUDIT", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_DEBUG_OUTPUT", "LD_BIND_NOW",
    "GLIBC_TUNABLES", "GCONV_PATH", "MALLOC_CHECK_", "MALLOC_ARENA_MAX", "LOCPATH", "NLSPATH",
    "HOSTALIASES", "RES_OPTIONS", "TMPDIR", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP",
    "PYTHONINSPECT", "PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYOPT", "RUBYLIB", "NODE_OPTIONS",
    "BASH_ENV", "BASH_FUNC_X%%", "ENV", "IFS", "PS4", "SHELLOPTS", "PATH", "HOME", "USER",
    "JUPYTERHUB_API_TOKEN", "WMLA_JOB_DIR", "RANK", "CUDA_VISIBLE_DEVICES", "OPENSSL_CONF",
    "JAVA_TOOL_OPTIONS", "ld_audit", "Path", "_X", "1X", "A-B", "A B", "A\x00B",
]  # fmt: skip


@pytest.mark.parametrize("name", REFUSED)
def test_every_dangerous_env_variable_is_refused_by_name(hub: Hub, name: str) -> None:
    r = hub.clients["user1"].post("/jobs", json=body("whoami", env={name: "/tmp/x.so"}))
    assert r.status_code == 400, r.text
    assert repr(name) in r.json()["error"] or name in r.json()["error"]


def test_an_env_value_with_a_nul_byte_is_refused(hub: Hub) -> None:
    r = hub.clients["user1"].post("/jobs", json=body("whoami", env={"MY_SETTING": "a\x00b"}))
    assert r.status_code == 400 and "MY_SETTING" in r.json()["error"], r.text


def test_a_job_runs_as_its_user_with_only_its_own_environment(hub: Hub) -> None:
    user2 = hub.clients["user2"]
    job = submit(user2, body("whoami", env={"MY_SETTING": "42"}))
    assert user2.wait_state(job["id"], {"FINISHED", "FAILED"})["state"] == "FINISHED"
    seen = json.loads((Path(job["workdir"]) / "whoami.json").read_text())
    entry = pwd.getpwnam(account("user2"))
    assert (seen["uid"], seen["euid"], seen["gid"]) == (entry.pw_uid, entry.pw_uid, entry.pw_gid)
    assert 0 not in seen["groups"]
    env = seen["env"]
    assert env["MY_SETTING"] == "42" and env["HOME"] == str(hub.storage / "user2")
    assert not [k for k in env if k.startswith(("JUPYTERHUB_", "LD_", "SUDO_"))], env
    for path in (Path(job["workdir"]), Path(job["workdir"]) / "logs" / "worker-0.log"):
        assert os.stat(path).st_uid == entry.pw_uid  # made by the user, not root's chown
    # the job says "python", the backend's choice; the log's first line names the one that ran
    assert job["command"][0] == "python", job["command"]
    header = user2.get(f"/jobs/{job['id']}/logs", params={"worker": "0"}).json()["logs"]
    assert header.startswith("==== wmla:") and seen["exe"] in header.splitlines()[0], header


# -- users without an account --------------------------------------------------------------------
def test_a_user_without_an_account_gets_one_and_never_runs_as_root(hub: Hub) -> None:
    user3 = hub.clients["user3"]
    with pytest.raises(KeyError):
        pwd.getpwnam(account("user3"))
    first = user3.post("/jobs", json=body("whoami"))
    assert first.status_code == 400 and "not a folder" in first.json()["error"], first.text
    entry = pwd.getpwnam(account("user3"))  # created like the spawner's, with a private folder
    folder = hub.storage / "user3"
    assert entry.pw_uid >= 1000 and entry.pw_dir == str(folder)
    info = os.stat(folder)
    assert info.st_uid == entry.pw_uid and stat.S_IMODE(info.st_mode) == 0o700
    as_user("user3", f"mkdir {folder}/code")
    shutil.copy(hub.storage / "user1" / "code" / "attack.py", folder / "code" / "attack.py")
    os.chown(folder / "code" / "attack.py", entry.pw_uid, entry.pw_gid)
    job = submit(user3, body("whoami"))
    assert user3.wait_state(job["id"], {"FINISHED", "FAILED"})["state"] == "FINISHED"
    seen = json.loads((Path(job["workdir"]) / "whoami.json").read_text())
    assert seen["euid"] == entry.pw_uid != 0


# -- another user's files and the plan tree ------------------------------------------------------
@pytest.mark.parametrize(
    "model_dir", ["../user1/code", "link-to-user1", "/etc", "code/../../user1/code"]
)
def test_a_model_dir_outside_the_users_folder_is_refused(hub: Hub, model_dir: str) -> None:
    folder = hub.storage / "user2"
    link = folder / "link-to-user1"
    if not link.is_symlink():
        as_user("user2", f"ln -s {hub.storage / 'user1' / 'code'} {link}")
    job = body("whoami")
    job["command"]["model_dir"] = model_dir
    r = hub.clients["user2"].post("/jobs", json=job)
    assert r.status_code == 400 and "outside your folder" in r.json()["error"], r.text


def test_a_non_admin_sees_only_their_own_user_leaf(hub: Hub) -> None:
    for user in USERS:  # both have a leaf under /sample-project/training by now
        submit(hub.clients[user], body("whoami"))
    mine = hub.clients["user2"].get("/plans").json()
    paths = {p["path"] for p in mine["plans"]}
    assert "/sample-project/training/user2" in paths
    assert not [p for p in paths if p.endswith("/user1")], paths
    training = next(p for p in mine["plans"] if p["path"] == "/sample-project/training")
    assert training["user_leaves"] >= 2
    r = hub.clients["user2"].get("/plans/sample-project/training/user1")
    assert r.status_code == 404, r.text
    everything = hub.clients["admin"].get("/plans").json()
    assert "/sample-project/training/user1" in {p["path"] for p in everything["plans"]}


def test_state_files_are_private_after_jobs_ran(hub: Hub) -> None:
    loose = []
    for folder, dirs, files in os.walk(hub.var):
        if Path(folder) == hub.var:
            dirs[:] = [d for d in dirs if not d.startswith("root-dir-")]
        for name in files:
            path = Path(folder) / name
            try:  # jobs of the tests before may be starting or ending: their files come and go
                info = path.lstat()
            except FileNotFoundError:
                continue
            if not stat.S_ISLNK(info.st_mode) and stat.S_IMODE(info.st_mode) & 0o077:
                loose.append(f"{path} {oct(info.st_mode)}")
    assert not loose, loose
    assert stat.S_IMODE(os.stat(hub.var / "wmla").st_mode) == 0o700


def test_a_users_job_reads_no_state_file_and_nothing_of_another_user(hub: Hub) -> None:
    user1, user2 = hub.clients["user1"], hub.clients["user2"]
    holder = submit(user1, body("whoami", env={"HOLD": "30", "MY_TOKEN": "alice-secret"}))
    wait_ready(hub, holder)
    worker = next(
        p for p in psutil.process_iter()
        if _environ(p).get("WMLA_JOB_ID") == holder["id"]
    )  # fmt: skip
    targets = [
        hub.var / "wmla" / "wmla.sqlite",  # every job's env and args
        hub.var / "jupyterhub.sqlite",
        hub.var / "jupyterhub_cookie_secret",
        hub.var / "hub-passwords.dbm.dat",  # password hashes
        hub.secret_file,
        Path(holder["workdir"]) / "whoami.json",  # user1's own files
        Path(holder["workdir"]) / "logs" / "worker-0.log",
        f"/proc/{worker.pid}/environ",  # user1's running worker's environment
    ]
    probe = submit(user2, body("probe", *map(str, targets)))
    assert user2.wait_state(probe["id"], {"FINISHED", "FAILED"})["state"] == "FINISHED"
    seen = json.loads((Path(probe["workdir"]) / "probe.json").read_text())
    assert seen == {str(t): "PermissionError" for t in targets}, seen
    user1.delete(f"/jobs/{holder['id']}")


def _environ(proc: psutil.Process) -> dict:
    try:
        return proc.environ()
    except (psutil.Error, OSError):
        return {}


def test_the_instance_says_how_users_are_kept_apart(hub: Hub) -> None:
    security = hub.clients["user1"].get("/instance").json()["security"]
    assert security["runs_as_root"] is True and security["jobs_run_as"] == "their users"
    assert security["state_dir_private"] is True and security["storage_root_safe"] is True
    if not security["proc_hidepid"]:  # the one thing the machine itself must provide
        assert any("hidepid=2" in w for w in security["warnings"]), security
