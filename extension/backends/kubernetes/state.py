"""What the backend knows: the cache of what the watches have seen, and its record of each job
it tracks (the phase it is in, the size asked for, where it runs)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..base import JobSpec
from .objects import _meta, _name


# -- the cache -----------------------------------------------------------------------------------
class Cache:
    """What the watches have seen, by kind and name. Read it; only the watch loop writes it."""

    def __init__(self) -> None:
        self._objects: dict[str, dict[str, dict]] = {}
        self.resource_version: dict[str, str] = {}

    def replace(self, kind: str, items: Iterable[dict], resource_version: str) -> None:
        self._objects[kind] = {self._key(o): o for o in items}
        self.resource_version[kind] = resource_version

    def apply(self, kind: str, event: str, obj: dict) -> None:
        objects = self._objects.setdefault(kind, {})
        if event == "DELETED":
            objects.pop(self._key(obj), None)
        elif event in ("ADDED", "MODIFIED"):
            objects[self._key(obj)] = obj
        version = _meta(obj).get("resourceVersion")
        if version:
            self.resource_version[kind] = version

    def get(self, kind: str, name: str) -> dict | None:
        return self._objects.get(kind, {}).get(name)

    def all(self, kind: str) -> list[dict]:
        return [self._objects[kind][k] for k in sorted(self._objects.get(kind, {}))]

    @staticmethod
    def _key(obj: Mapping) -> str:
        return _name(obj)


@dataclass
class _Tracked:
    spec: JobSpec
    name: str
    kind: str
    phase: str = "starting"  # starting, running, resizing, stopping
    workers: int = 0  # the size asked for (the target during a resize)
    seen: bool = False  # the job object has been in the cache
    reason: str = ""
    placement: tuple[str, ...] = ()
