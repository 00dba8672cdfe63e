"""A user's files, touched only with that user's rights: the privilege separation of the service.

When the service runs as root, nothing of it opens, creates, follows or lists a path inside a
user's folder: ``UserFiles(account)`` runs each operation of ``userfs_ops`` in a fresh helper
process that ``subprocess`` has already moved to the account's uid, gid and groups before it
executes anything (``python -I -S -c <userfs_ops source>``, a fixed minimal environment, ``/``
as its working directory). The helper sees what the user could see with a shell of their own and
nothing more, so a planted symlink, a renamed folder or a FIFO can only hurt the user.

``UserFiles(None)`` runs the same operations in-process: the service does not run as root (or
the account is the service's own), so there is no privilege to lose. The same checks apply:
files are read through ``userfs_ops.open_own_file`` (no link followed, regular files of the
reader only).

A helper is about 20 ms of CPU; it is used for job starts, log and metrics reads and submitted
paths, never in the scheduling cycle. Callers on the event loop use ``off_loop`` (a pool of its
own).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from extension.backends import userfs_ops
from extension.backends.accounts import Account, system_python, unreachable

# What the helper starts with: nothing of the service's environment (tokens, LD_*, PYTHON*).
HELPER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
HELPER_TIMEOUT = 10.0  # seconds; a helper the user stopped (SIGSTOP) is killed then
MAX_ANSWER = 4 * userfs_ops.MAX_READ  # bytes of JSON a helper may answer with
# Read once by the service from its own package; the helper gets it on its command line, so
# the account needs no access to the project's folder.
_SOURCE = Path(userfs_ops.__file__).read_text(encoding="utf-8")
# Blocking calls on users' files wait in a pool of their own: a user who stops their helpers
# (they run as the user, who may SIGSTOP them) holds up these threads, never the event loop's
# default executor that everything else shares.
_POOL = ThreadPoolExecutor(max_workers=32, thread_name_prefix="wmla-userfs")
T = TypeVar("T")


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in the user-files pool, awaited from the event loop."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, functools.partial(fn, *args, **kwargs))


class UserFileError(Exception):
    """An operation on a user's files was refused or failed; the message says why."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing  # the path did not exist


@functools.lru_cache(maxsize=1024)
def helper_python(account: Account) -> str:
    """An interpreter the account can execute: the service's own, else the system Python."""
    for candidate in (sys.executable, system_python(), "/usr/bin/python3"):
        if candidate and os.path.exists(candidate) and unreachable(candidate, account) is None:
            return candidate
    raise UserFileError(
        f"no Python that account {account.name!r} can run (tried {sys.executable}, "
        "/usr/bin/python3); install python3 for every account"
    )


@dataclass(frozen=True)
class UserFiles:
    """The operations of ``userfs_ops`` as ``account`` (None: in-process, as the service)."""

    account: Account | None

    @classmethod
    def of(cls, account: Account | None) -> UserFiles:
        """In-process when the account is the service's own (no privilege to drop)."""
        if account is not None and account.uid == os.geteuid():
            account = None
        return cls(account)

    def call(self, op: str, **args: Any) -> Any:
        request = {"op": op, "args": args}
        answer = userfs_ops.run(request) if self.account is None else self._helper(request)
        if "error" in answer:
            raise UserFileError(str(answer["error"]), bool(answer.get("missing")))
        return answer.get("ok")

    def _helper(self, request: dict) -> dict:
        account = self.account
        assert account is not None
        try:
            groups = os.getgrouplist(account.name, account.gid)
        except OSError:
            groups = [account.gid]
        proc = subprocess.Popen(
            [helper_python(account), "-I", "-S", "-c", _SOURCE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=HELPER_ENV,
            cwd="/",
            user=account.uid,
            group=account.gid,
            extra_groups=groups,
            umask=0o077,
            close_fds=True,
            start_new_session=True,  # the user's terminal signals never reach it through us
        )
        timer = threading.Timer(HELPER_TIMEOUT, proc.kill)
        timer.start()
        try:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(json.dumps(request).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            out = proc.stdout.read(MAX_ANSWER + 1)
            proc.stdout.close()
            if proc.poll() is None and len(out) > MAX_ANSWER:
                proc.kill()
            code = proc.wait()
        finally:
            timer.cancel()
        if len(out) > MAX_ANSWER:
            return {"error": f"the answer for {request['op']} was over {MAX_ANSWER} bytes"}
        try:
            answer = json.loads(out)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            why = "timed out" if code == -9 else f"exited with code {code}"
            return {"error": f"reading as {account.name} failed: the helper {why}"}
        return answer

    # the operations ------------------------------------------------------------------------
    def read_logs(self, workdir: str, worker: int | None = None, tail: int | None = None) -> str:
        return str(self.call("read_logs", workdir=workdir, worker=worker, tail=tail))

    def read_metrics(self, workdir: str, since: int = 0) -> tuple[list[dict], int]:
        metrics, next_line = self.call("read_metrics", workdir=workdir, since=since)
        return list(metrics), int(next_line)

    def tail(self, path: str, count: int) -> str:
        return str(self.call("tail", path=path, count=count))

    def prepare_job(self, workdir: str) -> None:
        self.call("prepare_job", workdir=workdir)

    def check_runnable(self, program: str, script: str = "", path: str = "/usr/bin:/bin") -> str:
        return str(self.call("check_runnable", program=program, script=script, path=path))

    def resolve_command(self, root: str, model_dir: str, model_main: str) -> tuple[str, str]:
        folder, script = self.call(
            "resolve_command", root=root, model_dir=model_dir, model_main=model_main
        )
        return str(folder), str(script)
