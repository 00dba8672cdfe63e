"""FAKE: an in-memory stand-in for the Kubernetes API server, for unit tests only.

No API server can run on this machine, so the reconcile logic of ``KubernetesBackend`` is
tested against this fake of the narrow ``KubeApi`` slice it uses. It is not Kubernetes: it
keeps objects as dicts with a global resourceVersion and a watch history, and models only what
the backend depends on:

- list and watch with label selectors (``k=v,k2=v2``), ``resourceVersion`` resume, ``410 Gone``
  when the history was compacted, ``BOOKMARK``-free streams;
- create (``409 AlreadyExists``), get, replace with optimistic concurrency (``409 Conflict`` on
  a stale resourceVersion), merge patch, delete with a grace period and propagation (objects
  get a ``deletionTimestamp`` and go away on ``settle()``, a Foreground-deleted job only after
  its pods), pod logs;
- custom objects checked against their CRD schemas (422, as the API server does), and Volcano's
  webhook rule that a queue with child queues cannot be deleted (403);
- the API server being unreachable (``go_down``/``come_up``): every call and open watch fails
  with status 0, as the real adapter reports a refused connection;
- ResourceQuota ``status.used`` recomputed from live pods, and quota admission of pods (a pod
  over the hard limit is refused with 403, as the real server does);
- injected one-shot failures (``fail_next``).

The training operator, Volcano and the kubelet are not simulated on their own: tests play them
explicitly with ``make_pods`` (the operator creating a job's pods, placed on nodes, Ready or
stuck Pending with a reason) and ``finish_job`` (pods exit, the job's condition is set).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import jsonschema
import yaml

from extension.backends.kubernetes import (
    CLUSTER_SCOPED,
    LIMIT_RANGES,
    NODES,
    PODS,
    PYTORCHJOBS,
    QUEUES,
    QUOTAS,
    VOLCANO_JOBS,
    ApiError,
    quantity,
)

_DOWN = object()
_COUNTED = {PYTORCHJOBS: "pytorchjobs.kubeflow.org", VOLCANO_JOBS: "jobs.batch.volcano.sh"}

# The real CRDs, as the issue asks: ../shared/data/k8s-crds relative to the repository root.
CRD_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "k8s-crds"
CRD_FILES = {
    PYTORCHJOBS: "kubeflow.org_pytorchjobs.yaml",
    VOLCANO_JOBS: "batch.volcano.sh_jobs.yaml",
    QUEUES: "scheduling.volcano.sh_queues.yaml",
    "podgroups": "scheduling.volcano.sh_podgroups.yaml",
}
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _strict(schema: object) -> object:
    """Refuse unknown fields, as ``kubectl apply --validate=strict`` does (the API server would
    silently prune them, hiding a misspelt field)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def crd_validator(kind: str) -> jsonschema.protocols.Validator:
    """A strict jsonschema validator for the served version of the CRD of ``kind``."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader: 10x faster
    crd = yaml.load((CRD_DIR / CRD_FILES[kind]).read_text(), Loader=loader)
    version = next(v for v in crd["spec"]["versions"] if v.get("served"))
    schema = _strict(version["schema"]["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


def crd_errors(kind: str, obj: Mapping) -> list[str]:
    """Every way ``obj`` breaks its CRD's schema (empty when valid)."""
    errors = [
        f"{'/'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in crd_validator(kind).iter_errors(obj)
    ]
    name = (obj.get("metadata") or {}).get("name", "")
    if not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        errors.append(f"metadata/name: {name!r} is not a DNS-1123 subdomain")
    return errors


def _matches(obj: Mapping, selector: str | None) -> bool:
    if not selector:
        return True
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _merge(into: dict, patch: Mapping) -> dict:
    for key, value in patch.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into


