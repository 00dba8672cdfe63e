"""Idle notebooks give their resources back, and a hub shutdown releases every notebook job.

The cullers' service entries and roles are checked as literal data; then a real hub from the
repository's jupyterhub_config.py (as tests/service/hub.py starts it) with the real
jupyterhub-idle-culler services, the wmla local spawner and the real wmla service: an idle
server that holds a GPU is stopped after a tiny GPU timeout and its notebook job released, while
an idle CPU-only server (the long timeout) stays; stopping the hub stops the servers while the
wmla service still runs, so nothing is left charged and nothing "could not release".
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hub_config import stop_servers_before_services
from hub_config.culler import GPU_GROUP, culler_services, culler_settings
from spawner.mixin import GPU_GROUP as SPAWNER_GPU_GROUP
from tests.service.hub import PROXY, Client, Hub
from tests.spawner.helpers import hub_request, notebook_jobs, server_model, wait_for

PY = sys.executable
# each culler ends when its hub dies, and at the hub's first signal (SIGINT) when it stops it
PDEATH = [PY, "-m", "hub_config.pdeath", PY, "-m", "hub_config.plainstop"]


# -- the service entries and roles (pure) ---------------------------------------------------------
def test_two_cullers_the_gpu_one_scoped_to_the_spawners_group() -> None:
    assert GPU_GROUP == SPAWNER_GPU_GROUP == "wmla-gpu-notebooks"
    services, roles = culler_services(timeout=3600, gpu_timeout=900, python=PY)
    assert services == [
        {
            "name": "wmla-idle-culler",
            "command": [*PDEATH, "jupyterhub_idle_culler", "--timeout=3600"],
            "display": False,
        },
        {
            "name": "wmla-idle-culler-gpu",
            "command": [*PDEATH, "jupyterhub_idle_culler", "--timeout=900"],
            "display": False,
        },
    ]
    assert roles == [
        {
            "name": "wmla-idle-culler-role",
            "description": "Stops every server idle for 3600 s (jupyterhub-idle-culler)",
            "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
            "services": ["wmla-idle-culler"],
        },
        {
            "name": "wmla-idle-culler-gpu-role",
            "description": "Stops servers of users in hub group wmla-gpu-notebooks idle for "
            "900 s (jupyterhub-idle-culler)",
            "scopes": [
                "list:users!group=wmla-gpu-notebooks",
                "read:users:activity!group=wmla-gpu-notebooks",
                "read:servers!group=wmla-gpu-notebooks",
                "delete:servers!group=wmla-gpu-notebooks",
            ],
            "services": ["wmla-idle-culler-gpu"],
        },
    ]


def test_culler_options_and_what_turns_a_culler_off() -> None:
    services, roles = culler_services(
        timeout=600,
        gpu_timeout=60,
        gpu_group="gpu-users",
        cull_every=10,
        name="cull",
        python=PY,
        extra_args=["--max-age=86400"],
        environment={"JUPYTERHUB_REQUEST_TIMEOUT": "30"},
    )
    assert [s["command"][7:] for s in services] == [
        ["--timeout=600", "--cull-every=10", "--max-age=86400"],
        ["--timeout=60", "--cull-every=10", "--max-age=86400"],
    ]
    assert [s["environment"] for s in services] == [{"JUPYTERHUB_REQUEST_TIMEOUT": "30"}] * 2
    assert roles[1]["scopes"][0] == "list:users!group=gpu-users"
    assert [r["services"] for r in roles] == [["cull"], ["cull-gpu"]]
    # a GPU timeout no shorter than the other needs no second culler
    assert [s["name"] for s in culler_services(600, 600)[0]] == ["wmla-idle-culler"]
    assert [s["name"] for s in culler_services(600, None)[0]] == ["wmla-idle-culler"]
    # only GPU servers are culled
    only_gpu, only_gpu_roles = culler_services(0, 900)
    assert [s["name"] for s in only_gpu] == ["wmla-idle-culler-gpu"]
    assert only_gpu_roles[0]["scopes"][0] == "list:users!group=wmla-gpu-notebooks"
    assert culler_services(0, 0) == ([], [])
    with pytest.raises(ValueError, match="gpu_group"):
        culler_services(600, 60, gpu_group="")


def test_culler_settings_from_the_environment() -> None:
    assert culler_settings({}) == {"timeout": 3600, "gpu_timeout": 900, "cull_every": 0}
    env = {"WMLA_CULL_TIMEOUT": "7200", "WMLA_CULL_GPU_TIMEOUT": "0", "WMLA_CULL_EVERY": " 30 "}
    assert culler_settings(env) == {"timeout": 7200, "gpu_timeout": 0, "cull_every": 30}
    for bad in ("1h", "-5"):
        with pytest.raises(ValueError, match="WMLA_CULL_GPU_TIMEOUT"):
            culler_settings({"WMLA_CULL_GPU_TIMEOUT": bad})


def test_the_shutdown_wrapper_needs_a_running_hub() -> None:
    assert stop_servers_before_services() is False  # a config read outside a hub: no-op


# -- a real hub ----------------------------------------------------------------------------------
SPAWNER_CONFIG = """
c.JupyterHub.spawner_class = "wmla-local"
c.WmlaLocalSpawner.storage_root = {storage!r}
c.WmlaLocalSpawner.system_users = False
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0}}
c.WmlaLocalSpawner.notebook_cpu = "100m"
c.WmlaLocalSpawner.notebook_memory = "64Mi"
c.WmlaLocalSpawner.admission_poll_interval = 0.3
c.WmlaLocalSpawner.profile_list = [
    {{"slug": "cpu", "display_name": "CPU only", "default": True}},
    {{"slug": "one-gpu", "display_name": "1 GPU", "kubespawner_override": {{"gpus": 1}}}},
]
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 90
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    if not PROXY.exists():
        pytest.skip("configurable-http-proxy is missing: run `make install`")
    tmp = tmp_path_factory.mktemp("culler-hub")
    storage = Path(tempfile.mkdtemp(prefix="wmla-culler-storage-"))
    traits = {"tick": 1, "grace": 1, "device_layout": "1x4", "cpu_oversubscription": 4}
    hub = Hub(tmp, traits)
    hub.env["WMLA_STORAGE_ROOT"] = str(storage)
    # what jupyterhub_config.py reads: GPU servers idle 5 s are culled, others after an hour
    hub.env.update(
        {"WMLA_CULL_TIMEOUT": "3600", "WMLA_CULL_GPU_TIMEOUT": "5", "WMLA_CULL_EVERY": "1"}
    )
    with open(hub.config, "a") as f:
        f.write(SPAWNER_CONFIG.format(storage=str(storage)))
    try:
        hub.start()
        hub.clients = {u: Client(hub, hub.user_token(u)) for u in ("admin", "user1", "user2")}
        yield hub
    finally:
        hub.stop()
        shutil.rmtree(storage, ignore_errors=True)


