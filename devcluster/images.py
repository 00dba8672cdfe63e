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
RECIPE = "1"  # bump when what goes into an image changes

# Not needed in a pod, and most of the standard library's size.
_STDLIB_SKIP = {
    "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data",
    "site-packages", "dist-packages", "config-3.11-x86_64-linux-gnu", "__phello__",
}  # fmt: skip


class ImageError(RuntimeError):
    """An image that could not be built; one line naming it and why."""


class _Layer:
    """A reproducible layer tar: root-owned, mtime 0, each path once."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)
        self.seen: set[str] = set()

    def _info(self, name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name.lstrip("/"))
        info.type, info.mode, info.mtime, info.uid, info.gid = kind, mode, 0, 0, 0
        return info

    def dir(self, name: str, mode: int = 0o755) -> None:
        name = name.strip("/")
        if not name or name in self.seen:
            return
        self.dir(os.path.dirname(name))
        self.seen.add(name)
        self.tar.addfile(self._info(name, tarfile.DIRTYPE, mode))

    def data(self, name: str, data: bytes, mode: int = 0o644) -> None:
        name = name.strip("/")
        self.dir(os.path.dirname(name))
        self.seen.add(name)
        info = self._info(name, tarfile.REGTYPE, mode)
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))

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
                    info = self._info(name, tarfile.SYMTYPE, 0o777)
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
                info = self._info(name, tarfile.REGTYPE, stat.S_IMODE(st.st_mode))
                info.size = st.st_size
                with open(current, "rb") as f:
                    self.tar.addfile(info, f)

    def close(self) -> bytes:
        self.tar.close()
        return self.buf.getvalue()


def _archive(out: Path, tag: str, layer: bytes, config: dict) -> None:
    """A docker-archive (``docker save`` format) of one layer, written atomically."""
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
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
    outer = _Layer()
    outer.data(config_name, config_bytes)
    outer.data(layer_name, layer)
    outer.data("manifest.json", json.dumps(manifest).encode())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(outer.close())
    os.replace(tmp, out)


def _cached(cache: Path, name: str, key: str) -> Path | None:
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
    if found := _cached(cache, "pause", key):
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
        layer = _Layer()
        layer.data("pause", binary.read_bytes(), 0o755)
    _archive(cache / "pause.tar", PAUSE, layer.close(), {"Entrypoint": ["/pause"], "User": "0"})
    (cache / "pause.stamp").write_text(key)
    return cache / "pause.tar"


def _needed_libraries(files: Iterable[str]) -> set[str]:
    """The shared libraries ``ldd`` says these ELF files load, the loader included."""
    libs: set[str] = set()
    for f in files:
        out = subprocess.run(["ldd", f], capture_output=True, text=True)
        for line in out.stdout.splitlines():
            match = re.search(r"(/\S+) \(0x", line)
            if match:
                libs.add(match[1])
    return libs


def python_image(cache: Path, python: str = "/usr/bin/python3") -> Path:
    """This machine's python3, its libraries and standard library, as one layer."""
    real = os.path.realpath(python)
    version = subprocess.run(
        [real, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    stdlib = Path(f"/usr/lib/python{version}")
    if not version or not (stdlib / "os.py").exists():
        raise ImageError(f"devcluster: {python} has no standard library at {stdlib}")
    st = os.stat(real)
    key = hashlib.sha256(f"{RECIPE} {real} {st.st_size} {st.st_mtime_ns}".encode()).hexdigest()
    if found := _cached(cache, "python", key):
        return found
    files: list[str] = []
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in _STDLIB_SKIP)
        files += [os.path.join(root, n) for n in sorted(names)]
    elf = [real] + [f for f in files if f.endswith(".so")]
    layer = _Layer()
    for d, mode in (("tmp", 0o1777), ("etc", 0o755), ("root", 0o700)):
        layer.dir(d, mode)
    layer.data("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n")
    layer.data("etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    for path in sorted(_needed_libraries(elf)) + [python, real, *files]:
        layer.host(path)
    for alias in ("/usr/bin/python3", "/usr/bin/python"):
        if alias.lstrip("/") not in layer.seen:
            info = layer._info(alias, tarfile.SYMTYPE, 0o777)
            info.linkname = os.path.basename(real)
            layer.seen.add(alias.lstrip("/"))
            layer.tar.addfile(info)
    config = {
        "Entrypoint": ["/usr/bin/python3"],
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1"],
        "WorkingDir": "/",
    }
    _archive(cache / "python.tar", PYTHON, layer.close(), config)
    (cache / "python.stamp").write_text(key)
    return cache / "python.tar"


if __name__ == "__main__":  # python -m devcluster.images CACHE: build both, print their paths
    from .build import DEFAULT_CACHE

    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_CACHE / "images"
    print(python_image(target))
