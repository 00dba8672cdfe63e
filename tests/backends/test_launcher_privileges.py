"""The launcher never runs anything of a job as root (docs/security.md "The launcher").

The API refuses loader variables such as LD_AUDIT; these tests hand one straight to the backend,
as if it had got through, and prove with a compiled audit library (it writes the effective uid of
every process that loads it) that only the user's own worker ever saw it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from extension.backends.local import LAUNCHER_ENV

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("gcc") is None,
    reason="dropping to an account needs root; the audit library needs gcc",
)

AUDIT = r"""
#define _GNU_SOURCE
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
unsigned int la_version(unsigned int version) {
    const char *out = getenv("AUDIT_OUT");
    FILE *f = out ? fopen(out, "a") : NULL;
    if (f) { fprintf(f, "%d\n", (int)geteuid()); fclose(f); }
    return LAV_CURRENT;
}
"""
SLEEPER = "import time, sys\nprint('up', flush=True)\ntime.sleep(float(sys.argv[1]))\n"


@pytest.fixture
def audit(tmp_path: Path):
    """(library, output file, script) in a folder every account can read; the output folder
    is writable by all, so a root process that loaded the library would leave its uid there."""
    base = Path(tempfile.mkdtemp(prefix="wmla-audit-"))
    try:
        base.chmod(0o755)
        (base / "audit.c").write_text(AUDIT)
        library = base / "audit.so"
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-o", str(library), str(base / "audit.c")], check=True
        )
        library.chmod(0o755)
        out_dir = base / "out"
        out_dir.mkdir()
        out_dir.chmod(0o1777)
        script = base / "sleeper.py"
        script.write_text(SLEEPER)
        script.chmod(0o644)
        yield library, out_dir / "euids", script
    finally:
        shutil.rmtree(base, ignore_errors=True)


def nobody_job_dir(rig, job: str) -> Path:
    folder = rig.shared / "nobody"
    folder.mkdir(mode=0o700, exist_ok=True)
    entry = pwd.getpwnam("nobody")
    os.chown(folder, entry.pw_uid, entry.pw_gid)
    return folder / "jobs" / job


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


async def test_a_loader_variable_reaches_only_the_users_own_worker(local_rig, audit) -> None:
    library, out, script = audit
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no system python that another account could run")
    backend = local_rig.backend(run_as_user=True, python="/usr/bin/python3")
    workdir = nobody_job_dir(local_rig, "audited")
    env = {"LD_AUDIT": str(library), "AUDIT_OUT": str(out)}
    spec = local_rig.spec(
        "audited", ["python", str(script), "30"], user="nobody", env=env, workdir=workdir
    )
    await backend.start(spec, ("local",))
    await local_rig.wait_until(lambda: out.exists(), "the worker to load the audit library")
    [launcher] = backend.worker_pids("audited")
    # the launcher, root, started with the fixed environment and nothing of the job's
    assert psutil.Process(launcher).uids().effective == 0
    assert environ(launcher) == LAUNCHER_ENV
    [worker] = psutil.Process(launcher).children()
    assert worker.uids().effective == pwd.getpwnam("nobody").pw_uid
    assert environ(worker.pid)["LD_AUDIT"] == str(library)
    await backend.stop("audited", 1, "test over")
    euids = {int(line) for line in out.read_text().split()}
    assert euids == {pwd.getpwnam("nobody").pw_uid}  # loaded, and never by a root process


async def test_the_job_spec_file_with_the_env_is_gone_once_the_launcher_read_it(
    local_rig, audit
) -> None:
    _, _, script = audit
    backend = local_rig.backend(run_as_user=True, python="/usr/bin/python3")
    workdir = nobody_job_dir(local_rig, "spec-gone")
    spec = local_rig.spec(
        "spec-gone", ["python", str(script), "30"], user="nobody", env={"TOKEN": "s3cr3t"},
        workdir=workdir,
    )  # fmt: skip
    await backend.start(spec, ("local",))
    await local_rig.wait_until(
        lambda: "up" in backend.logs("spec-gone", worker=0), "the worker to start"
    )
    leftovers = [
        p for p in Path(backend.state_dir).rglob("*") if p.is_file() and "s3cr3t" in p.read_text()
    ]
    assert leftovers == []
    for path in Path(backend.state_dir).rglob("*"):
        assert path.stat().st_mode & 0o077 == 0, path  # the backend's state is private
    await backend.stop("spec-gone", 1, "test over")


def test_a_launcher_that_cannot_drop_never_runs_the_command(tmp_path: Path) -> None:
    """setgroups for a uid/gid the kernel refuses: the command must not run at all."""
    import json

    from extension.backends import local

    marker = tmp_path / "ran"
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "argv": ["/bin/sh", "-c", f"touch {marker}"],
                "env": {},
                "cwd": "/",
                "log": str(tmp_path / "log"),
                "exit_file": str(tmp_path / "exit"),
                "uid": 2**32,  # out of range: setuid fails
                "gid": 2**32,
                "groups": [],
            }
        )
    )
    done = subprocess.run([sys.executable, "-I", local.LAUNCHER, str(spec)], env=LAUNCHER_ENV)
    assert done.returncode == 127 and not marker.exists()
    record = json.loads((tmp_path / "exit").read_text())
    assert record["code"] == 127 and record["error"]
