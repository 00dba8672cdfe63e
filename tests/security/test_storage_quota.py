"""Storage quotas held by the kernel (issue 39): each user folder is its own ext4 image,
mounted by a real hub's service as root; the users' jobs run as their own system accounts and
write past their limits. Cases: the hard limit stops a job with a clear reason while another
tenant's job finishes and the service goes on; the soft limit and its grace; the files limit;
a restart keeps everything; what ``wmla quota`` and ``GET /storage`` say agrees with ``du``
and the kernel; and, without a hub, a lowered limit below use and a folder swapped for a link.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from extension.storage.images import StorageError, UserImages, mounted_at
from extension.storage.limits import parse_limits
from extension.userfs.accounts import create_account
from tests.security.accounts import remove_accounts
from tests.service.hub import PROXY, Client, Hub

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("useradd") is not None
pytestmark = [
    pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing"),
    pytest.mark.skipif(not AS_ROOT, reason="images are mounted by a service run as root"),
]
PREFIX = f"sq{secrets.token_hex(3)}-"
USERS = ("user1", "user2")
MiB = 2**20
QUOTA = {"storage": "64Mi", "soft_storage": "40Mi", "files": 300, "grace": 3}

WRITER = r"""
import errno, json, os, sys
mode, amount = sys.argv[1], int(sys.argv[2])
job = os.environ["WMLA_JOB_DIR"]
out = {}
try:
    if mode == "bytes":  # amount MiB into the user's folder
        with open(os.path.join(job, "..", "..", f"data-{os.getpid()}"), "wb") as f:
            for _ in range(amount):
                f.write(b"x" * (1 << 20))
                f.flush()
                os.fsync(f.fileno())
    elif mode == "tmp":  # amount MiB into /tmp, after a marker named by the job
        open(os.path.join("/tmp", os.path.basename(job) + ".marker"), "w").close()
        with open("/tmp/fill", "wb") as f:
            for _ in range(amount):
                f.write(b"x" * (1 << 20))
                f.flush()
                os.fsync(f.fileno())
    elif mode == "link":  # a link in its /tmp to a folder of root's, left for the cleanup
        os.symlink(sys.argv[3], "/tmp/escape")
        os.symlink(sys.argv[3] + "/canary", "/tmp/canary-link")
    elif mode == "files":
        folder = os.path.join(job, "many")
        os.mkdir(folder)
        for n in range(amount):
            open(os.path.join(folder, str(n)), "w").close()
    out["ok"] = True
except OSError as err:
    out["error"] = errno.errorcode[err.errno]
    json.dump(out, open(os.path.join(job, "result.json"), "w"))
    raise
