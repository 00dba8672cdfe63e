"""What makes the ``%wmla_*`` magics appear in every kernel without ``%load_ext``, and ``wmla``
in every login shell of the user's server.

The spawner points ``IPYTHONDIR`` at ``<user folder>/.ipython`` (where IPython looks anyway when
HOME is that folder) and writes one startup file into its default profile on every server start.
A startup file, not ``ipython_kernel_config.py``, so a user's own profile config is left alone;
and inside the user's folder because IPython ignores an ``IPYTHONDIR`` it cannot write (it falls
back to a temp dir), which a folder inside the installed package is for a per-user account.

Login shells (``bash -l``, ``sh -l``, ``#!/bin/bash -l`` scripts, ``su - <account>``) start
from /etc/profile, which sets PATH afresh, so the server's own ``wmla``, ``python`` and
``python3`` (spawner/bin, first on the server's PATH) were lost there. The user's ``~/.profile``,
read by every login shell after /etc/profile, puts them back while the shell runs inside the
user's server. It is offered once per user (a marker remembers it) and never over a ``.profile``
the user has, written by the user-files helper as the user's own account: nothing running as
root writes into the user's folder for it. Non-login shells, a notebook's ``!`` commands and
``subprocess`` calls from a kernel inherit the server's PATH and need nothing.
"""

from __future__ import annotations

import logging
import os
import shlex
from pathlib import Path

from extension.userfs.accounts import Account, AccountError
from extension.userfs.errors import UserFileError
from extension.userfs.files import UserFiles

log = logging.getLogger(__name__)

STARTUP_NAME = "00-wmla-magics.py"
MAGICS_MODULE = "extension.magics"
TERMINAL_BIN = Path(__file__).resolve().parent / "bin"  # wmla, python, python3 (spawner/bin)
LOGIN_PROFILE = ".profile"  # read by login shells of sh and bash (bash: unless .bash_profile)
LOGIN_MARKER = ".wmla/login-profile"  # written once the profile was offered

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
    """Write the startup file under ``folder`` (``ipython_dir`` must lie inside it), then offer
    the login profile (``offer_login_profile``: once, as the user).

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
                raise AccountError(
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
    offer_login_profile(Path(folder), account)
    return Path(folder) / Path(*parts) / STARTUP_NAME


# POSIX sh: read by `sh -l` as well as `bash -l`. The second half is what Debian's default
# ~/.profile (/etc/skel) does, which a user without one would otherwise not get either.
_PROFILE = """\
# ~/.profile: read by login shells (bash -l, sh -l, `#!/bin/bash -l` scripts, su - <you>).
# Offered once by wmla at a server start; it is yours to change or delete (not written again).
#
# A login shell starts from /etc/profile, which sets PATH afresh: inside your notebook server
# ($WMLA_PYTHON is set there) this puts the server's `wmla`, `python` and `python3` back in
# front. The hub's address and your token are in the server's environment already.
if [ -n "${{WMLA_PYTHON-}}" ] && [ -d {bin} ]; then
  case ":$PATH:" in
    *:{bin}:*) ;;
    *) PATH={bin}:"$PATH"; export PATH ;;
  esac
fi

# as Debian's default ~/.profile: bash reads ~/.bashrc; your own bin folders come first
if [ -n "${{BASH_VERSION-}}" ] && [ -f "$HOME/.bashrc" ]; then
  . "$HOME/.bashrc"
fi
if [ -d "$HOME/bin" ]; then
  PATH="$HOME/bin:$PATH"
fi
if [ -d "$HOME/.local/bin" ]; then
  PATH="$HOME/.local/bin:$PATH"
fi
"""


def login_profile(bin_dir: Path = TERMINAL_BIN) -> str:
    """The ``~/.profile`` offered to users: ``bin_dir`` first on PATH inside their server."""
    return _PROFILE.format(bin=shlex.quote(str(bin_dir)))


def offer_login_profile(folder: Path, account: Account | None) -> list[str]:
    """Write ``~/.profile`` into ``folder`` (the user's HOME) unless the user has one or it was
    offered before, as ``account`` (the user-files helper; None: in-process, the hub's own
    account). Returns what was written; a failure is logged, never raised (a convenience: the
    spawn goes on without it)."""
    try:
        return UserFiles.of(account).call(
            "install_missing",
            root=str(folder),
            files={LOGIN_PROFILE: login_profile()},
            marker=LOGIN_MARKER,
        )
    except UserFileError as err:
        log.warning("no login profile in %s: %s", folder, err)
        return []
