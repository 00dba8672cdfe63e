"""The tiny parent of every local worker: drops to the user, runs the command, records the end.

The backend starts ``python -I local_launch.py SPEC`` as the leader of a new session (its own
process group), with a fixed minimal environment and ``/`` as its working directory. ``SPEC``
is a JSON file in the backend's private state directory (read, then removed: it holds the job's
``env``)::

    {"argv": [...], "env": {...}, "cwd": "<job dir>", "log": "<job dir>/logs/worker-0.log",
     "header": "==== wmla: ...", "exit_file": "...", "uid": 1001, "gid": 1001, "groups": [...]}

It forks the worker. The child gives up root first (setgroups, setgid, setuid, then checks that
root cannot be taken back), and only then touches the user's folder: it enters ``cwd``, opens
the log (``O_NOFOLLOW``; it must be a regular file of the user's), writes the header, and
executes ``argv`` with ``env``. So nothing of the job, neither its paths nor its environment
(``LD_AUDIT``, ``PYTHON*``, ...), is ever seen by a process that runs as root. Without ``uid``
(the service does not run as root) the child runs as the service's own account, the same way.

The launcher stays as it started (root, when the service is) to write the worker's exit status
to ``exit_file`` (``{"code": .., "at": .., "error": ..}``, atomically), in the state directory no
user can reach. That file is how a backend that restarted, and so is no longer the parent, still
learns a worker's exit code. ``error`` is set when the worker could not be started at all.

It ignores SIGTERM, SIGINT and SIGHUP with a no-op handler (not SIG_IGN, which the worker would
inherit): the worker decides what SIGTERM means, this process only waits for it. SIGKILL ends
both, and then there is no file, which the backend reads as "killed".

Standard library only; run with ``-I`` so nothing from any environment is imported here.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time

START_FAILED = 127  # like a shell whose command cannot be run


def _noop(signum, frame):  # noqa: ANN001 - signal handler signature
    pass


def _write_exit(path: str, code: int, error: str = "") -> None:
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump({"code": code, "at": time.time(), "error": error}, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def drop_privileges(uid: int, gid: int, groups: list[int]) -> None:
    """Become ``uid``/``gid`` with exactly ``groups``, for good."""
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)
    if uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:  # pragma: no cover - the kernel let us back: never run user code like that
            raise RuntimeError("root could be regained after setuid; refusing to run the job")
    if os.geteuid() != uid or os.getegid() != gid:  # pragma: no cover
        raise RuntimeError(f"still uid {os.geteuid()} gid {os.getegid()} after dropping")


def open_log(path: str) -> int:
    """The worker's log, appended to: created by the user, a regular file of the user's."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NOCTTY, 0o600)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(f"{path} is not a regular file of the job's user")
    return fd


def _child(spec: dict, report: int) -> None:
    """In the forked child: drop, then enter the job's world and exec. Never returns."""
    try:
        if spec.get("uid") is not None:
            drop_privileges(int(spec["uid"]), int(spec["gid"]), [int(g) for g in spec["groups"]])
        os.umask(0o077)
        os.chdir(spec["cwd"])
        log = open_log(spec["log"])
        os.write(log, spec.get("header", "").encode())
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        argv = [str(a) for a in spec["argv"]]
        try:
            os.execvpe(argv[0], argv, {str(k): str(v) for k, v in spec["env"].items()})
        except OSError as err:
            os.write(2, f"wmla: cannot start {argv[0]!r}: {err.strerror}\n".encode())
            raise
    except BaseException as err:  # noqa: BLE001 - whatever it was, report it and leave
        message = f"{type(err).__name__}: {err}" if not isinstance(err, OSError) else str(err)
        try:
            os.write(report, message.encode(errors="replace")[:4000])
        finally:
            os._exit(START_FAILED)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -I local_launch.py SPEC.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as src:
        spec = json.load(src)
    os.unlink(argv[0])  # it holds the job's env: gone as soon as it was read
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _noop)
    read_end, write_end = os.pipe()  # both close-on-exec: a successful exec closes it empty
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _child(spec, write_end)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 4096):
        chunks.append(chunk)
    os.close(read_end)
    error = b"".join(chunks).decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    _write_exit(spec["exit_file"], code, error)
    # A worker killed by signal N reads as -N in the file; the launcher itself exits like a shell.
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
