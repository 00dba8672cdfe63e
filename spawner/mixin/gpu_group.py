"""The GPU group: the hub group a user is in while one of their servers holds GPUs, which the
GPU idle culler's scopes are filtered to (hub_config.culler_services)."""

from __future__ import annotations

from typing import Any

from .spawn_log import SpawnLog


class GpuGroup:
    """Puts a hub user in ``group`` and takes them out, in the hub's own database. ``user`` is
    JupyterHub's (its ``orm_user``, ``db`` and ``spawners``); ``server`` is the spawner this
    group speaks for, left out when counting the user's other GPU servers. Never raises: the
    group only speeds culling."""

    def __init__(self, group: str, user: Any, server: object, log: SpawnLog) -> None:
        self.group = group
        self.user = user
        self.server = server
        self.log = log

    def join(self) -> None:
        """The user is in the group while this server holds GPUs."""
        self._update(join=True)

    def leave(self) -> None:
        """Out of the group, unless another of the user's running servers holds GPUs."""
        self._update(join=False)

    def _update(self, join: bool) -> None:
        orm_user = getattr(self.user, "orm_user", None)
        db = getattr(self.user, "db", None)
        if not self.group or orm_user is None or db is None:
            return
        try:
            from jupyterhub import orm

            group = orm.Group.find(db, self.group)
            if join:
                if group is None:
                    group = orm.Group(name=self.group)
                    db.add(group)
                if group not in orm_user.groups:
                    orm_user.groups.append(group)
                    db.commit()
                    self.log.info("in hub group %s while it holds GPUs", self.group)
                return
            if group is not None and group in orm_user.groups and not self._other_gpu_servers():
                orm_user.groups.remove(group)
                db.commit()
                self.log.info("out of hub group %s", self.group)
        except Exception as err:  # a database hiccup must not fail a spawn or a stop
            db.rollback()
            self.log.warning("hub group %s: %s", self.group, err)

    def _other_gpu_servers(self) -> list[object]:
        spawners = getattr(self.user, "spawners", {}) or {}
        return [
            s for s in spawners.values()
            if s is not self.server and getattr(s, "wmla_gpus", 0) and getattr(s, "active", False)
        ]  # fmt: skip
