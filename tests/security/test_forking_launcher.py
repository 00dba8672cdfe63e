"""The node's launcher forks each worker's launcher (issue 31): what the worker's program finds
at its exec must be exactly what the launcher that the backend used to exec per worker gave it
(docs/security.md "The launcher").

Each case runs the same spec through both: ``python -I worker_launcher.py SPEC`` started as the
backend used to start it, and ``NodeLauncher.launch``. The program is ``/bin/sh`` describing
itself from /proc before it runs anything else (its credentials, groups, signal masks,
capabilities, cgroups, ``oom_score_adj``, limits, working directory, session, every open
descriptor and the environment it was executed with). The two descriptions must be equal once
the run's own names (folder, cgroup) are taken out, and each must be what the account and the
grant say: the account's uid and gid, exactly its groups, the worker's cgroup in every
hierarchy, 0 from /dev/null, 1 and 2 the log, the checkpoint channel and nothing else open, the
job's env and nothing of root's. Then the node's launcher's own life: it leaves nothing behind
when its backend goes, and one that dies before its answer leaves no worker running."""

from __future__ import annotations

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
import time
from pathlib import Path

import psutil
import pytest

from extension.backends.local.node_launcher import LAUNCHER, LAUNCHER_ENV, NodeLauncher
from extension.backends.local.worker_launcher import SIG_DFL, SIG_IGN, raw_sigaction
from extension.confine import USER_OOM_SCORE_ADJ, Grant, detect
from extension.userfs.accounts import create_account

from .raw_signals import RAW, ignored

AS_ROOT = os.geteuid() == 0 and shutil.which("useradd") is not None
CGROUPS = AS_ROOT and getattr(detect("probe"), "version", 0) in (1, 2)
pytestmark = pytest.mark.skipif(not AS_ROOT, reason="dropping to an account needs root")

# Simple commands only, the listing of descriptors first: a pipeline or a substitution would
# have the shell hold a pipe of its own while it is listed. The status is read by the shell's
# own loop: while it waits for a child, the shell blocks every signal itself.
DESCRIBE = textwrap.dedent(
    """\
    p=$$
    echo '== fd'
    ls -l /proc/$p/fd
    echo '== status'
    while IFS= read -r line; do
      case $line in Uid:*|Gid:*|Groups:*|SigBlk:*|SigIgn:*|Cap*|NoNewPrivs:*) echo "$line";; esac
    done < /proc/$p/status
    echo '== cgroup'
    cat /proc/$p/cgroup
    echo '== oom'
    cat /proc/$p/oom_score_adj
    echo '== limits'
    cat /proc/$p/limits
    echo '== cwd'
    readlink /proc/$p/cwd
    echo '== session'
    cut -d' ' -f5,6 /proc/$p/stat
    echo '== umask'
    umask
    echo '== environ'
    tr '\\0' '\\n' < /proc/$p/environ
    echo '== end'
    """
)
JOB_ENV = {"WMLA_JOB_ID": "t31", "OMP_NUM_THREADS": "1", "SECRET": "the job's own"}


@pytest.fixture(scope="module")
def account():
    """A fresh account with a supplementary group of its own, and a folder it owns."""
    name = f"wf{secrets.token_hex(3)}"
    extra = f"{name}x"
    base = Path(tempfile.mkdtemp(prefix="wmla-fork-"))
    base.chmod(0o711)
    subprocess.run(["groupadd", extra], check=True, capture_output=True)
    try:
        acct = create_account(name, base / "home")
        subprocess.run(["usermod", "-aG", extra, name], check=True, capture_output=True)
        yield acct, base
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", extra], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def job_spec(acct, base: Path, run: str, cgroup=None) -> dict:
    """One worker's launch spec, as ``Launcher._spawn`` makes it."""
    work = base / run
    work.mkdir()
    os.chown(work, acct.uid, acct.gid)
    state = base / f"{run}-state"
    state.mkdir(mode=0o700)
    spec = {
        "argv": ["/bin/sh", "-c", DESCRIBE],
        "env": dict(JOB_ENV),
        "cwd": str(work),
        "log": str(work / "worker-0.log"),
        "header": "",
        "exit_file": str(state / "worker-0.exit"),
        "report_file": str(state / "worker-0.checkpoint"),
        "uid": acct.uid,
        "gid": acct.gid,
        "groups": os.getgrouplist(acct.name, acct.gid),
    }
    if cgroup is not None:
        spec.update(cgroup_procs=list(cgroup.enter_files()), oom_score_adj=USER_OOM_SCORE_ADJ)
    return spec


def exec_launcher(spec: dict, folder: Path) -> None:
    """The launcher as the backend started one per worker before the node's launcher."""
    path = folder / "spec.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(spec, out)
    subprocess.run(
        [sys.executable, "-I", LAUNCHER, str(path)],
        cwd="/",
        env=LAUNCHER_ENV,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        timeout=60,
    )


