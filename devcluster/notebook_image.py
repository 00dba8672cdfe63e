"""The notebook image of the real node, built offline like the others (devcluster/images.py):
this machine's python3 and, from the project's venv, what a user's notebook server imports:
JupyterHub's single-user server with JupyterLab, ipykernel, the widgets (with their JupyterLab
extensions and server settings), plotly, and the project's magics, widgets and ``wmla`` CLI.
No PyTorch: training runs in the worker image's pods, never in the notebook's.

``WmlaKubeSpawner`` runs it as the user's uid (no account in the image: HOME is the user's
folder), with ``jupyterhub-singleuser`` on its PATH.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from .images import (
    PYTHON_CONFIG,
    Layer,
    archive,
    cached,
    closure,
    needed_libraries,
    python_files,
)

NOTEBOOK = "wmla.local/notebook:dev"
# what the server and a kernel import; their requirements come with them
DISTRIBUTIONS = (
    "jupyterhub", "jupyterlab", "jupyter-server", "ipykernel", "ipywidgets", "anywidget",
    "plotly", "requests", "psutil", "pyyaml", "traitlets", "tornado",
)  # fmt: skip
# the project's packages a notebook uses (the spawner and hub_config stay on the hub)
PACKAGES = ("extension", "widgets")
SCRIPTS = {
    "jupyterhub-singleuser": "from jupyterhub.singleuser import main",
    "wmla": "from extension.cli import main",
}
# a shell and the tools the spawner's postStart hook and a terminal use, with their libraries
TOOLS = (
    "/bin/sh", "/bin/bash", "/bin/mkdir", "/usr/bin/base64", "/bin/ls", "/bin/cat", "/bin/rm",
    "/bin/cp", "/bin/mv", "/usr/bin/env", "/usr/bin/head", "/usr/bin/tail",
)  # fmt: skip
RECIPE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
# data files a wheel installs beside the venv (../../../share/jupyter/..., ../../../etc/...)
# land under the image's sys.prefix (/usr), where Jupyter's paths look; scripts are ours
_PREFIXED = ("share/", "etc/")


def _sources(project: Path) -> list[Path]:
    return sorted(
        p
        for package in PACKAGES
        for p in (project / package).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def notebook_image(cache: Path, project: Path, python: str = "/usr/bin/python3") -> Path:
    """The notebook image's docker-archive, built if its inputs changed."""
    dists = closure(DISTRIBUTIONS, ("setuptools",), image="notebook")
    sources = _sources(project)
    digest = hashlib.sha256(RECIPE.encode())
    for dist in dists:
        digest.update(f"{dist.metadata['Name']}=={dist.version};".encode())
    for path in sources:
        digest.update(f"{path.relative_to(project)}:".encode() + path.read_bytes())
    key = digest.hexdigest()
    if found := cached(cache, "notebook", key):
        return found
    layer = Layer(cache / "notebook.layer")
    stdlib_name = python_files(layer, python)
    site = f"usr/local/lib/{stdlib_name}/dist-packages"
    elf: list[str] = []
    for dist in dists:
        for f in dist.files or []:
            rel = str(f)
            if "__pycache__" in rel or rel.startswith("/"):
                continue
            src = Path(str(f.locate()))
            if not src.is_file():
                continue
            if rel.startswith("../../../"):
                outside = rel[len("../../../") :]
                if outside.startswith(_PREFIXED):
                    layer.file(f"usr/{outside}", src)
                continue
            if ".so" in src.name:
                elf.append(str(src))
            layer.file(f"{site}/{rel}", src)
    for path in sources:
        layer.file(f"{site}/{path.relative_to(project)}", path)
    tools = [t for t in TOOLS if os.path.exists(t)]
    for tool in tools:
        layer.host(tool)
    venv = str(Path(sys.prefix).resolve())
    for lib in sorted(needed_libraries(elf + [os.path.realpath(t) for t in tools])):
        if not os.path.realpath(lib).startswith(venv + "/"):
            layer.host(lib)  # a system library a compiled module links (libstdc++, ...)
    for name, line in SCRIPTS.items():
        script = f"#!/usr/bin/python3\n{line}\n\nraise SystemExit(main())\n"
        layer.data(f"usr/local/bin/{name}", script.encode(), 0o755)
    config = {**PYTHON_CONFIG, "Entrypoint": [], "Cmd": ["jupyterhub-singleuser"]}
    archive(cache / "notebook.tar", NOTEBOOK, layer.close(), config)
    (cache / "notebook.stamp").write_text(key)
    return cache / "notebook.tar"


if __name__ == "__main__":  # python -m devcluster.notebook_image [CACHE]: the image's path
    from .build import DEFAULT_CACHE

    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_CACHE / "images"
    print(notebook_image(target, Path(__file__).resolve().parent.parent))
