"""The user's journey on Kubernetes through the hub (issue 40): the repository's own
jupyterhub_config.py with ``WMLA_BACKEND=kubernetes`` over the test cluster with its real node
(a kubelet over containerd, devcluster/realnode.py). A user's notebook is a pod of the notebook
image (built here, devcluster/notebook_image.py) that ``wmla-kube`` starts on the real node: its
limits are its grant, it mounts only the user's folder and runs as the user's uid; JupyterLab
answers through the hub's proxy, and ``%wmla_train`` in one of its kernels trains the shipped
example as a 2-worker PyTorchJob on the same node (the browser walk's getting-started notebook).

The hub listens on the node's address (the pods' gateway to this machine), as ``make run`` does
on such a cluster (hub_config/kubernetes.py).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from devcluster.cluster import LocalCluster
from devcluster.realnode import NODE_NAME, RealNode, RealNodeError
from extension.backends.manifests import pod_uid
from hub_config.kubernetes import NAMESPACE, UID_BASE
from hub_config.kubernetes import RealNode as NodeState
from tests.e2e.walk import CHROMIUM, Visit, browser_page, log_in_and_spawn, train_and_check_chart
from tests.service.hub import PROXY, Client, Hub
from tests.spawner.helpers import hub_request, server_model, wait_for
from tests.spawner.test_local import run_in_kernel

from .test_seed002 import SEED_MODULE as SEED
from .test_seed002 import keep_output, seed_figures, start_seed

REPO = Path(__file__).resolve().parents[2]
USER = "user1"

# after the repository's config: the test's Hub sets the simple spawner for its other suites
KUBE_CONFIG = """
c.JupyterHub.spawner_class = "wmla-kube"
c.WmlaKubeSpawner.start_timeout = 240
"""


@pytest.fixture(scope="module")
def node(kube: LocalCluster) -> Iterator[RealNode]:
    real = kube.real_node()
    try:
        real.up()
        real.notebook_image()  # imported where notebooks are served, as make k8s-up does
    except RealNodeError as err:
        pytest.fail(str(err), pytrace=False)
    yield real


@pytest.fixture(scope="module")
def hub(kube: LocalCluster, node: RealNode, tmp_path_factory: pytest.TempPathFactory):
    if not PROXY.exists():
        pytest.skip("configurable-http-proxy is missing: run `make install`")
    state = NodeState.of(kube.var)
    assert state is not None, f"the real node wrote no state in {kube.var}/node"
    hub = Hub(tmp_path_factory.mktemp("kube-hub"), {"tick": 1, "backend_options": None})
    hub.env.update(
        {"WMLA_BACKEND": "kubernetes", "WMLA_K8S_VAR": str(kube.var), "WMLA_K8S_REAL_NODE": "1"}
    )
    hub.url = f"http://{state.address}:{hub.port}"  # where the proxy listens now
    hub.api = f"{hub.url}/services/wmla/api/v1"
    with open(hub.config, "a") as f:
        f.write(KUBE_CONFIG)
    try:
        hub.start()
        hub.clients = {name: Client(hub, hub.user_token(name)) for name in ("padmin", USER)}
        hub.clients["admin"] = hub.clients["padmin"]
        yield hub
    finally:
        try:
            hub_request(hub, "DELETE", f"/users/{USER}/server", USER)
            wait_for(lambda: not _pods(kube), "the notebook pod to go", 60)
        except Exception:
            pass
        hub.stop()
        kube.kubectl("delete", "pytorchjobs,pods", "--all", "-n", NAMESPACE,
                     "--grace-period=0", "--wait=false")  # fmt: skip


def _pods(kube: LocalCluster) -> list[dict]:
    out = kube.kubectl("get", "pods", "-n", NAMESPACE, "-l", "component=singleuser-server",
                       "-o", "json")  # fmt: skip
    return json.loads(out)["items"]


def _ready(hub: Hub, kube: LocalCluster) -> dict:
    def ready() -> dict | None:
        model = server_model(hub, USER)
        if model and model["ready"]:
            return model
        if model is None or not model.get("pending"):
            pods = kube.kubectl("get", "pods,events", "-n", NAMESPACE)
            raise AssertionError(f"{USER}'s server is not starting: {model}\n{pods}\n{hub.log()}")
        return None

    return wait_for(ready, f"{USER}'s notebook pod ready", 300, hub)


@pytest.fixture(scope="module")
def server(hub: Hub, kube: LocalCluster) -> dict:
    r = hub_request(hub, "POST", f"/users/{USER}/server", USER, json={"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    model = _ready(hub, kube)
    (pod,) = _pods(kube)
    return {"model": model, "pod": pod}


def test_the_notebook_pod_runs_on_the_real_node_as_its_user_with_its_grant(
    hub: Hub, kube: LocalCluster, server: dict
) -> None:
    pod = server["pod"]
    spec = pod["spec"]
    assert spec["nodeName"] == NODE_NAME and pod["status"]["phase"] == "Running"
    (container,) = spec["containers"]
    resources = container["resources"]
    assert resources["limits"]["cpu"] == resources["requests"]["cpu"]
    assert resources["limits"]["memory"] == resources["requests"]["memory"]
    uid = container["securityContext"]["runAsUser"]
    assert uid == pod_uid(USER, UID_BASE) and container["securityContext"]["runAsGroup"] == uid
    # the folder's top given to that uid first, by an init container with CAP_CHOWN only
    init = {c["name"]: c for c in spec["initContainers"]}
    owner = init["wmla-own-folder"]["securityContext"]
    assert owner["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    # then the getting-started files, as the user
    assert init["wmla-getting-started"]["securityContext"]["runAsUser"] == uid
    # one volume of the user's: the claim's folder of this user, nothing else of the claim
    claims = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
    assert len(claims) == 1
    mounts = [m for m in container["volumeMounts"] if m["name"] == claims[0]["name"]]
    assert [m["subPath"] for m in mounts] == [USER]
    assert pod["metadata"]["annotations"]["wmla.jupyter.org/leaf"].endswith(f"/{USER}")


def test_jupyterlab_answers_through_the_proxy(hub: Hub, server: dict) -> None:
    token = hub.clients[USER].headers["Authorization"]
    r = requests.get(f"{hub.url}/user/{USER}/lab", headers={"Authorization": token}, timeout=60)
    assert r.status_code == 200 and "JupyterLab" in r.text, r.text[:500]
    r = requests.get(f"{hub.url}/user/{USER}/api/status", headers={"Authorization": token},
                     timeout=30)  # fmt: skip
    assert r.status_code == 200, r.text


async def test_a_kernel_sees_its_grant_its_uid_and_only_its_folder(
    hub: Hub, kube: LocalCluster, server: dict
) -> None:
    pod = server["pod"]
    (container,) = pod["spec"]["containers"]
    folder = container["workingDir"]
    out = await run_in_kernel(
        hub,
        USER,
        "import getpass, os, json\n"
        "mem = open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read().strip()\n"
        "quota = open('/sys/fs/cgroup/cpu/cpu.cfs_quota_us').read().strip()\n"
        "period = open('/sys/fs/cgroup/cpu/cpu.cfs_period_us').read().strip()\n"
        "open('mine.txt', 'w').write('x')\n"
        "print(json.dumps({'uid': os.getuid(), 'mem': int(mem), 'cpu': int(quota) / int(period),"
        " 'cwd': os.getcwd(), 'parent': sorted(os.listdir('..')), 'name': getpass.getuser(),"
        " 'parent_writable': os.access('..', os.W_OK)}))\n",
    )
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["uid"] == container["securityContext"]["runAsUser"]
    assert seen["cwd"] == folder
    from extension.scheduler.resources import parse_quantity

    assert seen["mem"] == parse_quantity("memory", container["resources"]["limits"]["memory"])
    cpu = parse_quantity("cpu", container["resources"]["limits"]["cpu"]) / 1000
    assert seen["cpu"] == pytest.approx(cpu)
    assert seen["parent"] == [USER]  # the mount's parent holds the user's folder only
    # and the user cannot put anything there (a link named as another user's folder)
    assert seen["parent_writable"] is False
    assert seen["name"] == USER  # no passwd entry for the uid: USER says it (torch asks)
    host = kube.user_data / NAMESPACE / USER / "mine.txt"
    assert host.stat().st_uid == seen["uid"]


HOG = """import time
block = bytearray(1 << 30)  # 1 GiB touched page by page, past the job's 256 MiB
for i in range(0, len(block), 4096):
    block[i] = 1
