"""What the REST handlers ask of the scheduler: submit, look at and cancel jobs (also keyed by
an Idempotency-Key), free a notebook's job, change plans.

``Actions`` is given the state these read and change (``ActionState``, which the Scheduler of
scheduling.py implements): the store, the live jobs, the plan tree, the loop's lock.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Protocol

from extension.backends.base import Backend, ChecksAdmission, LocalAccounts
from extension.scheduler import (
    IndexCache,
    Instance,
    Job,
    JobState,
    PlanError,
    PlanTree,
    SchedulerConfig,
    Snapshot,
    check_submission,
)
from extension.scheduler.plans import ROOT, leaf_path, parent_of
from extension.storage.images import StorageError
from extension.storage.quotas import StorageQuotas
from extension.userfs.accounts import AccountError, ensure_folder
from extension.userfs.errors import UserFileError
from extension.userfs.files import UserFiles, off_loop
from extension.webapi import Caller

from . import runtime_limits
from .cancels import Cancel
from .key_lookups import KeyLookups
from .live import LiveJobs
from .pending_cap import PendingCap
from .records import JobKind
from .runtime_limits import Limits
from .store import JobRow, PlanRecord, Store
from .storecalls import StoreCalls
from .submission import Rejected, Submission, SubmissionError, resolve_command, user_root


class NotFound(LookupError):
    pass


class Forbidden(PermissionError):
    pass


class KeyReused(ValueError):
    """An Idempotency-Key sent again with a different submission."""


def _moot(task: asyncio.Future) -> None:
    """A submission's preparation no one awaits any more: its error is not news."""
    if not task.cancelled():
        task.exception()


def plans_after(
    tree: PlanTree, records: list[PlanRecord], create: bool, delete: Iterable[str] = ()
) -> PlanTree:
    """The tree with a change applied, on a copy, validated by the core (PlanError on a
    refusal, the original untouched): what change_plans stores and the admin page previews."""
    tree = tree.copy()
    for path in delete:
        tree.remove(path)
    for rec in records:
        if create:
            tree.add(rec.path, rec.share, rec.limit)
        else:
            tree.update(rec.path, rec.share, rec.limit)
    return tree


def runtimes_after(
    runtimes: dict[str, runtime_limits.PlanRuntime],
    records: list[PlanRecord],
    delete: Iterable[str] = (),
) -> dict[str, runtime_limits.PlanRuntime]:
    """The plans' runtime settings with a change applied, on a copy, checked (PlanError on a
    default above the maximum in force at its plan, the original untouched)."""
    out = dict(runtimes)
    for path in delete:
        out.pop(path, None)
    for rec in records:
        out[rec.path] = (rec.runtime_default, rec.runtime_max)
    runtime_limits.check_plans(out)
    return out


class ActionState(Protocol):
    """What the actions read and change of the scheduler: its store, plans and live jobs, the
    lock that keeps a change out of a cycle, and the loop that stores a submission."""

    store: Store
    db: StoreCalls
    plans: PlanTree
    members: dict[str, tuple[list[str], list[str]]]
    limits: Limits
    live: LiveJobs
    instance: Instance
    config: SchedulerConfig
    index_cache: IndexCache
    backend: Backend | None
    pending_cap: PendingCap
    storage_root: Path
    storage: StorageQuotas | None
    python: str
    lock: asyncio.Lock
    clock: Callable[[], float]

    @property
    def loop_running(self) -> bool: ...

    async def through_cycle(self, row: JobRow) -> None: ...

    async def cancel_through_cycle(self, cancel: Cancel) -> None: ...

    def sync_queues(self) -> None: ...

    async def kick(self) -> None: ...


