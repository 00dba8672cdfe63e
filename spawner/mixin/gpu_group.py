"""The GPU group: the hub group a user is in while one of their servers holds GPUs, which the
GPU idle culler's scopes are filtered to (hub_config.culler_services)."""

from __future__ import annotations

import logging
from typing import Any


class GpuGroup:
    """Part of :class:`~spawner.mixin.WmlaSpawnerMixin`. Reads the trait ``gpu_group``, the base
    spawner's ``user`` (its ``orm_user``, ``db`` and ``spawners``) and the other spawners'
    ``wmla_gpus`` and ``active``."""

    gpu_group: str
    user: Any
    log: logging.Logger
    _log_name: str

    def _wmla_gpu_group(self, join: bool) -> None:
        """Put the user in gpu_group (join) or take them out when none of their other servers
        holds GPUs; in the hub's own database. Never raises: the group only speeds culling."""
        orm_user = getattr(self.user, "orm_user", None)
        db = getattr(self.user, "db", None)
        if not self.gpu_group or orm_user is None or db is None:
            return
        try:
            from jupyterhub import orm

            group = orm.Group.find(db, self.gpu_group)
            if join:
                if group is None:
                    group = orm.Group(name=self.gpu_group)
                    db.add(group)
                if group not in orm_user.groups:
                    orm_user.groups.append(group)
                    db.commit()
                    self.log.info("%s: in hub group %s while it holds GPUs", self._log_name,
                                  self.gpu_group)  # fmt: skip
                return
            spawners = getattr(self.user, "spawners", {}) or {}
            others = [
                s for s in spawners.values()
                if s is not self and getattr(s, "wmla_gpus", 0) and getattr(s, "active", False)
            ]  # fmt: skip
            if group is not None and group in orm_user.groups and not others:
                orm_user.groups.remove(group)
                db.commit()
                self.log.info("%s: out of hub group %s", self._log_name, self.gpu_group)
        except Exception as err:  # a database hiccup must not fail a spawn or a stop
            db.rollback()
            self.log.warning("%s: hub group %s: %s", self._log_name, self.gpu_group, err)
