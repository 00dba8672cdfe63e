"""``WMLA_BACKEND=kubernetes make run``: the embedded hub over the local cluster of
``make k8s-up`` (docs/kubernetes.md): the wmla service runs its jobs through the
KubernetesBackend with the service account of hub_config/k8s/rbac.yaml, and notebooks are pods
made by the ``wmla-kube`` spawner with an account of their own. Neither ever holds the
cluster's admin credentials.

With the real node (``WMLA_K8S_REAL_NODE=1 make k8s-up``, and the same variable set for
``make run``) notebooks and jobs run there: the
notebook image serves JupyterLab as the user's uid, the worker image trains, and the hub
listens on the node's address (the pods' gateway), which is where the browser goes too.
Without it the nodes are KWOK's: pods are bound and shown Running, but no container runs, so a
notebook never answers and its spawn fails (the spawn page says so).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extension.backends.manifests import pod_uid

KUBERNETES_BACKEND = "extension.backends.kubernetes.KubernetesBackend"
LOCAL_BACKEND = "extension.backends.local.LocalBackend"
NAMESPACE = "wmla"
STORAGE_CLAIM = "wmla-user-data"
# the real node's label and taint (devcluster/realnode.py): only pods that ask land there
NODE_LABEL = "wmla.jupyter.org/real-node"
REAL_NODE_FLAG = "WMLA_K8S_REAL_NODE"  # as for make k8s-up: notebooks and jobs on the real node
# the pods' uids (manifests.pod_uid): above this, clear of local accounts' uids
UID_BASE = 200000
NOTEBOOK_IMAGE = "quay.io/jupyterhub/k8s-singleuser-sample:4.1.0"
KWOK_NOTICE = (
    "This hub runs on a local Kubernetes whose nodes are KWOK's: notebook pods are scheduled "
    "and shown Running, but no container runs in them, so a notebook server never answers and "
    "its start fails after the timeout. Training jobs work end to end (their pods run for the "
    "time in KWOK_RUNTIME). Start the cluster with WMLA_K8S_REAL_NODE=1 for real pods."
)


def backend_class(value: str) -> str:
    """``$WMLA_BACKEND``: ``kubernetes``, ``local`` or a class's import path."""
    return {"kubernetes": KUBERNETES_BACKEND, "local": LOCAL_BACKEND}.get(value, value)


@dataclass(frozen=True)
class RealNode:
    """What the cluster's real node wrote (devcluster/realnode.py ``state.json``)."""

    address: str  # the node's InternalIP: the pods' gateway to this machine
    notebook_image: str | None  # imported by make k8s-up (RealNode.notebook_image)
    worker_image: str | None

    @classmethod
    def of(cls, cluster_var: Path) -> RealNode | None:
        try:
            state = json.loads((cluster_var / "node" / "state.json").read_text())
            images = state["images"]
            return cls(state["node_ip"], images.get("notebook"), images.get("worker"))
        except (OSError, ValueError, KeyError):
            return None  # no real node (or one from before it wrote these)


def user_storage(cluster_var: Path) -> Path:
    """The host folder of the namespace's storage claim (devcluster ``user_storage``, under
    the cluster's ``user_data``): the service's storage root, so that a path means the same to
    it and to every pod."""
    try:
        data = Path(json.loads((cluster_var / "state.json").read_text())["user_data"])
    except (OSError, ValueError, KeyError, TypeError):
        data = cluster_var.with_name(f"{cluster_var.name}-user-data")  # devcluster's default
    return data / NAMESPACE


def user_uid(spawner: Any) -> int:
    """A notebook pod's uid: the uid of the user's job pods (the backend's
    ``run_as_uid_base``), above the local accounts' range."""
    return pod_uid(spawner.user.name, UID_BASE)


