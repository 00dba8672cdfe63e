"""What the service does inside a user's folder, written to run with that user's rights only.

Everything under ``<storage_root>/<user>`` is the user's to change at any moment: any name there
may become a symbolic link, a FIFO or a hard link while we look. So the service never opens,
creates, follows or lists those paths itself when it runs as root. It runs the operations of
this module in a helper process that has already dropped to the user's uid, gid and groups
(``userfs.UserFiles``), where following a link reaches only what the user could reach anyway.
When the service does not run as root, they run in-process (the user's files are then the
service's own, and the API is the only wall).

Either way, a file is only ever read through ``open_own_file``: ``O_NOFOLLOW`` (a link is
refused, not followed), ``O_NONBLOCK`` (a FIFO cannot hang the reader), and on the open file
descriptor a check that it is a regular file owned by the reader. That last check is what keeps
a hard link to someone else's file (where ``fs.protected_hardlinks`` is off) out.

Standard library only, and no import of the project: the helper runs this file with
``python -I -S -c <this source> serve <idle seconds>`` under an interpreter the account can
execute, which may not be the service's. It then answers requests one at a time until its
stdin closes (the service closed it, or died) or none came for ``<idle seconds>``: each is a
frame, 8 bytes of length (big-endian) then that many bytes of JSON, both ways. A request is
``{"id": n, "op": ..., "args": {...}}``; its answer ``{"id": n, "ok": value}`` or
``{"id": n, "error": message}``, at most ``MAX_ANSWER`` bytes (a larger one is answered with an
error instead, so an honest helper is never killed for its size).
"""

from __future__ import annotations

import errno
import json
import os
import select
import stat
import sys

# typing and shutil (a third of a helper's start-up, which each account's first request
# waits for) are imported only where they are used: typing never at run time
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_READ = 16 * 1024 * 1024  # the most of one file a read returns (its end: logs grow there)
MAX_ANSWER = 4 * MAX_READ  # bytes of JSON one answer may have (the service refuses more)
MAX_REQUEST = 64 * 1024 * 1024  # bytes of one request (they come from the service: a sanity cap)
FRAME = 8  # bytes of the length before each message
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Refused(Exception):
    """An operation refused; the message says why, in words fit for the user."""


