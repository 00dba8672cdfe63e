"""The helper server (extension/userfs/helper_server.py): each user-files helper it forks is what
the setpriv start made, seen from outside (/proc as root) and from inside (a probe run as the
helper's code, as the liar tests of test_userfs_pool.py run theirs), and no more: the account's
uid, gid and groups, no capability, ``HELPER_ENV``, ``/``, umask 077, a session of its own, its
two pipes and /dev/null, no signal caught, ignored or blocked. The server tells each helper's exit
code; a server killed, stopped or unable to start never holds up a request.

Real throw-away accounts (a random prefix), removed whatever happens."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from extension.backends.local.worker_launcher import SIG_DFL, SIG_IGN, raw_sigaction
from extension.userfs import forked
from extension.userfs import pool as userfs
from extension.userfs.accounts import Account, create_account
from extension.userfs.pool import HELPER_ENV, HelperPool, Identity
from tests.backends.test_userfs_pool import gone

from .raw_signals import PLANTED, ignored

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("useradd") is not None
pytestmark = pytest.mark.skipif(
    not (AS_ROOT and forked.SUPPORTED), reason="forked helpers: root, useradd, pidfds"
)
PREFIX = f"wf{secrets.token_hex(3)}-"
CHECK = {"op": "check_runnable", "args": {"program": "/bin/sh"}}


@pytest.fixture(scope="module")
def accounts() -> Iterator[dict[str, Account]]:
    home = Path(tempfile.mkdtemp(prefix="wmla-forked-"))
    made: dict[str, Account] = {}
    try:
        for user in ("a", "b"):
            made[user] = create_account(PREFIX + user, home / user)
        yield made
    finally:
        for user in ("a", "b"):
            subprocess.run(["userdel", PREFIX + user], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)
        for user in ("a", "b"):
            left = subprocess.run(["getent", "passwd", PREFIX + user], capture_output=True)
            assert left.returncode != 0, f"{PREFIX + user} is still there"


@pytest.fixture
def pool() -> Iterator[HelperPool]:
    made = HelperPool(timeout=3.0, idle=30.0, forking=True)
    yield made
    pids, server = list(made.pids()), made.server_pid
    made.close()
    assert all(gone(pid) for pid in pids), f"helpers left after close: {pids}"
    assert server is None or gone(server), f"the helper server {server} is left"


# -- from outside --------------------------------------------------------------------------------
def status_of(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in lines)}


def our_pipes() -> set[str]:
    """This process's pipes, as /proc names them (``pipe:[inode]``)."""
    links = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            links.add(os.readlink(f"/proc/self/fd/{name}"))
        except FileNotFoundError:  # the listing's own descriptor
            pass
    return {link for link in links if link.startswith("pipe:")}


def differences(pid: int, ident: Identity, parent: int) -> list[str]:
    """What process ``pid`` has that a helper of ``ident`` forked by ``parent`` must not."""
    _, uid, gid, groups = ident
    found, status = [], status_of(pid)
    if status["Uid"].split() != [str(uid)] * 4 or status["Gid"].split() != [str(gid)] * 4:
        found.append(f"uids {status['Uid']}, gids {status['Gid']}")
    if sorted(int(g) for g in status["Groups"].split()) != sorted(groups):
        found.append(f"groups {status['Groups']}")
    found += [
        f"{k} {status[k]}" for k in ("CapInh", "CapPrm", "CapEff", "CapAmb") if int(status[k], 16)
    ]
    found += [f"{k} {status[k]}" for k in ("SigIgn", "SigBlk", "SigCgt") if int(status[k], 16)]
    if status["Umask"] != "0077":
        found.append(f"umask {status['Umask']}")
    fds = {int(n): os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}
    if sorted(fds) != [0, 1, 2] or fds[2] != "/dev/null" or not {fds[0], fds[1]} <= our_pipes():
        found.append(f"descriptors {fds}")  # 0 and 1: pipes whose other ends are ours
    if psutil.Process(pid).environ() != HELPER_ENV:
        found.append(f"environment {psutil.Process(pid).environ()}")
    if os.readlink(f"/proc/{pid}/cwd") != "/":
        found.append(f"working directory {os.readlink(f'/proc/{pid}/cwd')}")
    if os.getsid(pid) != pid:
        found.append("not its own session")
    if psutil.Process(pid).ppid() != parent:
        found.append(f"parent {psutil.Process(pid).ppid()}")
    return found


