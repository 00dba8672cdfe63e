"""A throw-away PostgreSQL server for the tests: Debian's ``postgresql`` binaries, a fresh cluster.

``PostgresServer.start()`` runs ``initdb`` into a new folder and starts ``postgres`` on a free
port of 127.0.0.1 (trust authentication, superuser ``wmla``); ``create_database()`` hands out
one new database per test. ``stop()`` stops the server by its PID (SIGINT, PostgreSQL's fast
shutdown, which ends open sessions; SIGKILL to its process group if it has not gone in 10 s)
and removes the folder, whatever happened before.

PostgreSQL refuses to run as root: as root the cluster belongs to the ``postgres`` system account
(the ``postgresql`` package creates it) and lives in a folder made for it under the temp dir,
since pytest's own temp folders are 0700 root's; otherwise it runs as the current account in
the folder the caller gives. The tests skip, saying why, where no server binaries are found.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SEARCH = "/usr/lib/postgresql/*/bin"  # Debian's layout, one folder per major version
ACCOUNT = "postgres"  # who runs the server when the tests run as root
SUPERUSER = "wmla"
DRIVER = "postgresql+psycopg"  # SQLAlchemy's dialect for psycopg 3, the project's driver


def find_bindir() -> tuple[Path | None, str]:
    """The folder with ``initdb`` and ``postgres`` (newest major version first), or None and
    what was looked for."""
    candidates = sorted(
        (Path(p) for p in glob.glob(SEARCH)),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for name in ("initdb", "postgres"):
        found = shutil.which(name)
        if found:
            candidates.append(Path(os.path.realpath(found)).parent)
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "postgres").is_file():
            return folder, ""
    return None, (
        f"PostgreSQL is not installed: no initdb and postgres in {SEARCH} or on PATH "
        "(apt-get install postgresql; .ci/run does it)"
    )


def unavailable() -> str:
    """Why no server can be started here, or '' when one can."""
    bindir, why = find_bindir()
    if bindir is None:
        return why
    try:
        import psycopg  # noqa: F401 - the driver the URL names
    except ImportError:
        return "the PostgreSQL driver psycopg is not installed (pip install 'psycopg[binary]')"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(ACCOUNT)
        except KeyError:
            return f"running as root and there is no {ACCOUNT!r} account to run PostgreSQL as"
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, base: Path) -> None:
        """``base``: a folder of the caller's (used when not root; as root see the module doc)."""
        bindir, why = find_bindir()
        if bindir is None:
            raise RuntimeError(why)
        self.bindir = bindir
        self.base = base
        self.root: Path | None = None  # the folder this server made and removes
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.user: dict = {}
        self.startup_seconds = 0.0
        self._count = 0

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> None:
        began = time.monotonic()
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began

    def _start(self, timeout: float) -> None:
        if os.geteuid() == 0:
            account = pwd.getpwnam(ACCOUNT)
            self.root = Path(tempfile.mkdtemp(prefix="wmla-pg-"))
            os.chown(self.root, account.pw_uid, account.pw_gid)
            self.user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
            env = {"HOME": str(self.root), "PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
        else:
            self.root = Path(tempfile.mkdtemp(prefix="pg-", dir=self.base))
            env = {**os.environ, "LC_ALL": "C.UTF-8"}
        self.env = env
        data, sockets = self.root / "data", self.root / "sockets"
        self._run([str(self.bindir / "initdb"), "-D", str(data), "-U", SUPERUSER,
                   "--auth=trust", "--encoding=UTF8", "--no-sync"])  # fmt: skip
        self._run(["mkdir", "-m", "0700", str(sockets)])
        self.log_path = self.root / "postgres.log"
        for _attempt in range(5):  # another process may take the free port before we bind it
            self.port = free_port()
            args = [
                str(self.bindir / "postgres"), "-D", str(data), "-p", str(self.port),
                "-k", str(sockets), "-c", "listen_addresses=127.0.0.1",
                # the tests want speed, not durability: the cluster is thrown away
                "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                "-c", "max_connections=200",
            ]  # fmt: skip
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, **self.user,
                )  # fmt: skip
            if self._wait_ready(timeout):
                return
            if "already in use" not in self.log():
                raise RuntimeError(f"PostgreSQL did not start:\n{self.log()}")
            self._stop_process()
        raise RuntimeError(f"PostgreSQL found no free port:\n{self.log()}")

    def _run(self, args: list[str]) -> None:
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, **self.user)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed:\n{done.stdout}{done.stderr}")

    def _wait_ready(self, timeout: float) -> bool:
        import psycopg

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                psycopg.connect(self.dsn("postgres"), connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                time.sleep(0.05)
        raise RuntimeError(f"PostgreSQL did not accept connections in {timeout} s:\n{self.log()}")

    def stop(self) -> None:
        """Stop the server by PID and remove its folder; safe to call twice or after a failure."""
        try:
            self._stop_process()
        finally:
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
                self.root = None

    def _stop_process(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.send_signal(signal.SIGINT)  # fast shutdown: ends sessions, then exits
            proc.wait(10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the server's backends
            except ProcessLookupError:
                pass
            proc.wait(10)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except (OSError, AttributeError):
            return ""

    # -- databases -------------------------------------------------------------------------------
    def dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={database}"

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of one database, as ``c.WmlaService.db_url`` takes it."""
        return f"{DRIVER}://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str = "wmla") -> str:
        """A new empty database; returns its SQLAlchemy URL."""
        import psycopg

        self._count += 1
        name = f"{prefix}_{os.getpid()}_{self._count}"
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
