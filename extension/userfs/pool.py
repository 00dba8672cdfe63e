"""The pooled helpers behind ``userfs.UserFiles`` (that module's docstring says what they are
for and how far a helper is trusted): each runs ``userfs_ops`` as one account identity and answers
its requests as length-prefixed JSON; the pool starts (forked by the helper server as root,
``forked.py``; else through setpriv), reuses, retires and kills them."""

from __future__ import annotations

import atexit
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from extension.userfs import forked
from extension.userfs import ops as userfs_ops
from extension.userfs.accounts import Account, system_python, unreachable
from extension.userfs.errors import UserFileError

# What the helper starts with: nothing of the service's environment (tokens, LD_*, PYTHON*).
HELPER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
HELPER_TIMEOUT = 10.0  # seconds per request; a helper the user stopped (SIGSTOP) is killed then
HELPER_IDLE = 60.0  # seconds a helper waits unused before the pool ends it
MAX_HELPERS = 64  # helpers kept (idle or busy; about 6 MiB of their own each); above, the
# least recently used idle one goes: an LRU over fewer helpers than active accounts would miss
# on every request when they take turns
PER_ACCOUNT = 2  # helpers of one account at once: requests beyond wait for one of them
MAX_ANSWER = userfs_ops.MAX_ANSWER  # bytes of JSON a helper may answer with
MAX_PATH = 4096  # characters of a path a helper answers (resolve_command)
# Read once by the service from its own package; the helper gets it on its command line, so
# the account needs no access to the project's folder.
_SOURCE = Path(userfs_ops.__file__).read_text(encoding="utf-8")
Identity = tuple[str, int, int, tuple[int, ...]]  # name, uid, gid, groups


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


GROUPS_FRESH = 1.0  # seconds an account's groups are reused while /etc/group is unchanged
_GROUPS: dict[tuple[str, int], tuple[float, tuple, tuple[int, ...]]] = {}


def _group_file() -> tuple:
    try:
        info = os.stat("/etc/group")
    except OSError:
        return ()
    return (info.st_ino, info.st_size, info.st_mtime_ns)


def identity(account: Account) -> Identity:
    """What a helper's rights are made of: name, uid, gid and the groups it gets now.

    ``getgrouplist`` reads the whole group database (over half of a pooled request's cost in
    the service), so its answer is reused for ``GROUPS_FRESH`` seconds, and not at all once
    /etc/group changed (usermod, gpasswd): a change there reaches the next request, one in a
    directory service (LDAP, sssd) within a second."""
    key, now, signature = (account.name, account.gid), time.monotonic(), _group_file()
    cached = _GROUPS.get(key)
    if cached is not None and cached[0] > now and cached[1] == signature:
        groups = cached[2]
    else:
        try:
            found = os.getgrouplist(account.name, account.gid)
        except OSError:
            found = [account.gid]
        groups = tuple(sorted(set(found)))
        if len(_GROUPS) > 4096:  # accounts come and go: a bound, not an LRU
            _GROUPS.clear()
        _GROUPS[key] = (now + GROUPS_FRESH, signature, groups)
    return (account.name, account.uid, account.gid, groups)


SETPRIV = shutil.which("setpriv", path="/usr/bin:/bin")