print("still here", flush=True)
"""


def test_a_job_past_its_memory_is_oom_killed_and_its_user_reads_why(
    hub: Hub, kube: LocalCluster, server: dict
) -> None:
    """The kubelet's cgroup kills it (the pod's limit is the grant), and the user reads it in
    the job's reason and in ``wmla logs`` (the API the CLI and the widget read)."""
    token = hub.clients[USER].headers["Authorization"]
    for path, body in (
        ("models/hog", {"type": "directory"}),
        ("models/hog/main.py", {"type": "file", "format": "text", "content": HOG}),
    ):
        r = requests.put(f"{hub.url}/user/{USER}/api/contents/{path}",
                         headers={"Authorization": token}, json=body, timeout=30)  # fmt: skip
        assert r.status_code in (200, 201), r.text
    client = hub.clients[USER]
    r = client.post(
        "/jobs",
        json={
            "plan": "/sample-project/training",
            "workers": 1,
            "resources": {"cpu": "500m", "memory": "256Mi", "gpu": 0},
            "command": {"model_dir": "models/hog", "model_main": "main.py"},
        },
    )
    assert r.status_code == 201, r.text
    job = client.wait_state(r.json()["id"], {"FAILED"}, timeout=240)
    assert "OOMKilled" in job["reason"] and "137" in job["reason"], job
    logs = client.get(f"/jobs/{job['id']}/logs").json()["logs"]
    assert "still here" not in logs


