"""Build each program once per version into ``.cache/k8s/<version>/bin`` from its pinned build
module, and find the files of those modules (CRDs, stages) in the Go module cache."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from .components import SOURCES, Module, Program

HERE = Path(__file__).resolve().parent
MODULES = HERE / "modules"
DEFAULT_CACHE = HERE.parent / ".cache" / "k8s"


class BuildError(RuntimeError):
    """A program that could not be built; the message is one line naming it and its log."""


def go_env() -> dict[str, str]:
    """The environment every go command runs with: no cgo (static binaries), the pinned go.sum
    only, and this machine's Go (a toolchain line never downloads another)."""
    env = dict(os.environ)
    env.update(CGO_ENABLED="0", GOFLAGS="-mod=readonly", GOTOOLCHAIN="local")
    return env


def _go() -> str:
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else ""
    )
    if not go:
        raise BuildError("devcluster: no `go` on PATH (Go 1.26 builds the cluster's programs)")
    return go


class Builder:
    """Builds programs into ``cache/<version>/bin/<binary>``; a program whose stamp (its build
    module's go.mod and go.sum, package and flags) is unchanged is not built again."""

    def __init__(self, cache: Path = DEFAULT_CACHE, log=sys.stderr) -> None:
        self.cache = Path(cache)
        self.log = log

    def path(self, program: Program) -> Path:
        return self.cache / program.version / "bin" / program.binary

    def log_path(self, program: Program) -> Path:
        return self.cache / "logs" / f"{program.binary}.log"

    def _stamp(self, program: Program) -> str:
        digest = hashlib.sha256()
        module = MODULES / program.module.value
        for name in ("go.mod", "go.sum"):
            digest.update((module / name).read_bytes())
        digest.update(program.package.encode())
        digest.update(" ".join(program.version_ldflags).encode())
        return digest.hexdigest()

    def is_built(self, program: Program) -> bool:
        stamp = self.path(program).with_suffix(".stamp")
        return (
            self.path(program).exists()
            and stamp.exists()
            and stamp.read_text() == self._stamp(program)
        )

    def missing(self, programs: Iterable[Program]) -> list[Program]:
        return [p for p in programs if not self.is_built(p)]

    def build(self, programs: Iterable[Program]) -> dict[str, Path]:
        """Every program's binary, building those missing; ``BuildError`` on the first failure."""
        programs = list(programs)
        todo = self.missing(programs)
        for i, program in enumerate(todo, 1):
            self._build_one(program, f"[{i}/{len(todo)}]")
        return {p.binary: self.path(p) for p in programs}

    def _build_one(self, program: Program, step: str) -> None:
        out = self.path(program)
        out.parent.mkdir(parents=True, exist_ok=True)
        log_path = self.log_path(program)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        print(
            f"devcluster {step}: building {program.binary} {program.version} "
            f"({program.package}) ...",
            file=self.log,
            flush=True,
        )
        started = time.monotonic()
        ldflags = " ".join(("-s", "-w", *program.version_ldflags))
        tmp = out.with_name(out.name + ".tmp")
        cmd = [_go(), "build", "-trimpath", "-ldflags", ldflags, "-o", str(tmp), program.package]
        with open(log_path, "w", encoding="utf-8") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            rc = subprocess.call(
                cmd,
                cwd=MODULES / program.module.value,
                env=go_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        if rc != 0:
            tmp.unlink(missing_ok=True)
            raise BuildError(
                f"devcluster: building {program.binary} failed (go build exit {rc}); see {log_path}"
            )
        os.replace(tmp, out)
        out.with_suffix(".stamp").write_text(self._stamp(program))
        print(
            f"devcluster {step}: {program.binary} built in {time.monotonic() - started:.0f} s",
            file=self.log,
            flush=True,
        )


def module_dir(module_path: str) -> Path:
    """Where the Go module cache holds ``module_path`` at the version its build module pins
    (downloading it if this machine has not yet)."""
    build_module: Module = SOURCES[module_path]
    out = subprocess.run(
        [_go(), "mod", "download", "-json", module_path],
        cwd=MODULES / build_module.value,
        env=go_env(),
        capture_output=True,
        text=True,
    )
    info = json.loads(out.stdout or "{}") if out.stdout.strip().startswith("{") else {}
    if out.returncode != 0 or not info.get("Dir"):
        reason = info.get("Error") or out.stderr.strip().splitlines()[-1:] or "no Dir"
        raise BuildError(f"devcluster: cannot find module {module_path}: {reason}")
    return Path(info["Dir"])
