"""State is private: no other account on the machine reads the store, the hub's database, its
cookie secret or the passwords (extension/service/privacy.py; docs/service.md "State files").

Real files in temporary folders; the last test starts the real hub from jupyterhub_config.py
and looks at every file the hub, the proxy and the service left in its runtime folder.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from extension.service import privacy
from extension.service.app import WmlaService
from extension.service.privacy import (
    HIDEPID_ADVICE,
    make_dir,
    privatize_tree,
    proc_hides_other_processes,
)
from extension.service.store import Store, sqlite_url
from hub_config import PASSWORD_DB, PASSWORD_DB_FILES, private_hub_state
from hub_config.auth import seed_admin_passwords

from .hub import PROXY, Hub


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def open_to_others(top: Path, skip: Path | None = None) -> list[str]:
    """Every file or folder under ``top`` (itself included) with a group or other bit."""
    found = []
    for folder, dirs, files in os.walk(top):
        if skip is not None and Path(folder) == skip:
            dirs[:] = []
            continue
        for name in [*dirs, *files]:
            path = Path(folder) / name
            if not path.is_symlink() and path != skip and mode(path) & 0o077:
                found.append(f"{path} {oct(mode(path))}")
    if mode(top) & 0o077:
        found.append(f"{top} {oct(mode(top))}")
    return found


@pytest.fixture
def umask022() -> Iterator[None]:
    """The usual default umask, so that what is private is so by the code, not by the runner."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def umask077() -> Iterator[None]:
    """The umask the service and the hub set for themselves."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def test_the_state_fixer_makes_a_loose_db_file_and_folders_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "backend" / "jobs").mkdir(parents=True)
    for folder in (state, state / "backend", state / "backend" / "jobs"):
        os.chmod(folder, 0o755)
    for name in ("wmla.sqlite", "wmla.sqlite-wal", "backend/jobs/j1.json"):
        (state / name).write_text("secret")
        os.chmod(state / name, 0o644)
    os.chmod(state / "backend" / "jobs" / "j1.json", 0o755)

    fix = privatize_tree(state)

    assert mode(state) == 0o700 and mode(state / "backend" / "jobs") == 0o700
    assert mode(state / "wmla.sqlite") == 0o600 and mode(state / "wmla.sqlite-wal") == 0o600
    assert mode(state / "backend" / "jobs" / "j1.json") == 0o600
    assert len(fix.fixed) == 6 and not fix.failed and not fix.symlinks
    assert privatize_tree(state).fixed == []  # nothing left to fix


def test_the_state_fixer_skips_symlinks_and_leaves_their_targets_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours")
    os.chmod(outside, 0o644)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chmod(elsewhere, 0o755)
    (elsewhere / "inner.txt").write_text("not ours either")
    os.chmod(elsewhere / "inner.txt", 0o644)
    (state / "file-link").symlink_to(outside)
    (state / "dir-link").symlink_to(elsewhere)

    fix = privatize_tree(state)

    assert mode(outside) == 0o644 and mode(elsewhere) == 0o755
    assert mode(elsewhere / "inner.txt") == 0o644  # a linked folder is not walked either
    assert sorted(fix.symlinks) == [str(state / "dir-link"), str(state / "file-link")]
    assert mode(state) == 0o700

    linked_state = tmp_path / "linked-state"
    linked_state.symlink_to(elsewhere)
    assert privatize_tree(linked_state).symlinks == [str(linked_state)]
    assert mode(elsewhere) == 0o755


def test_the_state_fixer_never_enters_a_storage_root_inside_the_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    storage = state / "storage"
    (storage / "user1").mkdir(parents=True)
    for folder in (state, storage, storage / "user1"):
        os.chmod(folder, 0o755)
    (storage / "user1" / "notes.txt").write_text("the user's")
    os.chmod(storage / "user1" / "notes.txt", 0o644)

    fix = privatize_tree(state, keep_out=[storage])

    assert mode(state) == 0o700 and fix.kept_out == [str(storage)]
    assert mode(storage) == 0o755 and mode(storage / "user1" / "notes.txt") == 0o644
    assert privatize_tree(storage, keep_out=[storage]).kept_out == [str(storage)]
    assert mode(storage) == 0o755


@pytest.mark.usefixtures("umask022")
def test_a_store_opened_in_a_new_state_dir_leaves_db_wal_and_shm_private(tmp_path: Path) -> None:
    state = tmp_path / "new" / "state"
    store = Store.open(sqlite_url(state / "wmla.sqlite"))
    try:
        store.set_meta("probe", "a write, so that the WAL exists")
        assert store.get_meta("probe")
        names = {p.name for p in state.iterdir()}
        assert {"wmla.sqlite", "wmla.sqlite-wal", "wmla.sqlite-shm"} <= names, names
        assert open_to_others(state) == []
        assert mode(state / "wmla.sqlite-wal") == 0o600
        assert mode(state / "wmla.sqlite-shm") == 0o600
        assert mode(tmp_path / "new") == 0o711  # a parent made on the way: traversable only
    finally:
        store.close()


@pytest.mark.usefixtures("umask022")
def test_a_store_fixes_a_loose_existing_db_before_it_opens_it(tmp_path: Path) -> None:
    db = tmp_path / "wmla.sqlite"
    Store.open(sqlite_url(db)).close()
    for path in tmp_path.glob("wmla.sqlite*"):
        os.chmod(path, 0o644)
    store = Store.open(sqlite_url(db))
    try:
        store.set_meta("probe", "x")
        assert [p.name for p in tmp_path.glob("wmla.sqlite*") if mode(p) & 0o077] == []
    finally:
        store.close()


@pytest.mark.usefixtures("umask077")
def test_the_service_makes_its_state_dir_private_and_the_storage_root_traversable(
    tmp_path: Path,
) -> None:
    var = tmp_path / "var"
    old_state = var / "old-state"
    old_state.mkdir(parents=True)
    os.chmod(old_state, 0o755)
    (old_state / "wmla.sqlite").write_text("")
    os.chmod(old_state / "wmla.sqlite", 0o644)
    service = WmlaService()
    try:
        service.initialize(
            [f"--WmlaService.state_dir={var / 'wmla'}", f"--WmlaService.storage_root={var / 's'}"]
        )
        # under umask 0077 a plain mkdir would have made both 0700: nobody reaches their folder
        assert mode(var / "s") == 0o711
        assert mode(var / "wmla") == 0o700
        assert service.security_report()["state_dir_private"] is True
    finally:
        WmlaService.clear_instance()
    service = WmlaService()
    try:
        service.initialize(
            [f"--WmlaService.state_dir={old_state}", f"--WmlaService.storage_root={var / 's'}"]
        )
        assert mode(old_state) == 0o700 and mode(old_state / "wmla.sqlite") == 0o600
    finally:
        WmlaService.clear_instance()


def test_the_security_report_says_what_to_do(tmp_path: Path, monkeypatch) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (tmp_path / "storage").mkdir(mode=0o711)
    service = WmlaService(state_dir=str(state), storage_root=str(tmp_path / "storage"))
    monkeypatch.setattr(privacy, "proc_hides_other_processes", lambda: False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(os, "lstat", lambda p, real=os.lstat: _as_root(real(p)))
    report = service.security_report()
    assert report == {
        "runs_as_root": True,
        "proc_hidepid": False,
        "state_dir_private": True,
        "storage_root_safe": True,
        "jobs_run_as": "their users",
        "grants_enforced_by": "none",  # no backend yet: nothing said, nothing warned
        "enforced": {
            c: {"enforced": False, "how": "this backend does not say how grants are enforced"}
            for c in ("cpu", "memory", "pids", "devices")
        },
        "warnings": [HIDEPID_ADVICE],
    }
    assert "mount -o remount,hidepid=2 /proc" in HIDEPID_ADVICE and "gid=" in HIDEPID_ADVICE
    monkeypatch.setattr(privacy, "proc_hides_other_processes", lambda: True)
    assert service.security_report()["warnings"] == []
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    report = service.security_report()
    assert report["runs_as_root"] is False
    assert any("only the wmla API keeps users apart" in w for w in report["warnings"])
    assert any("uid 4242" in w for w in report["warnings"])


def _as_root(st: os.stat_result) -> os.stat_result:
    fields = list(st)
    fields[stat.ST_UID] = 0
    return os.stat_result(fields)


@pytest.mark.parametrize(
    ("options", "hidden"),
    [
        ("rw,nosuid,nodev,noexec,relatime,hidepid=2", True),
        ("rw,relatime,gid=27,hidepid=invisible", True),
        ("rw,relatime,hidepid=ptraceable", True),
        ("rw,nosuid,nodev,noexec,relatime", False),
        ("rw,relatime,hidepid=1", False),  # contents protected, processes still listed
        ("rw,relatime,hidepid=noaccess", False),
        ("rw,relatime,hidepid=0", False),
    ],
)
def test_the_hidepid_check_reads_the_proc_mount(options: str, hidden: bool) -> None:
    mounts = (
        "overlay / overlay rw,relatime,lowerdir=/l,upperdir=/u,workdir=/w 0 0\n"
        f"proc /proc proc {options} 0 0\n"
        "tmpfs /dev tmpfs rw,nosuid,size=65536k,mode=755 0 0\n"
        "proc /other/proc proc rw,relatime,hidepid=2 0 0\n"
    )
    assert proc_hides_other_processes(mounts) is hidden
    # the last /proc mount is the one on top
    assert proc_hides_other_processes(mounts + "proc /proc proc rw,hidepid=2 0 0\n") is True
    assert proc_hides_other_processes(mounts + "proc /proc proc rw,relatime 0 0\n") is False


def test_no_proc_mount_counts_as_not_hidden() -> None:
    assert proc_hides_other_processes("") is False
    assert isinstance(proc_hides_other_processes(), bool)  # this machine's, whatever it says


@pytest.mark.usefixtures("umask022")
def test_the_password_database_is_made_private_whatever_the_umask(tmp_path: Path) -> None:
    seed_admin_passwords(tmp_path / PASSWORD_DB, ["admin"], None)
    made = [tmp_path / name for name in PASSWORD_DB_FILES if (tmp_path / name).exists()]
    assert made and all(mode(path) == 0o600 for path in made)


@pytest.mark.usefixtures("umask022")
def test_the_hub_state_is_fixed_at_start_and_symlinks_are_refused(tmp_path: Path, capsys) -> None:
    var = tmp_path / "var"
    (var / "wmla").mkdir(parents=True)
    os.chmod(var, 0o755)
    os.chmod(var / "wmla", 0o755)
    (var / "hub-passwords.dbm.dat").write_text("")
    os.chmod(var / "hub-passwords.dbm.dat", 0o644)
    target = tmp_path / "secret-elsewhere"
    target.write_text("x")
    os.chmod(target, 0o644)
    (var / "jupyterhub_cookie_secret").symlink_to(target)

    warnings = private_hub_state(var)

    assert mode(var) == 0o711 and mode(var / "wmla") == 0o700
    assert mode(var / "hub-passwords.dbm.dat") == 0o600
    assert mode(var / "jupyterhub.sqlite") == 0o600  # created empty, before the hub opens it
    assert (var / "jupyterhub.sqlite").stat().st_size == 0
    assert mode(target) == 0o644 and (var / "jupyterhub_cookie_secret").is_symlink()
    assert any("jupyterhub_cookie_secret is a symbolic link" in w for w in warnings)
    assert "symbolic link" in capsys.readouterr().err

    fresh = tmp_path / "fresh" / "var"
    with_umask = os.umask(0o077)
    try:
        private_hub_state(fresh)
    finally:
        os.umask(with_umask)
    assert mode(fresh) == 0o711 and mode(fresh.parent) == 0o711
    assert make_dir(fresh, 0o711) is False  # exists: left as it is


@pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing")
def test_after_the_hub_and_service_start_no_state_file_is_open_to_others(tmp_path: Path) -> None:
    hub = Hub(tmp_path, {"tick": 1})
    # an older version's leftovers: a 0755 var/ and var/wmla, a 0644 store and password file,
    # and a user's file in the storage root, which is the user's business
    (hub.var / "wmla").mkdir(parents=True)
    (hub.storage / "user1").mkdir(parents=True)
    for folder in (hub.var, hub.var / "wmla", hub.storage, hub.storage / "user1"):
        os.chmod(folder, 0o755)
    (hub.var / "wmla" / "wmla.sqlite").write_text("")  # an empty file is a valid database
    (hub.storage / "user1" / "notes.txt").write_text("mine")
    for path in (hub.var / "wmla" / "wmla.sqlite", hub.storage / "user1" / "notes.txt"):
        os.chmod(path, 0o644)
    try:
        hub.start()
        files = {p.relative_to(hub.var).as_posix() for p in hub.var.rglob("*") if p.is_file()}
        assert {"jupyterhub.sqlite", "jupyterhub_cookie_secret", "hub-passwords.dbm.dat"} <= files
        assert {"jupyterhub-proxy.pid", "wmla/wmla.sqlite", "wmla/wmla.sqlite-wal"} <= files
        assert open_to_others(hub.var, skip=hub.storage) == [f"{hub.var} 0o711"]
        assert mode(hub.var) == 0o711 and mode(hub.var / "wmla") == 0o700
        # the storage root and what is in it were left as they were
        assert mode(hub.storage) == 0o755 and mode(hub.storage / "user1" / "notes.txt") == 0o644
        if os.geteuid() == 0 and not proc_hides_other_processes():
            assert "mount -o remount,hidepid=2 /proc" in hub.log_path.read_text(errors="replace")
    finally:
        hub.stop()


def test_a_storage_root_others_may_write_is_reported(tmp_path: Path) -> None:
    from extension.service.privacy import only_owner_writes

    safe = tmp_path / "safe" / "storage"
    safe.mkdir(parents=True)
    for folder in (safe, safe.parent):
        folder.chmod(0o711)
    assert only_owner_writes(safe)  # under pytest's temp folders and /tmp (sticky): fine
    open_root = tmp_path / "open"
    open_root.mkdir()
    open_root.chmod(0o777)
    assert not only_owner_writes(open_root)  # anyone could swap a user's folder for a link
    below = open_root / "storage"
    below.mkdir()
    below.chmod(0o711)
    assert not only_owner_writes(below)  # ... or the storage root itself, from its parent
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "storage").mkdir()
    assert only_owner_writes(sticky / "storage") and not only_owner_writes(sticky)