@dataclass
class PodVisit(Visit):
    """A visit whose server is a pod: its files are the uid the user's pods run as (no local
    account has it)."""

    pod_uid: int = 0

    @property
    def uid(self) -> int:
        return self.pod_uid


@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (CI installs it)")
def test_a_new_user_in_a_browser_trains_from_the_getting_started_notebook(
    hub: Hub, kube: LocalCluster
) -> None:
    """The embedded default's first visit (tests/e2e/walk.py), with the server a pod on the
    real node: log in, the spawn page, JupyterLab with the getting-started files the pod's
    init container offered as the user, Run All, the job monitor's chart. Screenshots in
    test-artifacts/k8s-new-user/."""
    user = "user2"
    artifacts = REPO / "test-artifacts" / "k8s-new-user"
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir(parents=True)
    try:
        with browser_page() as page:
            visit = PodVisit(
                page=page,
                url=hub.url,
                password=hub.password_of(user),
                user=user,
                folder=kube.user_data / NAMESPACE / user,
                account="",
                artifacts=artifacts,
                pod_uid=pod_uid(user, UID_BASE),
            )
            log_in_and_spawn(visit)
            chart = train_and_check_chart(visit)
        assert chart["traces"]
        # %wmla_train ran the example as a 2-worker PyTorchJob on the node, as the user's uid
        # (the notebook's too): everything in the job's folder is theirs, the folder included
        # (made by an init container as the user, not by runc as root)
        token = hub.user_token(user)
        client = Client(hub, token)
        jobs = client.get("/jobs").json()["jobs"]
        (job,) = [j for j in jobs if j["kind"] == "train"]
        assert job["state"] == "FINISHED" and job["workers"]["max"] == 2, job
        assert (Path(job["workdir"]) / "model.pt").is_file(), job
        for path in [Path(job["workdir"]), *Path(job["workdir"]).rglob("*")]:
            assert path.stat().st_uid == visit.uid, path
    finally:
        token = hub.user_token(user)
        r = requests.delete(f"{hub.url}/hub/api/users/{user}/server",
                            headers={"Authorization": f"token {token}"}, timeout=30)  # fmt: skip
        assert r.status_code in (202, 204, 400, 404), r.text


def test_seed002_through_wmla_on_the_real_node_every_gang_meets(
    hub: Hub, kube: LocalCluster, server: dict
) -> None:
    """Seed 002's part C with real processes: six 2-worker jobs from six threads through the
    hub's REST API; each worker joins its gang through torch.distributed on the real node (4
    GPUs). wmla admits whole gangs only: no job ever holds half its workers, and every gang
    meets (the rendezvous' log line) and FINISHES, with no timeout hit."""
    token = hub.clients[USER].headers["Authorization"]
    for path, body in (
        ("models/seed002", {"type": "directory"}),
        ("models/seed002/main.py", {"type": "file", "format": "text",
                                    "content": SEED.RENDEZVOUS}),
    ):  # fmt: skip
        r = requests.put(f"{hub.url}/user/{USER}/api/contents/{path}",
                         headers={"Authorization": token}, json=body, timeout=30)  # fmt: skip
        assert r.status_code in (200, 201), r.text
    seed = start_seed(
        kube, NAMESPACE, "--mode", "wmla", "--url", f"{hub.url}/services/wmla",
        "--token", token.split()[-1], "--plan", "/sample-project/training",
        "--model-dir", "models/seed002", "--cpu", "250m", "--memory", "1Gi",
        "--rendezvous-timeout", "120", "--job", "rendezvous", "--watch", "400", "--every", "1",
    )  # fmt: skip
    try:
        out, _ = seed.communicate(timeout=480)
    finally:
        if seed.poll() is None:
            seed.kill()
    keep_output("wmla", out)
    assert seed.returncode == 0, out[-3000:]
    figures = seed_figures(out)
    assert (figures["partial"], figures["succeeded"]) == (0, 6), out[-3000:]
    ids = re.search(r"submitted \[(.*)\]", out)
    assert ids, out[-3000:]
    client = hub.clients[USER]
    for job_id in re.findall(r"'([^']+)'", ids.group(1)):
        job = client.wait_state(job_id, {"FINISHED"}, timeout=60)
        logs = client.get(f"/jobs/{job['id']}/logs").json()["logs"]
        assert "the gang met" in logs, logs[-2000:]
