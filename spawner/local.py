"""``WmlaLocalSpawner``: JupyterHub's LocalProcessSpawner, admitted by the user's plan.

Each hub user's server runs in their private folder ``<storage_root>/<user>`` (its HOME and the
Jupyter root). When the hub runs as root, each hub user has a system account (created with
useradd on first spawn unless ``create_system_users`` is off) that owns the folder (mode 0700) and
runs the server, so another user's folder is unreadable at the OS level. Otherwise every server
runs as the hub's own account and only the API keeps users apart: the log says so loudly.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid
from traitlets import (
    Bool,
    Dict,
    Enum,
    Instance,
    Integer,
    List,
    TraitError,
    Unicode,
    Union,
    default,
    validate,
)
from traitlets import Callable as CallableTrait

from extension.adoption import Adoption, check_adoption
from extension.backends.local.worker_launcher import private_mounts, reset_signals
from extension.confine import DEFAULT_GPU_TEMPLATE, DEFAULT_PIDS, check_template, enter
from extension.userfs.accounts import Account, AccountError, create_account, find_account, is_root
from extension.userfs.errors import UserFileError
from extension.userfs.files import UserFiles

from . import profiles as profile_shapes
from .confining import ServerCgroup, server_gpus, server_grant
from .getting_started import MARKER, starter_files
from .kernel import install_startup
from .mixin import WmlaSpawnerMixin
from .private_tmp import LIBC, ServerTmp
from .profile_overrides import TraitOverrides
from .ready import answering
from .server_python import ServerCommand, server_command
from .storage import ensure_folder, user_folder

TERMINAL_BIN = Path(__file__).resolve().parent / "bin"  # wmla, python, python3 for terminals
SERVER_CONFIG = Path(__file__).resolve().parent / "jupyter"  # the servers' extra Jupyter config

NOT_ROOT_WARNING = (
    "\n!!! wmla: the hub does not run as root, so every notebook server runs as the hub's own "
    "account (uid %s) and users' folders under %s are NOT separated by the operating system; "
    "only the wmla API keeps users apart. Run the hub as root for one system account per user."
)


def own_account() -> Account:
    """The account the hub itself runs as (what runs the servers when it is not root)."""
    entry = pwd.getpwuid(os.geteuid())
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


class WmlaLocalSpawner(WmlaSpawnerMixin, LocalProcessSpawner):
    """Local notebook servers charged to a plan, each in the user's private folder."""

    system_users = Bool(
        True,
        help="""When the hub runs as root, run each user's server as their own system account
        (folder owned by it, mode 0700). Ignored when the hub is not root.

        c.WmlaLocalSpawner.system_users = True
        """,
    ).tag(config=True)

    create_system_users = Bool(
        True,
        help="""Create a missing system account with useradd on first spawn (home = the user's
        folder, no login shell).

        c.WmlaLocalSpawner.create_system_users = False
        """,
    ).tag(config=True)

    system_user_template = Unicode(
        "{username}",
        help="""The system account of a hub user; ``{username}`` is the hub name.

        c.WmlaLocalSpawner.system_user_template = "jh-{username}"
        """,
    ).tag(config=True)

    min_uid = Integer(
        1000,
        help="""Never run a server as an account with a smaller uid (root, daemons).

        c.WmlaLocalSpawner.min_uid = 1000
        """,
    ).tag(config=True)

    adopt_accounts = Enum(
        [a.value for a in Adoption],
        default_value=None,
        allow_none=True,
        help="""Which existing system accounts a hub user's server may run as: "ours" (only
        one that looks made by this spawner's useradd: no login shell, home = the user's
        folder, a group of its own and no other; anything else is refused with why) or "any"
        (the machine's own accounts, PAM or LDAP). Default: "ours" when create_system_users is
        on and system_user_template is not "{username}", else "any".

        c.WmlaLocalSpawner.adopt_accounts = "any"
        """,
    ).tag(config=True)

    account_python = Unicode(
        "auto",
        help="""When the account a server runs as cannot start ``c.Spawner.cmd`` (e.g. a
        virtualenv over a pyenv under /root, mode 0700; or, the hub not root, a
        ``jupyterhub-singleuser`` that is not on PATH), run the server with this Python over
        the hub's packages (PYTHONPATH = the hub's package folders and the project, and
        Jupyter's paths of the hub's environment). "auto": the hub's own interpreter when that
        account can run it, else the system Python of the same major.minor version; "": never
        (the spawn fails with the reason).

        c.WmlaLocalSpawner.account_python = "/usr/bin/python3.11"
        """,
    ).tag(config=True)

    profile_list = Union(
        [List(Dict()), CallableTrait(), Dict()],
        help="""The spawn page's choices, in KubeSpawner's ``profile_list`` shape, so one
        setting serves this spawner and WmlaKubeSpawner (spawner/profiles.py): a list (or a
        dict, or a callable of the spawner, maybe async) of ``display_name``, ``slug``
        (optional), ``description``, ``default``, ``kubespawner_override`` (traits of this
        spawner to set: ``wmla_plan``, ``gpus``, ``cpu_guarantee``, ``mem_guarantee``,
        ``notebook_cpu``, ``notebook_memory``, ``default_url``, ``environment``, ...; names this
        spawner has not, such as ``image``, are left to KubeSpawner) and ``profile_options``
        (``display_name``, ``choices`` of ``display_name``, ``default``,
        ``kubespawner_override``; ``unlisted_choice``). The pick arrives as
        ``user_options = {"profile": slug, <option>: <choice>}``. Default: the deprecated
        ``profiles``, read in this shape.

        c.WmlaLocalSpawner.profile_list = [
            {"display_name": "CPU only", "slug": "cpu", "default": True},
            {"display_name": "1 GPU", "slug": "gpu", "kubespawner_override": {"gpus": 1}},
        ]
        """,
    ).tag(config=True)

    @default("profile_list")
    def _wmla_profile_list_default(self) -> list[dict]:
        return profile_shapes.from_legacy(self.profiles)

    autoload_magics = Bool(
        True,
        help="""Load the %wmla_* magics in every kernel (a startup file in the user's
        ``.ipython``, IPYTHONDIR pointed at it).

        c.WmlaLocalSpawner.autoload_magics = True
        """,
    ).tag(config=True)
    getting_started = Bool(
        True,
        help="""On a user's first spawn, put a getting-started notebook and the example's code
        (models/pytorch_mnist) in their folder, written as their account; offered once, never
        over a file that exists.

        c.WmlaLocalSpawner.getting_started = False
        """,
    ).tag(config=True)

    private_tmp_template = Unicode(
        "",
        config=True,
        help="""A root-only folder per user ({username}) in which each server gets a folder
        bound on its /tmp and /var/tmp (docs/security.md "Storage quotas"); empty, or a
        folder that is not there: the machine's /tmp. jupyterhub_config.py sets it to the
        storage quotas' tmp/ of each user's image.

        c.WmlaLocalSpawner.private_tmp_template = "/var/lib/wmla/storage/mnt/{username}/tmp"
        """,
    )
    gpu_device_template = Unicode(
        DEFAULT_GPU_TEMPLATE,
        help="""The device node of GPU ``{index}``: a server's cgroup may open GPU nodes only
        when it holds GPUs (the "CPU only" profile opens none). jupyterhub_config.py reads it
        from $WMLA_GPU_DEVICE_TEMPLATE, like the service's backend.

        c.WmlaLocalSpawner.gpu_device_template = "/dev/nvidia{index}"
        """,
    ).tag(config=True)

    @validate("gpu_device_template")
    def _wmla_check_template(self, proposal: dict) -> str:
        try:
            return check_template(proposal["value"])
        except ValueError as err:
            raise TraitError(str(err)) from None

    pids_limit = Integer(
        DEFAULT_PIDS,
        min=1,
        help="""Processes and threads one server may run (its cgroup's pids limit).

        c.WmlaLocalSpawner.pids_limit = 2048
        """,
    ).tag(config=True)

    wmla_overrides = Instance(
        TraitOverrides, args=(), help="The picked profile's overrides (not configuration)."
    )
    wmla_command = Instance(
        ServerCommand, allow_none=True, help="What the server runs (not configuration)."
    )
    _wmla_account = None
    _wmla_cgroup: ServerCgroup | None = None
    _wmla_tmp: ServerTmp | None = None  # its /tmp inside the user's quota (private_tmp.py)
    _wmla_memory = 0  # its grant's memory limit (bytes), 0: none
    _wmla_warned = False
    _wmla_cmd: list | None = None  # the configured cmd (start() may swap the interpreter)

    # -- folder and account ------------------------------------------------------------------
    @property
    def wmla_folder(self) -> Path:
        return user_folder(self.storage_root, self.user.name)

    def wmla_account(self) -> Account | None:
        """The account the server runs as, or None for the hub's own (not root)."""
        if not (is_root() and self.system_users):
            if not is_root() and not WmlaLocalSpawner._wmla_warned:
                WmlaLocalSpawner._wmla_warned = True
                self.log.warning(NOT_ROOT_WARNING, os.geteuid(), self.storage_root)
            return None
        name = self.system_user_template.format(username=self.user.name)
        account = find_account(name, self.min_uid)
        if account is not None:  # made by someone: ours, or refused (extension/adoption.py)
            adoption = (
                Adoption(self.adopt_accounts)
                if self.adopt_accounts
                else Adoption.default(self.system_user_template, self.create_system_users)
            )
            setting = "c.WmlaLocalSpawner.adopt_accounts"
            return check_adoption(account, self.user.name, str(self.wmla_folder), adoption, setting)
        if not self.create_system_users:
            raise AccountError(
                f"no system account {name!r} for hub user {self.user.name}; create it, or "
                "set c.WmlaLocalSpawner.create_system_users = True"
            )
        account = create_account(name, self.wmla_folder, self.min_uid)
        self.wmla_log().info("created system account %s (uid %s)", name, account.uid)
        return account

    def wmla_prepare(self) -> tuple[Path, Account | None]:
        """Before the server starts (blocking, in a thread): its account, its command, its
        folder, the magics' startup file and the getting-started files."""
        account = self.wmla_account()
        if self._wmla_cmd is None:
            self._wmla_cmd = list(self.cmd)
        runner = account or own_account()  # not root: the servers run as the hub's account
        self.wmla_command = server_command(
            self._wmla_cmd, runner, self.account_python, self.user.name, self.wmla_log()
        )
        self.cmd = list(self.wmla_command.cmd)
        folder = ensure_folder(self.storage_root, self.user.name, account)
        if self.autoload_magics:
            install_startup(folder / ".ipython", folder, account)
        if self.getting_started:
            self._offer_getting_started(folder, account)
        return folder, account

    def _offer_getting_started(self, folder: Path, account: Account | None) -> None:
        """The first spawn's notebook and example, written with the user's own rights (the
        folder is theirs to change: a planted link reaches only what they could reach)."""
        try:
            written = UserFiles.of(account).call(
                "install_missing", root=str(folder), files=starter_files(), marker=MARKER
            )
        except UserFileError as err:  # a convenience: the spawn goes on without it
            self.wmla_log().warning("no getting-started files: %s", err)
            return
        if written:
            self.wmla_log().info("put %s in %s", ", ".join(written), folder)

    # -- the picked profile ---------------------------------------------------------------------
    async def wmla_load_profile(self) -> dict | None:
        """Apply the picked profile (user_options) as KubeSpawner's load_user_options does:
        its ``kubespawner_override``, then its options' choices, to this spawner's traits.
        What an earlier spawn's profile overrode is put back first, so a CPU server after a
        GPU one asks for no GPU."""
        profile, overrides = self.wmla_pick_profile(await self.wmla_profile_list())
        self.wmla_overrides.apply(self, overrides, self.wmla_log())
        return profile

    # -- start -------------------------------------------------------------------------------
    async def start(self) -> tuple[str, int]:
        began = time.monotonic()
        try:  # also a start cut short by start_timeout: JupyterHub then skips stop()
            await self.wmla_load_profile()
            await self.wmla_admit()
            folder, self._wmla_account = await asyncio.to_thread(self.wmla_prepare)
            self.wmla_note(f"your folder: {folder}", 30)
            self._wmla_cgroup = await asyncio.to_thread(self._wmla_confine)
            if self._wmla_account is not None:
                self._wmla_tmp = await asyncio.to_thread(
                    ServerTmp.create, self.private_tmp_template, self.user.name,
                    self.wmla_job_id or self.name or "default", self._wmla_account, folder,
                )  # fmt: skip
            ip, port = await super().start()
            url = f"http://{ip or '127.0.0.1'}:{port}{self.server.base_url}api"
            # within what is left of start_timeout (the hub cancels a longer start()), the
            # rest to the hub's own check
            left = self.start_timeout - (time.monotonic() - began) - 1.0
            if left > 0:
                await answering(url, self._wmla_alive, min(self.http_timeout, left))
            return ip, port
        except BaseException:
            await asyncio.to_thread(self._wmla_unconfine)
            await self.wmla_release()
            raise

    def _wmla_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _wmla_confine(self) -> ServerCgroup:
        """The server's cgroup, made with its notebook job's grant before the server starts;
        named by the job's id, so the service meters what the server uses as a job's."""
        account = self._wmla_account.name if self._wmla_account else self.user.name
        name = self.wmla_job_id or f"{account}-{self.name or 'default'}"
        grant = server_grant(self.wmla_granted, self.wmla_gpus, self.gpu_device_template,
                             self.pids_limit)  # fmt: skip
        self._wmla_memory = grant.memory_bytes  # its /dev/shm's size too (make_preexec_fn)
        if self.wmla_gpus and not server_gpus(self.wmla_granted):
            self.log.warning("%s: the service holds no GPU indexes for this server (its backend "
                             "hands out none): it opens no GPU node", self._log_name)  # fmt: skip
        return ServerCgroup.create(name, grant, self.log, self._log_name)

    def _wmla_unconfine(self) -> None:
        if self._wmla_cgroup is not None:
            self._wmla_cgroup.remove()
            self._wmla_cgroup = None
        if self._wmla_tmp is not None:
            self._wmla_tmp.remove()
            self._wmla_tmp = None

    async def poll(self) -> int | None:
        status = await super().poll()
        if status is not None and self._wmla_cgroup is not None and not self.wmla_spawn.stopping:
            await asyncio.to_thread(self._wmla_cgroup.say_why_it_died)
            await asyncio.to_thread(self._wmla_unconfine)
        return status

    async def stop(self, now: bool = False) -> None:
        try:
            await super().stop(now=now)
        finally:
            if self._wmla_cgroup is not None:
                await asyncio.to_thread(self._wmla_cgroup.say_why_it_died)
            await asyncio.to_thread(self._wmla_unconfine)

    def get_state(self) -> dict:
        state = super().get_state()
        if self._wmla_cgroup is not None and self._wmla_cgroup.name:
            state["wmla_cgroup"] = self._wmla_cgroup.name
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        if state.get("wmla_cgroup"):
            self._wmla_cgroup = ServerCgroup(str(state["wmla_cgroup"]), self.log, self._log_name)

    def make_preexec_fn(self, name: str) -> Callable[[], None]:
        folder = str(self.wmla_folder)
        account = self._wmla_account
        become = set_user_setuid(account.name, chdir=False) if account else None
        cgroup = self._wmla_cgroup.enter_files() if self._wmla_cgroup is not None else ()
        tmp = str(self._wmla_tmp.path) if self._wmla_tmp is not None else ""
        # its own /dev/shm, of its memory limit: the machine's would keep its files after it
        shm = self._wmla_memory if self._wmla_account is not None else 0

        def preexec() -> None:  # runs in the child between fork and exec
            reset_signals()  # none the hub inherited ignored reaches the server
            if cgroup:  # as root, before the user's code: no window outside the grant
                enter(cgroup)
            if tmp or shm:  # still root: its own /tmp inside its user's quota, its /dev/shm
                private_mounts(tmp, shm, LIBC)
            if become is not None:
                become()
            os.chdir(folder)

        return preexec

    def user_env(self, env: dict[str, str]) -> dict[str, str]:
        account = self._wmla_account
        env["USER"] = account.name if account else self.user.name
        env["HOME"] = str(self.wmla_folder)
        env["SHELL"] = "/bin/bash"
        return env

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        folder = str(self.wmla_folder)
        ipython_dir = str(self.wmla_folder / ".ipython") if self.autoload_magics else None
        env.update(self.wmla_env(folder, ipython_dir))
        command = self.wmla_command
        if command is not None and command.pythonpath:
            env["PYTHONPATH"] = command.pythonpath
            env.update(command.jupyter_env)
        # Terminals: `wmla`, `python` and `python3` run the server's own interpreter (the hub's
        # PATH may name one the account cannot run), and the shell is not a login shell, whose
        # /etc/profile would reset PATH (spawner/jupyter/jupyter_server_config.json).
        env["WMLA_PYTHON"] = command.python if command is not None else sys.executable
        if self.wmla_gpus:  # the GPUs the service holds for this server, as a job's workers
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, server_gpus(self.wmla_granted)))
        env["PATH"] = os.pathsep.join(p for p in (str(TERMINAL_BIN), env.get("PATH")) if p)
        env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
            p for p in (str(SERVER_CONFIG), env.get("JUPYTER_CONFIG_PATH")) if p
        )
        return env

    def get_args(self) -> list[str]:
        args = super().get_args()
        if not self.notebook_dir:  # the Jupyter root is the user's folder, nothing above it
            args.append(f"--ServerApp.root_dir={self.wmla_folder}")
        return args

    async def move_certs(self, paths: dict) -> dict:
        return paths  # internal SSL is not supported here: the folder is the only home
