"""The real node's images, built on this machine with no registry and no base image: each is a
docker-archive tar (one layer) that ``ctr images import`` reads, with a fixed tag.

- ``PAUSE``: Kubernetes' own build/pause/linux/pause.c (from the k8s.io/kubernetes module in the
  Go module cache) compiled with ``gcc -static``: containerd's sandbox image.
- ``PYTHON``: this machine's python3 with the shared libraries it and its extension modules
  load, and its standard library: enough for a pod that reads its cgroup, allocates memory or
  lists a folder. Pods run it with ``imagePullPolicy: IfNotPresent`` (never pulled).

Both are cached in ``.cache/k8s/images/`` and rebuilt when their inputs change.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path

PAUSE = "wmla.local/pause:3.10"
PYTHON = "wmla.local/python:3.11"
# an image is built again when this file, its recipe, changes
RECIPE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()

# Not needed in a pod, and most of the standard library's size.
_STDLIB_SKIP = {
    "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data",
    "site-packages", "dist-packages", "config-3.11-x86_64-linux-gnu", "__phello__",
}  # fmt: skip


class ImageError(RuntimeError):
    """An image that could not be built; one line naming it and why."""


class Layer:
    """A reproducible layer tar: root-owned, mtime 0, each path once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tar = tarfile.open(path, mode="w", format=tarfile.PAX_FORMAT)
        self.seen: set[str] = set()

    def entry(self, name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name.lstrip("/"))
        info.type, info.mode, info.mtime, info.uid, info.gid = kind, mode, 0, 0, 0
        return info

    def dir(self, name: str, mode: int = 0o755) -> None:
        name = name.strip("/")
        if not name or name in self.seen:
            return
        self.dir(os.path.dirname(name))
        self.seen.add(name)
        self.tar.addfile(self.entry(name, tarfile.DIRTYPE, mode))

    def data(self, name: str, data: bytes, mode: int = 0o644) -> None:
        name = name.strip("/")
        self.dir(os.path.dirname(name))
        self.seen.add(name)
        info = self.entry(name, tarfile.REGTYPE, mode)
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))

    def file(self, name: str, src: Path) -> None:
        """``src``'s bytes at ``name`` (once), readable by every uid."""
        name = name.strip("/")
        if name in self.seen:
            return
        self.dir(os.path.dirname(name))
        self.seen.add(name)
        st = src.stat()
        info = self.entry(name, tarfile.REGTYPE, stat.S_IMODE(st.st_mode) | 0o444)
        info.size = st.st_size
        with open(src, "rb") as f:
            self.tar.addfile(info, f)

    def host(self, path: str) -> None:
        """``path`` as it is on this machine: each symbolic link on the way to it kept a link,
        and its target added too."""
        parts = Path(path).parts[1:]
        current = "/"
        for i, part in enumerate(parts):
            current = os.path.join(current, part)
            name = current.strip("/")
            st = os.lstat(current)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(current)
                if name not in self.seen:
                    self.dir(os.path.dirname(name))
                    self.seen.add(name)
                    info = self.entry(name, tarfile.SYMTYPE, 0o777)
                    info.linkname = target
                    self.tar.addfile(info)
                rest = os.path.join(os.path.dirname(current), target, *parts[i + 1 :])
                self.host(os.path.normpath(rest))
                return
            if stat.S_ISDIR(st.st_mode):
                self.dir(name, stat.S_IMODE(st.st_mode))
            elif stat.S_ISREG(st.st_mode) and name not in self.seen:
                self.dir(os.path.dirname(name))
                self.seen.add(name)
                info = self.entry(name, tarfile.REGTYPE, stat.S_IMODE(st.st_mode))
                info.size = st.st_size
                with open(current, "rb") as f:
                    self.tar.addfile(info, f)

    def link(self, name: str, target: str) -> None:
        name = name.strip("/")
        if name in self.seen:
            return
        self.dir(os.path.dirname(name))
        self.seen.add(name)
        info = self.entry(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self.tar.addfile(info)

    def close(self) -> Path:
        self.tar.close()
        return self.path


def archive(out: Path, tag: str, layer: Path, config: dict) -> None:
    """A docker-archive (``docker save`` format) of one layer, written atomically; the layer's
    file is removed."""
    digest = hashlib.sha256()
    with open(layer, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    diff_id = "sha256:" + digest.hexdigest()
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "devcluster/images.py", "created": "1970-01-01T00:00:00Z"}],
        "created": "1970-01-01T00:00:00Z",
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.split(":")[1] + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": [layer_name]}]
    tmp = out.with_name(out.name + ".tmp")
    outer = Layer(tmp)
    outer.data(config_name, config_bytes)
    outer.dir(os.path.dirname(layer_name))
    info = outer.entry(layer_name, tarfile.REGTYPE, 0o644)
    info.size = layer.stat().st_size
    with open(layer, "rb") as f:
        outer.tar.addfile(info, f)
    outer.data("manifest.json", json.dumps(manifest).encode())
    outer.close()
    os.replace(tmp, out)
    layer.unlink()


