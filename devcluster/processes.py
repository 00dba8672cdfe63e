"""The cluster's processes, started in sessions of their own and stopped by PID: a pid file per
component says which process it is, and a stop checks that the PID still runs that binary before
it signals anything (a PID the kernel gave to somebody else is left alone)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Running:
    """A component's process: its name, PID and the binary it runs."""

    name: str
    pid: int
    binary: str


class Processes:
    """Pid files and logs of the components, in ``run_dir``."""

    def __init__(self, run_dir: Path, log_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.log_dir = Path(log_dir)

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def _pid_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        binary: str | None = None,
    ) -> Running:
        """Start ``argv`` in a session of its own, its output appended to ``<name>.log``.
        ``binary`` is what ``/proc/<pid>/exe`` shows once it runs (argv[0] by default)."""
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.log(name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )
        finally:
            os.close(fd)
        running = Running(name, proc.pid, str(Path(binary or argv[0]).resolve()))
        self._pid_file(name).write_text(f"{running.pid} {running.binary}\n")
        return running

    def running(self, name: str) -> Running | None:
        """The component's process if its pid file names one that still runs its binary."""
        try:
            pid_text, binary = self._pid_file(name).read_text().split(maxsplit=1)
        except (OSError, ValueError):
            return None
        pid, binary = int(pid_text), binary.strip()
        if not _runs(pid, binary):
            return None
        return Running(name, pid, binary)

    def alive(self, name: str) -> bool:
        """Whether the component's process is alive, whatever it runs now (it may still be
        the wrapper that execs the binary)."""
        try:
            pid = int(self._pid_file(name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return False
        return _runs(pid, None)

    def names(self) -> list[str]:
        if not self.run_dir.is_dir():
            return []
        return sorted(p.stem for p in self.run_dir.glob("*.pid"))

    def stop(self, name: str, timeout: float = 10.0) -> None:
        """SIGTERM the component's session, then SIGKILL what is left after ``timeout``."""
        running = self.running(name)
        if running is not None:
            _signal_session(running.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and _runs(running.pid, running.binary):
                time.sleep(0.1)
            _signal_session(running.pid, signal.SIGKILL)
            _reap(running.pid)
        self._pid_file(name).unlink(missing_ok=True)


def _runs(pid: int, binary: str | None) -> bool:
    """Whether ``pid`` is alive (not a zombie) and runs ``binary`` (any, if None)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and (binary is None or exe.removesuffix(" (deleted)") == binary)


def _signal_session(pid: int, sig: signal.Signals) -> None:
    """The process's whole session (it leads one: started with start_new_session), or the
    process alone if it no longer leads one."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getsid(pid) == pid:
            os.killpg(pid, sig)
            return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _reap(pid: int) -> None:
    """Collect the exit of a child of ours (a stop from the process that started it)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
