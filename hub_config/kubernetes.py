"""``WMLA_BACKEND=kubernetes make run``: the embedded hub over the local cluster of
``make k8s-up`` (docs/kubernetes.md): the wmla service runs its jobs through the
KubernetesBackend with the service account of hub_config/k8s/rbac.yaml, and notebooks are pods
made by the ``wmla-kube`` spawner with an account of their own. Neither ever holds the
cluster's admin credentials.

The cluster's nodes are KWOK's: pods are bound, run and end, but no container runs in them. A
notebook pod is Running and serves nothing, so its spawn fails when the hub cannot reach it;
the spawn page says so.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

KUBERNETES_BACKEND = "extension.backends.kubernetes.KubernetesBackend"
LOCAL_BACKEND = "extension.backends.local.LocalBackend"
NAMESPACE = "wmla"
STORAGE_CLAIM = "wmla-user-data"
NOTEBOOK_IMAGE = "quay.io/jupyterhub/k8s-singleuser-sample:4.1.0"
KWOK_NOTICE = (
    "This hub runs on a local Kubernetes whose nodes are KWOK's: notebook pods are scheduled "
    "and shown Running, but no container runs in them, so a notebook server never answers and "
    "its start fails after the timeout. Training jobs work end to end (their pods run for the "
    "time in KWOK_RUNTIME). Real pods on a kubelet node are the next step."
)


def backend_class(value: str) -> str:
    """``$WMLA_BACKEND``: ``kubernetes``, ``local`` or a class's import path."""
    return {"kubernetes": KUBERNETES_BACKEND, "local": LOCAL_BACKEND}.get(value, value)


def configure_kubernetes(c: Any, cluster_var: Path, storage_root: Path) -> dict[str, str]:
    """Point the hub's spawner at the cluster whose files are in ``cluster_var`` and return the
    environment of the wmla service (its kubeconfig and the backend's options). Pods see each
    user's folder where the service does (``storage_root``/<user>), so a job's paths mean the
    same to both."""
    service = cluster_var / "wmla-service.kubeconfig"
    spawner = cluster_var / "hub-spawner.kubeconfig"
    missing = [str(p) for p in (service, spawner) if not p.is_file()]
    if missing:
        raise SystemExit(
            f"WMLA_BACKEND=kubernetes: no local cluster ({', '.join(missing)} missing); run "
            "`make k8s-up` first, or set WMLA_K8S_VAR to the folder of a running one"
        )
    # KubeSpawner's client reads the hub process's kubeconfig
    os.environ["KUBECONFIG"] = str(spawner)
    c.JupyterHub.spawner_class = "wmla-kube"
    c.WmlaKubeSpawner.namespace = NAMESPACE
    c.WmlaKubeSpawner.storage_claim_name = STORAGE_CLAIM
    c.WmlaKubeSpawner.image = NOTEBOOK_IMAGE
    c.WmlaKubeSpawner.start_timeout = 120
    c.WmlaKubeSpawner.http_timeout = 30
    c.JupyterHub.template_vars = {
        **c.JupyterHub.get("template_vars", {}),
        "announcement_spawn": KWOK_NOTICE,
    }
    return {
        "KUBECONFIG": str(service),
        "WMLA_K8S_NAMESPACE": NAMESPACE,
        "WMLA_K8S_STORAGE_CLAIM": STORAGE_CLAIM,
        "WMLA_K8S_STORAGE_ROOT": str(storage_root),
        "WMLA_K8S_MOUNT_PATH": f"{storage_root}/{{user}}",
    }