def test_a_forked_helper_seen_from_outside_is_the_account_and_nothing_of_ours(
    accounts: dict[str, Account], pool: HelperPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WMLA_SECRET_TOKEN", "not-for-users")
    assert pool.ask(accounts["a"], CHECK) == {"ok": ""}
    [(pid, ident)] = pool.pids().items()
    assert pool.server_pid is not None
    assert differences(pid, ident, pool.server_pid) == []


def test_the_outside_check_finds_each_thing_a_helper_must_not_have(
    accounts: dict[str, Account], tmp_path: Path
) -> None:
    """A process wrong in every way (root's, an extra descriptor, a signal ignored and one
    blocked, another umask, environment and directory, no session of its own): each is found."""
    extra = os.open(tmp_path / "extra", os.O_CREAT | os.O_WRONLY, 0o600)

    def wrong() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        # the interpreter it execs catches SIGINT (SigCgt), unless SIGINT came in ignored (a
        # background job of a shell): not a thing of this test's to depend on
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        os.umask(0o022)

    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], cwd=tmp_path,
        env={**HELPER_ENV, "EXTRA": "1"}, pass_fds=(extra,), preexec_fn=wrong,
    )  # fmt: skip
    try:
        time.sleep(0.3)
        found = " | ".join(differences(proc.pid, userfs.identity(accounts["a"]), 1))
    finally:
        proc.kill()
        proc.wait()
        os.close(extra)
    wrongs = ("uids", "groups", "CapEff", "SigIgn", "SigBlk", "SigCgt", "umask", "descriptors",
              "environment", "working directory", "session", "parent")  # fmt: skip
    for what in wrongs:
        assert what in found, f"{what} not found in: {found}"


# -- from inside ---------------------------------------------------------------------------------
# What runs as the helper's code (test-only: the pool runs whatever ``_SOURCE`` says): one
# answer with what the process sees of itself, then it waits for its stdin to close.
PROBE = textwrap.dedent(
    """
    import json, os, signal, stat
    size = int.from_bytes(os.read(0, 8), "big")
    request = json.loads(os.read(0, size))
    names = os.listdir("/proc/self/fd")  # its own descriptor is closed once it returns
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    mask = os.umask(0)
    os.umask(mask)
    report = {
        "uids": os.getresuid(), "gids": os.getresgid(), "groups": sorted(os.getgroups()),
        "status": {k: int(status[k], 16) for k in
                   ("CapInh", "CapPrm", "CapEff", "CapAmb", "SigIgn", "SigBlk", "SigCgt")},
        "handlers": [int(s) for s in signal.valid_signals()
                     if signal.getsignal(s) not in (signal.SIG_DFL, None)],
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "fds": sorted(int(n) for n in names if os.path.lexists(f"/proc/self/fd/{n}")),
        "pipes": [stat.S_ISFIFO(os.fstat(fd).st_mode) for fd in (0, 1)],
        "null": os.fstat(2).st_rdev == os.stat("/dev/null").st_rdev,
        "env": dict(os.environ), "cwd": os.getcwd(), "umask": mask,
        "session": os.getsid(0) == os.getpid(),
    }
    data = json.dumps({"id": request["id"], "ok": report}).encode()
    os.write(1, len(data).to_bytes(8, "big") + data)
    os.read(0, 1)
    """
)