def spawn_ready(hub: Hub, user: str, profile: str) -> None:
    r = hub_request(hub, "POST", f"/users/{user}/server", user, json={"profile": profile})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: (server_model(hub, user) or {}).get("ready"), f"{user}'s server", 120, hub=hub)


def gpu_group_members(hub: Hub) -> set[str]:
    r = hub.hub_api("GET", f"/groups/{GPU_GROUP}")
    if r.status_code == 404:
        return set()
    assert r.status_code == 200, r.text
    return set(r.json()["users"])


def test_an_idle_gpu_server_is_culled_and_released_an_idle_cpu_one_stays(hub: Hub) -> None:
    spawn_ready(hub, "user1", "cpu")
    spawn_ready(hub, "user2", "one-gpu")
    (gpu_job,) = notebook_jobs(hub, "user2")
    (cpu_job,) = notebook_jobs(hub, "user1")
    # the spawner keeps the GPU holders in the group the GPU culler's scopes are filtered to
    assert "user2" in gpu_group_members(hub) and "user1" not in gpu_group_members(hub)

    wait_for(lambda: server_model(hub, "user2") is None, "the GPU culler", 40, hub=hub)
    assert "wmla-idle-culler-gpu" in hub.log() and "Culling server user2" in hub.log()
    wait_for(lambda: notebook_jobs(hub, "user2") == [], "the GPU job's release", hub=hub)
    assert hub.clients["admin"].get(f"/jobs/{gpu_job['id']}").json()["state"] == "CANCELLED"
    assert "user2" not in gpu_group_members(hub)

    # user1's CPU server was as idle, longer: the GPU culler cannot even see it
    time.sleep(3)
    model = server_model(hub, "user1")
    assert model and model["ready"], hub.log()
    assert [j["id"] for j in notebook_jobs(hub, "user1")] == [cpu_job["id"]]
    assert "Culling server user1" not in hub.log()


def test_stopping_the_hub_releases_every_notebook_job_without_errors(hub: Hub) -> None:
    if server_model(hub, "user1") is None:
        spawn_ready(hub, "user1", "cpu")
    (job,) = notebook_jobs(hub, "user1")
    before = hub.log_path.stat().st_size
    hub.stop()
    shutdown = hub.log_path.read_text(errors="replace")[before:]
    assert "could not release" not in shutdown, shutdown
    assert f"released notebook job {job['id']}" in shutdown, shutdown
    assert "stopping 1 single-user servers before the services" in shutdown, shutdown

    hub.start()
    state = hub.clients["admin"].get(f"/jobs/{job['id']}").json()["state"]
    assert state == "CANCELLED", hub.log()
    r = hub.clients["admin"].get("/jobs", params={"state": "RUNNING,PENDING"})
    assert [j for j in r.json()["jobs"] if j.get("kind") == "notebook"] == [], r.text
    assert server_model(hub, "user1") is None
