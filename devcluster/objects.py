"""What the local cluster applies besides the projects' own files: KWOK's stages (its own, read
from its module, plus the one that ends training pods), the GPU nodes of a layout, the service's
namespace with the shipped RBAC, and the training operator's webhook objects."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
RBAC = REPO / "hub_config" / "k8s" / "rbac.yaml"
VOLCANO_CONF = REPO / "hub_config" / "k8s" / "volcano-scheduler.yaml"
GPU = "nvidia.com/gpu"
NODE_LABEL = "wmla.jupyter.org/devcluster-node"  # KWOK manages the nodes labelled so
# How long a training pod runs on a KWOK node (a Go duration), and the exit code its containers
# end with; both read from the pod's first container's env, so a test or benchmark says it.
RUNTIME_ENV = "KWOK_RUNTIME"
EXIT_CODE_ENV = "KWOK_EXIT_CODE"
DEFAULT_RUNTIME_MS = 30_000


@dataclass(frozen=True)
class Layout:
    """``<nodes>x<gpus per node>``, as ``WMLA_DEVICE_LAYOUT`` says it; each node also has
    ``cpu`` cores and ``memory_gi`` GiB."""

    nodes: int
    gpus: int
    cpu: int = 32
    memory_gi: int = 256

    @classmethod
    def parse(cls, text: str) -> Layout:
        match = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", text or "")
        if not match or int(match[1]) < 1 or int(match[1]) > 1000 or int(match[2]) > 64:
            raise ValueError(
                f"layout {text!r} must read <nodes>x<gpus per node>, e.g. 4x8 (1-1000 nodes, "
                "0-64 GPUs each)"
            )
        return cls(int(match[1]), int(match[2]))


def nodes(layout: Layout) -> list[dict[str, Any]]:
    """The KWOK nodes of ``layout``: ``kwok-node-<i>`` with GPUs, cpu and memory."""
    resources = {
        "cpu": str(layout.cpu),
        "memory": f"{layout.memory_gi}Gi",
        "pods": "110",
        GPU: str(layout.gpus),
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"kwok-node-{i}",
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    NODE_LABEL: "true",
                    "kubernetes.io/hostname": f"kwok-node-{i}",
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                },
            },
            "spec": {},
            "status": {
                "allocatable": resources,
                "capacity": resources,
                "phase": "Running",
            },
        }
        for i in range(layout.nodes)
    ]


# Ends the pods of training jobs (the training operator's and Volcano's): KWOK's own
# pod-complete stage matches only pods owned by a Job.
TRAINING_POD_END = f"""
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: wmla-training-pod-end
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values: ['True']
    - key: '.spec.containers.[0].env.[] | select( .name == "{RUNTIME_ENV}" ) | .value'
      operator: 'Exists'
  delay:
    durationMilliseconds: {DEFAULT_RUNTIME_MS}
    durationFrom:
      expressionFrom: '.spec.containers.[0].env.[] | select( .name == "{RUNTIME_ENV}" ) | .value'
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $code := "0" }}}}
      {{{{ range (index .spec.containers 0).env }}}}{{{{ if eq .name "{EXIT_CODE_ENV}" }}}}
      {{{{ $code = .value }}}}{{{{ end }}}}{{{{ end }}}}
      containerStatuses:
      {{{{ range $index, $item := .spec.containers }}}}
      - image: {{{{ $item.image | Quote }}}}
        name: {{{{ $item.name | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: {{{{ $code }}}}
            finishedAt: {{{{ $now | Quote }}}}
            reason: {{{{ if eq $code "0" }}}}Completed{{{{ else }}}}Error{{{{ end }}}}
            startedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      phase: {{{{ if eq $code "0" }}}}Succeeded{{{{ else }}}}Failed{{{{ end }}}}
"""


# in the container runtime's log format (time, stream, full line, text), which KWOK serves
KWOK_POD_LOG = (
    "1970-01-01T00:00:00.000000000Z stdout F "
    "kwok: this pod ran on a KWOK node, which runs no container\n"
)


def kwok_config(kwok_dir: Path, pod_log: Path) -> str:
    """KWOK's configuration: its own stages from its module (nodes become Ready and keep their
    heartbeat; pods become Running once bound; a deleted pod goes within its grace period),
    then ours, and the log every pod's container shows (``pod_log``)."""
    stage = kwok_dir / "kustomize" / "stage"
    files = (
        stage / "node" / "fast" / "node-initialize.yaml",
        stage / "node" / "heartbeat-with-lease" / "node-heartbeat-with-lease.yaml",
        stage / "pod" / "fast" / "pod-ready.yaml",
        stage / "pod" / "general" / "pod-delete.yaml",
    )
    docs = [f.read_text().strip() for f in files]
    logs = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "ClusterLogs",
        "metadata": {"name": "every-pod"},
        "spec": {"logs": [{"logsFile": str(pod_log)}]},
    }
    docs += [TRAINING_POD_END.strip(), yaml.safe_dump(logs).strip()]
    return "\n---\n".join(docs) + "\n"


def volcano_scheduler_conf() -> str:
    """The scheduler configuration the project ships (its ConfigMap's one key)."""
    config_map = yaml.safe_load(VOLCANO_CONF.read_text())
    return config_map["data"]["volcano-scheduler.conf"]


def service_rbac(namespace: str, account: str = "hub") -> list[dict[str, Any]]:
    """hub_config/k8s/rbac.yaml for the service account ``account`` of ``namespace``: the
    shipped rules unchanged; the cluster-wide role and binding named after the namespace so that
    several namespaces can each have one."""
    out = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": namespace},
        },
    ]
    for doc in yaml.safe_load_all(RBAC.read_text()):
        doc = dict(doc)
        meta = dict(doc["metadata"])
        if doc["kind"].startswith("Cluster"):
            meta["name"] = f"{meta['name']}-{namespace}"
        else:
            meta["namespace"] = namespace
        doc["metadata"] = meta
        if "subjects" in doc:
            doc["subjects"] = [
                {**s, "name": account, "namespace": namespace} for s in doc["subjects"]
            ]
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"] = {**doc["roleRef"], "name": f"{doc['roleRef']['name']}-{namespace}"}
        out.append(doc)
    return out