def fork_launcher(node: NodeLauncher, spec: dict) -> None:
    launched = node.launch(spec)
    assert launched.wait(60) is not None


def described(spec: dict, names: tuple[str, ...]) -> dict[str, list[str]]:
    """The description the worker wrote, by section, with the run's own ``names`` replaced."""
    exit_record = json.loads(Path(spec["exit_file"]).read_text())
    assert exit_record["code"] == 0 and not exit_record["error"], exit_record
    text = Path(spec["log"]).read_text()
    for i, name in enumerate(names):
        text = text.replace(name, f"<{i}>")
    sections: dict[str, list[str]] = {}
    for block in text.split("== ")[1:]:
        title, *lines = block.rstrip("\n").split("\n")
        sections[title] = lines
    sections["fd"] = sorted(
        re.sub(r"^.* (\d+) -> ", r"\1 -> ", line) for line in sections["fd"] if "->" in line
    )
    sections["environ"] = sorted(sections["environ"])
    session, group = sections["session"][0].split()
    sections["session"] = ["its own" if session == group else f"{session} {group}"]
    # the socket's inode is this run's; its descriptor's number must be the same
    sections["fd"] = [re.sub(r"socket:\[\d+\]", "socket", fd) for fd in sections["fd"]]
    return sections


def both(acct, base: Path, node: NodeLauncher, confinement=None) -> tuple[dict, dict]:
    """The worker's description through the exec'd launcher and through the forked one."""
    base = base / secrets.token_hex(3)
    base.mkdir(mode=0o711)
    out = []
    for run, start in (("exec", exec_launcher), ("fork", None)):
        group = None
        if confinement is not None:
            group = confinement.create(f"t31-{run}", Grant(250, 64 << 20, pids=64))
        spec = job_spec(acct, base, run, group)
        if start is exec_launcher:
            exec_launcher(spec, base / f"{run}-state")
        else:
            fork_launcher(node, spec)
        names = (str(base / run), f"t31-{run}")
        out.append(described(spec, names))
        if group is not None:
            group.remove()
    return out[0], out[1]


def check_what_the_account_gets(description: dict, acct) -> None:
    status = dict(line.split(":", 1) for line in description["status"])
    assert status["Uid"].split() == [str(acct.uid)] * 4  # real, effective, saved, filesystem
    assert status["Gid"].split() == [str(acct.gid)] * 4
    groups = sorted(map(int, status["Groups"].split()))
    assert groups == sorted(set(os.getgrouplist(acct.name, acct.gid))) and len(groups) == 2
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
    # no signal blocked or ignored: not Python's SIGPIPE and SIGXFSZ, nor any the service inherited
    assert int(status["SigBlk"], 16) == 0 and int(status["SigIgn"], 16) == 0
    # 0 from /dev/null, the log on 1 and 2, rank 0's checkpoint channel: nothing of root's
    fds = description["fd"]
    assert fds[:3] == ["0 -> /dev/null", "1 -> <0>/worker-0.log", "2 -> <0>/worker-0.log"], fds
    assert len(fds) == 4 and re.fullmatch(r"\d+ -> socket", fds[3]), fds
    env = dict(line.split("=", 1) for line in description["environ"])
    channel = fds[3].split(" ")[0]
    assert env == {**JOB_ENV, "WMLA_REPORT_FD": channel}  # the job's env and nothing else
    assert description["cwd"] == ["<0>"]
    assert description["umask"] == ["0077"]
    assert description["session"] == ["its own"]  # the launcher's session, its group


def test_the_forked_launcher_gives_the_worker_what_the_execd_one_did(account) -> None:
    acct, base = account
    node = NodeLauncher()
    try:
        execd, forked = both(acct, base, node)
    finally:
        node.close()
    assert forked == execd
    check_what_the_account_gets(forked, acct)


@pytest.mark.skipif(not CGROUPS, reason="no cgroups to enter on this machine")
def test_the_forked_launchers_worker_is_in_its_cgroup_before_it_runs(account) -> None:
    acct, base = account
    confinement = detect(f"t31-{secrets.token_hex(3)}", users_memory=0)
    node = NodeLauncher()
    try:
        execd, forked = both(acct, base, node, confinement)
    finally:
        node.close()
        confinement.prune()
    assert forked == execd
    check_what_the_account_gets(forked, acct)
    assert forked["oom"] == [str(USER_OOM_SCORE_ADJ)]
    controllers = ("cpu", "memory", "pids", "devices") if confinement.version == 1 else ("",)
    for controller in controllers:
        lines = [ln for ln in forked["cgroup"] if controller in ln.split(":")[1].split(",")]
        assert lines and all(ln.endswith("/<1>") for ln in lines), forked["cgroup"]


