"""What the local cluster is made of: each Go program, the build module of ours that pins it
(``modules/<module>/go.mod``) and the name its binary gets.

Nothing of those projects is copied here: each is a Go module dependency of a build module, and
its files (CRDs, stages, webhook manifests) are read from the Go module cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

KUBERNETES_VERSION = "v1.34.1"  # the one Volcano v1.14.1 pins, so both share one build


class Module(str, Enum):
    """A build module under ``devcluster/modules/``."""

    CONTROL = "control"  # k8s.io/kubernetes and volcano.sh/volcano, built together
    ETCD = "etcd"
    KWOK = "kwok"
    TRAINING_OPERATOR = "trainingop"
    KUEUE = "kueue"
    KUBELET = "kubelet"  # k8s.io/kubernetes again, apart: the control programs keep their stamps


@dataclass(frozen=True)
class Program:
    """One binary: the Go package it is built from, in which build module."""

    binary: str
    package: str
    module: Module
    version: str
    version_ldflags: tuple[str, ...] = ()


def _kube_version_flags(version: str) -> tuple[str, ...]:
    """The ``-X`` flags upstream's hack/lib/version.sh sets: tools read ``--version``."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags: list[str] = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return tuple(flags)


_KUBE = _kube_version_flags(KUBERNETES_VERSION)

KUBE_APISERVER = Program(
    "kube-apiserver",
    "k8s.io/kubernetes/cmd/kube-apiserver",
    Module.CONTROL,
    KUBERNETES_VERSION,
    _KUBE,
)
KUBE_CONTROLLER_MANAGER = Program(
    "kube-controller-manager",
    "k8s.io/kubernetes/cmd/kube-controller-manager",
    Module.CONTROL,
    KUBERNETES_VERSION,
    _KUBE,
)
KUBE_SCHEDULER = Program(
    "kube-scheduler",
    "k8s.io/kubernetes/cmd/kube-scheduler",
    Module.CONTROL,
    KUBERNETES_VERSION,
    _KUBE,
)
KUBECTL = Program(
    "kubectl", "k8s.io/kubernetes/cmd/kubectl", Module.CONTROL, KUBERNETES_VERSION, _KUBE
)
# The real node's agent (WMLA_K8S_REAL_NODE=1): built only when that node is asked for.
KUBELET = Program(
    "kubelet", "k8s.io/kubernetes/cmd/kubelet", Module.KUBELET, KUBERNETES_VERSION, _KUBE
)
VC_SCHEDULER = Program(
    "vc-scheduler", "volcano.sh/volcano/cmd/scheduler", Module.CONTROL, "v1.14.1"
)
VC_CONTROLLER_MANAGER = Program(
    "vc-controller-manager", "volcano.sh/volcano/cmd/controller-manager", Module.CONTROL, "v1.14.1"
)
ETCD = Program("etcd", "go.etcd.io/etcd/server/v3", Module.ETCD, "v3.6.17")
KWOK = Program("kwok", "sigs.k8s.io/kwok/cmd/kwok", Module.KWOK, "v0.8.0")
TRAINING_OPERATOR = Program(
    "training-operator",
    "github.com/kubeflow/training-operator/cmd/training-operator.v1",
    Module.TRAINING_OPERATOR,
    "v1.9.0",
)
KUEUE = Program("kueue", "sigs.k8s.io/kueue/cmd/kueue", Module.KUEUE, "v0.17.0")

# What `make k8s-up` runs; Kueue is built only for the benchmark that compares with it.
CLUSTER = (
    ETCD,
    KUBE_APISERVER,
    KUBE_CONTROLLER_MANAGER,
    KUBE_SCHEDULER,
    KUBECTL,
    KWOK,
    VC_SCHEDULER,
    VC_CONTROLLER_MANAGER,
    TRAINING_OPERATOR,
)
ALL = (*CLUSTER, KUBELET, KUEUE)

# The Go modules whose own files the cluster applies (CRDs, stages, webhook manifests), and the
# build module that pins each one's version.
SOURCES = {
    "k8s.io/kubernetes": Module.KUBELET,  # build/pause/linux/pause.c, the real node's sandbox
    "volcano.sh/volcano": Module.CONTROL,
    "sigs.k8s.io/kwok": Module.KWOK,
    "github.com/kubeflow/training-operator": Module.TRAINING_OPERATOR,
    "sigs.k8s.io/kueue": Module.KUEUE,
}
