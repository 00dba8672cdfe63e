"""A user's files, touched only with that user's rights: the privilege separation of the service.

When the service runs as root, nothing of it opens, creates, follows or lists a path inside a
user's folder: ``UserFiles(account)`` hands each operation of ``userfs_ops`` to a helper process
already moved to the account's uid, gid and groups before it runs any of them: forked by the
helper server (``helper_server.py``, root's, started once; ``forked.py``), else started as
``python -I -S -c <userfs_ops source> serve <idle>`` through setpriv; either way with a fixed
minimal environment and ``/`` as its working directory. The helper sees what the user could see
with a shell of their own and nothing more, so a planted symlink, a renamed folder or a FIFO can
only hurt the user.

Helpers are pooled (``HelperPool``): one is started for an account when it is first needed and
then answers that account's requests, one at a time, as length-prefixed JSON over its stdin and
stdout, so a submission costs a round trip (about 0.3 ms, 0.07 ms of the service's CPU)
instead of an interpreter start (about 26 ms of CPU, 2.5 ms of it the service's). The pool is
keyed by the account's whole identity (name, uid, gid and groups, see ``identity``): a helper
never serves another account, and one whose account changed (groups added or taken away, a new
uid or gid for the name) is retired. The helper runs as the user, who may stop, kill or
ptrace it, so the service gives it what a fresh helper of theirs would get and no more: each
request has a deadline (``timeout``; a helper past it is killed and the next request gets a new
one), an answer is at most ``userfs_ops.MAX_ANSWER`` bytes, must be a JSON object that names the
request it answers, and is then checked like any answer of a helper of theirs (its shape, for
the operations whose values the service uses). Only the threads that asked wait (the
``off_loop`` pool), never the event loop. Helpers idle for ``idle`` seconds are killed, the pool
keeps at most ``max_helpers`` of them (the least recently used go first), and ``close`` (at
interpreter exit, for the default pool) kills them all; a helper whose stdin closes (the service
died) exits by itself.

``UserFiles(None)`` runs the same operations in-process: the service does not run as root (or
the account is the service's own), so there is no privilege to lose. The same checks apply:
files are read through ``userfs_ops.open_own_file`` (no link followed, regular files of the
reader only).

Helpers serve job starts, log and metrics reads and submitted paths, never the scheduling
cycle. Callers on the event loop use ``off_loop`` (a pool of its own).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from extension.userfs import ops as userfs_ops
from extension.userfs.accounts import Account
from extension.userfs.errors import UserFileError
from extension.userfs.pool import (
    HELPERS,
    MAX_PATH,
    HelperPool,
)

# Blocking calls on users' files wait in a pool of their own: a user who stops their helpers
# (they run as the user, who may SIGSTOP them) holds up these threads, never the event loop's
# default executor that everything else shares.
_POOL = ThreadPoolExecutor(max_workers=32, thread_name_prefix="wmla-userfs")
T = TypeVar("T")


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in the user-files pool, awaited from the event loop."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, functools.partial(fn, *args, **kwargs))


def _text(value: Any, what: str) -> str:
    """A path a helper answered: a string of at most MAX_PATH characters, no NUL."""
    if not isinstance(value, str) or len(value) > MAX_PATH or "\x00" in value:
        raise UserFileError(f"the helper's answer for {what} is not a path")
    if not os.path.isabs(value):
        raise UserFileError(f"the helper's answer for {what} is not a path")
    return value


@dataclass(frozen=True)
class UserFiles:
    """The operations of ``userfs_ops`` as ``account`` (None: in-process, as the service),
    through ``helpers`` (None: the default pool)."""

    account: Account | None
    helpers: HelperPool | None = field(default=None, compare=False)

    @classmethod
    def of(cls, account: Account | None, helpers: HelperPool | None = None) -> UserFiles:
        """In-process when the account is the service's own (no privilege to drop)."""
        if account is not None and account.uid == os.geteuid():
            account = None
        return cls(account, helpers)

    def call(self, op: str, **args: Any) -> Any:
        """Run ``op`` with ``args`` as the account; its value, or UserFileError."""
        request = {"op": op, "args": args}
        if self.account is None:
            answer = userfs_ops.run(request)
        else:
            answer = (self.helpers or HELPERS).ask(self.account, request)
        if "error" in answer:
            raise UserFileError(str(answer["error"]), bool(answer.get("missing")))
        return answer.get("ok")

    # the operations ------------------------------------------------------------------------
    def read_logs(self, workdir: str, worker: int | None = None, tail: int | None = None) -> str:
        return str(self.call("read_logs", workdir=workdir, worker=worker, tail=tail))

    def read_metrics(self, workdir: str, since: int = 0) -> tuple[list[dict], int]:
        value = self.call("read_metrics", workdir=workdir, since=since)
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list)):
            raise UserFileError("the helper's answer for read_metrics is not [metrics, next]")
        metrics, next_line = value
        if not isinstance(next_line, int) or isinstance(next_line, bool):
            raise UserFileError("the helper's answer for read_metrics is not [metrics, next]")
        return [m for m in metrics if isinstance(m, dict)], next_line

    def tail(self, path: str, count: int) -> str:
        return str(self.call("tail", path=path, count=count))

    def prepare_job(self, workdir: str) -> None:
        self.call("prepare_job", workdir=workdir)

    def check_runnable(self, program: str, script: str = "", path: str = "/usr/bin:/bin") -> str:
        return str(self.call("check_runnable", program=program, script=script, path=path))

    def prepare_start(
        self, workdir: str, program: str, script: str = "", path: str = "/usr/bin:/bin"
    ) -> str:
        """``prepare_job`` and ``check_runnable`` in one round trip (a job's start)."""
        args = {"workdir": workdir, "program": program, "script": script, "path": path}
        return str(self.call("prepare_start", **args))

    def resolve_command(self, root: str, model_dir: str, model_main: str) -> tuple[str, str]:
        value = self.call("resolve_command", root=root, model_dir=model_dir, model_main=model_main)
        if not (isinstance(value, list) and len(value) == 2):
            raise UserFileError("the helper's answer for resolve_command is not [folder, script]")
        return _text(value[0], "command.model_dir"), _text(value[1], "command.model_main")
