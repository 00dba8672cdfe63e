"""The tiny parent of every local worker: drops to the user, runs the command, records the end.

The backend starts ``python -I worker_launcher.py --serve`` once, the node's launcher
(``NodeServer``; ``node_launcher.py`` is its client), with a fixed minimal environment and ``/``
as its working directory. For each worker it forks a launcher that makes itself what
``python -I worker_launcher.py SPEC`` started by the backend as the leader of a new session was
(``_monitor``: its own session, ``/``, that environment, /dev/null on 0-2, no other
descriptor) and runs ``run_worker`` with the spec the node's launcher read on its stdin (the
``SPEC`` file form remains: a JSON file, read, then removed, as it holds the job's ``env``)::

    {"argv": [...], "env": {...}, "cwd": "<job dir>", "log": "<job dir>/logs/worker-0.log",
     "header": "==== wmla: ...", "exit_file": "...", "uid": 1001, "gid": 1001, "groups": [...]}

It forks the worker. The child first joins the worker's cgroup (``cgroup_procs``: the
``cgroup.procs`` file of each hierarchy, made by the backend with the worker's grant) and sets
its ``oom_score_adj``, so not one instruction of the user's runs outside the grant. It gives up
root next (setgroups, setgid, setuid, then checks that
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

**Checkpoint reports** (``report_file`` in the spec, rank 0's only). Before it forks, the
launcher makes a socketpair of datagram sockets; the worker inherits one end, named by
``WMLA_REPORT_FD`` (set last: a job's env cannot point it elsewhere), and ``extension.runtime``
sends ``{"at": .., "progress": ..}`` there after each checkpoint. The launcher keeps the other
end and, while it waits for the worker, relays the latest report to ``report_file``
(``{"at", "progress", "received", "reports"}``, 0600, atomically, in the state directory), at
most every ``REPORT_INTERVAL`` seconds and once more when the worker ends; the backend reads that
file, also after a service restart (the launcher outlives the service, and so does the channel).
So nothing running as root opens a path a user can name: the one thing the user controls is the
content of a datagram of at most ``REPORT_BYTES``, parsed as JSON and kept only when ``at`` is a
finite number (clamped to the time it arrived) and ``progress`` a finite number or null. The
channel carries no job id: it is this worker's, so a report cannot be about another job. A
flood is bounded by the socket's queue (the sender's ``MSG_DONTWAIT`` send fails when it is
full) and by the launcher reading at most ``REPORT_BATCH`` datagrams per ``REPORT_PAUSE``.

Standard library only; run with ``-I`` so nothing from any environment is imported here.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import select
import signal
import socket
import stat
import sys
import time

START_FAILED = 127  # like a shell whose command cannot be run
REPORT_BYTES = 512  # the longest checkpoint report read; longer datagrams are cut and refused
REPORT_BATCH = 64  # datagrams read at one wakeup; a full batch means a flood: pause before more
REPORT_PAUSE = 0.05  # seconds
REPORT_INTERVAL = 0.5  # seconds between two writes of report_file (the latest report wins)
POLL_FALLBACK = 0.5  # seconds between looks at the worker where pidfd_open is missing


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


def enter_cgroup(spec: dict) -> None:
    """Join the worker's cgroup (each hierarchy's ``cgroup.procs``, made by the backend as
    root) and become the OOM killer's early choice: still root, before any of the user's code.
    The paths are the backend's, under the cgroup mount; nothing of the job names them."""
    pid = str(os.getpid()).encode()
    for path in spec.get("cgroup_procs") or ():
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)
    if spec.get("oom_score_adj") is not None:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, str(int(spec["oom_score_adj"])).encode())
        finally:
            os.close(fd)


CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18


def private_tmp(spec: dict) -> None:
    """Still root: a mount namespace of the worker's own, where ``/tmp`` and ``/var/tmp`` are
    ``spec["tmp"]`` (a folder root made for the job inside its user's storage quota, so a job
    cannot fill the machine's /tmp) and ``/dev/shm`` a tmpfs of ``spec["shm_bytes"]`` of its own
    (the machine's would keep a job's files, and their memory, after the job)."""
    if spec.get("tmp") or spec.get("shm_bytes"):
        libc = ctypes.CDLL(None, use_errno=True)
        private_mounts(spec.get("tmp") or "", int(spec.get("shm_bytes") or 0), libc)