def configure_kubernetes(c: Any, cluster_var: Path, storage_root: Path) -> dict[str, Any]:
    """Point the hub's spawner at the cluster whose files are in ``cluster_var``; return the
    wmla service's ``environment`` (its kubeconfig and the backend's options) and
    ``backend_options``. Pods see each user's folder where the service does
    (``storage_root``/<user>), so a job's paths mean the same to both."""
    service = cluster_var / "wmla-service.kubeconfig"
    spawner = cluster_var / "hub-spawner.kubeconfig"
    missing = [str(p) for p in (service, spawner) if not p.is_file()]
    if missing:
        raise SystemExit(
            f"WMLA_BACKEND=kubernetes: no local cluster ({', '.join(missing)} missing); run "
            "`make k8s-up` first, or set WMLA_K8S_VAR to the folder of a running one"
        )
    # KubeSpawner's client reads the hub process's kubeconfig: $KUBECONFIG, which
    # kubernetes_asyncio read into its default location when it was imported (before this file
    # ran, when the hub's own imports brought it in)
    os.environ["KUBECONFIG"] = str(spawner)
    from kubernetes_asyncio.config import kube_config

    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(spawner)
    c.JupyterHub.spawner_class = "wmla-kube"
    c.WmlaKubeSpawner.namespace = NAMESPACE
    c.WmlaKubeSpawner.storage_claim_name = STORAGE_CLAIM
    c.WmlaKubeSpawner.image = NOTEBOOK_IMAGE
    c.WmlaKubeSpawner.cmd = ["jupyterhub-singleuser"]  # the image's, not this venv's path
    c.WmlaKubeSpawner.start_timeout = 120
    c.WmlaKubeSpawner.http_timeout = 120  # a cold node's first notebook imports for a while
    backend_options: dict[str, Any] = {}
    node = None
    if os.environ.get(REAL_NODE_FLAG, "").strip().lower() in ("1", "true", "yes"):
        node = RealNode.of(cluster_var)
        if node is None:
            raise SystemExit(
                f"{REAL_NODE_FLAG}=1: the cluster in {cluster_var} has no real node (no "
                f"{cluster_var / 'node' / 'state.json'}); start it with "
                f"`{REAL_NODE_FLAG}=1 make k8s-up`, or unset {REAL_NODE_FLAG} for KWOK nodes only"
            )
    if node is not None and node.notebook_image is None:
        raise SystemExit(
            f"{REAL_NODE_FLAG}=1: the real node of {cluster_var} has no notebook image "
            f"(devcluster/notebook_image.py could not be built or imported: see "
            f"{cluster_var / 'logs'}); run `{REAL_NODE_FLAG}=1 make k8s-up` again"
        )
    if node is None:
        c.JupyterHub.template_vars = {
            **c.JupyterHub.get("template_vars", {}),
            "announcement_spawn": KWOK_NOTICE,
        }
    else:
        backend_options = _on_real_node(c, node, storage_root)
    return {
        "environment": {
            "KUBECONFIG": str(service),
            "WMLA_K8S_NAMESPACE": NAMESPACE,
            "WMLA_K8S_STORAGE_CLAIM": STORAGE_CLAIM,
            "WMLA_K8S_STORAGE_ROOT": str(storage_root),
            "WMLA_K8S_MOUNT_PATH": f"{storage_root}/{{user}}",
        },
        "backend_options": backend_options,
    }


def _on_real_node(c: Any, node: RealNode, storage_root: Path) -> dict[str, Any]:
    """Notebooks and jobs on the real node; the hub where its pods reach it."""
    placement = {
        "node_selector": {NODE_LABEL: "true"},
        "tolerations": [{"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
    }
    c.WmlaKubeSpawner.image = node.notebook_image
    c.WmlaKubeSpawner.image_pull_policy = "IfNotPresent"
    c.WmlaKubeSpawner.node_selector = placement["node_selector"]
    c.WmlaKubeSpawner.tolerations = placement["tolerations"]
    c.WmlaKubeSpawner.user_mount_path = f"{storage_root}/{{username}}"
    c.WmlaKubeSpawner.uid = user_uid
    c.WmlaKubeSpawner.gid = user_uid
    # the uid has no passwd entry in the image: HOME, and the name getpass.getuser() reads
    # (torch's and matplotlib's caches ask it; without the name they fail)
    c.WmlaKubeSpawner.environment = {
        "HOME": f"{storage_root}/{{username}}",
        "USER": "{username}",
        "LOGNAME": "{username}",
    }
    # the proxy and the hub's API on the node's address: the pods' only way to this machine
    c.JupyterHub.ip = node.address
    c.JupyterHub.hub_ip = node.address
    public = f"http://{node.address}:{c.JupyterHub.port}"
    c.WmlaKubeSpawner.kernel_service_url = f"{public}/services/wmla/"
    c.Spawner.environment = {
        **c.Spawner.get("environment", {}),
        "WMLA_API_URL": f"{public}/services/wmla/api/v1",
    }
    options: dict[str, Any] = {
        "image_pull_policy": "IfNotPresent",
        "run_as_uid_base": UID_BASE,
        **placement,
    }
    if node.worker_image:
        options["image"] = node.worker_image
    return options
