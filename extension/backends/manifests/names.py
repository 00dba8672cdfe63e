"""The names every object we create carries: API groups and kinds, labels and annotations,
and the DNS-1123 names of queues and jobs.

Plans and job ids are free text to the rest of the project; Kubernetes wants DNS-1123 names.
``queue_name`` and ``job_object_name`` derive them deterministically: a readable part (lower
case, runs of other characters turned into ``-``) plus 8 hex digits of the SHA-256 of the exact
input, so two different plans never share a queue even when their readable parts agree
(``/a/b-c`` and ``/a-b/c``, ``/Dev`` and ``/dev``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

GROUP = "wmla.jupyter.org"
MANAGED_BY = "jupyterhub-wmla"

# Labels (values must be label-valid) and annotations (free text) on every object we create.
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_INSTANCE = f"{GROUP}/instance"
LABEL_JOB = f"{GROUP}/job"  # job_object_name(job id): label-valid
LABEL_USER = f"{GROUP}/user"
LABEL_QUEUE = f"{GROUP}/queue"
LABEL_KIND = f"{GROUP}/kind"  # train or notebook
ANNOTATION_JOB_ID = f"{GROUP}/job-id"  # the exact job id
ANNOTATION_PLAN = f"{GROUP}/plan"  # the exact plan path (label values cannot hold '/')

PYTORCHJOB_API = ("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
VOLCANO_JOB_API = ("batch.volcano.sh", "v1alpha1", "jobs", "Job")
QUEUE_API = ("scheduling.volcano.sh", "v1beta1", "queues", "Queue")
PODGROUP_API = ("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")

DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
# The training operator finds the training container by this name (PyTorchJob requirement).
PYTORCH_CONTAINER = "pytorch"
VOLCANO_ROOT_QUEUE = "root"

_USERNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NOT_NAME = re.compile(r"[^a-z0-9]+")


class ManifestError(ValueError):
    """An input that cannot become a valid Kubernetes object; the message says how to fix it."""


# -- names -------------------------------------------------------------------------------------
def validate_username(user: str) -> str:
    """A hub user name usable as a label value and as one ``subPath`` segment, or an error.

    Label values allow 63 characters of ``[A-Za-z0-9._-]`` that start and end with a letter or
    digit; that also rules out ``..``, ``/`` and empty names, so ``subPath`` cannot escape the
    user's folder.
    """
    if not isinstance(user, str) or not _USERNAME.match(user):
        raise ManifestError(
            f"user name {user!r} cannot be used on Kubernetes: use 1-63 letters, digits, "
            "'.', '_' or '-', starting and ending with a letter or digit"
        )
    return user


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def _readable(text: str) -> str:
    return _NOT_NAME.sub("-", text.lower()).strip("-")


def queue_name(plan_path: str, prefix: str = "wmla") -> str:
    """The Volcano queue of a plan: ``<prefix>-<readable path>-<hash>``, at most 63 characters.

    ``queue_name("/", prefix)`` is the instance's own queue, named ``prefix``.
    """
    _check_prefix(prefix)
    if plan_path == "/":
        return prefix
    if not isinstance(plan_path, str) or not plan_path.startswith("/"):
        raise ManifestError(f"plan path {plan_path!r} must start with '/', e.g. /project1")
    readable = _readable(plan_path)
    room = 63 - len(prefix) - 10  # two dashes and 8 hex digits
    readable = readable[:room].strip("-")
    return (
        f"{prefix}-{readable}-{_digest(plan_path)}"
        if readable
        else f"{prefix}-{_digest(plan_path)}"
    )


def job_object_name(job_id: str, prefix: str = "wmla") -> str:
    """The name of a job's PyTorchJob / Volcano Job, at most 40 characters.

    Short, because the operators derive pod and service names from it (``<name>-worker-12``,
    a DNS-1035 label that must start with a letter); ``prefix`` starts with a letter.
    """
    _check_prefix(prefix)
    if not isinstance(job_id, str) or not job_id:
        raise ManifestError(f"job id {job_id!r} must be a non-empty string")
    room = 40 - len(prefix) - 10
    if room < 1:
        raise ManifestError(
            f"prefix {prefix!r} is too long for job names; use 29 characters or less"
        )
    readable = _readable(job_id)[:room].strip("-")
    return f"{prefix}-{readable}-{_digest(job_id)}" if readable else f"{prefix}-{_digest(job_id)}"


def _check_prefix(prefix: str) -> None:
    if not isinstance(prefix, str) or not _DNS_LABEL.match(prefix) or not prefix[0].isalpha():
        raise ManifestError(
            f"name prefix {prefix!r} must be lower-case letters, digits and '-', "
            "starting with a letter, e.g. wmla"
        )
    if len(prefix) > 40:
        raise ManifestError(f"name prefix {prefix!r} is longer than 40 characters")


# -- metadata ----------------------------------------------------------------------------------
def make_labels(
    *,
    instance: str,
    job_id: str | None = None,
    user: str | None = None,
    queue: str | None = None,
    kind: str | None = None,
    prefix: str = "wmla",
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The labels the backend selects its objects by (re-adoption after a restart uses them)."""
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_INSTANCE: instance}
    if job_id is not None:
        labels[LABEL_JOB] = job_object_name(job_id, prefix)
    if user is not None:
        labels[LABEL_USER] = validate_username(user)
    if queue is not None:
        labels[LABEL_QUEUE] = queue
    if kind is not None:
        labels[LABEL_KIND] = kind
    labels.update(extra or {})
    return labels


def make_annotations(
    *, job_id: str | None = None, plan: str | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    out: dict[str, str] = {}
    if job_id is not None:
        out[ANNOTATION_JOB_ID] = job_id
    if plan is not None:
        out[ANNOTATION_PLAN] = plan
    out.update(extra or {})
    return out


def _object(api: tuple[str, str, str, str], name: str, namespace: str | None, labels, annotations):
    """The head every object we create starts with: apiVersion, kind and metadata."""
    group, version, _, kind = api
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": metadata}