def private_mounts(tmp: str, shm_bytes: int, libc: ctypes.CDLL) -> None:
    """In a new mount namespace of this process (still root): ``tmp`` (when given) bound on
    ``/tmp`` and ``/var/tmp``, and (``shm_bytes`` > 0) a new tmpfs of that size on
    ``/dev/shm``, freed with the namespace. ``tmp``'s path is root's alone (nothing of it is a
    user's to swap); it is bound by its descriptor, as its path may run through /tmp, which the
    first bind covers. Also the spawner's, for notebook servers (``libc`` loaded before the
    fork there)."""

    def check(result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"private mounts: {what}: {os.strerror(err)}")

    check(libc.unshare(CLONE_NEWNS), "unshare")
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
    if tmp:
        source = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for target in ("/tmp", "/var/tmp"):
                if os.path.isdir(target):
                    bound = libc.mount(f"/proc/self/fd/{source}".encode(), target.encode(),
                                       None, MS_BIND, None)  # fmt: skip
                    check(bound, target)
        finally:
            os.close(source)
    if shm_bytes > 0 and os.path.isdir("/dev/shm"):
        options = f"size={shm_bytes},mode=1777".encode()
        check(libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, options),
              "/dev/shm")  # fmt: skip


def reset_signals() -> None:
    """What a process starts with, as a shell's child would: no signal blocked (whatever the
    thread that forked it had blocked) and none ignored. An ignored disposition survives exec, so
    whatever the service's own parent ignored would reach the user's code: Python ignores SIGPIPE
    and SIGXFSZ (``Popen(restore_signals=True)`` undoes only those), and a supervisor may leave
    any other ignored, glibc's own 32 and 33 included, which its ``sigaction`` refuses to touch:
    those are reset with the raw system call. Handlers caught here return to their defaults at
    the exec by themselves."""
    for sig in _ignored_signals():
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            raw_sigaction(sig, SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _ignored_signals() -> list[int]:
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"SigIgn:"):
                mask = int(line.split()[1], 16)
                return [bit + 1 for bit in range(64) if mask >> bit & 1]
    return [signal.SIGPIPE, signal.SIGXFSZ]


# rt_sigaction's number per machine; the C library is opened at import, never in a forked child
RT_SIGACTION = {"x86_64": 13, "aarch64": 134, "ppc64le": 173, "s390x": 174}.get(os.uname().machine)
SIG_DFL, SIG_IGN = 0, 1  # the kernel's handler values
_LIBC = ctypes.CDLL(None, use_errno=True)


def raw_sigaction(sig: int, handler: int) -> None:
    """rt_sigaction(sig, handler) past glibc, which refuses its own 32 and 33: a kernel
    sigaction whose first word is the handler and the rest zero (no flags, an empty mask) on
    every architecture's layout. Nothing where the call's number is not known here."""
    if RT_SIGACTION is None:
        return
    action = ctypes.create_string_buffer(64)
    action[:8] = handler.to_bytes(8, sys.byteorder)
    if _LIBC.syscall(RT_SIGACTION, sig, action, None, 8) != 0:
        raise OSError(ctypes.get_errno(), f"cannot set signal {sig}'s disposition")


def _child(spec: dict, report: int, channel: socket.socket | None) -> None:
    """In the forked child: enter the cgroup, drop, then enter the job's world and exec.
    Never returns."""
    try:
        reset_signals()
        enter_cgroup(spec)
        private_tmp(spec)
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
        env = {str(k): str(v) for k, v in spec["env"].items()}
        env.pop("WMLA_REPORT_FD", None)  # only ever the launcher's own channel
        if channel is not None:
            os.set_inheritable(channel.fileno(), True)
            env["WMLA_REPORT_FD"] = str(channel.fileno())
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as err:
            os.write(2, f"wmla: cannot start {argv[0]!r}: {err.strerror}\n".encode())
            raise
    except BaseException as err:  # noqa: BLE001 - whatever it was, report it and leave
        message = f"{type(err).__name__}: {err}" if not isinstance(err, OSError) else str(err)
        try:
            os.write(report, message.encode(errors="replace")[:4000])
        finally:
            os._exit(START_FAILED)


