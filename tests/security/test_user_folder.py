"""Root makes and hands over a user's folder (accounts.ensure_folder): what is planted in its
place, by whoever could write the storage root, is refused and never followed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from extension.userfs.accounts import Account, AccountError, ensure_folder

NOBODY = Account("nobody", 65534, 65534)


@pytest.mark.parametrize("plant", ["link-to-dir", "link-to-file", "file", "dangling-link"])
def test_a_thing_planted_as_a_users_folder_is_refused_and_left_alone(
    tmp_path: Path, plant: str
) -> None:
    storage = tmp_path / "storage"
    storage.mkdir(mode=0o711)
    target = tmp_path / "roots-own"  # what root must never chmod or chown
    target.mkdir(mode=0o755)
    secret = target / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o640)
    folder = storage / "alice"
    if plant == "link-to-dir":
        folder.symlink_to(target)
    elif plant == "link-to-file":
        folder.symlink_to(secret)
    elif plant == "dangling-link":
        folder.symlink_to(tmp_path / "nowhere")
    else:
        folder.write_text("not a folder\n")
    with pytest.raises(AccountError, match="is not a folder"):
        ensure_folder(storage, "alice", NOBODY)
    for path, mode in ((target, 0o755), (secret, 0o640)):
        info = os.stat(path)
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (mode, os.geteuid())
    assert not (tmp_path / "nowhere").exists()


def test_a_users_folder_is_made_private_and_theirs(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    storage.mkdir(mode=0o711)
    (storage / "alice").mkdir(mode=0o755)  # made earlier, looser
    folder = ensure_folder(storage, "alice", NOBODY if os.geteuid() == 0 else None)
    info = os.stat(folder)
    assert stat.S_IMODE(info.st_mode) == 0o700
    if os.geteuid() == 0:
        assert (info.st_uid, info.st_gid) == (NOBODY.uid, NOBODY.gid)
    for bad in ("", "..", "a/b", "x\x00"):
        with pytest.raises(AccountError, match="cannot name one folder"):
            ensure_folder(storage, bad, None)
