"""The node's launcher, from the backend's side: one ``python -I worker_launcher.py --serve`` per
backend (root when the service is, started once, its imports done) that forks each worker's
launcher, instead of the backend starting a new interpreter per worker.

What it forks is what ``python -I worker_launcher.py SPEC`` used to be, down to the byte of its
environment: the leader of a session of its own, ``/`` as its working directory, the fixed
``LAUNCHER_ENV`` it was started with, /dev/null for 0-2 and no other descriptor; it runs the
same ``run_worker`` (cgroup and ``oom_score_adj``, then setgroups/setgid/setuid, then the job's
directory, log, environment and exec; the exit file when the worker ends). The spec travels
over the node's launcher's stdin, never through a file. A forked launcher starts its worker
only once the backend was told its pid (``worker_launcher._monitor``), so a node's launcher that
dies half-way leaves no worker that nobody knows, and the request is asked again of a new one.

The node's launcher is the parent of the launchers it forked and says when each ends
(``Forked.poll``). It ends when its stdin closes (``close``, or the service died): the
launchers it forked run on, their workers too, and a restarted service re-adopts them from
their records as before (``recovery.py``). A launcher whose node's launcher died is watched
like a re-adopted one (``watched`` false: its pid and start time, then its exit file)."""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from .records import alive

log = logging.getLogger("wmla.backends.local")

_HERE = os.path.dirname(os.path.abspath(__file__))  # extension/backends/local
LAUNCHER = os.path.join(_HERE, "worker_launcher.py")
# All the launcher (root, when the service is) starts with: nothing of the service's or the job's
# environment reaches a process that has not yet dropped to the user (worker_launcher.py).
LAUNCHER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
FRAME = 4  # bytes of the big-endian length before each message (worker_launcher.FRAME)
ANSWER_TIMEOUT = 10.0  # seconds for the node's launcher to fork and answer


class LauncherGone(OSError):
    """The node's launcher ended (or hung) before it answered."""


class _Server:
    """One process of the node's launcher and what it said so far."""

    def __init__(self, python: str) -> None:
        self.proc = subprocess.Popen(
            [python, "-I", LAUNCHER, "--serve"],
            cwd="/",
            env=LAUNCHER_ENV,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
            start_new_session=True,  # no terminal's signal reaches it through the service
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.to_fd, self.from_fd = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self.to_fd, False)
        os.set_blocking(self.from_fd, False)
        self.buffer = b""
        self.answers: dict[int, dict] = {}
        self.exits: dict[int, int] = {}
        self.running = True
        self.fatal = ""  # what ended it, when it said
        self.asked = 0
        self.lock = threading.Lock()  # pump: the watching and a launch may both read

    def pump(self) -> None:
        """Take in what it said since (answers, ends of launchers) without blocking."""
        with self.lock:
            self._take_in()

    def _take_in(self) -> None:
        while self.running:
            try:
                data = os.read(self.from_fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.running = False
                break
            self.buffer += data
        while len(self.buffer) >= FRAME:
            size = int.from_bytes(self.buffer[:FRAME], "big")
            if len(self.buffer) < FRAME + size:
                break
            message = json.loads(self.buffer[FRAME : FRAME + size])
            self.buffer = self.buffer[FRAME + size :]
            if "exited" in message:
                self.exits[int(message["exited"])] = int(message["code"])
            elif "fatal" in message:
                self.fatal = str(message["fatal"])
            else:
                self.answers[int(message["id"])] = message

    def ask(self, spec: dict, deadline: float) -> dict:
        """Have it fork a launcher for ``spec``; its answer (``pid``, ``create_time``)."""
        self.asked += 1
        data = json.dumps({"id": self.asked, "spec": spec}).encode()
        view = memoryview(len(data).to_bytes(FRAME, "big") + data)
        while view:  # never blocked on a full pipe while it waits for us to read its own
            try:
                view = view[os.write(self.to_fd, view) :]
                continue
            except BlockingIOError:
                pass
            except OSError:
                self.running = False
            self._wait(select.POLLOUT, deadline)
        answered = lambda: self.asked in self.answers  # noqa: E731
        while not answered():
            self._wait(0, deadline, answered)
        return self.answers.pop(self.asked)

    def _wait(self, event: int, deadline: float, done: Callable[[], bool] = lambda: False) -> None:
        """Wait for ``event`` on its stdin (or for anything it says); returns at once when
        what it said meanwhile is ``done``: an answer the pump took in before the poll would
        wait for the next message, which may be a launcher's end seconds later."""
        self.pump()
        if done():
            return
        if not self.running:
            raise LauncherGone("the node's launcher ended")
        poller = select.poll()
        poller.register(self.from_fd, select.POLLIN)
        if event:
            poller.register(self.to_fd, event)
        left = deadline - time.monotonic()
        if left <= 0:
            self.end()
            raise LauncherGone(f"the node's launcher gave no answer in {ANSWER_TIMEOUT:.0f}s")
        poller.poll(left * 1000)
        self.pump()

    def end(self, wait: float = 5.0) -> None:
        """Close its stdin (it ends by itself then; a hung one is killed) and reap it."""
        with self.lock:  # never while a pump reads: the descriptor's number could be reused
            self.running = False
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    pipe.close()
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=wait)


