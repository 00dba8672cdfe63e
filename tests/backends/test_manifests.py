"""The manifest builders: literal golden dicts, the real CRD schemas, the Kubernetes models.

CRD schemas are read from ``../shared/data/k8s-crds`` relative to the repository root and made
strict (unknown fields refused), so a misspelt field fails here instead of being pruned
silently by a real API server. Core objects (pod templates, ResourceQuota, LimitRange) go
through kubernetes_asyncio's models and back: a field the models do not know is dropped on the
way, and the round trip no longer equals the input.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extension.backends import manifests as m
from extension.backends.base import JobSpec
from extension.backends.kubernetes import KubernetesBackend
from extension.scheduler import NO_LIMIT, UNLIMITED, Plan, PlanTree, Resources

try:
    from tests.backends.fake_k8s import CRD_DIR, crd_errors
except ImportError:  # tests/backends is not a package: pytest put its folder on sys.path
    from fake_k8s import CRD_DIR, crd_errors

GiB = 2**30
needs_crds = pytest.mark.skipif(
    not CRD_DIR.is_dir(),
    reason=f"the CRD schemas are not at {CRD_DIR} (../shared/data/k8s-crds from the repo root)",
)

LABELS = {
    "app.kubernetes.io/managed-by": "jupyterhub-wmla",
    "wmla.jupyter.org/instance": "wmla",
    "wmla.jupyter.org/job": "wmla-job-7-c37bd1a8",
    "wmla.jupyter.org/user": "alice",
    "wmla.jupyter.org/queue": "wmla-project1-dev-team-alice-20ae9e8b",
    "wmla.jupyter.org/kind": "train",
}
ANNOTATIONS = {
    "wmla.jupyter.org/job-id": "job-7",
    "wmla.jupyter.org/plan": "/project1/dev-team/alice",
}
TEMPLATE = {
    "metadata": {"labels": LABELS, "annotations": ANNOTATIONS},
    "spec": {
        "containers": [
            {
                "name": "pytorch",
                "image": "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime",
                "command": ["python", "main.py", "--epochs", "4"],
                "workingDir": "/gpfs/myresultfs/alice/jobs/job-7",
                "env": [
                    {"name": "WMLA_JOB_ID", "value": "job-7"},
                    {"name": "WMLA_PLAN", "value": "/project1/dev-team/alice"},
                ],
                "resources": {
                    "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
                    "limits": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
                },
                "volumeMounts": [
                    {"name": "user-data", "mountPath": "/gpfs/myresultfs/alice", "subPath": "alice"}
                ],
            }
        ],
        "restartPolicy": "Never",
        "schedulerName": "volcano",
        "terminationGracePeriodSeconds": 30,
        "volumes": [
            {"name": "user-data", "persistentVolumeClaim": {"claimName": "wmla-user-data"}}
        ],
    },
}


def spec(**kw) -> JobSpec:
    args = dict(
        id="job-7",
        user="alice",
        leaf="/project1/dev-team/alice",
        per_worker=Resources(1, 2000, 8 * GiB),
        command=["python", "main.py", "--epochs", "4"],
        workdir="/gpfs/myresultfs/alice/jobs/job-7",
    )
    args.update(kw)
    return JobSpec(**args)


def backend(**kw) -> KubernetesBackend:
    return KubernetesBackend(lambda event: None, namespace="wmla", **kw)


S1_TREE = PlanTree(
    [
        Plan("/project1"),
        Plan("/project1/dev-team", 4, Resources(4, UNLIMITED, UNLIMITED)),
        Plan("/project1/qa-team", 2, Resources(2, UNLIMITED, UNLIMITED)),
        Plan("/project1/support-team", 2, Resources(2, UNLIMITED, UNLIMITED)),
    ]
)


# -- golden ------------------------------------------------------------------------------------
def test_rigid_pytorchjob_golden():
    assert backend().build_job(spec(), 2) == {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": "wmla-job-7-c37bd1a8",
            "namespace": "wmla",
            "labels": LABELS,
            "annotations": ANNOTATIONS,
        },
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "Never", "template": TEMPLATE},
                "Worker": {"replicas": 1, "restartPolicy": "Never", "template": TEMPLATE},
            },
            "runPolicy": {
                "backoffLimit": 0,
                "cleanPodPolicy": "Running",
                "schedulingPolicy": {
                    "minAvailable": 2,
                    "queue": "wmla-project1-dev-team-alice-20ae9e8b",
                },
                "ttlSecondsAfterFinished": 3600,
            },
        },
    }


def test_elastic_pytorchjob_golden():
    job = backend(priority_class="wmla-train").build_job(spec(min_workers=1, max_workers=4), 3)
    template = copy.deepcopy(TEMPLATE)
    template["spec"]["priorityClassName"] = "wmla-train"
    # torchrun takes the operator's PET_* settings (min:max nodes, c10d rendezvous)
    template["spec"]["containers"][0]["command"] = [
        "torchrun",
        "--nproc-per-node=1",
        "main.py",
        "--epochs",
        "4",
    ]
    assert job["spec"] == {
        "pytorchReplicaSpecs": {
            "Worker": {"replicas": 3, "restartPolicy": "Never", "template": template}
        },
        "runPolicy": {
            "backoffLimit": 0,
            "cleanPodPolicy": "Running",
            "schedulingPolicy": {
                "minAvailable": 1,
                "queue": "wmla-project1-dev-team-alice-20ae9e8b",
                "priorityClass": "wmla-train",
            },
            "ttlSecondsAfterFinished": 3600,
        },
        "elasticPolicy": {
            "minReplicas": 1,
            "maxReplicas": 4,
            "rdzvBackend": "c10d",
            "maxRestarts": 3,
        },
    }


def test_one_worker_job_is_a_lone_master():
    job = backend().build_job(spec(), 1)
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    assert job["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == 1


def test_volcano_job_golden():
    job = backend(job_kind="volcanojob").build_job(spec(), 3)
    assert job["apiVersion"] == "batch.volcano.sh/v1alpha1"
    assert job["spec"] == {
        "schedulerName": "volcano",
        "minAvailable": 3,
        "queue": "wmla-project1-dev-team-alice-20ae9e8b",
        "maxRetry": 0,
        "plugins": {"pytorch": ["--master=master", "--worker=worker", "--port=23456"]},
        "policies": [{"event": "PodFailed", "action": "AbortJob"}],
        "tasks": [
            {"name": "master", "replicas": 1, "template": TEMPLATE},
            {"name": "worker", "replicas": 2, "template": TEMPLATE},
        ],
        "ttlSecondsAfterFinished": 3600,
    }


def test_plan_tree_as_queues_golden():
    queues = backend().desired_queues(S1_TREE)
    managed = {
        "app.kubernetes.io/managed-by": "jupyterhub-wmla",
        "wmla.jupyter.org/instance": "wmla",
    }

    def queue(name, plan, parent, weight, gpu=None):
        spec = {"weight": weight, "reclaimable": True, "parent": parent}
        if gpu is not None:
            spec["capability"] = {"nvidia.com/gpu": gpu}
        return {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": {
                "name": name,
                "labels": managed,
                "annotations": {"wmla.jupyter.org/plan": plan},
            },
            "spec": spec,
        }

    project = "wmla-project1-c639daac"
    assert queues == [
        queue("wmla", "/", "root", 1),
        queue(project, "/project1", "wmla", 100),
        queue("wmla-project1-dev-team-bb4fc412", "/project1/dev-team", project, 400, "4"),
        queue("wmla-project1-qa-team-30ad5a42", "/project1/qa-team", project, 200, "2"),
        queue("wmla-project1-support-team-3d0232fc", "/project1/support-team", project, 200, "2"),
    ]


def test_queue_capability_takes_the_finite_limits_in_kubernetes_units():
    q = m.make_queue(
        name="q",
        parent="root",
        weight=m.share_to_weight(0.5),
        labels={},
        capability=Resources(UNLIMITED, 1500, 3 * GiB),
    )
    assert q["spec"] == {
        "weight": 50,
        "reclaimable": True,
        "parent": "root",
        "capability": {"cpu": "1500m", "memory": "3Gi"},
    }
    assert (
        "capability"
        not in m.make_queue(name="q", parent=None, weight=1, labels={}, capability=NO_LIMIT)["spec"]
    )


def test_podgroup_golden():
    assert m.make_podgroup(
        name="jupyter-alice",
        namespace="wmla",
        min_member=1,
        queue="wmla-x-1",
        labels={"a": "b"},
        min_resources=Resources(1, 500, 2 * GiB),
    ) == {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "jupyter-alice", "namespace": "wmla", "labels": {"a": "b"}},
        "spec": {
            "minMember": 1,
            "queue": "wmla-x-1",
            "minResources": {"cpu": "500m", "memory": "2Gi", "nvidia.com/gpu": "1"},
        },
    }


# -- names and input checks ---------------------------------------------------------------------
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True), min_size=1, max_size=6))
def test_queue_names_are_valid_and_deterministic(parts):
    path = "/" + "/".join(parts)
    name = m.queue_name(path)
    assert _DNS_LABEL.match(name) and len(name) <= 63
    assert m.queue_name(path) == name


@pytest.mark.parametrize(
    "a,b",
    [("/a/b-c", "/a-b/c"), ("/Dev", "/dev"), ("/x.y", "/x_y"), ("/" + "a" * 80, "/" + "a" * 81)],
    ids=["dash-vs-slash", "case", "dot-vs-underscore", "truncated-alike"],
)
def test_different_plans_never_share_a_queue(a, b):
    assert m.queue_name(a) != m.queue_name(b)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=80))
def test_job_object_names_are_short_dns_labels(job_id):
    name = m.job_object_name(job_id)
    assert _DNS_LABEL.match(name) and len(name) <= 40 and name[0].isalpha()


@pytest.mark.parametrize(
    "user",
    ["../bob", "a/b", "", "-alice", "alice-", "x" * 64, "Bob Smith", "alice@example.com", ".."],
    ids=[
        "dotdot",
        "slash",
        "empty",
        "leading-dash",
        "trailing-dash",
        "too-long",
        "space",
        "at",
        "dots",
    ],
)
def test_bad_usernames_are_refused_with_the_rule(user):
    with pytest.raises(m.ManifestError, match="letters, digits"):
        m.validate_username(user)
    with pytest.raises(m.ManifestError):
        backend().build_job(spec(user=user), 1)


@pytest.mark.parametrize(
    "workdir",
    [
        "/gpfs/myresultfs/bob/jobs/1",
        "/gpfs/myresultfs/alice/../bob",
        "/etc",
        "/gpfs/myresultfs/alicex",
    ],
    ids=["other-user", "dotdot-escape", "elsewhere", "prefix-lookalike"],
)
def test_workdir_outside_the_users_folder_is_refused(workdir):
    with pytest.raises(m.ManifestError, match="outside alice's folder"):
        backend().build_job(spec(workdir=workdir), 1)


def test_user_folder_is_the_only_mount():
    template = backend().build_job(spec(), 2)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    mounts = template["spec"]["containers"][0]["volumeMounts"]
    assert mounts == [
        {"name": "user-data", "mountPath": "/gpfs/myresultfs/alice", "subPath": "alice"}
    ]


@pytest.mark.parametrize(
    "amounts,expected",
    [
        (Resources(0, 500, 100 * 2**20), {"cpu": "500m", "memory": "100Mi"}),
        (Resources(2, 4000, 1000), {"cpu": "4", "memory": "1000", "nvidia.com/gpu": "2"}),
        (Resources(1, 1, 3 * 2**40), {"cpu": "1m", "memory": "3Ti", "nvidia.com/gpu": "1"}),
    ],
    ids=["no-gpu", "plain-bytes", "tiny-cpu"],
)
def test_resource_lists(amounts, expected):
    assert m.resource_list(amounts) == expected


def test_bad_builder_input_is_refused():
    with pytest.raises(m.ManifestError, match="min <= workers <= max"):
        m.make_pytorchjob(
            name="x",
            namespace="n",
            template={},
            workers=5,
            queue="q",
            labels={},
            min_workers=1,
            max_workers=4,
        )
    with pytest.raises(m.ManifestError, match="whole devices"):
        m.resource_list(Resources(0.5, 0, 0))
    with pytest.raises(m.ManifestError, match="needs a command"):
        backend().build_job(spec(command=[]), 1)
    with pytest.raises(m.ManifestError, match="prefix"):
        m.queue_name("/a", prefix="Bad_Prefix")
    with pytest.raises(ValueError, match="job_kind"):
        backend(job_kind="mpijob")


# -- the real CRD schemas ----------------------------------------------------------------------
def _built_objects():
    yield "rigid-pytorchjob", "pytorchjobs", backend(priority_class="high").build_job(spec(), 4)
    yield (
        "elastic-pytorchjob",
        "pytorchjobs",
        backend().build_job(spec(min_workers=2, max_workers=8), 2),
    )
    yield (
        "pytorchjob-cpu-only-tolerations",
        "pytorchjobs",
        backend(
            node_selector={"pool": "gpu"},
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            service_account="wmla-jobs",
            image_pull_policy="IfNotPresent",
        ).build_job(spec(per_worker=Resources(0, 250, 512 * 2**20), env={"EPOCHS": "4"}), 1),
    )
    yield (
        "volcano-job",
        "volcanojobs",
        backend(job_kind="volcanojob", priority_class="p").build_job(spec(), 3),
    )
    for q in backend().desired_queues(S1_TREE):
        yield f"queue-{q['metadata']['name']}", "queues", q
    yield (
        "podgroup",
        "podgroups",
        m.make_podgroup(
            name="jupyter-alice",
            namespace="wmla",
            min_member=1,
            queue="wmla-x-1",
            labels={},
            priority_class="notebooks",
            min_resources=Resources(1, 500, GiB),
        ),
    )


BUILT = list(_built_objects())


@needs_crds
@pytest.mark.parametrize("kind,obj", [(k, o) for _, k, o in BUILT], ids=[i for i, _, _ in BUILT])
def test_built_objects_match_the_crd_schemas(kind, obj):
    assert crd_errors(kind, obj) == []


@needs_crds
@pytest.mark.parametrize(
    "mutate,expected",
    [
        (
            lambda j: j["spec"]["runPolicy"]["schedulingPolicy"].update(minAvailabel=2),
            "minAvailabel",
        ),
        (
            lambda j: j["spec"]["runPolicy"]["schedulingPolicy"].update(minAvailable="2"),
            "'2' is not of type",
        ),
        (
            lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"].update(
                terminationGracePeriodSeconds="30"
            ),
            "'30' is not of type 'integer'",
        ),
        (lambda j: j["metadata"].update(name="Bad_Name"), "DNS-1123"),
        (
            lambda j: j["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][
                0
            ].update(resorces={}),
            "resorces",
        ),
    ],
    ids=["misspelt-field", "wrong-type", "wrong-type-in-pod", "bad-name", "misspelt-pod-field"],
)
def test_the_schema_check_can_fail(mutate, expected):
    job = backend().build_job(spec(), 2)
    mutate(job)
    assert any(expected in e for e in crd_errors("pytorchjobs", job))


@needs_crds
def test_queue_weight_out_of_volcano_range_is_caught():
    q = m.make_queue(name="q", parent="root", weight=0, labels={})
    assert any("minimum" in e for e in crd_errors("queues", q))
    assert m.share_to_weight(10**6) == 65535 and m.share_to_weight(0.001) == 1


# -- the Kubernetes core models ----------------------------------------------------------------
def _round_trip(obj: dict, model: str) -> dict:
    from kubernetes_asyncio import client

    async def go():
        api = client.ApiClient()
        try:
            parsed = api.deserialize(types.SimpleNamespace(data=json.dumps(obj)), model)
            return api.sanitize_for_serialization(parsed)
        finally:
            await api.close()

    return asyncio.run(go()) if not _loop_running() else _in_thread(go)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _in_thread(factory):
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


def _pod_templates():
    for ident, _, obj in BUILT:
        spec_ = obj.get("spec") or {}
        for role, replica in (spec_.get("pytorchReplicaSpecs") or {}).items():
            yield f"{ident}-{role}", replica["template"]
        for task in spec_.get("tasks") or []:
            yield f"{ident}-{task['name']}", task["template"]


TEMPLATES = list(_pod_templates())


@pytest.mark.parametrize("template", [t for _, t in TEMPLATES], ids=[i for i, _ in TEMPLATES])
def test_pod_templates_are_valid_kubernetes_objects(template):
    assert _round_trip(template, "V1PodTemplateSpec") == template


def test_the_model_check_can_fail():
    broken = copy.deepcopy(TEMPLATE)
    broken["spec"]["containers"][0]["resorces"] = {}
    assert _round_trip(broken, "V1PodTemplateSpec") != broken
    nameless = copy.deepcopy(TEMPLATE)
    del nameless["spec"]["containers"][0]["name"]
    with pytest.raises(ValueError, match="name"):
        _round_trip(nameless, "V1PodTemplateSpec")


SEED_QUOTA = m.make_resource_quota(
    name="quota-test",
    namespace="test",
    hard={
        "requests.cpu": "2",
        "requests.memory": "2Gi",
        "limits.cpu": "4",
        "limits.memory": "4Gi",
        "requests.nvidia.com/gpu": 4,
        "pods": "3",
        "services": "6",
    },
)
SEED_LIMIT_RANGE = m.make_limit_range(
    name="lr-test",
    namespace="test",
    limits=[
        {
            "type": "Container",
            "max": {"cpu": "1", "memory": "1Gi"},
            "min": {"cpu": "100m", "memory": "100Mi"},
            "default": {"cpu": "900m", "memory": "800Mi"},
            "defaultRequest": {"cpu": "200m", "memory": "200Mi"},
            "maxLimitRequestRatio": {"cpu": 2, "memory": 1.5},
        },
        {"type": "Pod", "max": {"cpu": "2", "memory": "2Gi"}},
        {"type": "PersistentVolumeClaim", "max": {"storage": "2Gi"}, "min": {"storage": "1Gi"}},
    ],
)


def test_seed_quota_and_limit_range_are_valid_kubernetes_objects():
    assert _round_trip(SEED_QUOTA, "V1ResourceQuota") == SEED_QUOTA
    assert _round_trip(SEED_LIMIT_RANGE, "V1LimitRange") == SEED_LIMIT_RANGE
    assert SEED_LIMIT_RANGE["spec"]["limits"][0]["maxLimitRequestRatio"] == {
        "cpu": "2",
        "memory": "1.5",
    }


def test_shipped_example_manifests_match_the_seed():
    """hub_config/k8s holds the seed's ResourceQuota and LimitRange (namespace wmla)."""
    import pathlib

    import yaml

    folder = pathlib.Path(__file__).resolve().parents[2] / "hub_config" / "k8s"
    quota = yaml.safe_load((folder / "resourcequota.yaml").read_text())
    limit_range = yaml.safe_load((folder / "limitrange.yaml").read_text())
    assert _round_trip(quota, "V1ResourceQuota") == quota
    assert _round_trip(limit_range, "V1LimitRange") == limit_range
    assert quota["spec"]["hard"] == SEED_QUOTA["spec"]["hard"]
    assert limit_range["spec"] == SEED_LIMIT_RANGE["spec"]


