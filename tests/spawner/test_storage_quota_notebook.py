"""A notebook server on a storage quota (issue 39), through a real hub as root: the user's
first spawn makes their folder its own filesystem (the service does, when it admits the
server), the server runs as the user's account on it, and a save past the hard limit is
refused by the kernel: JupyterLab's contents API answers with an error, which is what the user
sees on save, and the files saved before are whole. The account is created by the spawn
itself, as on a fresh install."""

from __future__ import annotations

import base64
import os
import pwd
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest
import requests

from extension.storage.images import UserImages, mounted_at
from tests.security.test_storage_quota import outside_tmp
from tests.service.hub import PROXY, Client, Hub
from tests.spawner.helpers import hub_request, server_model, wait_for
from tests.spawner.test_local import (
    accounts_can_run_servers,
    progress_events,
    run_in_terminal,
    stop,
    wait_ready,
)

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("useradd") is not None
pytestmark = [
    pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing"),
    pytest.mark.skipif(not AS_ROOT, reason="images are mounted by a service run as root"),
]
PREFIX = f"sn{secrets.token_hex(3)}-"
MiB = 2**20

SPAWNER_CONFIG = """
c.JupyterHub.spawner_class = "wmla-local"
c.WmlaLocalSpawner.storage_root = {storage!r}
c.WmlaLocalSpawner.system_user_template = {template!r}
c.WmlaLocalSpawner.create_system_users = True
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0}}  # the spawn's events can be read
c.WmlaLocalSpawner.notebook_cpu = "100m"
c.WmlaLocalSpawner.notebook_memory = "256Mi"
c.WmlaLocalSpawner.private_tmp_template = {tmps!r}
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 90
"""


def account_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture(scope="module")
def hub():
    tmp = outside_tmp("wmla-quota-nb-")
    os.chmod(tmp, 0o711)
    storage = outside_tmp("wmla-quota-nb-storage-")
    os.chmod(storage, 0o711)
    traits = {"tick": 1, "grace": 1, "device_layout": "1x4", "cpu_oversubscription": 4}
    traits["backend_options"] = {"account_template": PREFIX + "{username}"}
    traits["default_storage_quota"] = "32Mi"
    hub = Hub(tmp, traits)
    hub.env["WMLA_STORAGE_ROOT"] = str(storage)
    hub.storage = storage
    tmps = str(hub.var / "wmla" / "storage" / "mnt" / "{username}" / "tmp")
    with open(hub.config, "a") as f:
        f.write(SPAWNER_CONFIG.format(template=PREFIX + "{username}", storage=str(storage),
                                      tmps=tmps))  # fmt: skip
    images = UserImages(hub.var / "wmla" / "storage", storage)
    try:
        hub.start()
        hub.clients = {name: Client(hub, hub.user_token(name)) for name in ("admin", "user1")}
        yield hub
    finally:
        try:
            hub_request(hub, "DELETE", "/users/user1/server", "user1")
        except Exception:
            pass
        hub.stop()
        problems = images.unmount_all()
        subprocess.run(["userdel", PREFIX + "user1"], capture_output=True)
        shutil.rmtree(storage, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
        assert not problems, problems


def test_a_notebook_save_past_the_quota_is_refused_with_the_kernels_error(hub: Hub) -> None:
    r = hub_request(hub, "POST", "/users/user1/server", "user1", json={})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: account_exists(PREFIX + "user1"), "the spawn to create the account", 60)
    if not accounts_can_run_servers(PREFIX + "user1"):
        pytest.skip("no Python the accounts can run here")
    wait_ready(hub, "user1")
    folder = hub.storage / "user1"
    assert mounted_at(folder), "the user's folder is not on its own filesystem"
    assert os.stat(folder).st_uid != 0
    token = hub.clients["user1"].headers["Authorization"]
    api = f"{hub.url}/user/user1/api/contents"

    def save(name: str, size: int) -> requests.Response:
        body = {"type": "file", "format": "base64",
                "content": base64.b64encode(os.urandom(size)).decode()}  # fmt: skip
        return requests.put(f"{api}/{name}", json=body, headers={"Authorization": token},
                            timeout=60)  # fmt: skip

    assert save("small.bin", MiB).status_code in (200, 201)
    refused = save("big.bin", 40 * MiB)
    # jupyter_server's atomic save keeps a backup of a file it overwrites; its message names
    # the backup's rename (there was none to keep) after the write's ENOSPC
    assert refused.status_code == 500 and "Unexpected error while saving" in refused.text
    assert (folder / "small.bin").stat().st_size == MiB  # what was saved before is whole
    mine = hub.clients["user1"].get("/storage").json()["users"][0]
    assert mine["storage"] == 32 * MiB and mine["used_bytes"] <= 32 * MiB, mine
    assert server_model(hub, "user1")["ready"]  # the server goes on


async def test_a_terminal_writes_its_tmp_inside_the_users_quota(hub: Hub) -> None:
    if server_model(hub, "user1") is None:
        pytest.skip("the first test's server did not start")
    marker = f"wmla-{secrets.token_hex(4)}"
    out = await run_in_terminal(
        hub, "user1", f"touch /tmp/{marker} /dev/shm/{marker} && ls /tmp /var/tmp /dev/shm"
    )
    assert out.count(marker) >= 4, out  # the command and the three listings
    assert not Path(f"/tmp/{marker}").exists()  # not the machine's /tmp
    assert not Path(f"/dev/shm/{marker}").exists()  # nor its /dev/shm
    tmps = list((hub.var / "wmla" / "storage" / "mnt" / "user1" / "tmp").glob(f"*/{marker}"))
    assert len(tmps) == 1, tmps  # the server's folder in the user's image


def test_the_spawn_page_warns_from_ninety_percent_of_the_quota(hub: Hub) -> None:
    if server_model(hub, "user1") is None:
        pytest.skip("the first test's server did not start")
    folder = hub.storage / "user1"
    uid = os.stat(folder).st_uid
    for name in os.listdir(folder):  # as the user would, from the terminal
        if name.endswith(".bin"):
            os.unlink(folder / name)
    fill = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           "sh", "-c", f"head -c 30M /dev/zero > {folder}/data"],
                          capture_output=True, text=True)  # fmt: skip
    assert fill.returncode == 0, fill.stderr
    stop(hub, "user1")
    r = hub_request(hub, "POST", "/users/user1/server", "user1", json={})
    assert r.status_code in (201, 202), r.text
    lines = [e.get("message", "") for e in progress_events(hub, "user1")]
    warning = [line for line in lines if "quota" in line]
    assert warning and "of its 32 MiB quota" in warning[0], lines
    wait_ready(hub, "user1")
