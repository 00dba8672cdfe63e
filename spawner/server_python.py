"""The command a local notebook server runs with: the configured one when the server's account
can start it, else a Python that account can run over the hub's packages (PYTHONPATH = the
hub's package folders and the project, and Jupyter's paths of the hub's environment)."""

from __future__ import annotations

import os
import shutil
import site
import sys
from dataclasses import dataclass, field
from pathlib import Path

from extension.userfs.accounts import (
    Account,
    AccountError,
    account_python,
    folder_unreachable,
    unreachable,
)

from .mixin.spawn_log import SpawnLog

PROJECT = Path(__file__).resolve().parents[1]  # holds spawner/ and extension/ (editable install)


@dataclass(frozen=True)
class ServerCommand:
    """The server's command line, the interpreter it runs (for ``wmla`` in its terminals), and
    the environment a swapped interpreter needs ("" and {} for the configured command)."""

    cmd: list[str]
    python: str = sys.executable
    pythonpath: str = ""
    jupyter_env: dict[str, str] = field(default_factory=dict)


def hub_package_paths() -> list[str]:
    """Where the hub's Python packages are: what a server started with another interpreter
    needs on PYTHONPATH. The hub's own ``PYTHONPATH`` (a hub run by a system Python over a
    virtualenv's packages, as when it does not run as root), the folder JupyterHub was imported
    from, the virtualenv's site-packages when the hub runs in one, and the project (installed
    editable: the ``.pth`` file that finds it is read only in a site folder)."""
    import jupyterhub

    given = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [*given, str(Path(jupyterhub.__file__).resolve().parents[1])]
    if sys.prefix != sys.base_prefix:  # a virtualenv: its site-packages (the system's are not)
        paths += site.getsitepackages()
    paths.append(str(PROJECT))
    return [p for p in dict.fromkeys(os.path.abspath(p) for p in paths) if os.path.isdir(p)]


def hub_prefixes() -> list[str]:
    """The environments holding the hub's packages: for each package folder
    ``<prefix>/lib/pythonX.Y/site-packages``, its ``<prefix>``, then ``sys.prefix`` (a system
    Python running a virtualenv's packages has ``sys.prefix`` = /usr, while JupyterLab's files
    are the virtualenv's)."""
    prefixes = []
    for path in hub_package_paths():
        parts = Path(path).parts
        if len(parts) > 3 and parts[-1] in ("site-packages", "dist-packages"):
            if parts[-3] == "lib" and parts[-2].startswith("python"):
                prefixes.append(str(Path(*parts[:-3])))
    return list(dict.fromkeys([*prefixes, sys.prefix]))


def hub_jupyter_paths() -> dict[str, str]:
    """Where the hub's environment keeps Jupyter's configuration and data, for a server that
    runs another interpreter over the hub's packages. Jupyter finds them from ``sys.prefix``,
    which is then the other Python's, so without these the server starts without JupyterLab,
    the terminals or the widgets' front-end (their ``jupyter_server_config.d`` entries and lab
    extensions live in the hub's environment)."""
    found = [Path(p) for p in hub_prefixes() if (Path(p) / "share" / "jupyter").is_dir()]
    found = found or [Path(sys.prefix)]
    lab = next((p for p in found if (p / "share" / "jupyter" / "lab").is_dir()), found[0])
    return {
        "JUPYTER_CONFIG_PATH": os.pathsep.join(str(p / "etc" / "jupyter") for p in found),
        "JUPYTER_PATH": os.pathsep.join(str(p / "share" / "jupyter") for p in found),
        "JUPYTERLAB_DIR": str(lab / "share" / "jupyter" / "lab"),
    }


def server_command(
    configured: list[str], runner: Account, wanted: str, user: str, log: SpawnLog
) -> ServerCommand:
    """The command ``runner`` (the server's account) runs: ``configured`` when it can start
    it, else ``<python> -m jupyterhub.singleuser`` with ``wanted`` (c.WmlaLocalSpawner
    .account_python: "auto", a path, or "" for never: AccountError with the reason)."""
    if not configured:
        return ServerCommand(list(configured))
    why = unreachable(configured[0], runner)
    if why and os.sep not in configured[0] and shutil.which(configured[0]) is None:
        why = f"{configured[0]} is not on the hub's PATH"
    if not why:
        return ServerCommand(list(configured))
    paths = hub_package_paths()
    python = None
    if wanted == "auto" and unreachable(sys.executable, runner) is None:
        if not any(folder_unreachable(p, runner) for p in paths):
            python = sys.executable  # the hub's own interpreter (e.g. the hub not root)
    if python is None and wanted:
        python = account_python(runner, wanted, paths)
    if python is None:
        raise AccountError(
            f"{user}'s server would run as account {runner.name}, "
            f"which cannot start {configured[0]}: {why}. Install Python where every "
            "account can read it (or set c.WmlaLocalSpawner.account_python to one), or set "
            "c.WmlaLocalSpawner.system_users = False"
        )
    log.warning("%s cannot run %s (%s); running the server with %s over the hub's packages",
                runner.name, configured[0], why, python)  # fmt: skip
    return ServerCommand(
        cmd=[python, "-m", "jupyterhub.singleuser"],
        python=python,
        pythonpath=os.pathsep.join(paths),
        jupyter_env=hub_jupyter_paths(),
    )