json.dump(out, open(os.path.join(job, "result.json"), "w"))
"""


def account(user: str) -> str:
    return PREFIX + user


def outside_tmp(prefix: str) -> Path:
    """A folder outside /tmp: each job's /tmp is bound over the machine's, which would hide a
    storage root under it (the service then keeps jobs on the machine's /tmp)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/srv" if os.path.isdir("/srv") else None))


@pytest.fixture(scope="module")
def hub():
    tmp = outside_tmp("wmla-quota-hub-")
    os.chmod(tmp, 0o711)
    traits = {"tick": 1, "grace": 1, "device_layout": "1x4", "cpu_oversubscription": 4}
    traits["backend_options"] = {"account_template": PREFIX + "{username}"}
    traits["default_storage_quota"] = QUOTA
    traits["storage_check_seconds"] = 0.5
    hub = Hub(tmp, traits)
    created = []
    images = UserImages(hub.var / "wmla" / "storage", hub.storage)
    try:
        for user in USERS:
            created.append(create_account(account(user), hub.storage / user).name)
        hub.start()
        hub.clients = {name: Client(hub, hub.user_token(name)) for name in ("admin", *USERS)}
        for user in USERS:  # the first submission makes the folder, on its image
            r = hub.clients[user].post("/jobs", json=body("bytes", "0"))
            assert r.status_code == 400 and "code" in r.text, r.text
            code = hub.storage / user / "code"
            code.mkdir()
            (code / "writer.py").write_text(WRITER)
            uid = os.stat(hub.storage / user).st_uid
            for path in (code, code / "writer.py"):
                os.chown(path, uid, uid)
        yield hub
    finally:
        hub.stop()
        problems = images.unmount_all()
        remove_accounts(created)
        shutil.rmtree(tmp, ignore_errors=True)
        assert not problems, problems


def body(*args: str, memory: str = "128Mi") -> dict:
    return {
        "plan": "/sample-project/training",
        "resources": {"gpu": 0, "cpu": "500m", "memory": memory},
        "command": {"model_dir": "code", "model_main": "writer.py", "args": list(args)},
    }


def run(client: Client, job: dict, timeout: float = 60) -> tuple[dict, dict]:
    r = client.post("/jobs", json=job)
    assert r.status_code == 201, r.text
    done = client.wait_state(r.json()["id"], {"FINISHED", "FAILED", "CANCELLED"}, timeout)
    result = Path(done["workdir"]) / "result.json"
    return done, json.loads(result.read_text()) if result.exists() else {}


def clean(hub: Hub, user: str) -> None:
    """The user deletes what the jobs wrote, from their terminal: a folder at its limit has no
    room for a new job's directory, so no job could."""
    folder = hub.storage / user
    done = as_user(os.stat(folder).st_uid, f"rm -f {folder}/data-*")
    assert done.returncode == 0, done.stderr


def storage_of(client: Client) -> dict:
    r = client.get("/storage")
    assert r.status_code == 200, r.text
    (mine,) = r.json()["users"]
    return mine


def test_each_folder_is_its_own_filesystem_and_the_instance_says_so(hub: Hub) -> None:
    for user in USERS:
        assert mounted_at(hub.storage / user), f"{user}'s folder is not a mount"
    security = hub.clients["user1"].get("/instance").json()["security"]
    assert security["enforced"]["storage"]["enforced"], security
    mine = storage_of(hub.clients["user1"])
    assert mine["user"] == "user1" and mine["storage"] == 64 * MiB and mine["files"] == 300


def test_the_hard_limit_fails_a_job_with_a_reason_while_the_other_tenant_finishes(
    hub: Hub,
) -> None:
    job, _ = run(hub.clients["user1"], body("bytes", "100"))
    assert job["state"] == "FAILED" and "No space left on device" in job["reason"], job
    assert "storage quota" in job["reason"] and "free space or ask for more" in job["reason"]
    other, result = run(hub.clients["user2"], body("bytes", "8"))
    assert other["state"] == "FINISHED", (other, result)
    assert requests.get(hub.api + "/health", timeout=10).json()["ok"]
    assert hub.clients["user1"].get("/plans").status_code == 200
    clean(hub, "user1")
    assert storage_of(hub.clients["user1"])["used_bytes"] < 2 * MiB


def test_the_soft_limit_holds_after_its_grace_and_lets_go_once_under(hub: Hub) -> None:
    user2 = hub.clients["user2"]
    job, _ = run(user2, body("bytes", "44"))  # over 40 MiB soft, under 64 MiB hard
    assert job["state"] == "FINISHED", job
    mine = storage_of(user2)
    assert mine["state"] == "over soft limit, in grace" and 0 < mine["grace_left"] <= 3, mine
    assert mine["held_bytes"] == 64 * MiB
    time.sleep(4)
    mine = storage_of(user2)
    assert mine["state"] == "over soft limit, grace expired", mine
    assert mine["held_bytes"] == 40 * MiB
    auth = {"Authorization": f"token {hub.user_token('admin')}"}
    page = requests.get(f"{hub.url}/services/wmla/admin/instance", headers=auth, timeout=30)
    assert page.status_code == 200, page.text
    assert '<tr class="quota over" data-user="user2">' in page.text  # the admin sees who is over
    assert '<tr class="quota" data-user="user1">' in page.text
    job, _ = run(user2, body("bytes", "4"))  # room under the hard limit, none now
    assert job["state"] == "FAILED" and "40 MiB storage quota" in job["reason"], job
    # no job starts now (its folder cannot be made): the user deletes from their terminal
    clean(hub, "user2")
    time.sleep(1.5)  # the next check gives the hard limit back
    mine = storage_of(user2)
    assert mine["state"] == "under" and mine["held_bytes"] == 64 * MiB, mine


def test_the_files_limit_holds(hub: Hub) -> None:
    job, _ = run(hub.clients["user1"], body("files", "400"))  # no inode left for its result
    assert job["state"] == "FAILED" and "No space left on device" in job["reason"], job
    assert "more than its 300 files allowed" in job["reason"], job["reason"]
    mine = storage_of(hub.clients["user1"])
    # 300 while it ran; its /tmp folder went with it
    assert mine["used_files"] in (299, 300) and mine["state"] in ("at hard limit", "near"), mine
    shutil.rmtree(Path(job["workdir"]) / "many")  # as an admin would


def test_a_jobs_tmp_is_its_own_inside_the_quota_and_gone_with_it(hub: Hub) -> None:
    job, _ = run(hub.clients["user2"], body("tmp", "100"))
    assert job["state"] == "FAILED" and "storage quota" in job["reason"], job
    assert "No space left on device" in job["reason"]
    assert not Path(f"/tmp/{job['id']}.marker").exists()  # the machine's /tmp never saw it
    assert not (hub.var / "wmla" / "storage" / "mnt" / "user2" / "tmp" / job["id"]).exists()
    assert storage_of(hub.clients["user2"])["used_bytes"] < 16 * MiB  # went with the job


def test_removing_a_jobs_tmp_follows_none_of_its_links(hub: Hub) -> None:
    canary = hub.var / "canary"  # root's; the job's tmp is removed by root after the job
    canary.mkdir(mode=0o700, exist_ok=True)
    (canary / "canary").write_text("root's")
    job, _ = run(hub.clients["user1"], body("link", "0", str(canary)))
    assert job["state"] == "FINISHED", job
    assert not (hub.var / "wmla" / "storage" / "mnt" / "user1" / "tmp" / job["id"]).exists()
    assert (canary / "canary").read_text() == "root's"  # the links went, not what they name


def test_quota_and_the_api_agree_with_du_and_the_kernel(hub: Hub) -> None:
    job, _ = run(hub.clients["user1"], body("bytes", "10"))
    assert job["state"] == "FINISHED", job
    folder = hub.storage / "user1"
    du = subprocess.run(["du", "-s", "--block-size=1", str(folder)], capture_output=True,
                        text=True, check=True)  # fmt: skip
    used = int(du.stdout.split()[0])
    mine = storage_of(hub.clients["user1"])
    assert abs(mine["used_bytes"] - used) <= 64 * 1024, (mine, used)
    vfs = os.statvfs(folder)
    assert vfs.f_bavail * vfs.f_frsize == mine["held_bytes"] - mine["used_bytes"]
    env = {**os.environ, "WMLA_URL": hub.url, "WMLA_TOKEN": hub.user_token("user1")}
    wmla = Path(sys.executable).parent / "wmla"
    done = subprocess.run([str(wmla), "quota"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("user1 ")]
    assert "64 MiB" in line and "40 MiB" in line and " 300 " in line, done.stdout
    assert hub.clients["user1"].get("/storage", params={"user": "user2"}).status_code == 403
    home = requests.get(f"{hub.url}/services/wmla/", timeout=30,
                        headers={"Authorization": f"token {hub.user_token('user1')}"})  # fmt: skip
    assert home.status_code == 200 and 'id="jobs-table"' in home.text  # a page, not JSON
    assert "of 64 MiB used" in home.text and job["id"] in home.text
    everyone = hub.clients["admin"].get("/storage").json()["users"]
    assert {r["user"] for r in everyone} >= set(USERS)
    auth = {"Authorization": f"token {hub.user_token('admin')}"}
    metrics = requests.get(hub.api.rsplit("/api/v1", 1)[0] + "/metrics", headers=auth, timeout=10)
    assert 'wmla_storage_used_bytes{user="user1"}' in metrics.text


def test_a_plan_admin_sets_a_plans_limits_at_once_and_they_outlive_a_restart(hub: Hub) -> None:
    admin, user1 = hub.clients["admin"], hub.clients["user1"]
    job, _ = run(user1, body("bytes", "0"))  # user1's leaf under the plan, as a first job makes
    assert job["state"] == "FINISHED", job
    path = "/storage/plans/sample-project/training"
    limits = {"storage": "128Mi", "files": 600}
    assert user1.put(path, json=limits).status_code == 403  # only plan admins
    bad = admin.put(path, json={"storage": "128Mi", "soft_storage": "1Gi"})
    assert bad.status_code == 400 and "a soft limit above its hard limit" in bad.text
    assert admin.put("/storage/plans/nowhere", json=limits).status_code == 404
    assert storage_of(user1)["storage"] == 64 * MiB  # the refused ones changed nothing
    r = admin.put(path, json=limits)
    assert r.status_code == 200, r.text
    assert {"plan": "/sample-project/training", "source": "admin"}.items() <= r.json()["plans"][
        0
    ].items()
    mine = storage_of(user1)  # at once: the image had room to grow into
    assert mine["storage"] == 128 * MiB and mine["files"] == 600, mine
    vfs = os.statvfs(hub.storage / "user1")
    assert vfs.f_bavail * vfs.f_frsize == 128 * MiB - mine["used_bytes"]
    hub.restart()
    assert storage_of(user1)["storage"] == 128 * MiB  # stored with the service's state
    assert admin.delete(path).status_code == 200
    assert storage_of(user1)["storage"] == 64 * MiB  # back to the default


def test_the_admin_page_sets_a_plans_limits_and_refuses_a_bad_one(hub: Hub) -> None:
    job, _ = run(hub.clients["user1"], body("bytes", "0"))  # user1's leaf under the plan
    assert job["state"] == "FINISHED", job
    web = requests.Session()
    web.headers["Authorization"] = f"token {hub.user_token('admin')}"
    page = f"{hub.url}/services/wmla/admin/instance"
    text = web.get(page, timeout=30).text
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', text).group(1)
    form = {"_xsrf": xsrf, "plan": "/sample-project/training", "storage": "96Mi"}
    done = web.post(f"{hub.url}/services/wmla/admin/storage", data=form, timeout=30)
    assert done.status_code == 200 and "/sample-project/training: storage limits set" in done.text
    assert '<tr data-plan="/sample-project/training">' in done.text
    assert storage_of(hub.clients["user1"])["storage"] == 96 * MiB
    bad = web.post(f"{hub.url}/services/wmla/admin/storage", timeout=30,
                   data={**form, "storage": "lots"})  # fmt: skip
    assert "refused: " in bad.text and "is not a quantity" in bad.text
    assert storage_of(hub.clients["user1"])["storage"] == 96 * MiB  # unchanged
    remove = {"_xsrf": xsrf, "plan": "/sample-project/training", "remove": "1"}
    gone = web.post(f"{hub.url}/services/wmla/admin/storage", data=remove, timeout=30)
    assert "storage limits removed" in gone.text
    assert storage_of(hub.clients["user1"])["storage"] == 64 * MiB


def test_a_restart_keeps_the_folders_their_files_and_their_limits(hub: Hub) -> None:
    before = storage_of(hub.clients["user1"])
    hub.restart()
    assert mounted_at(hub.storage / "user1")
    after = storage_of(hub.clients["user1"])
    assert after["used_bytes"] == before["used_bytes"] and after["storage"] == 64 * MiB
    job, _ = run(hub.clients["user1"], body("bytes", "100"))
    assert job["state"] == "FAILED" and "storage quota" in job["reason"], job
    clean(hub, "user1")


# -- the images alone, as root (no hub) ------------------------------------------------------
@pytest.fixture
def images():
    base = Path(tempfile.mkdtemp(prefix="wmla-quota-"))  # pytest's tmp is 0700: no account gets in
    os.chmod(base, 0o711)
    root = base / "storage"
    root.mkdir(mode=0o711)
    made = UserImages(base / "quota", root)
    yield made
    problems = made.unmount_all()
    shutil.rmtree(base, ignore_errors=True)
    assert not problems


def as_user(uid: int, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           "sh", "-c", script], capture_output=True, text=True)  # fmt: skip


def test_a_limit_lowered_below_use_refuses_writes_until_under(images: UserImages) -> None:
    (images.storage_root / "ann").mkdir(mode=0o700)
    folder = images.ensure("ann", 54321, 54321, parse_limits("64Mi", "t"))
    assert as_user(54321, f"head -c 40M /dev/zero > {folder}/a").returncode == 0
    held = images.hold("ann", 32 * MiB, 1000)
    assert held.free_bytes == 0 and held.used_bytes >= 40 * MiB
    assert as_user(54321, f"head -c 1M /dev/zero > {folder}/b").returncode != 0
    assert as_user(54321, f"rm {folder}/a {folder}/b").returncode == 0
    held = images.hold("ann", 32 * MiB, 1000)
    assert abs(held.free_bytes - (32 * MiB - held.used_bytes)) <= 2 * 4096  # ext4's own blocks
    assert as_user(54321, f"head -c 1M /dev/zero > {folder}/c").returncode == 0


def test_a_folder_swapped_for_a_link_is_refused_and_nothing_is_mounted_there(
    images: UserImages,
) -> None:
    target = images.quota_dir.parent / "secret"
    target.mkdir()
    (images.storage_root / "bob").symlink_to(target)
    with pytest.raises(StorageError, match="not a folder"):
        images.ensure("bob", 54322, 54322, parse_limits("64Mi", "t"))
    assert not mounted_at(target) and not mounted_at(images.storage_root / "bob")


def test_a_folder_from_before_quotas_is_copied_in_as_its_user_links_as_links(
    images: UserImages,
) -> None:
    old = images.storage_root / "cid"
    old.mkdir(mode=0o700)
    (old / "sub").mkdir()
    (old / "sub" / "notes.txt").write_text("mine")
    (old / "shadow").symlink_to("/etc/shadow")  # root copying it would read root's secret
    for path in (old, old / "sub", old / "sub" / "notes.txt"):
        os.chown(path, 54323, 54323)
    os.lchown(old / "shadow", 54323, 54323)
    folder = images.ensure("cid", 54323, 54323, parse_limits("64Mi", "t"))
    assert mounted_at(folder)
    assert (folder / "sub" / "notes.txt").read_text() == "mine"
    assert os.readlink(folder / "shadow") == "/etc/shadow"
    assert os.stat(folder / "sub" / "notes.txt").st_uid == 54323
    assert not (images.storage_root / ".wmla-before-quota" / "cid").exists()


def test_a_new_10gib_image_costs_the_disk_megabytes_and_holds_its_files_limit_exactly(
    images: UserImages,
) -> None:
    limits = parse_limits("10Gi", "t")
    (images.storage_root / "dee").mkdir(mode=0o700)
    folder = images.ensure("dee", 54324, 54324, limits)
    held = images.measure("dee")
    assert held.free_files == limits.files_hard  # the kernel's own inode count says so
    # mke2fs's 128 MiB groups round the inode count up; the size was chosen so that few are
    # over, each a file in reserve/ (321 groups at GROWTH x 10 GiB would be 1,984)
    assert held.reserved_files <= 256
    assert images.image("dee").stat().st_blocks * 512 < 64 * MiB  # no journal of zeros
    assert as_user(54324, f"touch {folder}/a").returncode == 0
    assert images.measure("dee").free_files == limits.files_hard - 1


def test_new_users_images_are_made_a_few_at_a_time(
    images: UserImages, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many new users at once (fifty first submissions): at most MAKING_AT_ONCE images are
    made together, the others wait their turn, and every one is made. All at once, each was
    ready only when all were."""
    from extension.storage import images as module

    lock, running, most = threading.Lock(), [0], [0]
    real = module._run

    def counted(cmd: list[str], what: str) -> str:
        if cmd[0] != "mkfs.ext4":
            return real(cmd, what)
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            return real(cmd, what)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(module, "_run", counted)
    users = [f"new{i}" for i in range(3 * module.MAKING_AT_ONCE)]
    for user in users:
        (images.storage_root / user).mkdir(mode=0o700)
    limits = parse_limits("1Gi", "t")
    with ThreadPoolExecutor(len(users)) as pool:
        list(pool.map(lambda u: images.ensure(u, 54331, 54331, limits), users))
    assert 2 <= most[0] <= module.MAKING_AT_ONCE, most
    assert all(mounted_at(images.mount_point(u)) for u in users)
