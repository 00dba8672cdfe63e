"""The pooled userfs helpers (extension/userfs/pool.py), with real processes and real
throw-away system accounts: each helper runs as its account only, serves only it, and a user
who stops, kills or rewrites their own helper cannot hang the service or make it believe more
than a helper of theirs could say (docs/security.md, "The helper").

The accounts (a random prefix) are removed whatever happens, and ``getent passwd`` is checked
after; every pool a test makes is closed, and its helpers are checked gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from extension.userfs import forked
from extension.userfs import ops as userfs_ops
from extension.userfs import pool as userfs
from extension.userfs.accounts import Account, create_account, ensure_folder
from extension.userfs.errors import UserFileError
from extension.userfs.files import UserFiles
from extension.userfs.pool import HELPER_ENV, HelperPool

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("useradd") is not None
pytestmark = pytest.mark.skipif(not AS_ROOT, reason="helpers drop to accounts: root, useradd")
PREFIX = f"wu{secrets.token_hex(3)}-"
ROOT = Path(__file__).resolve().parents[2]


def gone(pid: int, within: float = 5.0) -> bool:
    """Whether process ``pid`` ended (a zombie counts: it runs nothing) within ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


class World:
    def __init__(self, storage: Path, accounts: dict[str, Account], group: str) -> None:
        self.storage, self.accounts, self.group = storage, accounts, group

    def folder(self, user: str) -> Path:
        return self.storage / user


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    # outside pytest's 0700 temp folders: the accounts must reach their own folders
    storage = Path(tempfile.mkdtemp(prefix="wmla-userfs-pool-"))
    os.chmod(storage, 0o711)
    names = {user: PREFIX + user for user in ("a", "b")}
    group = PREFIX + "g"
    accounts: dict[str, Account] = {}
    try:
        for user, name in names.items():
            accounts[user] = create_account(name, storage / user)
            ensure_folder(storage, user, accounts[user])
        subprocess.run(["groupadd", group], check=True, capture_output=True)
        yield World(storage, accounts, group)
    finally:
        for name in names.values():
            subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)
        shutil.rmtree(storage, ignore_errors=True)
        for name in (*names.values(), group):
            for db in ("passwd", "group"):
                left = subprocess.run(["getent", db, name], capture_output=True, text=True)
                assert left.returncode != 0, f"{name} is still in {db}: {left.stdout}"


@pytest.fixture(params=["forked", "setpriv"])
def pools(request: pytest.FixtureRequest) -> Iterator[Callable[..., HelperPool]]:
    """Make pools (short limits unless told) whose helpers the helper server forks, or that
    start each with setpriv (the start when there is no server); each is closed, its helpers
    and its server checked gone."""
    made: list[HelperPool] = []

    def make(**options: float) -> HelperPool:
        settings = {"timeout": 2.0, "idle": 30.0, "forking": request.param == "forked"}
        pool = HelperPool(**{**settings, **options})  # type: ignore[arg-type]
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pids = list(pool.pids())
        server = pool.server_pid
        pool.close()
        assert all(gone(pid) for pid in pids), f"helpers left after close: {pids}"
        assert server is None or gone(server), f"the helper server {server} is left"


@pytest.fixture
def pool(pools: Callable[..., HelperPool]) -> HelperPool:
    return pools()


def as_account(account: Account, script: str) -> None:
    subprocess.run(
        ["/bin/sh", "-c", script], user=account.uid, group=account.gid, extra_groups=[],
        env={"PATH": "/usr/bin:/bin"}, cwd="/", check=True,
    )  # fmt: skip


def write_log(world: World, pool: HelperPool, user: str, job: str, text: str) -> str:
    """A job directory of the user's (made by their helper) with worker 0's log; its path."""
    account = world.accounts[user]
    # a job of its own for each run: the tests run once per way of starting helpers, and a
    # test may leave a FIFO where the log was
    workdir = world.folder(user) / "jobs" / f"{job}-{secrets.token_hex(3)}"
    UserFiles(account, pool).prepare_job(str(workdir))
    log = workdir / "logs" / "worker-0.log"
    log.write_text(text)  # the test's own setup: what the worker would have written
    os.chown(log, account.uid, account.gid)
    return str(workdir)


