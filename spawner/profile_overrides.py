"""A picked profile's overrides set on a spawner's traits, as KubeSpawner's load_user_options
sets them, and the configured values put back before the next pick (a CPU server after a GPU one
asks for no GPU)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from traitlets import HasTraits, TraitError

from . import profiles as profile_shapes
from .mixin.errors import AdmissionError
from .mixin.spawn_log import SpawnLog


class TraitOverrides:
    """Applies overrides to one spawner's config traits and remembers what they replaced."""

    def __init__(self) -> None:
        self.saved: dict[str, Any] = {}  # trait -> its value before the first override

    def restore(self, target: HasTraits) -> None:
        """The configured values back, as before any profile."""
        for name, value in self.saved.items():
            setattr(target, name, value)
        self.saved = {}

    def apply(self, target: HasTraits, overrides: list[dict], log: SpawnLog) -> None:
        """Restore, then set each override in order (a callable is called with ``target``, a
        mapping is merged into a dict trait); names ``target`` has not are left to
        KubeSpawner. A value that does not fit its trait fails the spawn."""
        self.restore(target)
        known = target.traits(config=True)
        left = []
        for override in overrides:
            for name, value in override.items():
                if name not in known:
                    left.append(name)
                    continue
                self._set(target, name, value(target) if callable(value) else value)
        if left:
            log.info("profile settings left to KubeSpawner (not this spawner's): %s",
                     ", ".join(dict.fromkeys(left)))  # fmt: skip

    def _set(self, target: HasTraits, name: str, value: Any) -> None:
        current = getattr(target, name)
        self.saved.setdefault(name, copy.deepcopy(current))
        if isinstance(value, Mapping) and isinstance(current, dict):
            value = profile_shapes.merge(current, value)
        try:
            setattr(target, name, value)
        except TraitError as err:
            raise AdmissionError(
                f"the profile's kubespawner_override {name}={value!r} does not fit "
                f"c.{type(target).__name__}.{name}: {err}"
            ) from None
