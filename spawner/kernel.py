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

from .storage import Account, chown_tree

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
    """Write the startup file; new directories are the account's (``folder`` is the top)."""
    startup = ipython_dir / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    path = startup / STARTUP_NAME
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(script)
    os.replace(tmp, path)
    chown_tree(path, folder, account)
    return path
