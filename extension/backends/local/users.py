"""The hub user behind a job: the Unix account its workers run as (created when missing, as
root), and the user's files read with that account's rights (the logs)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from extension.adoption import Adoption, check_adoption
from extension.userfs.accounts import Account, AccountError, create_account, find_account
from extension.userfs.errors import UserFileError
from extension.userfs.files import UserFiles

log = logging.getLogger("wmla.backends.local")


@dataclass(frozen=True)
class JobOwner:
    """Whose a job is and where its files are: what its logs are read with."""

    workdir: str
    user: str


class UserAccounts:
    """The accounts jobs run as, and the jobs whose logs can be read (those that ran here
    since the service started, or were re-adopted).

    ``run_as_user``, ``create_accounts``, ``account_template``, ``min_uid`` and
    ``adopt_accounts`` are the ``LocalBackend`` options of the same names."""

    def __init__(
        self,
        run_as_user: bool | None,
        create_accounts: bool,
        account_template: str,
        min_uid: int,
        adopt_accounts: str | None = None,
    ) -> None:
        if "{username}" not in account_template:
            raise ValueError(
                f"account_template {account_template!r} must contain {{username}}, e.g. "
                "'{username}' or 'wmla-{username}' (the spawner's system_user_template)"
            )
        self.run_as_user = run_as_user
        self.create_accounts = create_accounts
        self.account_template = account_template
        self.min_uid = int(min_uid)
        self.adoption = (
            Adoption(adopt_accounts)
            if adopt_accounts is not None
            else Adoption.default(account_template, create_accounts)
        )
        self.owners: dict[str, JobOwner] = {}
        # why a user's failed job may have failed of storage (their folder at its quota):
        # the service's storage quotas set it (extension/storage/quotas.py)
        self.storage_reason: Callable[[str], str | None] = _no_reason
        # a job's private /tmp inside its user's quota (user, job id -> folder, or None for the
        # machine's /tmp), and its removal when the job ends; set by the same
        self.job_tmp: Callable[[str, str], str | None] = _no_tmp
        self.drop_job_tmp: Callable[[str, str], None] = _nothing

    def note(self, job_id: str, owner: JobOwner, replace: bool = True) -> None:
        """Remember whose ``job_id`` is (a start replaces, a re-adoption only fills in)."""
        if replace or job_id not in self.owners:
            self.owners[job_id] = owner

    def logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> str:
        """One worker's log, or every worker's with ``[worker-N]`` before each line.

        ``tail`` keeps the last lines of each worker's log. Read with the job's user's rights
        (``UserFiles``): a log the user replaced by a link or a FIFO is refused, not followed.
        Blocking (a helper process as root): call it from a thread on an event loop.
        """
        owner = self.owners.get(job_id)
        if owner is None:
            raise KeyError(f"job {job_id} has not run on this backend since the service started")
        if tail is not None and tail < 0:
            raise ValueError(f"tail must be 0 or more lines, got {tail}")
        try:
            return self.files_for(owner.user).read_logs(owner.workdir, worker, tail)
        except AccountError as err:
            raise UserFileError(f"job {job_id}'s logs cannot be read: {err}") from None

    def account_for(self, user: str, home: str | None = None) -> Account | None:
        """The account ``user``'s workers run as (None: the service's own), created when
        missing as root (``create_accounts``, home = ``home``, the user's folder).

        Raises AccountError with what to do when there is none: as root a job never runs as
        root by default.
        """
        if self.run_as_user is False:
            return None
        name = self.account_template.format(username=user)
        found = find_account(name, self.min_uid)
        if os.geteuid() != 0:
            return self._not_root(user, name, found)
        if found is None:
            if not self.create_accounts or home is None:
                raise AccountError(
                    f"user {user!r} has no account {name!r} on this machine, and jobs never "
                    "run as root; create it (useradd) or set LocalBackend create_accounts=True"
                )
            found = create_account(name, home, self.min_uid)
            log.info("created account %s (uid %d) for hub user %s", name, found.uid, user)
            return found
        # made by someone: ours, or refused (extension/adoption.py)
        setting = "LocalBackend adopt_accounts (c.WmlaService.backend_options)"
        return check_adoption(found, user, home, self.adoption, setting)

    def _not_root(self, user: str, name: str, found: Account | None) -> Account | None:
        """The account when the service is not root: only its own can be run as."""
        if self.run_as_user is None:
            return None
        if found is None:
            raise AccountError(
                f"run_as_user is set but user {user!r} has no account {name!r} on this "
                "machine; create it (useradd) or set run_as_user=False"
            )
        if found.uid != os.geteuid():
            raise AccountError(
                f"running workers as {user!r} needs the service to run as root; start it "
                "as root or set run_as_user=False"
            )
        return found

    def files_for(self, user: str) -> UserFiles:
        """``user``'s files with their account's rights (in-process when it is ours)."""
        return UserFiles.of(self.account_for(user))


def _no_reason(user: str) -> str | None:
    return None


def _no_tmp(user: str, job_id: str) -> str | None:
    return None


def _nothing(user: str, job_id: str) -> None:
    return None