OPERATOR_NAMESPACE = "kubeflow"
OPERATOR_SECRET = "training-operator-webhook-cert"


def operator_webhook(rendered: str) -> list[dict[str, Any]]:
    """The training operator's own ValidatingWebhookConfiguration (``rendered``: its module's
    manifests/base/webhook through kustomize) in the operator's namespace, and the empty Secret
    its cert controller fills. Its cert controller starts the job controllers only once both
    exist. Out of a cluster no Service reaches the operator's webhook server, so the webhooks
    fail open (``Ignore``) instead of refusing every job."""
    out: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": OPERATOR_SECRET, "namespace": OPERATOR_NAMESPACE},
        },
    ]
    for doc in yaml.safe_load_all(rendered):
        if not doc or doc.get("kind") != "ValidatingWebhookConfiguration":
            continue
        for hook in doc["webhooks"]:
            hook["failurePolicy"] = "Ignore"
            hook["timeoutSeconds"] = 2
            hook["clientConfig"]["service"]["namespace"] = OPERATOR_NAMESPACE
        out.append(doc)
    return out


STORAGE_CLAIM = "wmla-user-data"


def user_storage(namespace: str, path: Path, claim: str = STORAGE_CLAIM) -> list[dict[str, Any]]:
    """The users' storage the backend mounts in every pod (``WMLA_K8S_STORAGE_CLAIM``): a
    host folder as a PersistentVolume bound to the namespace's claim. KWOK pods never open it;
    the scheduler still needs the claim bound to place them."""
    volume = f"{claim}-{namespace}"
    size = {"storage": "100Gi"}
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": size,
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "wmla-devcluster",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "wmla-devcluster",
                "volumeName": volume,
                "resources": {"requests": size},
            },
        },
    ]


SPAWNER_ACCOUNT = "notebook-spawner"


def spawner_rbac(namespace: str, account: str = SPAWNER_ACCOUNT) -> list[dict[str, Any]]:
    """What the hub's KubeSpawner needs in ``namespace`` (Zero to JupyterHub's hub role): it
    makes and removes the notebook pods itself; the wmla service never does."""
    role = f"{account}"
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": role, "namespace": namespace},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods", "persistentvolumeclaims", "secrets", "services"],
                    "verbs": ["get", "watch", "list", "create", "delete"],
                },
                {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": role, "namespace": namespace},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        },
    ]


# The training operator's init container for PyTorchJob workers (its
# --pytorch-init-container-template-file): upstream's waits with `nslookup` in alpine; this one
# with the python image, same resources, so a worker on the real node starts only once the
# master's service name resolves.
PYTORCH_INIT_CONTAINER = """- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: IfNotPresent
  resources:
    limits:
      cpu: 100m
      memory: 20Mi
    requests:
      cpu: 50m
      memory: 10Mi
  command:
  - /usr/bin/python3
  - -S
  - -c
  - |
    import socket, sys, time
    for i in range({{.MaxTries}}):
        try:
            socket.getaddrinfo("{{.MasterAddr}}", None, socket.AF_INET)
            sys.exit(0)
        except OSError:
            print("waiting for master", flush=True)
            time.sleep(2)
    sys.exit(1)
"""