def open_own_file(path: str) -> int:
    """A read-only descriptor of ``path``: a regular file of this process's user, not a link."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as err:
        if err.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise Refused(f"{path} is a symbolic link; it is not read") from None
        raise Refused(f"{path} cannot be read: {err.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Refused(f"{path} is not a regular file; it is not read")
    if info.st_uid != os.geteuid():
        os.close(fd)
        raise Refused(f"{path} is not owned by the job's user; it is not read")
    return fd


def read_end(path: str, limit: int = MAX_READ) -> bytes:
    """The last ``limit`` bytes of a file of ours (b"" when it does not exist)."""
    try:
        fd = open_own_file(path)
    except FileNotFoundError:
        return b""
    with os.fdopen(fd, "rb") as src:
        size = os.fstat(src.fileno()).st_size
        if size > limit:
            src.seek(size - limit)
        return src.read(limit)


def tail_lines(path: str, count: int | None) -> list[str]:
    """The last ``count`` lines of a file of ours (all when None), read from its end."""
    if count == 0:
        return []
    try:
        fd = open_own_file(path)
    except FileNotFoundError:
        return []
    with os.fdopen(fd, "rb") as src:
        end = src.seek(0, os.SEEK_END)
        pos, chunk = end, b""
        while pos > 0 and len(chunk) < MAX_READ and (count is None or chunk.count(b"\n") <= count):
            step = min(65536, pos)
            pos -= step
            src.seek(pos)
            chunk = src.read(step) + chunk
    lines = chunk.decode(errors="replace").splitlines(keepends=True)
    if pos > 0 and lines:
        lines = lines[1:]  # the first line was cut by MAX_READ
    return lines if count is None else lines[-count:]


def _ranks_with_logs(logs_dir: str) -> list[int]:
    try:
        fd = os.open(logs_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as err:
        raise Refused(f"{logs_dir} cannot be listed: {err.strerror}") from None
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    ranks = []
    for name in names:
        number = name[len("worker-") : -len(".log")]
        if name.startswith("worker-") and name.endswith(".log") and number.isdigit():
            ranks.append(int(number))
    return sorted(ranks)


def read_logs(workdir: str, worker: int | None = None, tail: int | None = None) -> str:
    """One worker's log, or every worker's with ``[worker-N]`` before each line.

    ``tail`` keeps the last lines of each worker's log. A worker without a log reads as "".
    """
    logs_dir = os.path.join(workdir, "logs")
    if worker is not None:
        return "".join(tail_lines(os.path.join(logs_dir, f"worker-{int(worker)}.log"), tail))
    out: list[str] = []
    for rank in _ranks_with_logs(logs_dir):
        path = os.path.join(logs_dir, f"worker-{rank}.log")
        try:
            lines = tail_lines(path, tail)
        except Refused as err:  # one planted file does not hide the other workers' logs
            lines = [f"(wmla: {err})\n"]
        out.extend(f"[worker-{rank}] {line}" for line in lines)
    return "".join(line if line.endswith("\n") else line + "\n" for line in out)


def read_metrics(workdir: str, since: int = 0) -> list[Any]:
    """[metrics, next]: JSON objects of ``metrics.jsonl`` from line ``since``; a partial last
    line is left for the next read."""
    data = read_end(os.path.join(workdir, "metrics.jsonl")).decode(errors="replace")
    complete = data.split("\n")[:-1]  # the text after the last newline may be being written
    out = []
    for line in complete[since:]:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return [out, max(since, len(complete))]


def prepare_job(workdir: str) -> None:
    """Create the job's directory and its ``logs`` folder (private to the user)."""
    try:
        os.makedirs(os.path.join(workdir, "logs"), mode=0o700, exist_ok=True)
    except OSError as err:
        raise Refused(f"cannot create the job directory {workdir}/logs: {err.strerror}") from None


def _closed_folder(path: str) -> str:
    """The first folder on ``path`` this user cannot pass through, or ''."""
    parts = path.split(os.sep)
    for i in range(1, len(parts)):
        folder = os.sep.join(parts[:i]) or os.sep
        if not os.access(folder, os.X_OK):
            return folder
    return ""


def check_runnable(program: str, script: str = "", path: str = "/usr/bin:/bin") -> str:
    """Why this user cannot run ``program`` (or read ``script``), or ''."""
    if os.sep in program:
        found: str | None = program
    else:
        import shutil

        found = shutil.which(program, path=path)
    if found is None:
        return ""  # the launcher reports a missing program (exit code 127)
    for target, mode, verb in ((found, os.X_OK, "run"), (script, os.R_OK, "read")):
        if not target or os.access(target, mode):
            continue
        for route in (os.path.abspath(target), os.path.realpath(target)):
            closed = _closed_folder(route)
            if closed:
                return f"cannot {verb} {target} (no access to the directory {closed})"
        if not os.path.exists(target):
            return ""  # missing: the launcher says so (exit code 127)
        how = "executable" if mode == os.X_OK else "readable"
        return f"cannot {verb} {target} ({os.path.realpath(target)} is not {how} for it)"
    return ""


def prepare_start(workdir: str, program: str, script: str = "", path: str = "/usr/bin:/bin") -> str:
    """``prepare_job`` then ``check_runnable``: a job's start in one request."""
    prepare_job(workdir)
    return check_runnable(program, script, path)


def _inside(root: str, relative: str, what: str, real_root: str | None = None) -> str:
    """``relative`` resolved against ``root`` (links followed), refused when it escapes.
    ``real_root``: ``root`` already resolved (each resolution stats every component)."""
    path = os.path.realpath(os.path.join(root, relative))
    real_root = os.path.realpath(root) if real_root is None else real_root
    if path != real_root and not path.startswith(real_root.rstrip(os.sep) + os.sep):
        raise Refused(
            f"{what} {relative!r} is outside your folder {real_root}; use a path inside it"
        )
    return path