@pytest.mark.skipif(not RAW, reason="rt_sigaction's number on this machine is not known")
def test_signals_the_service_inherited_ignored_are_not_the_workers(account) -> None:
    """An ignored disposition survives fork and exec: a supervisor that starts the service with
    some signals ignored (one CI runner ignores 32, glibc's own) must not hand them to the
    user's code. Both launchers inherit them here, the worker gets none."""
    acct, base = account
    before = ignored()
    planted = [sig for sig in (signal.SIGUSR1, signal.SIGTERM, 32, 33) if sig not in before]
    for sig in planted:
        raw_sigaction(sig, SIG_IGN)
    try:
        assert set(planted) <= ignored()
        node = NodeLauncher()
        try:
            execd, forked = both(acct, base, node)
        finally:
            node.close()
    finally:
        for sig in planted:
            raw_sigaction(sig, SIG_DFL)
    assert ignored() == before
    assert forked == execd
    check_what_the_account_gets(forked, acct)


def test_the_forked_launcher_holds_nothing_of_the_node_launchers(account) -> None:
    """The worker's launcher (root) keeps none of the node's launcher's pipes: it outlives it
    and the service, and their ends must close when they go."""
    acct, base = account
    node = NodeLauncher()
    try:
        spec = job_spec(acct, base, "holds", None)
        spec["argv"] = ["/bin/sleep", "30"]
        launched = node.launch(spec)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until it forked and its worker exec'd
            kids = psutil.Process(launched.pid).children()
            if kids and kids[0].name() == "sleep":
                break
            time.sleep(0.02)
        server = psutil.Process(node.pid)
        theirs = {os.readlink(f"/proc/{server.pid}/fd/{fd}") for fd in (0, 1)}
        ours = {os.readlink(f"/proc/{launched.pid}/fd/{fd}") for fd in os.listdir(
            f"/proc/{launched.pid}/fd")}  # fmt: skip
        assert not ours & theirs, ours
        assert {os.readlink(f"/proc/{launched.pid}/fd/{fd}") for fd in (0, 1, 2)} == {"/dev/null"}
        assert psutil.Process(launched.pid).ppid() == server.pid
        assert os.getsid(launched.pid) == launched.pid
        assert psutil.Process(launched.pid).environ() == LAUNCHER_ENV
        assert psutil.Process(launched.pid).cwd() == "/"
        os.killpg(launched.pid, signal.SIGKILL)
        assert launched.wait(10) is not None
    finally:
        node.close()


SERVICE = textwrap.dedent(
    """\
    import sys, time
    from extension.backends.local.node_launcher import NodeLauncher
    node = NodeLauncher()
    launched = node.launch({"argv": ["/bin/sleep", "60"], "env": {}, "cwd": "/",
                            "log": sys.argv[1], "exit_file": sys.argv[2]})
    print(node.pid, launched.pid, flush=True)
    time.sleep(600)
    """
)


def test_a_dead_service_leaves_no_node_launcher_but_its_workers_run_on(tmp_path: Path) -> None:
    """The node's launcher ends with its service (its stdin closes); the worker's launcher it
    forked and the worker go on, as they always did, to be re-adopted."""
    service = subprocess.Popen(
        [sys.executable, "-c", SERVICE, str(tmp_path / "log"), str(tmp_path / "exit")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    server, launcher = map(int, service.stdout.readline().split())
    try:
        service.kill()
        service.wait(10)
        deadline = time.monotonic() + 10
        while psutil.pid_exists(server) and time.monotonic() < deadline:
            if psutil.Process(server).status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.05)
        assert not psutil.pid_exists(server) or (
            psutil.Process(server).status() == psutil.STATUS_ZOMBIE
        )
        assert psutil.Process(launcher).status() != psutil.STATUS_ZOMBIE
        assert [p.name() for p in psutil.Process(launcher).children()] == ["sleep"]
    finally:
        for proc in psutil.Process(launcher).children():
            proc.kill()


def test_a_node_launcher_that_dies_before_its_answer_starts_nothing(tmp_path: Path) -> None:
    """The go comes after the answer: a node's launcher that cannot answer (here its reader
    is gone) never lets the launcher it forked start the worker."""
    marker = tmp_path / "ran"
    server = subprocess.Popen(
        [sys.executable, "-I", LAUNCHER, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=LAUNCHER_ENV,
        cwd="/",
    )
    server.stdout.close()  # its answer has nowhere to go
    spec = {"argv": ["/bin/touch", str(marker)], "env": {}, "cwd": "/",
            "log": str(tmp_path / "log"), "exit_file": str(tmp_path / "exit")}  # fmt: skip
    body = json.dumps({"id": 1, "spec": spec}).encode()
    server.stdin.write(len(body).to_bytes(4, "big") + body)
    server.stdin.flush()
    assert server.wait(10) != 0
    time.sleep(0.5)
    assert not marker.exists() and not (tmp_path / "exit").exists()