# -- who the helper is ------------------------------------------------------------------------
def test_the_pooled_helper_runs_as_the_account_with_nothing_of_ours(
    world: World, pool: HelperPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WMLA_SECRET_TOKEN", "not-for-users")
    account = world.accounts["a"]
    files = UserFiles(account, pool)
    workdir = world.folder("a") / "jobs" / "who"
    files.prepare_job(str(workdir))
    [pid] = pool.pids()
    proc = psutil.Process(pid)
    assert proc.uids() == (account.uid,) * 3
    assert proc.gids() == (account.gid,) * 3
    status = Path(f"/proc/{pid}/status").read_text()
    groups = next(line for line in status.splitlines() if line.startswith("Groups:"))
    assert sorted(int(g) for g in groups.split()[1:]) == sorted(pool.pids()[pid][3])
    caps = dict(line.split(":\t") for line in status.splitlines() if line.startswith("Cap"))
    assert all(int(caps[k], 16) == 0 for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")), caps
    assert proc.environ() == HELPER_ENV
    assert proc.cwd() == "/"
    argv = proc.cmdline()
    assert argv[1:4] == ["-I", "-S", "-c"]
    # the source travels on the command line (the server's, when forked): no project path
    assert argv[4 if pool.server_pid is None else 5] == userfs._SOURCE
    # and the helper is the forking server's child, or ours when started with setpriv
    assert proc.ppid() == (pool.server_pid or os.getpid())
    assert os.stat(workdir).st_uid == account.uid  # made by the helper, as the account
    assert os.stat(workdir / "logs").st_mode & 0o777 == 0o700


def test_one_helper_serves_many_requests(world: World, pool: HelperPool) -> None:
    files = UserFiles(world.accounts["a"], pool)
    workdir = write_log(world, pool, "a", "many", "line 1\nline 2\n")
    first = set(pool.pids())
    for _ in range(50):
        assert files.read_logs(workdir, worker=0, tail=1) == "line 2\n"
    assert set(pool.pids()) == first and pool.started == 1


def test_not_root_stays_in_process(world: World, pool: HelperPool, tmp_path: Path) -> None:
    files = UserFiles(None, pool)
    files.prepare_job(str(tmp_path / "job"))
    assert (tmp_path / "job" / "logs").is_dir()
    assert pool.started == 0 and not pool.pids()
    assert UserFiles.of(Account("root", 0, 0), pool).account is None


# -- accounts are kept apart -------------------------------------------------------------------
def test_two_accounts_never_share_a_helper(world: World, pool: HelperPool) -> None:
    """Many requests of both accounts at once: every directory a helper made is its own
    account's, and every helper runs as the account it is listed for."""
    scratch = Path(tempfile.mkdtemp(prefix="wmla-userfs-shared-"))
    os.chmod(scratch, 0o1777)  # both may create here; each folder's owner says who made it
    errors: list[BaseException] = []

    def work(user: str, n: int) -> None:
        try:
            files = UserFiles(world.accounts[user], pool)
            for i in range(n):
                files.prepare_job(str(scratch / f"{user}-{i}"))
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    try:
        threads = [threading.Thread(target=work, args=(u, 30)) for u in ("a", "b", "a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        for user in ("a", "b"):
            owners = {os.stat(p).st_uid for p in scratch.glob(f"{user}-*")}
            assert owners == {world.accounts[user].uid}
        live = pool.pids()
        assert {ident[1] for ident in live.values()} == {a.uid for a in world.accounts.values()}
        for pid, ident in live.items():
            assert psutil.Process(pid).uids().real == ident[1]
        assert pool.started <= 2 * pool.per_account
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_a_helper_whose_account_got_a_group_is_replaced(world: World, pool: HelperPool) -> None:
    account = world.accounts["b"]
    files = UserFiles(account, pool)
    files.check_runnable("/bin/sh")
    [old] = pool.pids()
    gid = int(subprocess.run(["getent", "group", world.group], capture_output=True,
                             text=True, check=True).stdout.split(":")[2])  # fmt: skip
    subprocess.run(["usermod", "-aG", world.group, account.name], check=True)
    try:
        files.check_runnable("/bin/sh")
        [new] = pool.pids()
        assert new != old and gone(old)
        assert gid in groups_of(new)
        # and taken away again: the very next request runs without it
        subprocess.run(["gpasswd", "-d", account.name, world.group], check=True,
                       capture_output=True)  # fmt: skip
        files.check_runnable("/bin/sh")
        [newest] = pool.pids()
        assert newest != new and gone(new) and gid not in groups_of(newest)
    finally:
        subprocess.run(["gpasswd", "-d", account.name, world.group], capture_output=True)


def groups_of(pid: int) -> set[int]:
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("Groups:"))
    return {int(g) for g in line.split()[1:]}


# -- a user who stops, kills or rewrites their helper -------------------------------------------
def test_a_stopped_helper_times_out_and_is_replaced(
    world: World, pools: Callable[..., HelperPool]
) -> None:
    pool = pools(timeout=0.5)
    files = UserFiles(world.accounts["a"], pool)
    files.check_runnable("/bin/sh")
    [pid] = pool.pids()
    os.kill(pid, signal.SIGSTOP)  # what the user may do to their own process
    t0 = time.monotonic()
    with pytest.raises(UserFileError, match="timed out"):
        files.check_runnable("/bin/sh")
    assert time.monotonic() - t0 < 2.0
    assert gone(pid)
    assert files.check_runnable("/bin/sh") == ""
    assert pool.started == 2 and pid not in pool.pids()


def test_a_killed_helper_is_replaced(world: World, pool: HelperPool) -> None:
    files = UserFiles(world.accounts["a"], pool)
    files.check_runnable("/bin/sh")
    [pid] = pool.pids()
    os.kill(pid, signal.SIGKILL)
    assert gone(pid)
    assert files.check_runnable("/bin/sh") == ""  # asked again of a fresh one
    assert pool.started == 2 and pid not in pool.pids()


# What a user could make their own helper say (it runs as them: they may ptrace it or, here,
# it is simply given other code). Each line: the helper's behaviour after reading a request.
LIARS = {  # the lie: (what the helper does, what the caller is told)
    "huge": ("out(b'\\xff' * 8)", "was over 67108864 bytes"),
    "wrong id": ("answer({'id': 999, 'ok': ''})", "out of turn"),
    "not json": ("frame(b'{not json')", "answered no JSON"),
    "nested": ("frame(b'[' * 100000)", "answered no JSON"),
    "not an object": ("frame(json.dumps([1, 2]).encode())", "out of turn"),
    "silent": ("time.sleep(60)", "timed out"),
    "exits": ("sys.exit(3)", "helper exited (3)"),
    "bad shape": ("answer({'id': req['id'], 'ok': ['/x' * 5000, 'y']})", "is not a path"),
}
LIAR = textwrap.dedent(
    """
    import json, os, sys, time
    def out(data):
        os.write(1, data)
    def frame(data):
        out(len(data).to_bytes(8, 'big') + data)
    def answer(obj):
        frame(json.dumps(obj).encode())
    while True:
        size = int.from_bytes(os.read(0, 8), 'big')
        req = json.loads(os.read(0, size))
        {behaviour}
    """
)


@pytest.mark.parametrize("lie", list(LIARS), ids=list(LIARS))
def test_a_helper_that_lies_is_refused_and_replaced(
    world: World, pools: Callable[..., HelperPool], monkeypatch: pytest.MonkeyPatch, lie: str
) -> None:
    pool = pools(timeout=0.5)
    behaviour, told = LIARS[lie]
    monkeypatch.setattr(userfs, "_SOURCE", LIAR.format(behaviour=behaviour))
    files = UserFiles(world.accounts["a"], pool)
    t0 = time.monotonic()
    with pytest.raises(UserFileError, match=re.escape(told)):
        files.resolve_command(str(world.folder("a")), ".", "main.py")
    assert time.monotonic() - t0 < 2.0
    if lie == "bad shape":  # a well-formed answer with a value refused: the helper may stay
        return
    assert not pool.pids()  # a helper out of step is ended: nothing it sends next is believed
    monkeypatch.setattr(userfs, "_SOURCE", Path(userfs_ops.__file__).read_text())
    assert files.check_runnable("/bin/sh") == ""  # a new one (honest here) answers next


def test_an_answer_over_the_bound_is_refused(
    world: World, pool: HelperPool, pools: Callable[..., HelperPool]
) -> None:
    workdir = write_log(world, pool, "b", "big", "x" * 5000 + "\n")
    small = pools(answer_limit=1000)
    with pytest.raises(UserFileError, match="over 1000 bytes"):
        UserFiles(world.accounts["b"], small).read_logs(workdir, worker=0)
    assert not small.pids()  # it may still be writing: ended, not read further
    assert UserFiles(world.accounts["b"], pool).read_logs(workdir, worker=0).startswith("xxx")


def test_an_honest_helper_refuses_its_own_oversized_answer() -> None:
    answer = userfs_ops.answer_bytes({"id": 7, "op": "tail", "args": {"path": "/", "count": 1}})
    assert json.loads(answer[userfs_ops.FRAME :])["id"] == 7
    big = {"id": 8, "op": "nope", "args": {}}
    original = userfs_ops.MAX_ANSWER
    try:
        userfs_ops.MAX_ANSWER = 10
        reply = json.loads(userfs_ops.answer_bytes(big)[userfs_ops.FRAME :])
    finally:
        userfs_ops.MAX_ANSWER = original
    assert reply["id"] == 8 and "over 10 bytes" in reply["error"]


# -- the end of helpers --------------------------------------------------------------------------
def test_an_idle_helper_ends(world: World, pools: Callable[..., HelperPool]) -> None:
    pool = pools(idle=0.3)
    files = UserFiles(world.accounts["a"], pool)
    files.check_runnable("/bin/sh")
    [pid] = pool.pids()
    assert gone(pid, within=3.0)
    assert not pool.pids()
    assert files.check_runnable("/bin/sh") == ""  # and a new one comes when needed
    assert pool.started == 2


def test_the_pool_is_bounded_least_recently_used_first(
    world: World, pools: Callable[..., HelperPool]
) -> None:
    pool = pools(max_helpers=1)
    a, b = (UserFiles(world.accounts[u], pool) for u in ("a", "b"))
    a.check_runnable("/bin/sh")
    [pid_a] = pool.pids()
    b.check_runnable("/bin/sh")
    [(pid_b, ident)] = pool.pids().items()
    assert ident[1] == world.accounts["b"].uid and gone(pid_a)


def test_requests_beyond_per_account_wait_for_a_helper(
    world: World, pools: Callable[..., HelperPool]
) -> None:
    pool = pools(per_account=1)
    files = UserFiles(world.accounts["a"], pool)
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(files.check_runnable("/bin/sh")))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [""] * 8 and pool.started == 1


def test_close_ends_every_helper_and_a_closed_stdin_ends_one(
    world: World, pool: HelperPool
) -> None:
    for user in ("a", "b"):
        UserFiles(world.accounts[user], pool).check_runnable("/bin/sh")
    pids = list(pool.pids())
    assert len(pids) == 2
    pool.close()
    assert all(gone(pid) for pid in pids)
    with pytest.raises(UserFileError, match="stopping"):
        UserFiles(world.accounts["a"], pool).check_runnable("/bin/sh")
    # the helper's own side: its stdin closed (the service closed it, or died) is its end
    account = world.accounts["a"]
    ident = userfs.identity(account)
    started = userfs._Popened(ident, userfs.helper_python(account), 30.0)
    assert started.proc.stdin is not None
    started.proc.stdin.close()
    assert started.proc.wait(5) == 0
    started.end()
    # and a forked one's: its parent, the helper server, says it exited by itself (0)
    server = forked.HelperServer(userfs.helper_python(account), userfs._SOURCE, HELPER_ENV)
    try:
        child = userfs._Forked(ident, server, 30.0, time.monotonic() + 5)
        os.close(child.to_fd)
        assert forked.readable(child.child.pidfd, timeout=5)
        assert server.exit_code(child.child) == 0
        os.close(child.from_fd)
        os.close(child.child.pidfd)
    finally:
        server.close()


def test_close_ends_a_helper_in_the_middle_of_a_request(
    world: World, pools: Callable[..., HelperPool]
) -> None:
    pool = pools(timeout=20.0)
    files = UserFiles(world.accounts["a"], pool)
    files.check_runnable("/bin/sh")
    [pid] = pool.pids()
    os.kill(pid, signal.SIGSTOP)  # its request would wait for the whole timeout
    caught: list[BaseException] = []

    def ask() -> None:
        try:
            files.check_runnable("/bin/sh")
        except BaseException as err:
            caught.append(err)

    asker = threading.Thread(target=ask)
    asker.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    pool.close()
    asker.join(5)
    assert not asker.is_alive() and time.monotonic() - t0 < 3.0
    assert len(caught) == 1 and isinstance(caught[0], UserFileError)
    assert gone(pid)


SERVICE = """
import os, sys, time
sys.path.insert(0, {root!r})
from extension.userfs.accounts import Account
from extension.userfs.files import UserFiles
files = UserFiles(Account({name!r}, {uid}, {gid}))
files.check_runnable("/bin/sh")
from extension.userfs.pool import HELPERS
print(*HELPERS.pids(), HELPERS.server_pid or "", flush=True)
time.sleep(60)
"""


def test_helpers_end_when_the_service_dies(world: World) -> None:
    """A service killed with SIGKILL runs no clean-up: its helpers see their stdin close."""
    account = world.accounts["a"]
    script = SERVICE.format(root=str(ROOT), name=account.name, uid=account.uid, gid=account.gid)
    service = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert service.stdout is not None
        pids = [int(p) for p in service.stdout.readline().split()]
        assert len(pids) == 2 and psutil.Process(pids[0]).uids().real == account.uid
    finally:
        service.kill()
        service.wait(10)
    assert gone(pids[0]) and gone(pids[1])  # the helper, and the helper server that forked it


def test_a_normal_exit_of_the_service_ends_even_a_stopped_helper(world: World) -> None:
    """A helper its user stopped reads no end of file; the service's exit kills it (atexit)."""
    account = world.accounts["b"]
    script = SERVICE.format(root=str(ROOT), name=account.name, uid=account.uid, gid=account.gid)
    script = script.replace("time.sleep(60)", "sys.stdin.read()")  # exits when we close it
    service = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    pids: list[int] = []
    try:
        assert service.stdout is not None and service.stdin is not None
        pids = [int(p) for p in service.stdout.readline().split()]  # the helper, the server
        os.kill(pids[0], signal.SIGSTOP)
        service.stdin.close()
        assert service.wait(10) == 0
        assert pids and all(gone(pid, within=2.0) for pid in pids)
    finally:
        service.kill()
        service.wait(10)
        for pid in pids:  # the test's own clean-up, should the service not have ended them
            if not gone(pid, within=0):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


# -- the checks of the operations, through a pooled helper -----------------------------------------
def test_a_linked_log_is_refused_and_a_fifo_does_not_hang(world: World, pool: HelperPool) -> None:
    files = UserFiles(world.accounts["a"], pool)
    workdir = write_log(world, pool, "a", "planted", "ok\n")
    log = Path(workdir) / "logs" / "worker-0.log"
    as_account(world.accounts["a"], f"rm {log} && ln -s /etc/shadow {log}")
    with pytest.raises(UserFileError, match="symbolic link"):
        files.read_logs(workdir, worker=0)
    as_account(world.accounts["a"], f"rm {log} && mkfifo {log}")
    with pytest.raises(UserFileError, match="not a regular file"):
        files.read_logs(workdir, worker=0)
    # a hard link to another account's readable file (what a user could plant where
    # fs.protected_hardlinks is off): readable, but not the reader's, so not read
    other = world.accounts["b"]
    theirs = world.folder("b") / "theirs.txt"
    theirs.write_text("b's words\n")
    os.chown(theirs, other.uid, other.gid)
    theirs.chmod(0o644)
    planted = Path(workdir) / "logs" / "worker-1.log"
    os.link(theirs, planted)
    try:
        text = files.read_logs(workdir)
        assert "not owned by the job's user" in text and "b's words" not in text
    finally:
        planted.unlink()
        theirs.unlink()


def test_a_command_outside_the_folder_is_refused(world: World, pool: HelperPool) -> None:
    account = world.accounts["a"]
    files = UserFiles(account, pool)
    root = world.folder("a")
    as_account(account, f"mkdir -p {root}/code && echo pass > {root}/code/main.py "
               f"&& ln -sfn /etc {root}/escape")  # fmt: skip
    assert files.resolve_command(str(root), "code", "main.py") == (
        str(root / "code"), str(root / "code" / "main.py"),
    )  # fmt: skip
    for model_dir in ("../b", "/etc", "escape"):
        with pytest.raises(UserFileError, match="outside your folder"):
            files.resolve_command(str(root), model_dir, "passwd")
    with pytest.raises(UserFileError, match="not a folder"):
        files.resolve_command(str(root), "nowhere", "main.py")