def test_paths_in_the_users_folder_are_moved_to_the_pods_mount():
    job = backend(storage_root="/srv/wmla/storage", mount_path="/home/{user}").build_job(
        spec(
            command=["python", "/srv/wmla/storage/alice/models/m/main.py", "--out", "/tmp/x"],
            workdir="/srv/wmla/storage/alice/jobs/job-7",
        ),
        1,
    )
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "/home/alice/models/m/main.py", "--out", "/tmp/x"]
    assert container["workingDir"] == "/home/alice/jobs/job-7"
    assert container["volumeMounts"][0] == {
        "name": "user-data",
        "mountPath": "/home/alice",
        "subPath": "alice",
    }


def test_the_shipped_queues_are_what_sync_queues_makes_for_the_default_plans():
    import pathlib

    import yaml

    from extension.service.app import DEFAULT_PLANS

    path = pathlib.Path(__file__).resolve().parents[2] / "hub_config" / "k8s" / "queues.yaml"
    shipped = [q for q in yaml.safe_load_all(path.read_text()) if q]
    assert shipped == backend().desired_queues([Plan(p) for p in DEFAULT_PLANS])


@needs_crds
@pytest.mark.parametrize("mode", ["plain", "volcano"])
def test_the_seed_002_experiment_manifests_are_valid(mode):
    import pathlib
    import subprocess
    import sys

    import yaml

    script = pathlib.Path(__file__).resolve().parents[2] / "hub_config/k8s/seed002/six_jobs.py"
    out = subprocess.run(
        [sys.executable, str(script), "--mode", mode, "--dry-run"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=script.parents[3],
    ).stdout
    jobs = list(yaml.safe_load_all(out))
    assert [j["metadata"]["name"] for j in jobs] == [f"pytorch-t{i}" for i in range(6)]
    for job in jobs:
        assert crd_errors("pytorchjobs", job) == []
        replicas = job["spec"]["pytorchReplicaSpecs"]
        assert replicas["Master"]["replicas"] + replicas["Worker"]["replicas"] == 2
        policy = job["spec"]["runPolicy"].get("schedulingPolicy")
        pod = replicas["Worker"]["template"]["spec"]
        if mode == "volcano":
            assert policy == {"minAvailable": 2, "queue": "default"}
            assert pod["schedulerName"] == "volcano"
        else:
            # the default scheduler by name: an operator with the gang flag keeps it
            assert policy is None and pod["schedulerName"] == "default-scheduler"


def test_the_helm_values_configure_the_service_with_this_backend(monkeypatch):
    """Run the values' extraConfig as the hub would, and build the backend the way the service
    does (``Backend(emit, nodes, state_dir)`` with the values' environment)."""
    import importlib
    import pathlib

    import yaml
    from traitlets.config import Config

    path = pathlib.Path(__file__).resolve().parents[2] / "hub_config/k8s/jupyterhub-values.yaml"
    values = yaml.safe_load(path.read_text())
    c = Config()
    exec(values["hub"]["extraConfig"]["wmla"], {"c": c})
    services = c.JupyterHub.services
    (service,) = services.get_value([]) if hasattr(services, "get_value") else services
    assert service["name"] == "wmla" and service["url"] == "http://hub:10101"
    assert service["command"][1:] == ["-m", "extension.service"]
    config = json.loads(service["environment"]["WMLA_SERVICE_CONFIG"])["WmlaService"]
    assert (config["ip"], config["port"]) == ("0.0.0.0", 10101)
    assert values["hub"]["service"]["extraPorts"][0]["port"] == 10101
    assert values["hub"]["extraVolumeMounts"][0]["mountPath"] == config["storage_root"]

    for name, value in values["hub"]["extraEnv"].items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("WMLA_K8S_NAMESPACE", "wmla")
    module, _, cls = config["backend_class"].rpartition(".")
    backend_ = getattr(importlib.import_module(module), cls)(lambda e: None, [], "/tmp/unused")
    assert isinstance(backend_, KubernetesBackend)
    assert (backend_.namespace, backend_.storage_root) == ("wmla", config["storage_root"])
    assert backend_.image == values["hub"]["extraEnv"]["WMLA_K8S_IMAGE"]
    assert backend_.mount_path == "/gpfs/myresultfs/{user}"