def cached(cache: Path, name: str, key: str) -> Path | None:
    out = cache / f"{name}.tar"
    stamp = cache / f"{name}.stamp"
    if out.exists() and stamp.exists() and stamp.read_text() == key:
        return out
    return None


def pause_image(cache: Path, kubernetes_dir: Path) -> Path:
    """The sandbox image from the Kubernetes module's pause.c."""
    source = kubernetes_dir / "build" / "pause" / "linux" / "pause.c"
    if not source.exists():
        raise ImageError(f"devcluster: no {source} in the Go module cache")
    key = hashlib.sha256(RECIPE.encode() + source.read_bytes()).hexdigest()
    if found := cached(cache, "pause", key):
        return found
    gcc = shutil.which("gcc")
    if not gcc:
        raise ImageError("devcluster: no gcc to build the pause image (apt-get install gcc)")
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "pause"
        out = subprocess.run(
            [gcc, "-Os", "-static", "-DVERSION=v3.10-wmla", "-o", str(binary), str(source)],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise ImageError(f"devcluster: gcc -static pause.c failed: {out.stderr.strip()[-300:]}")
        layer = Layer(cache / "pause.layer")
        layer.data("pause", binary.read_bytes(), 0o755)
    archive(cache / "pause.tar", PAUSE, layer.close(), {"Entrypoint": ["/pause"], "User": "0"})
    (cache / "pause.stamp").write_text(key)
    return cache / "pause.tar"


def needed_libraries(files: Iterable[str]) -> set[str]:
    """The shared libraries ``ldd`` says these ELF files load, the loader included."""
    libs: set[str] = set()
    for f in files:
        out = subprocess.run(["ldd", f], capture_output=True, text=True)
        for line in out.stdout.splitlines():
            match = re.search(r"(/\S+) \(0x", line)
            if match:
                libs.add(match[1])
    return libs


def _python(python: str) -> tuple[str, Path]:
    """The interpreter's real path and its standard library's folder."""
    real = os.path.realpath(python)
    version = subprocess.run(
        [real, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    stdlib = Path(f"/usr/lib/python{version}")
    if not version or not (stdlib / "os.py").exists():
        raise ImageError(f"devcluster: {python} has no standard library at {stdlib}")
    return real, stdlib


def python_files(layer: Layer, python: str) -> str:
    """The interpreter, the libraries it and its extension modules load, its standard library
    and a minimal /etc; the standard library's folder name (python3.11)."""
    real, stdlib = _python(python)
    files: list[str] = []
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in _STDLIB_SKIP)
        files += [os.path.join(root, n) for n in sorted(names)]
    elf = [real] + [f for f in files if f.endswith(".so")]
    for d, mode in (("tmp", 0o1777), ("etc", 0o755), ("root", 0o700)):
        layer.dir(d, mode)
    layer.data("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n")
    layer.data("etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    for path in sorted(needed_libraries(elf)) + [python, real, *files]:
        layer.host(path)
    for alias in ("/usr/bin/python3", "/usr/bin/python"):
        layer.link(alias, os.path.basename(real))
    return stdlib.name


PYTHON_CONFIG = {
    "Entrypoint": ["/usr/bin/python3"],
    "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1"],
    "WorkingDir": "/",
}


def python_image(cache: Path, python: str = "/usr/bin/python3") -> Path:
    """This machine's python3, its libraries and standard library, as one layer."""
    real, _ = _python(python)
    st = os.stat(real)
    key = hashlib.sha256(f"{RECIPE} {real} {st.st_size} {st.st_mtime_ns}".encode()).hexdigest()
    if found := cached(cache, "python", key):
        return found
    layer = Layer(cache / "python.layer")
    python_files(layer, python)
    archive(cache / "python.tar", PYTHON, layer.close(), PYTHON_CONFIG)
    (cache / "python.stamp").write_text(key)
    return cache / "python.tar"


WORKER = "wmla.local/worker:dev"
# What a training worker imports: the project's runtime, PyTorch and scikit-learn (the
# example's digits). The venv's torch is a CUDA build, which loads its CUDA libraries (the
# nvidia wheels) even on CPU: they come too, headers and static libraries left out; triton
# (GPU kernels, imported lazily) stays out.
WORKER_DISTRIBUTIONS = ("torch", "scikit-learn", "psutil", "cloudpickle")
_WORKER_SKIP_DISTS = ("triton", "setuptools")
_WORKER_SKIP_FILES = ("torch/include/", "torch/share/cmake/", "torch/test/")


def closure(names: Iterable[str], skip: tuple[str, ...] = (), image: str = "worker") -> list:
    """The installed distributions ``names`` need (their non-extra requirements), by name;
    those whose names start with one of ``skip`` left out."""
    import importlib.metadata as md

    from packaging.markers import Marker

    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen or key.startswith(skip):
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise ImageError(f"devcluster: {image} image: {name} is not installed") from None
        seen[key] = dist
        for req in dist.requires or []:
            spec, _, marker = req.partition(";")
            if marker and not Marker(marker).evaluate({"extra": ""}):
                continue
            match = re.match(r"[A-Za-z0-9_.-]+", spec.strip())
            if match:
                todo.append(match[0])
    return [seen[k] for k in sorted(seen)]


def worker_image(cache: Path, project: Path, python: str = "/usr/bin/python3") -> Path:
    """A training worker: the python image's files, the worker's distributions from this
    interpreter's environment (``sys.prefix``, the project's venv) and the project's runtime
    (``extension.runtime``) from ``project``, all in /usr/local/lib/python3.X/dist-packages."""
    dists = closure(WORKER_DISTRIBUTIONS, _WORKER_SKIP_DISTS)
    # the runtime alone (it imports nothing else of the project): the image changes when it
    # does, not with every edit of the service
    ext = project / "extension"
    sources = [ext / "__init__.py"] + sorted(
        p for p in (ext / "runtime").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    digest = hashlib.sha256(RECIPE.encode())
    for dist in dists:
        digest.update(f"{dist.metadata['Name']}=={dist.version};".encode())
    for path in sources:
        digest.update(f"{path.relative_to(project)}:".encode() + path.read_bytes())
    key = digest.hexdigest()
    if found := cached(cache, "worker", key):
        return found
    layer = Layer(cache / "worker.layer")
    stdlib_name = python_files(layer, python)
    site = f"usr/local/lib/{stdlib_name}/dist-packages"
    elf: list[str] = []
    for dist in dists:
        for f in dist.files or []:
            rel = str(f)
            if rel.startswith(("..", "/")) or rel.startswith(_WORKER_SKIP_FILES):
                continue
            if "__pycache__" in rel or rel.endswith(".a") or "/include/" in rel:
                continue
            src = Path(str(f.locate()))
            if not src.is_file():
                continue
            layer.file(f"{site}/{rel}", src)
            if ".so" in src.name:
                elf.append(str(src))
    # the nvidia wheels torch names through extras (cuda-toolkit[cudart], ...): whole
    venv_site = Path(str(dists[0].locate_file("")))
    for tree in ("nvidia",):
        for src in sorted((venv_site / tree).rglob("*")):
            rel = src.relative_to(venv_site).as_posix()
            if src.is_file() and "/include/" not in rel and not rel.endswith(".a"):
                layer.file(f"{site}/{rel}", src)
                if ".so" in src.name:
                    elf.append(str(src))
    for path in sources:
        layer.file(f"{site}/{path.relative_to(project)}", path)
    venv = str(Path(sys.prefix).resolve())
    for lib in sorted(needed_libraries(elf)):
        if not os.path.realpath(lib).startswith(venv + "/"):
            layer.host(lib)  # a system library a wheel links (libstdc++, libgcc_s, ...)
    archive(cache / "worker.tar", WORKER, layer.close(), PYTHON_CONFIG)
    (cache / "worker.stamp").write_text(key)
    return cache / "worker.tar"


if __name__ == "__main__":  # python -m devcluster.images [CACHE]: the worker image's path
    from .build import DEFAULT_CACHE

    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_CACHE / "images"
    print(worker_image(target, Path(__file__).resolve().parent.parent))
