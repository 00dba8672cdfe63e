"""The helper server: a root process that forks each user-files helper and drops it to its account.

The pool (``pool.py``, through ``forked.py``) starts it once, as ``python -I -S -c <this source>
<userfs_ops source>`` with the helpers' fixed environment (``HELPER_ENV``), ``/`` as its working
directory, a session of its own and one end of a ``SOCK_SEQPACKET`` socket pair as its stdin. It
never runs user code and never opens a path a user names: it reads fork requests, forks, and
says when each child ends. Standard library only, no import of the project (the source travels on
the command line, as the helper's did).

A request is one packet: ``{"id": n, "uid", "gid", "groups", "idle"}`` in JSON with two
descriptors attached (``SCM_RIGHTS``): the read end of the helper's request pipe and the write
end of its answer pipe. The service made both pipes and keeps the other ends, so the server never
holds a way to talk to a helper. The answer is ``{"id": n, "pid": pid}`` with a pidfd of the child
attached (opened by its parent before it can be reaped, so it names that child and no later
process: the service kills through it without a pid race), or ``{"id": n, "error": ...}``.
When a child ends, its parent says ``{"exited": pid, "id": n, "code": c}`` (``code`` as
``Popen.returncode``: -N for signal N): the service is not its parent and learns it from that.

The child makes itself what ``setpriv --reuid --regid --groups -- python -I -S -c <ops> serve``
started by the service was (``become``): the leader of a session of its own; its request pipe
on 0, its answer pipe on 1, /dev/null on 2 and no other descriptor; no signal caught, ignored or
blocked; ``/`` and umask 077; then setgroups, setresgid, setresuid, checked (the three uids and
gids, the groups, and no capability in any set: it exits 126 otherwise, before it reads a
request). Its environment is the server's, which is ``HELPER_ENV`` and nothing else. It then
runs the ops source as ``__main__`` with ``serve <idle>``, as ``python -c`` would have. Unlike a
fresh interpreter it is not dumpable (the kernel's rule for a process that was root): its user
may signal it, but not ptrace it or read its memory, which holds only the server's (the ops
source and the identities of earlier requests; nothing secret: the server is started with the
fixed environment and is told uids and groups only).

The server ends when its stdin reads end of file (the pool closed it, or the service died); the
helpers it forked run on, each until its own request pipe closes.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import sys

MAX_FD = 1 << 20  # a child closes every descriptor from 3 below this
MAX_REQUEST = 1 << 16  # bytes of one fork request (an identity: a sanity cap)
NOT_DROPPED = 126  # a child's exit code when its rights are not exactly the account's
CAPS = (b"CapInh:", b"CapPrm:", b"CapEff:", b"CapAmb:")


def _noop(signum, frame):  # noqa: ANN001 - a handler: SIGCHLD only wakes the poll
    pass


def capabilities() -> dict[bytes, int]:
    """This process's capability sets that a helper must end with empty."""
    with open("/proc/self/status", "rb") as status:
        return {ln.split()[0]: int(ln.split()[1], 16) for ln in status if ln.startswith(CAPS)}


def drop(uid: int, gid: int, groups: list[int]) -> None:
    """Become ``uid``, ``gid`` and exactly ``groups`` for good, as setpriv does (groups, then
    the three gids, then the three uids), and check it: raises PermissionError otherwise."""
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3:
        raise PermissionError("the uids or gids are not the account's")
    if sorted(set(os.getgroups())) != sorted(set(groups)):
        raise PermissionError("the groups are not the account's")
    if uid != 0:
        try:
            os.setresuid(0, 0, 0)
        except PermissionError:
            pass
        else:
            raise PermissionError("root could be taken back")
        if any(capabilities().values()):  # the kernel clears them with root's uid: check it
            raise PermissionError("a capability is left")


# rt_sigaction's number per machine (as worker_launcher.RT_SIGACTION: this file imports
# nothing of the project); the C library is opened by the server, never in a forked child
RT_SIGACTION = {"x86_64": 13, "aarch64": 134, "ppc64le": 173, "s390x": 174}.get(os.uname().machine)
_LIBC = ctypes.CDLL(None, use_errno=True)


def ignored_signals() -> list[int]:
    """The signals this process ignores (its SigIgn mask)."""
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"SigIgn:"):
                mask = int(line.split()[1], 16)
                return [bit + 1 for bit in range(64) if mask >> bit & 1]
    return []


def default_past_glibc(sig: int) -> None:
    """SIG_DFL for ``sig`` through the rt_sigaction system call: glibc's sigaction refuses its
    own 32 and 33, which a supervisor may leave ignored (a CI runner here does) and which an
    ignored disposition keeps across fork and exec. A kernel sigaction whose first word is the
    handler (0) and the rest zero, on every architecture's layout."""
    if RT_SIGACTION is not None:
        action = ctypes.create_string_buffer(64)
        _LIBC.syscall(RT_SIGACTION, sig, action, None, 8)


