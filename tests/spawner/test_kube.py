"""WmlaKubeSpawner's pod, built offline by the real KubeSpawner and compared with literal dicts.

No API server runs here: KubeSpawner is constructed with ``_mock=True`` and a dummy kubeconfig
(nothing connects before ``start()``), the wmla overlay is applied as ``load_user_options``
applies it after admission, and ``get_pod_manifest()`` builds the real pod, serialised with
kubernetes_asyncio's ApiClient. The whole pod is validated against the Kubernetes OpenAPI
schemas (kubernetes-validate, strict: unknown fields fail) when that package is installed.
"""

from __future__ import annotations

import base64
import copy
import os
import types
from pathlib import Path

import pytest
from traitlets.config import Config

pytest.importorskip("kubespawner")

from extension.backends.manifests import ManifestError  # noqa: E402
from spawner import objects  # noqa: E402
from spawner.kernel import STARTUP_SCRIPT  # noqa: E402
from spawner.kube import WmlaKubeSpawner  # noqa: E402

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: not-a-token}}]
contexts: [{name: c, context: {cluster: c, user: u, namespace: wmla}}]
current-context: c
"""
# manifests.queue_name("/project1/dev-team/alice"): the leaf's queue, where the jobs go too
REPO = Path(__file__).resolve().parents[2]
QUEUE = "wmla-project1-dev-team-alice-20ae9e8b"


@pytest.fixture(scope="module", autouse=True)
def dummy_kubeconfig(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("kube") / "config"
    path.write_text(KUBECONFIG)
    from kubernetes_asyncio.config import kube_config

    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(path)
    # read once when kubernetes_asyncio is imported, maybe before this module
    old_default = kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(path)
    yield
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = old_default
    if old is None:
        os.environ.pop("KUBECONFIG", None)
    else:
        os.environ["KUBECONFIG"] = old


def make_spawner(name: str = "alice", **config) -> WmlaKubeSpawner:
    c = Config()
    c.WmlaKubeSpawner.service_url = "http://hub.wmla.svc:8081/services/wmla/"
    c.WmlaKubeSpawner.kernel_service_url = "http://proxy-public.wmla.svc/services/wmla/"
    for key, value in config.items():
        setattr(c.WmlaKubeSpawner, key, value)
    user = types.SimpleNamespace(name=name, id=7, url=f"/user/{name}/", groups=[], settings={})
    return WmlaKubeSpawner(config=c, _mock=True, user=user)


async def pod_of(spawner: WmlaKubeSpawner, plan: str = "/project1/dev-team") -> dict:
    spawner.wmla_job_id = "job-1"
    spawner.wmla_leaf = f"{plan}/{spawner.user.name}"
    spawner.apply_wmla_overlay(plan)
    pod = await spawner.get_pod_manifest()
    return spawner.api.api_client.sanitize_for_serialization(pod)


async def test_the_pod_mounts_only_the_users_folder_in_its_leafs_queue() -> None:
    pod = await pod_of(make_spawner(gpus=1, notebook_cpu="500m", notebook_memory="2Gi"))
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert spec["schedulerName"] == "volcano"
    assert spec["volumes"] == [
        {"name": "wmla-user-folder", "persistentVolumeClaim": {"claimName": "wmla-storage"}}
    ]
    assert container["volumeMounts"] == [
        {"name": "wmla-user-folder", "mountPath": "/gpfs/myresultfs/alice", "subPath": "alice"}
    ]
    assert container["workingDir"] == "/gpfs/myresultfs/alice"
    # the grant is the limit too: no limit was configured
    assert container["resources"] == {
        "limits": {"cpu": 0.5, "memory": 2 * 2**30, "nvidia.com/gpu": "1"},
        "requests": {"cpu": 0.5, "memory": 2 * 2**30},
    }
    assert "initContainers" not in spec  # no uid set: the image's user, nothing to own
    labels = pod["metadata"]["labels"]
    assert {k: v for k, v in labels.items() if k.startswith("wmla.jupyter.org/")} == {
        "wmla.jupyter.org/instance": "wmla",
        "wmla.jupyter.org/user": "alice",
        "wmla.jupyter.org/queue": QUEUE,
        "wmla.jupyter.org/kind": "notebook",
    }
    assert labels["app.kubernetes.io/managed-by"] == "kubespawner"
    annotations = pod["metadata"]["annotations"]
    assert {k: v for k, v in annotations.items() if "wmla" in k or k.startswith("scheduling.")} == {
        "wmla.jupyter.org/job-id": "job-1",
        "wmla.jupyter.org/plan": "/project1/dev-team",
        "wmla.jupyter.org/leaf": "/project1/dev-team/alice",
        "scheduling.volcano.sh/queue-name": QUEUE,
    }
    env = {e["name"]: e.get("value") for e in container["env"] if e["name"].startswith("WMLA_")}
    assert env == {
        "WMLA_URL": "http://proxy-public.wmla.svc/services/wmla/",
        "WMLA_SERVICE_NAME": "wmla",
        "WMLA_USER": "alice",
        "WMLA_PLAN": "/project1/dev-team",
        "WMLA_LEAF": "/project1/dev-team/alice",
        "WMLA_USER_DIR": "/gpfs/myresultfs/alice",
        "WMLA_STORAGE_ROOT": "/gpfs/myresultfs",
        "WMLA_NOTEBOOK_JOB": "job-1",
    }
    assert {e["name"]: e["value"] for e in container["env"]}["IPYTHONDIR"] == (
        "/gpfs/myresultfs/alice/.ipython"
    )
    command = container["lifecycle"]["postStart"]["exec"]["command"]
    assert command[:2] == ["sh", "-c"]
    encoded = command[2].split("echo ", 1)[1].split(" ", 1)[0]
    assert base64.b64decode(encoded).decode() == STARTUP_SCRIPT
    assert (
        "/gpfs/myresultfs/alice/.ipython/profile_default/startup/00-wmla-magics.py" in (command[2])
    )
    _validate(pod)


async def test_a_pod_run_as_a_uid_owns_the_top_of_its_folder_first_and_keeps_a_set_limit() -> None:
    spawner = make_spawner(
        notebook_cpu="500m", notebook_memory="1Gi", uid=lambda s: 100000 + s.user.id
    )
    spawner.mem_limit = 4 * 2**30  # a profile's or the site's limit stays
    pod = await pod_of(spawner)
    spec = pod["spec"]
    assert spec["containers"][0]["securityContext"]["runAsUser"] == 100007
    init, starter = spec["initContainers"]
    assert init["name"] == "wmla-own-folder" and init["image"] == spawner.image
    assert init["command"][-3:] == ["/gpfs/myresultfs/alice", "100007", "100007"]
    assert init["volumeMounts"] == spec["containers"][0]["volumeMounts"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    limits = spec["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": 0.5, "memory": 4 * 2**30}
    spawner.apply_wmla_overlay("/project1/dev-team")  # a second start: still one
    assert len(spawner.init_containers) == 2
    # then the getting-started files, offered as the user (never root, no capabilities)
    assert starter["name"] == "wmla-getting-started"
    assert starter["securityContext"]["runAsUser"] == 100007
    assert starter["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    _validate(pod)


def test_the_getting_started_init_writes_the_files_once_and_never_over_the_users(
    tmp_path,
) -> None:
    """Its command, run here as it runs in the pod: the files once, what the user changed
    kept, nothing again after the marker."""
    import subprocess
    import sys

    from spawner.getting_started import MARKER, starter_files

    starter = objects.make_starter(image="i", folder=str(tmp_path), mount={}, uid=1, gid=1,
                                   files=starter_files(), marker=MARKER)  # fmt: skip
    argv = [sys.executable, *starter["command"][1:]]
    (tmp_path / "getting-started.ipynb").write_text("mine")
    subprocess.run(argv, check=True, env={"PYTHONPATH": str(REPO)})
    assert (tmp_path / "getting-started.ipynb").read_text() == "mine"
    assert (tmp_path / "models" / "pytorch_mnist" / "main.py").is_file()
    (tmp_path / "models" / "pytorch_mnist" / "main.py").unlink()
    subprocess.run(argv, check=True, env={"PYTHONPATH": str(REPO)})
    assert not (tmp_path / "models" / "pytorch_mnist" / "main.py").exists()


async def test_a_cpu_only_pod_without_volcano_has_no_gpu_and_no_queue() -> None:
    spawner = make_spawner(
        scheduler_name="", user_mount_path="/home/{username}", storage_claim_name="homes"
    )
    pod = await pod_of(spawner, plan="/sample-project/notebooks")
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert "schedulerName" not in spec
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert "scheduling.volcano.sh/queue-name" not in pod["metadata"]["annotations"]
    assert container["volumeMounts"] == [
        {"name": "wmla-user-folder", "mountPath": "/home/alice", "subPath": "alice"}
    ]
    assert spec["volumes"][0]["persistentVolumeClaim"] == {"claimName": "homes"}
    _validate(pod)


async def test_configured_volumes_are_kept_and_ours_replaced_by_name() -> None:
    spawner = make_spawner(
        volumes=[
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
            {"name": "wmla-user-folder", "emptyDir": {}},  # ours wins: the folder is the mount
        ],
        volume_mounts=[{"name": "shm", "mountPath": "/dev/shm"}],
    )
    pod = await pod_of(spawner)
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["shm", "wmla-user-folder"]
    assert pod["spec"]["volumes"][1]["persistentVolumeClaim"] == {"claimName": "wmla-storage"}
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert [m["mountPath"] for m in mounts] == ["/dev/shm", "/gpfs/myresultfs/alice"]


@pytest.mark.parametrize("name", ["../etc", "a/b", "bob smith", "-x", "x" * 64, ""])
async def test_user_names_that_could_escape_the_folder_are_refused(name: str) -> None:
    spawner = make_spawner("placeholder")
    spawner.user.name = name
    with pytest.raises(ManifestError, match="cannot be used on Kubernetes"):
        spawner.apply_wmla_overlay("/project1/dev-team")
    with pytest.raises(ManifestError):
        objects.make_user_storage(claim_name="c", user=name)


def test_the_pure_overlay() -> None:
    overlay = objects.make_pod_overlay(
        user="bob",
        plan="/project1/qa-team",
        leaf="/project1/qa-team/bob",
        job_id="job-9",
        gpus=2,
        claim_name="gpfs",
    )
    queue = "wmla-project1-qa-team-bob-" + overlay["extra_labels"]["wmla.jupyter.org/queue"][-8:]
    assert overlay == {
        "volumes": [{"name": "wmla-user-folder", "persistentVolumeClaim": {"claimName": "gpfs"}}],
        "volume_mounts": [
            {"name": "wmla-user-folder", "mountPath": "/gpfs/myresultfs/bob", "subPath": "bob"}
        ],
        "extra_labels": {
            "wmla.jupyter.org/instance": "wmla",
            "wmla.jupyter.org/user": "bob",
            "wmla.jupyter.org/queue": queue,
            "wmla.jupyter.org/kind": "notebook",
        },
        "extra_annotations": {
            "wmla.jupyter.org/job-id": "job-9",
            "wmla.jupyter.org/plan": "/project1/qa-team",
            "wmla.jupyter.org/leaf": "/project1/qa-team/bob",
            "scheduling.volcano.sh/queue-name": queue,
        },
        "extra_resource_limits": {"nvidia.com/gpu": "2"},
        "environment": {},
        "working_dir": "/gpfs/myresultfs/bob",
        "lifecycle_hooks": {},
    }
    assert objects.make_gpu_limits(gpus=0) == {}
    with pytest.raises(ManifestError):
        objects.make_gpu_limits(gpus=-1)


def _validate(pod: dict) -> None:
    try:
        import kubernetes_validate
    except ImportError:  # optional: the literal dicts above still pin the pod
        return
    kubernetes_validate.validate(pod, "1.30.0", strict=True)
    # and the check is not vacuous: a misspelt field fails
    broken = copy.deepcopy(pod)
    broken["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.30.0", strict=True)


async def test_the_spawn_page_offers_the_plans_as_the_local_spawners_does() -> None:
    """The mixin's form, not KubeSpawner's: profiles and the plans the user may use."""
    spawner = make_spawner()
    assert spawner.options_from_form == spawner.wmla_options_from_form
    assert spawner.options_form.__code__.co_names == ("wmla_spawn_form",)
    html = spawner.wmla_options_form(["/a/b", "/a/c"], [{"display_name": "CPU", "slug": "cpu"}])
    assert 'name="plan" value="/a/b"' in html and 'name="profile"' in html
    assert spawner.options_from_form({"profile": ["cpu"], "plan": ["/a/c"]}) == {
        "profile": "cpu",
        "plan": "/a/c",
    }