class Actions:
    """The handlers' side of the Scheduler (see the module's docstring), over the state it is
    given."""

    def __init__(self, state: ActionState) -> None:
        self.state = state
        self._keys: dict[tuple[str, str], asyncio.Future] = {}  # submissions under way
        self._leaves_wanted: dict[tuple[str, str], None] = {}  # (plan, user), for one commit
        self._key_lookups = KeyLookups(lambda pairs: state.db.read(state.store.jobs_by_keys, pairs))

    # -- jobs -----------------------------------------------------------------------
    def may_submit(self, caller: Caller, plan: str) -> bool:
        if caller.admin:
            return True
        listed = False
        path = plan
        while path != ROOT:
            users, groups = self.state.members.get(path, ([], []))
            if users or groups:
                listed = True
                if caller.name in users or caller.groups & set(groups):
                    return True
            path = parent_of(path)
        return not listed  # a plan nobody on its path restricts is open to every hub user

    def usable_plans(self, caller: Caller, under: str = ROOT) -> list[str]:
        """The plans ``caller`` may be charged to (those that take jobs), all or under one."""
        plans = self.state.plans
        return [
            p.path
            for p in plans
            if (under == ROOT or p.path.startswith(under + "/"))
            and plans.takes_jobs(p.path)
            and self.may_submit(caller, p.path)
        ]

    async def submit_once(
        self,
        caller: Caller,
        sub: Submission | Callable[[], Awaitable[Submission]],
        key: str,
        digest: str,
    ) -> tuple[JobRow, bool]:
        """``submit`` keyed by the client: (the job, whether it is new). A retry of a request
        whose answer was lost (a 503 while the service restarted, a dropped connection) gets
        the job the first one made instead of a second job; the same key with another body
        (``digest``) is KeyReused. ``sub`` may be a coroutine function that parses the body:
        it runs only when the key is new, as far as anyone can tell: it is parsed and resolved as
        the user while the store looks the key up (each a wait in a thread of its own, which
        one after the other were two fifths of a submission's time under load), and a key
        found makes that work, and any error it raised, moot."""
        while (under_way := self._keys.get((caller.name, key))) is not None:
            await asyncio.shield(under_way)  # one submission per key at a time
        done = asyncio.get_running_loop().create_future()
        self._keys[(caller.name, key)] = done
        prepared = asyncio.ensure_future(self._prepared(caller, sub))
        try:
            row = await self._key_lookups.find(caller.name, key)
            if row is not None:
                if (row.request or {}).get("digest") != digest:
                    raise KeyReused(
                        f"Idempotency-Key {key!r} was used for job {row.id} with a different "
                        "body; send a new key for a new submission"
                    )
                return row, False
            return await self.submit(caller, await prepared, key=key, digest=digest), True
        finally:
            if not prepared.done():
                prepared.cancel()
            prepared.add_done_callback(_moot)
            del self._keys[(caller.name, key)]
            done.set_result(None)

    async def _prepared(
        self, caller: Caller, sub: Submission | Callable[[], Awaitable[Submission]]
    ) -> Submission:
        return await self._as_user(caller, await sub() if callable(sub) else sub)

    async def submit(
        self, caller: Caller, sub: Submission, key: str | None = None, digest: str = ""
    ) -> JobRow:
        """Resolve the command as the user (making their account first), validate against the
        plans and the instance, store the job, and run a cycle."""
        sub = await self._as_user(caller, sub)
        self._check_plan(caller, sub.plan)
        max_runtime = self._runtime_limit(caller, sub)
        now = self.state.clock()
        job_id = new_job_id()
        self._check_fits(caller, sub, job_id, now)
        if sub.kind is not JobKind.NOTEBOOK:  # a server's job is bounded by the hub's named servers
            self.state.pending_cap.admit(caller.name)
        # the user leaf is created on first use (docs/scheduling.md "Words": user leaf)
        leaf = self.state.plans.copy().ensure_user_leaf(sub.plan, caller.name)
        row = self._job_row(caller, sub, job_id, leaf.path, now, key, digest)
        row.max_runtime = max_runtime
        if leaf.path not in self.state.plans:
            await self._add_user_leaf(sub.plan, caller.name, now)
        if self.state.loop_running:
            # the next cycle stores it with everything else it writes, in one commit, and
            # decides on it; the answer comes once it is stored (row: as that cycle left it)
            await self.state.through_cycle(row)
            return row
        # no loop running (tests drive the cycles): store it on its own
        await self.state.db.write(self.state.store.add_job, row, now)
        async with self.state.lock:  # not while a cycle reloads the jobs from the store
            if job_id not in self.state.live:
                self.state.live.take_in(row)
        return row

    async def _as_user(self, caller: Caller, sub: Submission) -> Submission:
        """``sub`` with its command's paths resolved with the user's own rights: as root, where
        the backend runs jobs as the users, their account and private folder are made here
        when missing (``files_for``). In a thread: that runs helpers."""
        if sub.resolved:
            if self.state.storage is not None and self.state.storage.enforced:
                try:  # a notebook: its folder and quota are ready before its server starts
                    await off_loop(self.files_for, caller.name, True)
                except (UserFileError, AccountError) as err:
                    raise SubmissionError(str(err)) from None
            return sub
        return await off_loop(self._resolved, caller.name, sub)

    def _resolved(self, user: str, sub: Submission) -> Submission:
        try:
            files = self.files_for(user, create=True)
        except (UserFileError, AccountError) as err:
            raise SubmissionError(str(err)) from None
        return resolve_command(sub, files, self.state.storage_root, user)

    def _check_plan(self, caller: Caller, plan: str) -> None:
        """The plan exists, takes jobs (neither a user leaf nor a parent of other plans), and
        the caller may submit to it."""
        if plan not in self.state.plans:
            raise NotFound(
                f"there is no plan {plan!r}; plans you may use: "
                f"{', '.join(self.usable_plans(caller)) or 'none (ask an admin)'}"
            )
        if self.state.plans.get(plan).user_leaf:
            raise SubmissionError(f"{plan} is a user leaf; submit to its parent {parent_of(plan)}")
        if not self.state.plans.takes_jobs(plan):
            below = self.usable_plans(caller, under=plan)
            raise SubmissionError(
                f"{plan} has plans under it, and only a plan without child plans takes jobs "
                f"and notebooks; pick one of {', '.join(below) or 'them'}"
            )
        if not self.may_submit(caller, plan):
            raise Forbidden(
                f"you may not submit to {plan}; plans you may use: "
                f"{', '.join(self.usable_plans(caller)) or 'none (ask an admin to add you)'}"
            )

    def _runtime_limit(self, caller: Caller, sub: Submission) -> float | None:
        """The job's runtime limit: what it asked for within its plans' maximum, else their
        default (docs/runtime.md "Runtime limits"). Notebook servers get one only when the
        admin turned it on (``c.WmlaService.notebook_runtime_limit``)."""
        if sub.kind is JobKind.NOTEBOOK and not self.state.limits.notebooks:
            if sub.max_runtime is not None:
                raise SubmissionError(
                    "max_runtime: notebook servers have no runtime limit on this instance "
                    "(c.WmlaService.notebook_runtime_limit is off); leave max_runtime out"
                )
            return None
        leaf = leaf_path(sub.plan, caller.name)
        return runtime_limits.job_limit(self.state.limits.plans, leaf, sub.plan, sub.max_runtime)

    def _check_fits(self, caller: Caller, sub: Submission, job_id: str, now: float) -> None:
        """Rejected when the job can never run as asked (docs/scheduling.md "Admission"), by
        the plans and the instance or by the platform itself (a LimitRange on Kubernetes)."""
        job = Job(
            id=job_id,
            user=caller.name,
            plan=sub.plan,
            per_worker=sub.per_worker,
            min_workers=sub.min_workers,
            max_workers=sub.max_workers,
            priority=sub.priority,
            submitted=now,
            preemptible=sub.preemptible,
        )
        try:
            snapshot = Snapshot(self.state.plans, self.state.instance, [], self.state.config)
            problem = check_submission(snapshot, job, self.state.index_cache)
        except PlanError as err:
            raise SubmissionError(str(err)) from None
        if problem is None and isinstance(self.state.backend, ChecksAdmission):
            found = self.state.backend.admission_problem(sub.per_worker, sub.min_workers)
            if found is not None and found[1]:
                problem = f"rejected: {found[0]}"
        if problem:
            raise Rejected(problem)

    def _job_row(
        self,
        caller: Caller,
        sub: Submission,
        job_id: str,
        leaf: str,
        now: float,
        key: str | None,
        digest: str,
    ) -> JobRow:
        """The job as the store keeps it: what was asked, where it runs, the env it gets."""
        workdir = user_root(self.state.storage_root, caller.name) / "jobs" / job_id
        command = (
            [] if sub.kind is JobKind.NOTEBOOK else [self.state.python, sub.model_main, *sub.args]
        )
        env = {
            **sub.env,
            "WMLA_JOB_ID": job_id,
            "WMLA_JOB_DIR": str(workdir),
            "WMLA_USER": caller.name,
            "WMLA_PLAN": sub.plan,
            "WMLA_LEAF": leaf,
            "WMLA_MODEL_DIR": sub.model_dir,
        }
        request = {"name": sub.name, "args": list(sub.args), "model_dir": sub.model_dir}
        if key:
            request["digest"] = digest  # a retry with this key must send the same body
        return JobRow(
            id=job_id,
            user=caller.name,
            plan=sub.plan,
            leaf=leaf,
            kind=sub.kind.value,
            state=JobState.PENDING.value,
            gpu=sub.per_worker.gpu,
            cpu=sub.per_worker.cpu,
            memory=sub.per_worker.memory,
            limits=sub.limits.to_dict(),
            min_workers=sub.min_workers,
            max_workers=sub.max_workers,
            priority=sub.priority,
            preemptible=sub.preemptible,
            command=command,
            request=request,
            idempotency_key=key,
            workdir=str(workdir),
            env=env,
            name=sub.name,
            submitted=now,
            placement=[],
            terminating=False,
            cancel_requested=False,
            timeout_requested=False,  # set here: the cycle's bulk insert applies no defaults
            aged=False,
            reason="",
            preemptions=0,
        )

    async def _add_user_leaf(self, plan: str, user: str, now: float) -> None:
        """Make ``plan/<user>``, with every other leaf asked for meanwhile: new users' first
        submissions (a class logging in at nine) queue on the lock, and the first of them to
        get it writes all of their leaves in one commit instead of one commit each."""
        self._leaves_wanted[(plan, user)] = None
        async with self.state.lock:  # the tree changes: not in the middle of a cycle
            # its own leaf always (the batch that took it may have failed to store it), the
            # others' while their plan is still there (else their own submission says so)
            wants = [(plan, user), *(w for w in self._leaves_wanted if w[0] in self.state.plans)]
            self._leaves_wanted.clear()
            tree = self.state.plans.copy()
            added = []
            for want in dict.fromkeys(wants):
                try:
                    leaf = tree.ensure_user_leaf(*want)
                except PlanError:
                    if want == (plan, user):
                        raise
                    continue
                if leaf.path not in self.state.plans:
                    added.append(PlanRecord(leaf.path, 1.0, leaf.limit, True))
            if not added:  # another submission made it meanwhile
                return
            await self.state.db.write(self.state.store.save_plans, added, now)
            self.state.plans = tree
            for record in added:
                self.state.members[record.path] = ([], [])
            self.state.sync_queues()

    def files_for(self, user: str, create: bool = False) -> UserFiles:
        """``user``'s files with the rights their jobs run with (docs/security.md).

        ``create``: as root, make the user's account (when the backend creates accounts) and
        their private folder first. Raises AccountError when the user has no account and gets
        none. Blocking when it creates: call it from a thread on an event loop.
        """
        if not isinstance(self.state.backend, LocalAccounts):  # no local accounts (Kubernetes)
            return UserFiles(None)
        folder = user_root(self.state.storage_root, user)
        account = self.state.backend.account_for(user, home=str(folder) if create else None)
        if create:
            ensure_folder(self.state.storage_root, user, account)
            if self.state.storage is not None:
                try:  # the folder on its own filesystem, with the user's quota
                    self.state.storage.attach(user, account)
                except (StorageError, OSError) as err:
                    raise AccountError(f"your storage could not be set up: {err}") from None
        return UserFiles.of(account)

    async def visible_job(self, caller: Caller, job_id: str) -> JobRow:
        """The job if the caller may see it; 404 for everyone else (its existence is private)."""
        row = None
        if isinstance(job_id, str) and len(job_id) <= 64:
            row = await self.state.db.read(self.state.store.job, job_id)
        if row is None or (row.user != caller.name and not caller.admin):
            raise NotFound(f"there is no job {job_id!r} of yours")
        return row

    async def cancel(self, caller: Caller, job_id: str) -> JobRow:
        """Cancel through the cycle (cancels.py): the job as the store has it now, once the
        cycle stored the cancel; Conflict when there is nothing to cancel."""
        row = await self.visible_job(caller, job_id)
        await self._through_cycle(job_id, f"cancelled by {caller.name}", row)
        return await self.state.db.read(self.state.store.job, job_id) or row

    def notebook_jobs(self) -> list[str]:
        """Ids of the live notebook jobs (reconcile.py checks them against the hub)."""
        return self.state.live.notebooks()

    async def release_notebook(self, job_id: str, reason: str) -> None:
        """End a notebook job whose server is gone: its resources are free at once (the
        spawner runs the server; nothing runs under the backend)."""
        if self.state.live.kind_of(job_id) is JobKind.NOTEBOOK:
            await self._through_cycle(job_id, reason, None)

    async def _through_cycle(self, job_id: str, reason: str, row: JobRow | None) -> None:
        done = asyncio.get_running_loop().create_future()
        cancel = Cancel(job_id, reason, self.state.clock(), row, done)
        await self.state.cancel_through_cycle(cancel)

    # -- plans -----------------------------------------------------------------------
    async def change_plans(
        self,
        records: list[PlanRecord],
        create: bool,
        delete: Iterable[str] = (),
    ) -> None:
        """Validate on a copy of the tree, then write to the store, then swap the tree in."""
        delete = list(delete)
        async with self.state.lock:
            tree = plans_after(self.state.plans, records, create, delete)
            runtimes = runtimes_after(self.state.limits.plans, records, delete)
            await self.state.db.write(
                self.state.store.save_plans, records, self.state.clock(), delete=delete
            )
            self.state.plans = tree
            self.state.limits.plans = runtimes
            for path in delete:
                self.state.members.pop(path, None)
            for rec in records:
                self.state.members[rec.path] = (list(rec.users), list(rec.groups))
            self.state.sync_queues()
        await self.state.kick()

    def live_jobs_under(self, path: str) -> list[Job]:
        return [
            j
            for j in self.state.live.jobs.values()
            if j.leaf == path or j.leaf.startswith(path + "/")
        ]

    def record(self, path: str) -> PlanRecord:
        plan = self.state.plans.get(path)
        users, groups = self.state.members.get(path, ([], []))
        default, most = self.state.limits.plans.get(path, runtime_limits.NONE)
        return PlanRecord(
            plan.path, plan.share, plan.limit, plan.user_leaf, users, groups, default, most
        )


def new_job_id() -> str:
    return "job-" + secrets.token_hex(5)