class Forked:
    """A worker's launcher that the node's launcher forked; ``poll`` as ``Popen.poll``."""

    def __init__(self, pid: int, create_time: float, server: _Server) -> None:
        self.pid = pid
        self.create_time = create_time
        self.server = server
        self.code: int | None = None

    @property
    def watched(self) -> bool:
        """Whether its end will be told (the node's launcher that forked it still runs)."""
        return self.code is not None or self.server.running

    def poll(self) -> int | None:
        """Its exit code once the node's launcher reaped it; None before."""
        if self.code is None:
            self.server.pump()
            self.code = self.server.exits.pop(self.pid, None)
        return self.code

    def wait(self, timeout: float) -> int | None:
        """Its exit code, waiting up to ``timeout`` seconds (None: still there)."""
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            if not self.watched and not alive(self.pid, self.create_time):
                return None
            time.sleep(0.01)
        return self.code


class NodeLauncher:
    """The backend's node's launcher (``python`` runs it), started at the first launch and
    again whenever it is found ended; thread-safe."""

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self.started = 0  # processes started so far (tests read it)

    def launch(self, spec: dict) -> Forked:
        """Fork a worker's launcher for ``spec`` (worker_launcher.py says what it holds).
        A node's launcher that ended is started again, and asked once more: the launcher it
        may have forked before it ended never starts its worker. Raises OSError."""
        with self._lock:
            for attempt in range(2):
                server = self._running()
                try:
                    answer = server.ask(spec, time.monotonic() + ANSWER_TIMEOUT)
                except LauncherGone:
                    server.end(wait=1.0)
                    if attempt:
                        raise
                    continue
                if "pid" not in answer:
                    why = answer.get("error")
                    raise OSError(f"the node's launcher could not start a launcher: {why}")
                return Forked(int(answer["pid"]), float(answer["create_time"]), server)
        raise AssertionError("unreachable")  # pragma: no cover

    def _running(self) -> _Server:
        if self._server is None or not self._server.running:
            if self._server is not None:  # ended (or killed): reaped, its pipes closed
                self._server.end(wait=1.0)
                log.warning(
                    "the node's launcher (pid %d) ended (%s); starting another",
                    self._server.proc.pid,
                    self._server.fatal or f"exit code {self._server.proc.returncode}",
                )
            self._server = _Server(self.python)
            self.started += 1
        return self._server

    @property
    def pid(self) -> int | None:
        """The running node's launcher's pid (None when there is none)."""
        with self._lock:
            server = self._server
            return server.proc.pid if server is not None and server.running else None

    def close(self) -> None:
        """End the node's launcher; the launchers it forked, and their workers, run on."""
        with self._lock:
            if self._server is not None:
                self._server.end()
                self._server = None
