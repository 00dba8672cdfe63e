"""What makes the ``%wmla_*`` magics appear in every kernel without ``%load_ext``.

The spawner points ``IPYTHONDIR`` at ``<user folder>/.ipython`` (where IPython looks anyway when
HOME is that folder) and writes one startup file into its default profile on every server start.
A startup file, not ``ipython_kernel_config.py``, so a user's own profile config is left alone;
and inside the user's folder because IPython ignores an ``IPYTHONDIR`` it cannot write (it falls
back to a temp dir), which a folder inside the installed package is for a per-user account.
"""

from __future__ import annotations

import os
from pathlib import Path

from .storage import Account, StorageError

STARTUP_NAME = "00-wmla-magics.py"
MAGICS_MODULE = "extension.magics"

# Runs in the kernel's namespace: everything is cleaned up, and a missing or broken magics
# module only leaves a one-line note (the kernel must start regardless).
_TEMPLATE = """\
# Written by the wmla spawner at every server start; edits are overwritten.
# Loads the %wmla_* magics (the same as `%load_ext {module}`).
def _wmla_load_magics():
    import importlib
    import sys

    ip = get_ipython()  # noqa: F821 - defined in IPython startup files
    if ip is None:
        return
    try:
        module = importlib.import_module("{module}")
    except ImportError as err:
        print(f"wmla: magics not available ({{err}})", file=sys.stderr)
        return
    if hasattr(module, "load_ipython_extension"):
        try:
            ip.extension_manager.load_extension("{module}")
        except Exception as err:
            print(f"wmla: loading the magics failed: {{err}}", file=sys.stderr)


_wmla_load_magics()
del _wmla_load_magics
"""


def startup_script(module: str = MAGICS_MODULE) -> str:
    return _TEMPLATE.format(module=module)


STARTUP_SCRIPT = startup_script()


def install_startup(
    ipython_dir: Path, folder: Path, account: Account | None, script: str = STARTUP_SCRIPT
) -> Path:
    """Write the startup file under ``folder`` (``ipython_dir`` must lie inside it).

    The folder belongs to the user, who could plant symlinks in it; as root we must not follow
    them (a symlinked ``startup`` would make the hub write and chown a file anywhere). So every
    step is opened relative to its parent with O_NOFOLLOW, and what we create is the account's.
    """
    rel = Path(ipython_dir).resolve().relative_to(Path(folder).resolve())
    parts = [*rel.parts, "profile_default", "startup"]
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
                created = True
            except FileExistsError:
                created = False
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as err:
                raise StorageError(
                    f"{folder}/{'/'.join(parts[: parts.index(part) + 1])} is not a folder "
                    f"({err.strerror}); remove it so the magics can be set up"
                ) from None
            if created and account is not None:
                os.fchown(child, account.uid, account.gid)
            os.close(fd)
            fd = child
        tmp = STARTUP_NAME + ".tmp"
        try:
            os.unlink(tmp, dir_fd=fd)
        except FileNotFoundError:
            pass
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
        with os.fdopen(out, "w") as f:
            f.write(script)
            if account is not None:
                os.fchown(f.fileno(), account.uid, account.gid)
        os.replace(tmp, STARTUP_NAME, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)
    return Path(folder) / Path(*parts) / STARTUP_NAME