def reset_signals() -> None:
    """No signal caught, ignored or blocked: what the server's Python set (SIGINT's handler,
    SIGPIPE and SIGXFSZ ignored, SIGCHLD) and whatever the service's own parent ignored."""
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # glibc's own (32, 33) are not valid_signals: below
            pass
    for sig in ignored_signals():
        default_past_glibc(sig)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def become(request: dict, pipes: list[int]) -> None:
    """In the forked child: the helper's world, then the account's rights (``drop``)."""
    os.setsid()
    os.dup2(pipes[0], 0)  # the server's 0 (its socket) goes: received descriptors are >= 3
    os.dup2(pipes[1], 1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.closerange(3, MAX_FD)  # the server's wakeup pipe, the pipes' copies: none are the child's
    reset_signals()
    os.chdir("/")
    os.umask(0o077)
    drop(int(request["uid"]), int(request["gid"]), [int(g) for g in request["groups"]])


def run_ops(code: object, idle: float) -> int:
    """The ops source as ``python -I -S -c <source> serve <idle>`` runs it: its exit code."""
    sys.argv = ["-c", "serve", f"{idle:.3f}"]
    try:
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102
    except SystemExit as end:
        if end.code is None or isinstance(end.code, int):
            return end.code or 0
        return 1
    except BaseException:  # noqa: BLE001 - as an uncaught exception ends ``python -c``
        return 1
    return 0


def child(code: object, request: dict, pipes: list[int]) -> None:
    """The forked child's whole life; never returns (nothing of the server's loop runs on)."""
    status = NOT_DROPPED
    try:
        become(request, pipes)
        status = run_ops(code, float(request["idle"]))
    except BaseException:  # noqa: BLE001, S110 - exit without a word: 2 is /dev/null
        pass
    finally:
        os._exit(status)


class Server:
    """Reads fork requests on ``sock``, forks (``child``), answers, reports each child's end."""

    def __init__(self, sock: socket.socket, code: object) -> None:
        self.sock, self.code = sock, code
        self.children: dict[int, int] = {}  # pid -> the request that forked it
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)  # SIGCHLD wakes the poll below
        signal.signal(signal.SIGCHLD, _noop)

    def run(self) -> int:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self.wake_r in ready:
                self.drain_wakeups()
            self.reap()
            if self.sock.fileno() in ready:
                data, fds, _, _ = socket.recv_fds(self.sock, MAX_REQUEST, 2)
                if not data:
                    return 0  # the pool closed its end, or the service died
                self.fork(data, fds)

    def drain_wakeups(self) -> None:
        while True:
            try:
                if not os.read(self.wake_r, 512):
                    return
            except BlockingIOError:
                return

    def fork(self, data: bytes, pipes: list[int]) -> None:
        """Fork a helper for one request; answer with its pid and a pidfd of it."""
        ident = None
        try:
            request = json.loads(data)
            ident = int(request["id"])
            if len(pipes) != 2:
                raise ValueError(f"{len(pipes)} descriptors came with the request, not 2")
            pid = os.fork()
            if pid == 0:
                child(self.code, request, pipes)
        except Exception as err:  # noqa: BLE001 - told to the pool; the server stays up
            self.send({"id": ident, "error": f"{type(err).__name__}: {err}"})
            return
        finally:
            for fd in pipes:  # the child's now (or nobody's): the server keeps none
                os.close(fd)
        self.children[pid] = ident
        pidfd = os.pidfd_open(pid)  # before any reap: it can only name this child
        try:
            self.send({"id": ident, "pid": pid}, [pidfd])
        finally:
            os.close(pidfd)

    def send(self, message: dict, fds: list[int] | None = None) -> None:
        socket.send_fds(self.sock, [json.dumps(message).encode()], fds or [])

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ident = self.children.pop(pid, None)
            code = os.waitstatus_to_exitcode(status)
            self.send({"exited": pid, "id": ident, "code": code})


def main(argv: list[str]) -> int:
    """``-c <ops source>``: serve fork requests on stdin until it closes."""
    if any(capabilities().get(name) for name in (b"CapInh:", b"CapAmb:")):
        return 3  # kept across setresuid: the pool starts helpers with setpriv instead
    code = compile(argv[1], "<userfs ops>", "exec", dont_inherit=True)
    import shutil  # noqa: F401 - what check_runnable imports: loaded once here, not per helper

    sock = socket.socket(fileno=0)
    try:
        return Server(sock, code).run()
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the pool is gone


if __name__ == "__main__":
    sys.exit(main(sys.argv))