@pytest.mark.parametrize("forking", [True, False], ids=["forked", "setpriv"])
def test_a_helper_seen_from_inside_is_the_account_and_nothing_of_ours(
    accounts: dict[str, Account], monkeypatch: pytest.MonkeyPatch, forking: bool
) -> None:
    monkeypatch.setattr(userfs, "_SOURCE", PROBE)
    # as under a supervisor that starts the service with signals ignored (SIGUSR1, and glibc's
    # own 32 that Python cannot set): the server inherits them, its helpers must not
    inherited = ignored()
    planted = [sig for sig in PLANTED if sig not in inherited]
    for sig in planted:
        raw_sigaction(sig, SIG_IGN)
    try:
        pool = HelperPool(timeout=5.0, forking=forking)
        try:
            answer = pool.ask(accounts["b"], {"op": "probe"})
            [(pid, ident)] = pool.pids().items()
            assert (psutil.Process(pid).ppid() == pool.server_pid) == forking
        finally:
            pool.close()
    finally:
        for sig in planted:
            raw_sigaction(sig, SIG_DFL)
    report = answer["ok"]
    _, uid, gid, groups = ident
    assert report["uids"] == [uid] * 3 and report["gids"] == [gid] * 3
    assert report["groups"] == sorted(groups)
    assert report["fds"] == [0, 1, 2] and report["pipes"] == [True, True] and report["null"]
    assert report["env"] == HELPER_ENV and report["cwd"] == "/" and report["umask"] == 0o077
    assert report["session"] and report["blocked"] == []
    caps = {k: v for k, v in report["status"].items() if k.startswith("Cap")}
    assert not any(caps.values()), caps
    signals = {k: report["status"][k] for k in ("SigIgn", "SigBlk", "SigCgt")}
    if forking:
        assert signals == {"SigIgn": 0, "SigBlk": 0, "SigCgt": 0} and report["handlers"] == []
    else:  # a fresh interpreter ignores SIGPIPE and SIGXFSZ and catches SIGINT, and an exec
        # keeps what the service ignored: the check sees both
        python = 1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)
        assert signals["SigIgn"] & python == python, signals
        assert all(signals["SigIgn"] >> (sig - 1) & 1 for sig in PLANTED), signals
        # SIGINT, SIGPIPE, SIGXFSZ, and what Python can see of the planted ones and of what this
        # process ignored already (under nohup SIGHUP, as a shell's background job SIGQUIT):
        # an exec keeps those as well
        kept = (set(PLANTED) | inherited) & signal.valid_signals()
        assert report["handlers"] == sorted({2, 13, 25} | kept)


def test_its_user_may_stop_their_forked_helper_and_the_pool_kills_it_at_its_deadline(
    accounts: dict[str, Account], monkeypatch: pytest.MonkeyPatch
) -> None:
    account = accounts["a"]
    pool = HelperPool(timeout=0.5, forking=True)
    try:
        assert pool.ask(account, CHECK) == {"ok": ""}
        [pid] = pool.pids()
        subprocess.run(
            ["kill", "-STOP", str(pid)], user=account.uid, group=account.gid, extra_groups=[],
            env={"PATH": "/usr/bin:/bin"}, check=True,
        )  # fmt: skip
        deadline = time.monotonic() + 5  # the signal is taken when it is next scheduled
        while psutil.Process(pid).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, psutil.Process(pid).status()
            time.sleep(0.02)
        t0 = time.monotonic()
        assert "timed out" in pool.ask(account, CHECK)["error"]
        assert time.monotonic() - t0 < 2.0 and gone(pid)
        assert pool.ask(account, CHECK) == {"ok": ""} and pool.started == 2
    finally:
        pool.close()


# -- exit codes, and the server's own troubles ----------------------------------------------------
ENDS = {
    "exits": ("import sys; sys.stdin.buffer.raw.read(16); sys.exit(5)", "exited (5)"),
    "killed": (
        "import os, signal; os.read(0, 16); os.kill(os.getpid(), signal.SIGTERM)",
        "was killed",
    ),  # fmt: skip
}


