"""The service's side of the helper server (``helper_server.py``): starting it, asking it to fork
a helper for an identity, and hearing when each helper ends.

The pool makes each helper's two pipes itself and hands the helper's ends to the server
(``SCM_RIGHTS`` over a ``SOCK_SEQPACKET`` socket pair, the server's stdin); the server forks, drops
the child to the account and answers with its pid and a pidfd, through which the service kills it
(the server, not the service, is its parent, so a pid could already name another process). A
listening thread takes in what the server says (answers, and ``exited`` with each helper's exit
code). A server that ended, hung or never started raises ``ServerGone``: the pool then starts
another, or starts that helper with setpriv.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from extension.userfs import helper_server

SERVER_SOURCE = Path(helper_server.__file__).read_text(encoding="utf-8")
FORK_TIMEOUT = 5.0  # seconds for the server to fork and answer: past it, it is ended as hung
EXIT_WAIT = 1.0  # seconds to wait for a reaped helper's exit code to be told
SUPPORTED = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")


class ServerGone(OSError):
    """The helper server ended, hung or could not start: no helper was forked."""


class ForkLate(Exception):
    """The caller's deadline passed before the (running) server answered."""


@dataclass
class Child:
    """A forked helper: its pid, a pidfd of it, and the service's ends of its pipes."""

    request: int
    pid: int
    pidfd: int
    to_fd: int
    from_fd: int


def readable(fd: int, timeout: float = 0.0) -> bool:
    """Whether ``fd`` polls readable within ``timeout`` seconds (a pidfd: its process ended)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout * 1000))))


class HelperServer:
    """One helper server process (``python`` runs it, with ``env``), forking helpers that run
    the ops ``source``; thread-safe."""

    def __init__(self, python: str, source: str, env: dict[str, str]) -> None:
        self.python, self.source = python, source
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [python, "-I", "-S", "-c", SERVER_SOURCE, source],
                stdin=theirs,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                cwd="/",
                close_fds=True,
                start_new_session=True,  # no terminal's signal reaches it through the service
            )
        except BaseException:
            self.sock.close()
            raise
        finally:
            theirs.close()
        self.running = True
        self._lock = threading.Lock()
        self._told = threading.Condition(self._lock)  # an answer or an exit came in
        self._answers: dict[int, tuple[dict, list[int]]] = {}
        self._exits: dict[int, int] = {}  # request id -> exit code
        self._abandoned: set[int] = set()  # requests whose askers left: answers dropped
        self._asked = 0
        self.forked = 0  # helpers it forked (a server that never did is not restarted at once)
        self._listener = threading.Thread(
            target=self._listen, name="wmla-userfs-server", daemon=True
        )
        self._listener.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fork(self, uid: int, gid: int, groups: list[int], idle: float, deadline: float) -> Child:
        """A helper forked and dropped to ``uid``/``gid``/``groups``, serving until its stdin
        closes or ``idle`` seconds pass. Raises ServerGone or ForkLate (nothing serves then)."""
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()
        ours = [req_w, ans_r]
        try:
            with self._lock:
                self._asked += 1
                request = self._asked
            message = {"id": request, "uid": uid, "gid": gid, "groups": groups, "idle": idle}
            try:
                socket.send_fds(self.sock, [json.dumps(message).encode()], [req_r, ans_w])
            except OSError as err:
                self._gone()
                raise ServerGone(f"the helper server is gone: {err}") from None
            answer, fds = self._answer(request, deadline, time.monotonic() + FORK_TIMEOUT)
            if "pid" not in answer or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise ServerGone(f"the helper server could not fork: {answer.get('error')}")
            ours = []
            self.forked += 1
            return Child(request, int(answer["pid"]), fds[0], req_w, ans_r)
        finally:
            for fd in (req_r, ans_w, *ours):  # the helper's ends travelled (or nobody's)
                os.close(fd)

    def _answer(self, request: int, deadline: float, hung: float) -> tuple[dict, list[int]]:
        """The server's answer to ``request``. Past ``deadline`` (the caller's) raises
        ForkLate, and the answer is dropped when it comes; past ``hung`` the server is ended
        as hung, and ServerGone raised, as when it ended."""
        with self._told:
            while request not in self._answers:
                left = min(deadline, hung) - time.monotonic()
                if not self.running or left <= 0:
                    break
                self._told.wait(left)
            found = self._answers.pop(request, None)
            if found is None and self.running and time.monotonic() < hung:
                self._abandoned.add(request)  # its helper finds its stdin closed, and exits
                raise ForkLate("the request's deadline passed while the helper was forked")
        if found is None:
            self.close(wait=0.0)  # ended, or hung: a new one serves the next start
            raise ServerGone("the helper server gave no answer")
        return found

    def _listen(self) -> None:
        """Take in the server's packets until it ends (or ``close`` shut our end)."""
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 1)
            except OSError:
                data, fds = b"", []
            if not data:
                for fd in fds:
                    os.close(fd)
                break
            with self._told:
                self._take(data, fds)
                self._told.notify_all()
        self._gone()

    def _take(self, data: bytes, fds: list[int]) -> None:
        """One packet of the server's: an answer (kept with its pidfd for its asker) or an
        ``exited`` (kept for ``exit_code``); under the lock."""
        try:
            message = json.loads(data)
            ident = message.get("id")
        except (ValueError, AttributeError):
            message, ident = {}, None
        if "exited" in message and isinstance(ident, int):
            if len(self._exits) > 4096:  # ends never asked for: a bound
                self._exits.clear()
            self._exits[ident] = int(message["code"])
        elif isinstance(ident, int) and ident in self._abandoned:
            self._abandoned.discard(ident)
        elif self.running and isinstance(ident, int) and "exited" not in message:
            self._answers[ident] = (message, fds)
            return
        for fd in fds:  # nobody waits for it (closed, or the answer to an unreadable request)
            os.close(fd)

    def _gone(self) -> None:
        with self._told:
            self.running = False
            self._told.notify_all()

    def exit_code(self, child: Child, wait: float = EXIT_WAIT) -> int | None:
        """``child``'s exit code once the server reaped it (None: not told within ``wait``)."""
        deadline = time.monotonic() + wait
        with self._told:
            while child.request not in self._exits:
                left = deadline - time.monotonic()
                if not self.running or left <= 0:
                    return None
                self._told.wait(left)
            return self._exits.pop(child.request)

    def close(self, wait: float = 5.0) -> None:
        """End the server (its helpers run on until their own pipes close) and reap it."""
        self._gone()
        with self._told:  # answers nobody waits for any more: their pidfds
            for _, fds in self._answers.values():
                for fd in fds:
                    os.close(fd)
            self._answers.clear()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the listener; the server reads its end
        except OSError:
            pass
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # hung: ours to kill (its parent), and nothing runs of the users'
            self.proc.wait(timeout=5)
        if threading.current_thread() is not self._listener:
            self._listener.join(timeout=5)
            self.sock.close()
