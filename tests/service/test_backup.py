"""``wmla backup`` (issue 38, item 6): copies of both databases taken while the hub and the
service run, restored into a fresh runtime folder: the next hub has the jobs, the users and
their tokens. Every process is stopped by PID at the end (``Hub.stop``)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from extension.backup import BackupError, backup

from .hub import PROXY, Client, Hub
from .test_api import SCRIPT, job_body

ROOT = Path(__file__).resolve().parents[2]
TRAITS = {"tick": 1, "grace": 1, "device_layout": "1x4", "lease_seconds": 3}


def wmla_backup(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "extension.cli", "backup", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing")
def test_a_backup_taken_while_running_restores_into_a_fresh_runtime_folder(
    tmp_path: Path,
) -> None:
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first, second = Hub(tmp_path / "first", TRAITS), Hub(tmp_path / "second", TRAITS)
    saved = tmp_path / "saved"
    try:
        first.start()
        token = first.user_token("user1")
        user1 = Client(first, token)
        folder = first.storage / "user1" / "models" / "hi"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "main.py").write_text(SCRIPT)
        r = user1.post("/jobs", json=job_body("/sample-project/training", seconds=0))
        assert r.status_code == 201, r.text
        done = r.json()["id"]
        assert user1.wait_state(done, {"FINISHED"})["state"] == "FINISHED"
        # the service keeps writing while the copy is taken: submissions and their cycles
        stop = threading.Event()

        def submit() -> None:
            while not stop.is_set():
                user1.post("/jobs", json=job_body("/sample-project/training", seconds=0))

        writer = threading.Thread(target=submit)
        writer.start()
        try:
            made = wmla_backup(str(saved), "--var", str(first.var))
        finally:
            stop.set()
            writer.join(60)
        assert made.returncode == 0, made.stderr
        assert "To restore: stop the hub" in made.stdout
        assert saved.stat().st_mode & 0o777 == 0o700
        names = sorted(p.name for p in saved.iterdir())
        assert {"jupyterhub.sqlite", "wmla.sqlite"} <= set(names), names
        assert any(n.startswith("hub-passwords.dbm") for n in names), names
        assert all(p.stat().st_mode & 0o777 == 0o600 for p in saved.iterdir())
        again = wmla_backup(str(saved), "--var", str(first.var))
        assert again.returncode == 1 and "already holds" in again.stderr  # never overwritten
        first.stop()

        # restore into a fresh runtime folder, then start a new hub there
        (second.var / "wmla").mkdir(parents=True)
        for path in saved.iterdir():
            dest = second.var / "wmla" if path.name == "wmla.sqlite" else second.var
            shutil.copy2(path, dest / path.name)
        second.start()
        back = Client(second, token)  # the token of before: the hub database came back
        row = back.get(f"/jobs/{done}")
        assert row.status_code == 200, row.text
        assert row.json()["state"] == "FINISHED"
        assert len(back.get("/jobs").json()["jobs"]) >= 2  # and those of during the copy
        users = requests.get(
            f"{second.url}/hub/api/users/user1",
            headers={"Authorization": f"token {second.token}"},
            timeout=30,
        )
        assert users.status_code == 200, users.text
    finally:
        first.stop()
        second.stop()


def test_a_missing_database_or_a_postgresql_store_says_what_to_do(tmp_path: Path) -> None:
    var = tmp_path / "var"
    var.mkdir()
    sqlite3.connect(var / "jupyterhub.sqlite").close()
    with pytest.raises(BackupError, match=r"not found: wmla service store .*pg_dump"):
        backup(tmp_path / "out", var)
    made = wmla_backup(str(tmp_path / "out"), "--var", str(tmp_path / "nowhere"))
    assert made.returncode == 1 and made.stderr.startswith("wmla backup: not found: hub database")


def test_a_folder_others_can_write_is_refused_before_anything_is_copied(tmp_path: Path) -> None:
    """An attacker's folder (or one they can write) could swap a copy's name for a link to a
    file of root's between the check and the write: refused, nothing written."""
    var = tmp_path / "var"
    (var / "wmla").mkdir(parents=True)
    sqlite3.connect(var / "jupyterhub.sqlite").close()
    sqlite3.connect(var / "wmla" / "wmla.sqlite").close()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    target = tmp_path / "precious"
    target.write_text("root's\n")
    (shared / "planted").symlink_to(target)
    with pytest.raises(BackupError, match="only you can enter and write"):
        backup(shared, var)
    assert sorted(p.name for p in shared.iterdir()) == ["planted"]
    assert target.read_text() == "root's\n"
    with pytest.raises(BackupError, match="only you can enter and write"):
        backup(shared / "below", var)  # made 0700, but its parent is open to all
    made = backup(tmp_path / "mine", var)
    assert len(made) == 2