class Relay:
    """The latest checkpoint report of the worker, relayed to ``report_file``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.latest: dict | None = None  # received, not yet written
        self.written = -math.inf  # monotonic time of the last write
        self.reports = 0

    def drain(self, sock: socket.socket) -> int:
        """Read what is queued, at most a batch; returns how many datagrams were read."""
        for n in range(REPORT_BATCH):
            try:
                data = sock.recv(REPORT_BYTES, socket.MSG_DONTWAIT)
            except OSError:  # nothing more queued (or the worker's end is gone)
                return n
            report = parse_report(data, time.time())
            if report is not None:
                self.reports += 1
                self.latest = {**report, "reports": self.reports}
        return REPORT_BATCH

    def due_in(self) -> float | None:
        """Seconds until the pending report may be written; None when nothing is pending."""
        if self.latest is None:
            return None
        return max(0.0, self.written + REPORT_INTERVAL - time.monotonic())

    def flush(self, force: bool = False) -> None:
        if self.latest is None or (not force and self.due_in()):
            return
        record, self.latest = self.latest, None
        self.written = time.monotonic()
        try:  # a full disk costs the report, never the exit file that follows
            tmp = f"{self.path}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(record, out)
            os.replace(tmp, self.path)
        except OSError:
            pass


def parse_report(data: bytes, now: float) -> dict | None:
    """A report as the worker sent it, checked: ``{"at", "progress", "received"}`` or None."""
    try:
        message = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(message, dict):
        return None
    at = _finite(message.get("at"))
    if at is None:
        return None
    return {"at": min(at, now), "progress": _finite(message.get("progress")), "received": now}


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer of 400 digits
        return None
    return number if math.isfinite(number) else None


def _wait(pid: int, errors: int, channel: socket.socket | None, relay: Relay | None) -> tuple:
    """Wait for the worker while reading its start error and relaying its checkpoint reports;
    returns (the start error, its wait status)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # an older kernel or Python: look every POLL_FALLBACK
        pidfd = None
    poller = select.poll()
    poller.register(errors, select.POLLIN)
    if channel is not None:
        poller.register(channel, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    chunks: list[bytes] = []
    while True:
        waits = [relay.due_in() if relay else None, None if pidfd is not None else POLL_FALLBACK]
        timeout = min((w for w in waits if w is not None), default=None)
        ready = {fd for fd, _ in poller.poll(None if timeout is None else timeout * 1000)}
        if errors in ready:
            chunk = os.read(errors, 4096)
            chunks.append(chunk)
            if not chunk:  # the exec succeeded (close-on-exec) or the child gave up
                poller.unregister(errors)
        if channel is not None and relay is not None and channel.fileno() in ready:
            read = relay.drain(channel)
            if read == 0:  # ready with nothing to read (shut down): never spin on it
                poller.unregister(channel)
                channel = None
            elif read == REPORT_BATCH:  # a flood: the queue fills meanwhile, the rest is lost
                time.sleep(REPORT_PAUSE)
        if relay is not None:
            relay.flush()
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
    if relay is not None:  # what it said last, e.g. on SIGTERM
        if channel is not None:
            relay.drain(channel)
        relay.flush(force=True)
    while chunk := os.read(errors, 4096):
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace"), status


def run_worker(spec: dict) -> int:
    """Be the worker's launcher: fork the worker (``_child``), wait for it while relaying its
    reports, write its exit file; returns what the launcher exits with (like a shell's)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _noop)
    read_end, write_end = os.pipe()  # both close-on-exec: a successful exec closes it empty
    ours = theirs = None
    if spec.get("report_file"):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        if ours is not None:
            ours.close()
        _child(spec, write_end, theirs)
    os.close(write_end)
    if theirs is not None:
        theirs.close()
    relay = Relay(spec["report_file"]) if ours is not None else None
    error, status = _wait(pid, read_end, ours, relay)
    os.close(read_end)
    code = os.waitstatus_to_exitcode(status)
    _write_exit(spec["exit_file"], code, error)
    # A worker killed by signal N reads as -N in the file; the launcher itself exits like a shell.
    return code if code >= 0 else 128 - code


# -- the node's launcher (--serve) -------------------------------------------------------------
FRAME = 4  # bytes of the big-endian length before each message, both ways
MAX_REQUEST = 16 << 20  # bytes of one launch request (argv and env of one worker)
MAX_FD = 1 << 20  # a forked launcher closes every descriptor below this but its own


def _send(fd: int, message: dict) -> None:
    data = json.dumps(message).encode()
    view = memoryview(len(data).to_bytes(FRAME, "big") + data)
    while view:
        view = view[os.write(fd, view) :]


def _monitor(spec: dict, go: int) -> None:
    """In a child of the node's launcher: become exactly what ``python -I worker_launcher.py
    SPEC`` started as a session leader by the backend is (``/`` as working directory, the
    fixed environment the node's launcher was started with, /dev/null for 0-2, no other
    descriptor), wait for the go of the node's launcher, then ``run_worker``. Never returns.

    The go comes once the backend was told this process's pid: a node's launcher that died
    before then closes ``go`` empty, and this process leaves without starting anything (the
    backend starts the worker again through a new one), so no worker runs that nobody knows."""
    code = START_FAILED
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd, inheritable=False)
        os.closerange(3, go)  # the node's launcher's pipes and wakeup fd: none of them ours
        os.closerange(go + 1, MAX_FD)
        if os.read(go, 1) == b"g":
            os.close(go)
            code = run_worker(spec)
    except BaseException:  # noqa: BLE001 - nothing of the node's launcher runs on in a child
        pass
    finally:
        os._exit(code)


class NodeServer:
    """The node's launcher: reads launch requests (``{"id", "spec"}``) on ``requests``, forks a
    launcher per request (``_monitor``), answers ``{"id", "pid"}`` on ``answers`` and says
    ``{"exited": pid, "code": ..}`` when one of them ends (it is their parent, and reaps them).
    Ends when ``requests`` closes (the backend closed it or died); the launchers it forked run
    on, their workers too, as a restarted backend finds them on record."""

    def __init__(self, requests: int, answers: int) -> None:
        self.requests, self.answers = requests, answers
        self.buffer = b""
        with open("/proc/stat", "rb") as src:
            self.boot_time = float(next(ln for ln in src if ln.startswith(b"btime")).split()[1])
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)  # SIGCHLD wakes the poll below
        signal.signal(signal.SIGCHLD, _noop)

    def run(self) -> int:
        poller = select.poll()
        poller.register(self.requests, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self.wake_r in ready:
                while True:
                    try:
                        if not os.read(self.wake_r, 512):
                            break
                    except BlockingIOError:
                        break
            self.reap()
            if self.requests in ready:
                data = os.read(self.requests, 1 << 16)
                if not data:
                    return 0
                self.buffer += data
                self.handle_requests()

    def handle_requests(self) -> None:
        while len(self.buffer) >= FRAME:
            size = int.from_bytes(self.buffer[:FRAME], "big")
            if size > MAX_REQUEST:
                raise ValueError(f"a launch request of {size} bytes")
            if len(self.buffer) < FRAME + size:
                return
            body, self.buffer = self.buffer[FRAME : FRAME + size], self.buffer[FRAME + size :]
            request = json.loads(body)
            self.launch(request["id"], request["spec"])

    def launch(self, request: int, spec: dict) -> None:
        """Fork one; a launch that fails is answered with why (the node's launcher serves on)."""
        try:
            go_r, go_w = os.pipe()
        except OSError as err:
            _send(self.answers, {"id": request, "error": f"no pipe: {err.strerror}"})
            return
        try:
            pid = os.fork()
        except OSError as err:  # EAGAIN at a pids limit, ENOMEM
            os.close(go_r)
            os.close(go_w)
            _send(self.answers, {"id": request, "error": f"fork: {err.strerror}"})
            return
        if pid == 0:
            os.close(go_w)
            _monitor(spec, go_r)
        os.close(go_r)
        try:  # first the backend knows it (and its start time, psutil's way: pids recycle)...
            try:
                created = self.started(pid)
            except (OSError, ValueError, IndexError) as err:  # gone before its go
                _send(self.answers, {"id": request, "error": f"it ended at once: {err}"})
                return
            _send(self.answers, {"id": request, "pid": pid, "create_time": created})
            try:
                os.write(go_w, b"g")  # ...then it may start
            except BrokenPipeError:
                pass  # it ended before its go: its exit is told as any other's
        finally:
            os.close(go_w)

    def started(self, pid: int) -> float:
        """When ``pid`` started, as psutil's ``create_time`` says it (seconds since the epoch):
        read while it waits for its go, so it is still there."""
        with open(f"/proc/{pid}/stat", "rb") as src:
            ticks = int(src.read().rsplit(b")", 1)[1].split()[19])
        return self.boot_time + ticks / os.sysconf("SC_CLK_TCK")

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            _send(self.answers, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def serve() -> int:
    """The node's launcher on stdin/stdout; what ends it unexpectedly is told the backend
    first (its stderr goes nowhere)."""
    try:
        return NodeServer(0, 1).run()
    except BaseException as err:
        try:
            _send(1, {"fatal": f"{type(err).__name__}: {err}"[:500]})
        except OSError:
            pass
        raise


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        return serve()
    if len(argv) != 1:
        print("usage: python -I worker_launcher.py SPEC.json | --serve", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as src:
        spec = json.load(src)
    os.unlink(argv[0])  # it holds the job's env: gone as soon as it was read
    return run_worker(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