@pytest.mark.parametrize("end", list(ENDS))
def test_the_service_learns_each_helpers_exit_code_from_the_server(
    accounts: dict[str, Account], pool: HelperPool, monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    source, told = ENDS[end]
    monkeypatch.setattr(userfs, "_SOURCE", source)
    answer = pool.ask(accounts["a"], CHECK)
    assert told in answer["error"]
    assert pool.server_pid is not None and pool.started == 1  # forked, not ours to reap


def test_a_killed_server_holds_up_no_request(
    accounts: dict[str, Account], pool: HelperPool
) -> None:
    assert pool.ask(accounts["a"], CHECK) == {"ok": ""}
    [helper] = pool.pids()
    server = pool.server_pid
    assert server is not None
    os.kill(server, signal.SIGKILL)
    assert gone(server)
    t0 = time.monotonic()
    assert pool.ask(accounts["a"], CHECK) == {"ok": ""}  # its helper serves on
    assert pool.ask(accounts["b"], CHECK) == {"ok": ""}  # a new helper: a new server forks it
    assert time.monotonic() - t0 < 2.0
    assert pool.servers_started == 2 and pool.server_pid not in (None, server)
    os.kill(helper, signal.SIGKILL)  # its parent is gone: killed through its pidfd all the same
    assert gone(helper)


def test_a_stopped_server_holds_up_no_request(
    accounts: dict[str, Account], pool: HelperPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forked, "FORK_TIMEOUT", 0.5)
    assert pool.ask(accounts["a"], CHECK) == {"ok": ""}
    server = pool.server_pid
    assert server is not None
    os.kill(server, signal.SIGSTOP)  # only root could; a hung server, then
    t0 = time.monotonic()
    assert pool.ask(accounts["b"], CHECK) == {"ok": ""}
    assert time.monotonic() - t0 < 2.5
    assert gone(server) and pool.server_pid not in (None, server)


def test_a_request_out_of_time_leaves_a_slow_server_running(accounts: dict[str, Account]) -> None:
    """The request's own deadline passes first (the server was only slow): that request times
    out, the server is kept, and the helper it forks late finds its pipes closed and exits."""
    pool = HelperPool(timeout=0.5, forking=True)
    try:
        assert pool.ask(accounts["a"], CHECK) == {"ok": ""}
        server = pool.server_pid
        assert server is not None
        os.kill(server, signal.SIGSTOP)
        assert "timed out" in pool.ask(accounts["b"], CHECK)["error"]
        os.kill(server, signal.SIGCONT)
        assert pool.ask(accounts["b"], CHECK) == {"ok": ""}
        assert pool.server_pid == server and pool.servers_started == 1
        late = [p for p in psutil.Process(server).children() if p.pid not in pool.pids()]
        assert all(gone(p.pid) for p in late)
    finally:
        pool.close()


def test_a_server_that_cannot_start_leaves_setpriv_starts(
    accounts: dict[str, Account], pool: HelperPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forked, "SERVER_SOURCE", "import sys; sys.exit(3)")
    for user in ("a", "b"):
        assert pool.ask(accounts[user], CHECK) == {"ok": ""}
    assert {psutil.Process(pid).ppid() for pid in pool.pids()} == {os.getpid()}
    assert pool.servers_started == 1  # and not one per request: tried again later


def test_the_server_is_roots_and_holds_no_helpers_pipe(
    accounts: dict[str, Account], pool: HelperPool
) -> None:
    for user in ("a", "b"):
        assert pool.ask(accounts[user], CHECK) == {"ok": ""}
    server = pool.server_pid
    assert server is not None
    proc = psutil.Process(server)
    assert proc.uids() == (0, 0, 0) and proc.environ() == HELPER_ENV and proc.cwd() == "/"
    assert os.getsid(server) == server
    deadline = time.monotonic() + 2.0
    while True:  # the pidfd of the last answer is closed once it was sent: a moment after
        fds = {}
        for name in os.listdir(f"/proc/{server}/fd"):
            try:
                fds[int(name)] = os.readlink(f"/proc/{server}/fd/{name}")
            except FileNotFoundError:
                pass
        if len(fds) <= 5 or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert fds[0].startswith("socket:") and fds[1] == fds[2] == "/dev/null"
    helpers = {
        os.readlink(f"/proc/{pid}/fd/{n}") for pid in pool.pids() for n in (0, 1)
    }  # fmt: skip
    assert not helpers & set(fds.values())  # only the service holds the other ends
    assert stat.S_ISSOCK(os.stat(f"/proc/{server}/fd/0").st_mode)
    assert json.dumps(sorted(fds)) == "[0, 1, 2, 3, 4]"  # and its SIGCHLD wakeup pipe


def test_a_malformed_request_is_refused_and_the_server_serves_on(
    accounts: dict[str, Account],
) -> None:
    account = accounts["b"]
    server = forked.HelperServer(userfs.helper_python(account), userfs._SOURCE, HELPER_ENV)
    try:
        read_end, write_end = os.pipe()
        try:  # one descriptor where two must come
            socket.send_fds(server.sock, [json.dumps({"id": 99}).encode()], [read_end])
        finally:
            os.close(read_end)
            os.close(write_end)
        socket.send_fds(server.sock, [b"not json"], [])
        time.sleep(0.3)
        assert server.running and psutil.Process(server.pid).children() == []
        ident = userfs.identity(account)
        helper = userfs._Helper(
            ident, account, userfs._Forked(ident, server, 30.0, time.monotonic() + 5)
        )
        answer = helper.exchange({"id": 1, **CHECK}, time.monotonic() + 5, 1 << 20)
        assert answer == {"id": 1, "ok": ""}
        helper.end()
    finally:
        server.close()
