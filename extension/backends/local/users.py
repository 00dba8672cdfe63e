"""The hub user behind a job: the Unix account its workers run as (created when missing, as
root), and the user's files read with that account's rights (the logs)."""

from __future__ import annotations

import logging
import os

from extension.backends.accounts import Account, AccountError, create_account, find_account
from extension.backends.userfs import UserFileError, UserFiles

log = logging.getLogger("wmla.backends.local")


class _Users:
    """Accounts and the user's files.

    A part of ``LocalBackend``: ``backend.py`` sets the attributes declared here.
    """

    run_as_user: bool | None
    create_accounts: bool
    account_template: str
    min_uid: int
    _workdirs: dict[str, tuple[str, str]]

    def logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> str:
        """One worker's log, or every worker's with ``[worker-N]`` before each line.

        ``tail`` keeps the last lines of each worker's log. Read with the job's user's rights
        (``UserFiles``): a log the user replaced by a link or a FIFO is refused, not followed.
        Blocking (a helper process as root): call it from a thread on an event loop.
        """
        known = self._workdirs.get(job_id)
        if known is None:
            raise KeyError(f"job {job_id} has not run on this backend since the service started")
        if tail is not None and tail < 0:
            raise ValueError(f"tail must be 0 or more lines, got {tail}")
        workdir, user = known
        try:
            return self.files_for(user).read_logs(workdir, worker, tail)
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
        if found is None:
            if not self.create_accounts or home is None:
                raise AccountError(
                    f"user {user!r} has no account {name!r} on this machine, and jobs never "
                    "run as root; create it (useradd) or set LocalBackend create_accounts=True"
                )
            found = create_account(name, home, self.min_uid)
            log.info("created account %s (uid %d) for hub user %s", name, found.uid, user)
        return found

    def files_for(self, user: str) -> UserFiles:
        """``user``'s files with their account's rights (in-process when it is ours)."""
        return UserFiles.of(self.account_for(user))