class FakeKube:
    """FAKE Kubernetes API (see the module docstring). One instance is one cluster."""

    def __init__(self, history_limit: int = 10_000, validate: bool | None = None) -> None:
        # Like a real server, refuse custom objects that break their CRD (when the CRDs are here).
        self.validate = CRD_DIR.is_dir() if validate is None else validate
        self.objects: dict[str, dict[tuple[str | None, str], dict]] = {}
        self.history: dict[str, list[tuple[int, str, dict]]] = {}
        self.compacted: dict[str, int] = {}  # versions at or below this are gone from history
        self.version = 100
        self.down = False
        self.watchers: list[tuple[str, str | None, str | None, asyncio.Queue]] = []
        self.calls: list[tuple] = []  # (verb, kind, name, extra) for assertions
        self.logs: dict[str, str] = {}
        self.failures: list[tuple[str, str, ApiError]] = []
        self.history_limit = history_limit
        self.closed = 0

    # -- the KubeApi slice ------------------------------------------------------------------------
    async def list(self, kind, namespace, label_selector):
        self._check("list", kind)
        items = [
            copy.deepcopy(o)
            for (ns, _), o in sorted(self.objects.get(kind, {}).items())
            if (namespace is None or ns == namespace) and _matches(o, label_selector)
        ]
        return items, str(self.version)

    async def watch(self, kind, namespace, label_selector, resource_version) -> AsyncIterator:
        self._check("watch", kind)
        since = int(resource_version or 0)
        if since < self.compacted.get(kind, 0):
            yield "ERROR", {"kind": "Status", "code": 410, "reason": "Expired"}
            return
        queue: asyncio.Queue = asyncio.Queue()
        for version, event, obj in self.history.get(kind, []):
            if version > since:
                queue.put_nowait((event, obj))
        entry = (kind, namespace, label_selector, queue)
        self.watchers.append(entry)
        try:
            while True:
                item = await queue.get()
                if item is _DOWN:
                    raise ApiError(0, "Unreachable", "connection refused (fake)")
                event, obj = item
                meta = obj.get("metadata") or {}
                if namespace is not None and meta.get("namespace") != namespace:
                    continue
                if _matches(obj, label_selector):
                    yield event, copy.deepcopy(obj)
        finally:
            self.watchers.remove(entry)

    async def get(self, kind, namespace, name):
        self._check("get", kind, name)
        obj = self.objects.get(kind, {}).get(self._key(kind, namespace, name))
        if obj is None:
            raise ApiError(404, "NotFound", f"{kind} {name} not found")
        return copy.deepcopy(obj)

    async def create(self, kind, namespace, body):
        name = body["metadata"]["name"]
        self._check("create", kind, name)
        key = self._key(kind, namespace, name)
        if key in self.objects.get(kind, {}):
            raise ApiError(409, "AlreadyExists", f"{kind} {name} already exists")
        self._validate(kind, body)
        obj = copy.deepcopy(body)
        if kind not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = namespace
        if kind == PODS:
            self._admit_pod(namespace, obj)
        elif kind in _COUNTED:
            self._admit_pod(namespace, {}, {f"count/{_COUNTED[kind]}": 1.0})
        self._store(kind, "ADDED", obj)
        return copy.deepcopy(obj)

    async def replace(self, kind, namespace, name, body):
        self._check("replace", kind, name)
        current = await self._current(kind, namespace, name)
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f"the object {name} has been modified; try again")
        self._validate(kind, body)
        self._store(kind, "MODIFIED", copy.deepcopy(body))
        return copy.deepcopy(self.objects[kind][self._key(kind, namespace, name)])

    async def patch(self, kind, namespace, name, body):
        self._check("patch", kind, name, body)
        current = copy.deepcopy(await self._current(kind, namespace, name))
        self._store(kind, "MODIFIED", _merge(current, body))
        return copy.deepcopy(current)

    async def delete(self, kind, namespace, name, grace_seconds=None, propagation=None):
        self._check("delete", kind, name, (grace_seconds, propagation))
        current = copy.deepcopy(await self._current(kind, namespace, name))
        if kind == QUEUES:  # Volcano's webhook: children first
            children = [
                q["metadata"]["name"]
                for q in self.objects.get(QUEUES, {}).values()
                if (q.get("spec") or {}).get("parent") == name
            ]
            if children:
                raise ApiError(
                    403, "Forbidden", f"queue {name} can not be deleted: child queues {children}"
                )
        if kind == PODS or kind in (PYTORCHJOBS, VOLCANO_JOBS):
            if not current["metadata"].get("deletionTimestamp"):
                current["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                current["metadata"]["deletionGracePeriodSeconds"] = grace_seconds
                self._store(kind, "MODIFIED", current)
        else:
            self._remove(kind, current)

    async def read_log(self, namespace, pod, container, tail):
        self._check("read_log", PODS, pod)
        text = self.logs.get(pod, "")
        lines = text.splitlines()
        return "\n".join(lines[-tail:] if tail else lines)

    async def close(self):
        self.closed += 1

    # -- faults ---------------------------------------------------------------------------------
    def go_down(self) -> None:
        """The API server becomes unreachable: calls fail, open watches break."""
        self.down = True
        for *_, queue in list(self.watchers):
            queue.put_nowait(_DOWN)

    def come_up(self) -> None:
        self.down = False

    def fail_next(self, verb: str, kind: str, error: ApiError) -> None:
        """The next ``verb`` on ``kind`` fails with ``error`` (one shot)."""
        self.failures.append((verb, kind, error))

    def compact(self, kind: str) -> None:
        """Forget the watch history of ``kind``: resuming an old version gets 410 Gone."""
        self.compacted[kind] = self.version
        self.history[kind] = []
        for k, _, _, queue in list(self.watchers):
            if k == kind:
                queue.put_nowait(_DOWN)

    # -- playing the cluster --------------------------------------------------------------------
    def add(self, kind: str, obj: dict) -> dict:
        """Put an object in as an administrator or a controller would."""
        obj = copy.deepcopy(obj)
        self._store(kind, "ADDED", obj)
        return obj

    def add_node(self, name: str, gpu: int = 4, cpu: str = "16", memory: str = "64Gi", **kw):
        status = {
            "allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpu)},
            "conditions": [{"type": "Ready", "status": kw.get("ready", "True")}],
        }
        spec = {"unschedulable": True} if kw.get("unschedulable") else {}
        return self.add(
            NODES,
            {
                "metadata": {"name": name, "labels": kw.get("labels", {})},
                "spec": spec,
                "status": status,
            },
        )

    def job(self, name: str, namespace: str = "default", kind: str = PYTORCHJOBS) -> dict | None:
        return self.objects.get(kind, {}).get((namespace, name))

    def pods_of(self, job_name: str, namespace: str = "default") -> list[dict]:
        return [
            p
            for (ns, _), p in sorted(self.objects.get(PODS, {}).items())
            if ns == namespace
            and (p["metadata"].get("labels") or {}).get("wmla.jupyter.org/job") == job_name
        ]

    def make_pods(
        self,
        job_name: str,
        nodes: list[str],
        *,
        namespace: str = "default",
        ready: bool = True,
        reason: str = "Unschedulable",
        message: str = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
        kind: str = PYTORCHJOBS,
    ) -> list[dict]:
        """Play the operator (and Volcano and the kubelet): one pod per replica of the job,
        rank i on ``nodes[i]``, Ready, or Pending with ``reason`` when ``ready`` is false."""
        job = self.objects[kind][(namespace, job_name)]
        roles = []
        if kind == PYTORCHJOBS:
            for role, replica in sorted(job["spec"]["pytorchReplicaSpecs"].items()):
                roles += [
                    (role.lower(), i, replica["template"]) for i in range(replica["replicas"])
                ]
        else:
            for task in job["spec"]["tasks"]:
                roles += [(task["name"], i, task["template"]) for i in range(task["replicas"])]
        made = []
        for rank, (role, index, template) in enumerate(roles):
            name = f"{job_name}-{role}-{index}"
            if (namespace, name) in self.objects.get(PODS, {}):
                continue
            labels = dict(template["metadata"]["labels"])
            labels["training.kubeflow.org/replica-type"] = role
            labels["training.kubeflow.org/replica-index"] = str(index)
            owner = {"kind": kind, "name": job_name, "uid": job["metadata"].get("uid", "")}
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": labels,
                    "ownerReferences": [owner],
                },  # fmt: skip
                "spec": copy.deepcopy(template["spec"]),
                "status": {"phase": "Pending"},
            }
            if ready:
                pod["spec"]["nodeName"] = nodes[rank % len(nodes)]
                pod["status"] = {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
            else:
                pod["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": reason,
                        "message": message,
                    }
                ]
            self._admit_pod(namespace, pod)
            self._store(PODS, "ADDED", pod)
            made.append(pod)
        return made

    def set_ready(self, pod_name: str, node: str, namespace: str = "default") -> None:
        pod = copy.deepcopy(self.objects[PODS][(namespace, pod_name)])
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        self._store(PODS, "MODIFIED", pod)

    def fail_pod(
        self, pod_name: str, exit_code: int, reason: str, namespace: str = "default"
    ) -> None:
        """One pod's container ends with ``exit_code`` and the kubelet's ``reason``."""
        pod = copy.deepcopy(self.objects[PODS][(namespace, pod_name)])
        terminated = {"exitCode": exit_code, "reason": reason}
        pod["status"] = {"phase": "Failed", "containerStatuses": [
            {"name": "pytorch", "state": {"terminated": terminated}}]}  # fmt: skip
        self._store(PODS, "MODIFIED", pod)

    def delete_failed_pod(
        self, pod_name: str, exit_code: int, reason: str, namespace: str = "default"
    ) -> None:
        """A pod whose end and deletion reach a watch as one DELETED event (its last status
        in it): a watch that was behind sees no MODIFIED with the failure."""
        pod = copy.deepcopy(self.objects[PODS][(namespace, pod_name)])
        terminated = {"exitCode": exit_code, "reason": reason}
        pod["status"] = {"phase": "Failed", "containerStatuses": [
            {"name": "pytorch", "state": {"terminated": terminated}}]}  # fmt: skip
        self._remove(PODS, pod)

    def delete_pods(self, job_name: str, namespace: str = "default") -> None:
        """The training operator's cleanup of a job's pods (gone at once)."""
        for pod in self.pods_of(job_name, namespace):
            self._remove(PODS, pod)

    def set_job_failed(self, job_name: str, namespace: str = "default") -> None:
        """A PyTorchJob's Failed condition alone (its pods may be gone already)."""
        job = copy.deepcopy(self.objects[PYTORCHJOBS][(namespace, job_name)])
        job["status"] = {"conditions": [{"type": "Failed", "status": "True", "message": "failed"}]}
        self._store(PYTORCHJOBS, "MODIFIED", job)

    def finish_job(
        self,
        job_name: str,
        *,
        succeeded: bool = True,
        exit_code: int = 1,
        failed_rank: int = 0,
        namespace: str = "default",
        kind: str = PYTORCHJOBS,
        message: str = "",
    ) -> None:
        """Play the end of a job: pods terminate, the job gets its final condition."""
        for rank, pod in enumerate(self.pods_of(job_name, namespace)):
            pod = copy.deepcopy(pod)
            bad = not succeeded and rank == failed_rank
            code = exit_code if bad else 0
            pod["status"] = {
                "phase": "Failed" if bad else "Succeeded",
                "containerStatuses": [
                    {"name": "pytorch", "state": {"terminated": {"exitCode": code}}}
                ],
            }
            self._store(PODS, "MODIFIED", pod)
        job = copy.deepcopy(self.objects[kind][(namespace, job_name)])
        if kind == PYTORCHJOBS:
            cond = "Succeeded" if succeeded else "Failed"
            job["status"] = {
                "conditions": [
                    {"type": "Running", "status": "False"},
                    {"type": cond, "status": "True", "message": message or f"job {cond}"},
                ]
            }
        else:
            job["status"] = {"state": {"phase": "Completed" if succeeded else "Failed"}}
        self._store(kind, "MODIFIED", job)

    def settle(self) -> None:
        """Grace periods end: terminating pods go (with the pods of terminating jobs, which the
        garbage collector deletes as the jobs' dependents), then terminating jobs."""
        doomed = {
            name
            for kind in (PYTORCHJOBS, VOLCANO_JOBS)
            for (_, name), job in self.objects.get(kind, {}).items()
            if job["metadata"].get("deletionTimestamp")
        }
        for pod in list(self.objects.get(PODS, {}).values()):
            owner = (pod["metadata"].get("labels") or {}).get("wmla.jupyter.org/job")
            if pod["metadata"].get("deletionTimestamp") or owner in doomed:
                self._remove(PODS, pod)
        for kind in (PYTORCHJOBS, VOLCANO_JOBS):
            for (ns, name), job in list(self.objects.get(kind, {}).items()):
                if job["metadata"].get("deletionTimestamp") and not self.pods_of(name, ns):
                    self._remove(kind, job)

    def bump(self, kind: str, name: str, namespace: str | None = None) -> None:
        """Someone else updates the object (its resourceVersion moves on)."""
        key = self._key(kind, namespace, name)
        self._store(kind, "MODIFIED", copy.deepcopy(self.objects[kind][key]))

    # -- internals ------------------------------------------------------------------------------
    def _validate(self, kind: str, body: Mapping) -> None:
        if self.validate and kind in CRD_FILES:
            errors = crd_errors(kind, body)
            if errors:
                raise ApiError(422, "Invalid", "; ".join(errors))

    @staticmethod
    def _key(kind: str, namespace: str | None, name: str) -> tuple[str | None, str]:
        return (None if kind in CLUSTER_SCOPED else namespace, name)

    def _check(self, verb: str, kind: str, name: str = "", extra=None) -> None:
        self.calls.append((verb, kind, name, extra))
        if self.down:
            raise ApiError(0, "Unreachable", "connection refused (fake API server is down)")
        for i, (v, k, error) in enumerate(self.failures):
            if v == verb and k == kind:
                del self.failures[i]
                raise error

    async def _current(self, kind, namespace, name) -> dict:
        obj = self.objects.get(kind, {}).get(self._key(kind, namespace, name))
        if obj is None:
            raise ApiError(404, "NotFound", f"{kind} {name} not found")
        return obj

    def _store(self, kind: str, event: str, obj: dict) -> None:
        self.version += 1
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{self.version}")  # as the API server gives each object
        meta["resourceVersion"] = str(self.version)
        key = self._key(kind, meta.get("namespace"), meta["name"])
        self.objects.setdefault(kind, {})[key] = obj
        self._publish(kind, event, obj)
        if kind == PODS or kind in _COUNTED:
            self._recount(meta.get("namespace"))

    def _remove(self, kind: str, obj: dict) -> None:
        meta = obj["metadata"]
        self.objects[kind].pop(self._key(kind, meta.get("namespace"), meta["name"]), None)
        self.version += 1
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = str(self.version)
        self._publish(kind, "DELETED", gone)
        if kind == PODS or kind in _COUNTED:
            self._recount(meta.get("namespace"))

    def _publish(self, kind: str, event: str, obj: dict) -> None:
        history = self.history.setdefault(kind, [])
        history.append((self.version, event, copy.deepcopy(obj)))
        if len(history) > self.history_limit:
            self.compacted[kind] = history.pop(0)[0]
        for k, _, _, queue in list(self.watchers):
            if k == kind:
                queue.put_nowait((event, copy.deepcopy(obj)))

    # quota: what the real API server's admission and quota controller do for pods
    def _pod_charges(self, pod: Mapping) -> dict[str, float]:
        out: dict[str, float] = {"pods": 1.0}
        for container in (pod.get("spec") or {}).get("containers") or []:
            resources = container.get("resources") or {}
            for section in ("requests", "limits"):
                for name, value in (resources.get(section) or {}).items():
                    key = f"{section}.{name}"
                    out[key] = out.get(key, 0) + quantity(key, value, "nvidia.com/gpu")
        out["cpu"] = out.get("requests.cpu", 0)
        out["memory"] = out.get("requests.memory", 0)
        return out

    def _usage(self, namespace: str | None) -> dict[str, float]:
        used: dict[str, float] = {}
        for (ns, _), pod in self.objects.get(PODS, {}).items():
            if ns != namespace or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            for key, value in self._pod_charges(pod).items():
                used[key] = used.get(key, 0) + value
        for kind, resource in _COUNTED.items():
            count = sum(1 for (ns, _) in self.objects.get(kind, {}) if ns == namespace)
            used[f"count/{resource}"] = float(count)
        return used

    def _admit_pod(
        self, namespace: str | None, pod: Mapping, charges: Mapping[str, float] | None = None
    ) -> None:
        used = self._usage(namespace)
        charges = charges if charges is not None else self._pod_charges(pod)
        for (ns, name), quota in self.objects.get(QUOTAS, {}).items():
            if ns != namespace:
                continue
            for key, bound in quota["spec"]["hard"].items():
                limit = quantity(key, bound, "nvidia.com/gpu")
                if used.get(key, 0) + charges.get(key, 0) > limit:
                    raise ApiError(
                        403,
                        "Forbidden",
                        f"exceeded quota: {name}, requested: {key}, limited: {bound}",
                    )

    def _recount(self, namespace: str | None) -> None:
        used = self._usage(namespace)
        for (ns, _), quota in self.objects.get(QUOTAS, {}).items():
            if ns != namespace:
                continue
            new = {k: _plain(k, used.get(k, 0)) for k in quota["spec"]["hard"]}
            if (quota.get("status") or {}).get("used") != new:
                quota = copy.deepcopy(quota)
                quota["status"] = {"hard": dict(quota["spec"]["hard"]), "used": new}
                self.version += 1
                quota["metadata"]["resourceVersion"] = str(self.version)
                self.objects[QUOTAS][(ns, quota["metadata"]["name"])] = quota
                self._publish(QUOTAS, "MODIFIED", quota)


def _plain(key: str, value: float) -> str:
    base = key.split(".", 1)[1] if key.startswith(("requests.", "limits.")) else key
    if base == "cpu":
        return f"{int(round(value))}m"
    return str(int(round(value)))


__all__ = ["FakeKube", "LIMIT_RANGES", "NODES", "PODS", "PYTORCHJOBS", "QUEUES", "QUOTAS"]