def as_account(ident: Identity, argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    """How to start ``argv`` as ``ident`` (name, uid, gid, groups): the command and Popen's
    arguments. Through util-linux's ``setpriv`` where there is one (it sets the groups, then
    the real, effective and saved gid and uid, and executes ``argv``; the kernel drops every
    capability with root's uid): Popen then uses vfork, where its own ``user=``/``group=``/
    ``extra_groups=`` make it fork the whole service (its page tables, 6 ms of the service's CPU
    per helper, and far longer on a busy machine, while the forking thread holds the GIL: the
    stalls of each account's first requests). Else Popen drops, the same way."""
    _, uid, gid, groups = ident
    if SETPRIV is None:
        return argv, {"user": uid, "group": gid, "extra_groups": list(groups)}
    which = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
    return [SETPRIV, f"--reuid={uid}", f"--regid={gid}", which, "--", *argv], {}


# Helpers forked by a root server (helper_server.py) where the service is root and the kernel
# has pidfds; else (and when the server cannot start) each is a fresh setpriv start.
FORKING = hasattr(os, "geteuid") and os.geteuid() == 0 and forked.SUPPORTED
SERVER_RETRY = 30.0  # seconds of setpriv starts after a helper server failed to start or fork


class _Dead(Exception):
    """The helper's pipe closed before its answer came: it exited or was killed."""


class _Late(Exception):
    """The request's deadline passed."""


class _Helper:
    """One helper of one identity as the pool holds it: its process (``_Popened`` or
    ``_Forked``), our two ends of its pipes (non-blocking) and the request exchange over them."""

    def __init__(self, ident: Identity, account: Account, process: _Popened | _Forked) -> None:
        self.ident = ident
        self.name = account.name
        self.process = process
        self.to_fd, self.from_fd = process.to_fd, process.from_fd
        self.last_used = time.monotonic()
        self.retired = False  # its account changed while it was busy: ended when it returns
        self.requests = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.alive()

    def kill(self) -> None:
        self.process.kill()

    def end(self) -> int | None:
        """Kill the process, close our pipes and wait for its end; its exit code (None: not
        known)."""
        return self.process.end()

    def exchange(self, request: dict, deadline: float, limit: int) -> Any:
        """Send one request, return its decoded answer (anything JSON: the caller checks it).

        Raises _Late past ``deadline``, _Dead when the pipe closes, UserFileError for an
        answer over ``limit`` bytes or one that is not JSON (the helper must then be ended:
        what it sends next can no longer be told apart from an answer)."""
        data = json.dumps(request).encode()
        self._write(len(data).to_bytes(userfs_ops.FRAME, "big") + data, deadline)
        size = int.from_bytes(self._read(userfs_ops.FRAME, deadline), "big")
        if size > limit:
            raise UserFileError(f"the answer for {request['op']} was over {limit} bytes")
        body = self._read(size, deadline)
        try:
            return json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than json goes
            raise UserFileError(
                f"reading as {self.name} failed: the helper answered no JSON"
            ) from None

    def _wait(self, fd: int, event: int, deadline: float) -> None:
        poller = select.poll()
        poller.register(fd, event)
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(max(1, int(left * 1000))):
            if time.monotonic() >= deadline:
                raise _Late

    def _write(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.to_fd, view) :]
                continue
            except BlockingIOError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                raise _Dead from None
            self._wait(self.to_fd, select.POLLOUT, deadline)

    def _read(self, size: int, deadline: float) -> bytes:
        chunks: list[bytes] = []
        left = size
        while left:
            try:
                chunk = os.read(self.from_fd, min(left, 1 << 20))
            except BlockingIOError:
                self._wait(self.from_fd, select.POLLIN, deadline)
                continue
            if not chunk:
                raise _Dead
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


def own_idle_limit(idle: float) -> float:
    """A helper's own idle limit: longer than the pool's, as it is only for a service that can
    no longer end it (the pool kills it first otherwise)."""
    return 2 * idle + 10