def resolve_command(root: str, model_dir: str, model_main: str) -> list[str]:
    """[model_dir, model_main] as real paths inside ``root``, the user's folder."""
    real_root = os.path.realpath(root)
    folder = _inside(root, model_dir, "command.model_dir", real_root)
    if not os.path.isdir(folder):
        raise Refused(
            f"command.model_dir {model_dir!r} is not a folder in {root}; "
            "upload the model code there first"
        )
    script = _inside(folder, model_main, "command.model_main", folder)  # folder: a real path
    if not script.startswith(real_root.rstrip(os.sep) + os.sep):
        raise Refused(f"command.model_main {model_main!r} is outside your folder {root}")
    if not os.path.isfile(script):
        raise Refused(
            f"command.model_main {model_main!r} is not a file in {folder}; check the name"
        )
    return [folder, script]


def install_missing(root: str, files: dict, marker: str) -> list[str]:
    """Write ``files`` ({path inside root: text}) that do not exist yet, once: nothing when
    ``marker`` (a path inside root) exists, so what the user changed or deleted stays so.
    Returns the paths written."""
    marker_path = os.path.join(root, marker)
    if os.path.lexists(marker_path):
        return []
    written = []
    for relative, text in sorted(files.items()):
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            continue  # theirs: never overwritten
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        written.append(relative)
    os.makedirs(os.path.dirname(marker_path), mode=0o700, exist_ok=True)
    with open(marker_path, "x", encoding="utf-8") as out:
        out.write("\n".join(written) + "\n")
    return written


OPS = {
    "install_missing": install_missing,
    "read_logs": read_logs,
    "read_metrics": read_metrics,
    "tail": lambda path, count: "".join(tail_lines(path, count)),
    "prepare_job": prepare_job,
    "check_runnable": check_runnable,
    "prepare_start": prepare_start,
    "resolve_command": resolve_command,
}


def run(request: dict) -> dict:
    """Carry out one request; the answer is ``{"ok": value}`` or ``{"error": message}``."""
    try:
        return {"ok": OPS[request["op"]](**request.get("args", {}))}
    except Refused as err:
        return {"error": str(err)}
    except FileNotFoundError as err:
        return {"error": f"{err.filename} does not exist", "missing": True}
    except OSError as err:
        return {"error": f"{err.filename or request['op']}: {err.strerror}"}


def _read_exact(fd: int, size: int) -> bytes | None:
    """``size`` bytes from ``fd``, or None at end of file (the service closed our stdin)."""
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def answer_bytes(request: Any) -> bytes:
    """The framed answer to one decoded request (what ``serve`` writes)."""
    ident = request.get("id") if isinstance(request, dict) else None
    try:
        answer = run(request)
    except Exception as err:  # a bad request or a bug: say so, and stay up for the next one
        answer = {"error": f"the helper failed: {type(err).__name__}: {err}"}
    answer["id"] = ident
    data = json.dumps(answer).encode()
    if len(data) > MAX_ANSWER:
        op = request.get("op") if isinstance(request, dict) else None
        error = f"the answer for {op} was over {MAX_ANSWER} bytes"
        data = json.dumps({"id": ident, "error": error}).encode()
    return len(data).to_bytes(FRAME, "big") + data


def serve(idle: float) -> int:
    """Answer framed requests on stdin until it closes or ``idle`` seconds pass without one."""
    os.umask(0o077)
    while True:
        # the service kills helpers idle for its own limit; this one (longer) is for a service
        # that stopped without closing our stdin, e.g. stopped itself (SIGSTOP)
        ready, _, _ = select.select([0], [], [], idle)
        if not ready:
            return 0
        header = _read_exact(0, FRAME)
        if header is None:
            return 0
        size = int.from_bytes(header, "big")
        if size > MAX_REQUEST:
            return 2
        body = _read_exact(0, size)
        if body is None:
            return 0
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        _write_all(1, answer_bytes(request))


def main(argv: list[str]) -> int:
    idle = float(argv[2]) if len(argv) > 2 and argv[1] == "serve" else 120.0
    return serve(idle)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
