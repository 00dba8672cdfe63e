"""The plan tree as Volcano queues: ``sync_queues`` makes the queues mirror the plans (create,
update, delete), and a job's user leaf queue and its ancestors are made on first use."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from extension.scheduler import Resources

from .. import manifests as m
from .api import QUEUES, QUOTAS, ApiError, WatchEvent
from .calls import ApiCalls
from .errors import BackendError
from .objects import annotations_of, is_deleting, labels_of, meta_of, name_of, quantity
from .state import Cache

log = logging.getLogger("extension.backends.kubernetes")


@dataclass
class QueueSync:
    """What ``sync_queues`` changed, by queue name."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # not in the plans but still holding jobs
    failed: list[str] = field(default_factory=list)  # "<queue>: <why>", left as they were


class QueueWriter:
    """Writes the Volcano queues: the plan tree's, and a job's user leaf on first use."""

    def __init__(
        self,
        calls: ApiCalls,
        cache: Cache,
        quota: Callable[[], Resources],
        *,
        prefix: str,
        instance_name: str,
        gpu_resource: str,
        job_kind: str,
    ) -> None:
        self.calls = calls
        self.cache = cache
        self.quota = quota
        self.prefix = prefix
        self.instance_name = instance_name
        self.gpu_resource = gpu_resource
        self.job_kind = job_kind

    def desired_queues(self, plans: Iterable[Any]) -> list[dict]:
        return m.make_plan_queues(
            list(plans),
            instance=self.instance_name,
            prefix=self.prefix,
            instance_capability=self.quota() if self.cache.all(QUOTAS) else None,
            gpu_resource=self.gpu_resource,
        )

    async def sync_queues(self, plans: Iterable[Any]) -> QueueSync:
        """Make the Volcano queues mirror the plan tree: create, update (replace with the
        resourceVersion; a conflict re-reads and retries), delete those no plan has, except
        queues our live jobs still use (user leaves created on first use)."""
        desired = {name_of(q): q for q in self.desired_queues(plans)}
        result = QueueSync()
        # The queues live jobs name, read before the writes below yield to the watch loops.
        in_use = {
            labels_of(obj).get(m.LABEL_QUEUE)
            for obj in self.cache.all(self.job_kind)
            if not is_deleting(obj)
        }
        await self._write_queues(desired, result)
        protected = self._protected_queues(desired, in_use)
        await self._delete_unplanned_queues(desired, protected, result)
        return result

    async def _write_queues(self, desired: Mapping[str, dict], result: QueueSync) -> None:
        """Create the missing queues and replace those that differ, in ``desired``'s order
        (parents first); a queue whose parent could not be written is not tried."""
        not_written: set[str] = set()
        for name, body in desired.items():
            live = self.cache.get(QUEUES, name)
            parent = (body.get("spec") or {}).get("parent")
            if parent in not_written:
                not_written.add(name)
                result.failed.append(f"{name}: its parent queue {parent} could not be written")
                continue
            try:
                if live is None:
                    if await self._create_queue(body):
                        result.created.append(name)
                elif _queue_differs(live, body):
                    await self._replace_queue(name, body)
                    result.updated.append(name)
            except BackendError as exc:
                # One refused queue (e.g. by Volcano's webhook) must not stop the others.
                log.warning("Volcano queue %s: %s", name, exc)
                not_written.add(name)
                result.failed.append(f"{name}: {exc}")

    def _protected_queues(
        self, desired: Mapping[str, dict], in_use: set[str | None]
    ) -> set[str | None]:
        """The queues a sync never deletes: the desired queues' parents, what live jobs use and
        every queue above those (a queue's parent must exist)."""
        protected = {(q.get("spec") or {}).get("parent") for q in desired.values()}
        todo = [q for q in in_use if q]
        while todo:
            name = todo.pop()
            if name in protected:
                continue
            protected.add(name)
            live = self.cache.get(QUEUES, name)
            if live is not None:
                todo.append((live.get("spec") or {}).get("parent"))
        return protected

    async def _delete_unplanned_queues(
        self, desired: Mapping[str, dict], protected: set[str | None], result: QueueSync
    ) -> None:
        """Delete our queues that no plan has and nothing protects (those are ``kept``)."""

        # Children before parents: Volcano refuses to delete a queue that has child queues.
        def depth(queue: Mapping) -> int:
            return -annotations_of(queue).get(m.ANNOTATION_PLAN, "/").rstrip("/").count("/")

        for live in sorted(self.cache.all(QUEUES), key=lambda q: (depth(q), name_of(q))):
            name = name_of(live)
            if name in desired:
                continue
            if name in protected:
                result.kept.append(name)
                continue
            try:
                await self.calls.call(
                    f"delete queue {name}", lambda n=name: self.calls.api.delete(QUEUES, None, n)
                )
                result.deleted.append(name)
            except ApiError as exc:
                if exc.status != 404:
                    log.warning("could not delete queue %s: %s", name, exc)
                    result.kept.append(name)

    async def _create_queue(self, body: dict) -> bool:
        try:
            created = await self.calls.call(
                f"create queue {name_of(body)}", lambda: self.calls.api.create(QUEUES, None, body)
            )
        except ApiError as exc:
            if exc.status == 409:
                return False  # someone made it meanwhile; the next sync compares it
            raise BackendError(f"creating Volcano queue {name_of(body)} failed: {exc}") from exc
        self.cache.apply(QUEUES, WatchEvent.ADDED, created)
        return True

    async def _replace_queue(self, name: str, body: dict, attempts: int = 5) -> None:
        live = self.cache.get(QUEUES, name)
        for _ in range(attempts):
            new = dict(live or body)
            new["metadata"] = {
                **meta_of(live or {}),
                "labels": {**labels_of(live or {}), **labels_of(body)},
                "annotations": {**annotations_of(live or {}), **annotations_of(body)},
            }
            spec = dict((live or {}).get("spec") or {})
            for key in ("weight", "parent", "reclaimable", "capability"):
                spec.pop(key, None)
            spec.update(body["spec"])
            new["spec"] = spec
            try:
                replaced = await self.calls.call(
                    f"update queue {name}",
                    lambda new=new: self.calls.api.replace(QUEUES, None, name, new),
                )
                self.cache.apply(QUEUES, WatchEvent.MODIFIED, replaced)
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise BackendError(f"updating Volcano queue {name} failed: {exc}") from exc
                live = await self.calls.call(
                    f"read queue {name}", lambda: self.calls.api.get(QUEUES, None, name)
                )
        raise BackendError(
            f"updating Volcano queue {name}: still conflicting after {attempts} tries"
        )

    async def ensure_queue_path(self, leaf: str) -> None:
        """Make sure the leaf's queue and its ancestors exist before a job names it (a user leaf
        is created on first use; ``sync_queues`` later gives plans their shares and limits)."""
        parts = leaf.strip("/").split("/")
        paths = ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
        for path in paths:
            name = m.queue_name(path, self.prefix)
            if self.cache.get(QUEUES, name) is not None:
                continue
            parent = (
                m.VOLCANO_ROOT_QUEUE
                if path == "/"
                else m.queue_name(path.rsplit("/", 1)[0] or "/", self.prefix)
            )
            body = m.make_queue(
                name=name,
                parent=parent,
                weight=m.share_to_weight(1.0) if path != "/" else 1,
                labels=m.make_labels(instance=self.instance_name),
                annotations=m.make_annotations(plan=path),
                gpu_resource=self.gpu_resource,
            )
            await self._create_queue(body)


def _queue_differs(live: Mapping, body: Mapping) -> bool:
    spec = live.get("spec") or {}
    want = body.get("spec") or {}
    for key in ("weight", "parent", "reclaimable"):
        if spec.get(key) != want.get(key):
            return True
    if _normal_list(spec.get("capability")) != _normal_list(want.get("capability")):
        return True
    return any(annotations_of(live).get(k) != v for k, v in annotations_of(body).items())


def _normal_list(resources: Mapping | None) -> dict[str, float]:
    out = {}
    for key, value in (resources or {}).items():
        try:
            out[key] = float(quantity(key, value, key))  # cpu, memory, else whole devices
        except ValueError:
            out[key] = math.nan
    return out