class _Popened:
    """A helper's process started as a fresh interpreter through setpriv (or Popen's own drop):
    the start when the service is not root's or no helper server runs."""

    def __init__(self, ident: Identity, python: str, idle: float) -> None:
        own_idle = f"{own_idle_limit(idle):.3f}"
        argv, drop = as_account(ident, [python, "-I", "-S", "-c", _SOURCE, "serve", own_idle])
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
            env=HELPER_ENV,
            cwd="/",
            umask=0o077,
            close_fds=True,  # no other helper's pipe: each sees the end of its own stdin
            start_new_session=True,  # the user's terminal signals never reach it through us
            **drop,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.to_fd, self.from_fd = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self.to_fd, False)  # our ends only: waits are polls with a deadline
        os.set_blocking(self.from_fd, False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        try:
            self.proc.kill()  # Popen does nothing once it has reaped it: never another's pid
        except OSError:
            pass

    def end(self) -> int | None:
        """Kill the process, close our pipes and reap it; its exit code (None: not reaped)."""
        self.kill()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # stuck in the kernel: Popen reaps it later
            return None


class _Forked:
    """A helper's process that the helper server forked (``forked.py``): the server is its
    parent and tells its exit code; the service signals it through a pidfd, never by pid."""

    def __init__(
        self, ident: Identity, server: forked.HelperServer, idle: float, deadline: float
    ) -> None:
        self.server = server
        _, uid, gid, groups = ident
        self.child = server.fork(uid, gid, list(groups), own_idle_limit(idle), deadline)
        self.to_fd, self.from_fd = self.child.to_fd, self.child.from_fd
        os.set_blocking(self.to_fd, False)  # our ends only: waits are polls with a deadline
        os.set_blocking(self.from_fd, False)
        self.closed = False

    @property
    def pid(self) -> int:
        return self.child.pid

    def alive(self) -> bool:
        return not self.closed and not forked.readable(self.child.pidfd)

    def kill(self) -> None:
        try:  # the pidfd is open until ``end``: it names this process, reaped or not
            signal.pidfd_send_signal(self.child.pidfd, signal.SIGKILL)
        except OSError:
            pass

    def end(self) -> int | None:
        """Kill it, close our pipes, wait for its end; its exit code (None: not told)."""
        if self.closed:
            return None
        self.closed = True
        self.kill()
        os.close(self.to_fd)
        os.close(self.from_fd)
        ended = forked.readable(self.child.pidfd, timeout=5.0)
        os.close(self.child.pidfd)
        return self.server.exit_code(self.child) if ended else None


class HelperPool:
    """Long-lived helpers, at most ``per_account`` per account identity and ``max_helpers`` in
    all (idle ones beyond that end, least recently used first); each request has ``timeout``
    seconds, and a helper unused for ``idle`` seconds ends. Thread-safe: any number of threads
    may ask at once; each helper serves one request at a time."""

    def __init__(
        self,
        *,
        timeout: float = HELPER_TIMEOUT,
        idle: float = HELPER_IDLE,
        max_helpers: int = MAX_HELPERS,
        per_account: int = PER_ACCOUNT,
        answer_limit: int = MAX_ANSWER,
        forking: bool | None = None,
    ) -> None:
        self.timeout, self.idle = float(timeout), float(idle)
        # helpers forked by a helper server (root's; None: when the service is root)
        self.forking = (FORKING if forking is None else forking) and forked.SUPPORTED
        self.max_helpers, self.per_account = max(1, max_helpers), max(1, per_account)
        self.answer_limit = answer_limit
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)  # a helper came back (or the end)
        self._idle: dict[_Helper, None] = {}  # insertion order: least recently used first
        self._busy: set[_Helper] = set()
        self._count: Counter[Identity] = Counter()  # live or starting helpers per identity
        self._closed = False
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self.started = 0  # helpers started so far (tests and benchmarks read it)
        self._server_lock = threading.Lock()
        self._server: forked.HelperServer | None = None
        self._server_retry = 0.0  # monotonic time before which no new server is tried
        self.servers_started = 0

    # -- asking ------------------------------------------------------------------------------
    def ask(self, account: Account, request: dict) -> dict:
        """The answer of ``account``'s helper to ``request`` (``{"op": ..., "args": ...}``):
        a dict with "ok" or "error", as ``userfs_ops.run`` answers."""
        ident = identity(account)
        deadline = time.monotonic() + self.timeout
        op = request.get("op")
        for attempt in range(2):
            try:
                helper, fresh = self._checkout(ident, account, deadline)
            except _Late:
                return {"error": f"reading as {account.name} failed: the helper timed out"}
            except UserFileError as err:
                return {"error": str(err)}
            helper.requests += 1
            message = {"id": helper.requests, **request}
            try:
                answer = helper.exchange(message, deadline, self.answer_limit)
            except _Dead:
                code = self._checkin(helper, healthy=False)
                # a helper that sat idle may have ended meanwhile (its own idle limit, or its
                # user killed it): the request never reached it, so a fresh one is asked once
                if not fresh and attempt == 0:
                    continue
                why = "was killed" if code is not None and code < 0 else f"exited ({code})"
                return {"error": f"reading as {account.name} failed: the helper {why}"}
            except _Late:
                self._checkin(helper, healthy=False)
                return {"error": f"reading as {account.name} failed: the helper timed out"}
            except UserFileError as err:
                self._checkin(helper, healthy=False)
                return {"error": str(err)}
            if not isinstance(answer, dict) or answer.get("id") != message["id"]:
                self._checkin(helper, healthy=False)  # out of step: nothing it says holds
                return {"error": f"reading as {account.name} failed: the helper answered {op} "
                        "out of turn"}  # fmt: skip
            self._checkin(helper, healthy=True)
            answer.pop("id", None)
            return answer
        raise AssertionError("unreachable")  # pragma: no cover

    def _checkout(self, ident: Identity, account: Account, deadline: float) -> tuple[_Helper, bool]:
        """An idle helper of ``ident`` (False), else a new one (True) when the account has
        fewer than ``per_account``; else wait for one of theirs to come back."""
        ended: list[_Helper] = []
        try:
            with self._lock:
                while True:
                    if self._closed:
                        raise UserFileError("the service is stopping; try again")
                    ended += self._retire_others(ident)
                    for helper in reversed(self._idle):  # the most recently used first
                        if helper.ident != ident:
                            continue
                        del self._idle[helper]
                        if helper.alive():
                            self._busy.add(helper)
                            return helper, False
                        self._count[ident] -= 1
                        ended.append(helper)
                        break  # dead: look again
                    else:
                        if self._count[ident] < self.per_account:
                            self._count[ident] += 1
                            ended += self._over_bound(extra=1)
                            break
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise _Late
                        self._returned.wait(left)
        finally:
            for helper in ended:
                helper.end()
        try:  # outside the lock: a start (fork, exec) holds up no other account
            helper = self._start(ident, account, deadline)
        except BaseException as err:
            with self._lock:
                self._count[ident] -= 1
                self._returned.notify_all()
            if isinstance(err, (OSError, subprocess.SubprocessError)):
                raise UserFileError(
                    f"reading as {account.name} failed: the helper did not start: {err}"
                ) from None
            raise
        with self._lock:
            self.started += 1
            self._busy.add(helper)
            closed = self._closed
            if self._reaper is None and not closed:
                self._reaper = threading.Thread(
                    target=self._reap, name="wmla-userfs-reaper", daemon=True
                )
                self._reaper.start()
        if closed:  # close() ran while it started: it would outlive the pool
            helper.end()
            raise UserFileError("the service is stopping; try again")
        return helper, True

    def _start(self, ident: Identity, account: Account, deadline: float) -> _Helper:
        """A new helper: forked by the helper server where there is one (a server found ended
        is replaced once), else started with setpriv."""
        python = helper_python(account)
        for _ in range(2):
            server = self._helper_server(python)
            if server is None:
                break
            try:
                return _Helper(ident, account, _Forked(ident, server, self.idle, deadline))
            except forked.ForkLate:
                raise _Late from None
            except forked.ServerGone:
                with self._server_lock:
                    if not server.forked:  # it never forked: starting more would not either
                        self._server_retry = time.monotonic() + SERVER_RETRY
                if time.monotonic() >= deadline:
                    raise _Late from None
        return _Helper(ident, account, _Popened(ident, python, self.idle))

    def _helper_server(self, python: str) -> forked.HelperServer | None:
        """The running helper server for ``python`` (started when there is none), or None:
        not forking, another interpreter's server runs, or one failed moments ago."""
        if not self.forking:
            return None
        with self._server_lock:
            server = self._server
            if server is not None and server.running and server.source == _SOURCE:
                return server if server.python == python else None
            if server is not None:  # ended, or another ops source (tests): replaced
                server.close(wait=1.0)
                self._server = None
            if self._closed or time.monotonic() < self._server_retry:
                return None
            try:
                self._server = forked.HelperServer(python, _SOURCE, HELPER_ENV)
            except (OSError, subprocess.SubprocessError):
                self._server_retry = time.monotonic() + SERVER_RETRY
                return None
            self.servers_started += 1
            return self._server

    @property
    def server_pid(self) -> int | None:
        """The helper server's pid (None: none runs; for tests and diagnostics)."""
        with self._server_lock:
            server = self._server
            return server.pid if server is not None and server.running else None

    def _checkin(self, helper: _Helper, healthy: bool) -> int | None:
        """A helper back from a request: idle again, or ended (its exit code then)."""
        ended: list[_Helper] = []
        with self._lock:
            self._busy.discard(helper)
            if healthy and not helper.retired and not self._closed:
                helper.last_used = time.monotonic()
                self._idle[helper] = None
                ended += self._over_bound()
            else:
                self._count[helper.ident] -= 1
                ended.append(helper)
            self._returned.notify_all()
        codes = {h: h.end() for h in ended}
        return codes.get(helper)

    def _retire_others(self, ident: Identity) -> list[_Helper]:
        """Helpers of the same account name with another identity (its groups, gid or uid
        changed): idle ones are taken out to be ended, busy ones end when they come back. (A
        uid that another name shares is another identity: its helpers are its own.)"""
        out = []
        for helper in [*self._idle, *self._busy]:
            other = helper.ident
            if other != ident and other[0] == ident[0]:
                if helper in self._idle:
                    del self._idle[helper]
                    self._count[other] -= 1
                    out.append(helper)
                else:
                    helper.retired = True
        return out

    def _over_bound(self, extra: int = 0) -> list[_Helper]:
        """Idle helpers to end so that at most ``max_helpers`` live (with ``extra`` starting);
        busy ones are never taken: the callers' threads bound them."""
        out = []
        while self._idle and len(self._idle) + len(self._busy) + extra > self.max_helpers:
            helper = next(iter(self._idle))
            del self._idle[helper]
            self._count[helper.ident] -= 1
            out.append(helper)
        return out

    # -- ending ------------------------------------------------------------------------------
    def _reap(self) -> None:
        """End helpers idle for ``idle`` seconds (and reap any that exited) until closed."""
        step = min(5.0, max(0.05, self.idle / 4))
        while not self._stop.wait(step):
            now = time.monotonic()
            with self._lock:
                ended = [h for h in self._idle if now - h.last_used >= self.idle or not h.alive()]
                for helper in ended:
                    del self._idle[helper]
                    self._count[helper.ident] -= 1
            for helper in ended:
                helper.end()

    def close(self) -> None:
        """End every helper, idle or busy (a caller waiting on one gets an error), for good."""
        with self._lock:
            self._closed = True
            idle = list(self._idle)
            self._idle.clear()
            for helper in self._busy:
                # only the process, and under the lock (a busy helper is reaped only once its
                # caller handed it back, so this pid is still its own): the caller's thread,
                # reading our pipe ends, sees them close and hands it back, which ends it
                # (closing the pipes here could give their numbers to another file under it)
                helper.kill()
            self._returned.notify_all()
        self._stop.set()
        for helper in idle:
            helper.end()
        with self._server_lock:  # busy helpers end without it: their pidfds, their pipes
            server, self._server = self._server, None
        if server is not None:
            server.close()

    def pids(self) -> dict[int, Identity]:
        """Live helpers' process ids and whose they are (for tests and diagnostics)."""
        with self._lock:
            return {h.pid: h.ident for h in [*self._idle, *self._busy] if h.alive()}


# The service's (and the hub's) pool; its helpers end with the process at the latest, as
# their stdin closes then, and before that at a normal exit.
HELPERS = HelperPool()
atexit.register(HELPERS.close)


def close_helpers() -> None:
    """End every helper of the default pool (the service's shutdown; also run at exit)."""
    HELPERS.close()
