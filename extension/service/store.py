"""The service's persistent store: plans, jobs, decisions and transitions (SQLAlchemy 2).

SQLite file by default, PostgreSQL (or anything SQLAlchemy speaks) by URL. The schema is owned by
the alembic migrations in ``extension/service/migrations``; ``Store.open`` brings any database
up to the newest revision before it is used, so an upgrade of the service migrates in place.

The ``transitions`` table is the history metering builds on: one row for every change of a job's
state or of the workers it holds, with the time, the job, the user leaf charged, the per-worker
request and the number of workers held from that time on. Integrating ``workers x per_worker``
over time between consecutive rows of a job gives exact requested resource-seconds per leaf.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    Select,
    and_,
    bindparam,
    create_engine,
    event,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from extension.metering.transitions import Transition
from extension.scheduler import UNLIMITED, JobState, Resources

from .cycle_writes import ROW_COLUMNS, job_values, transition_values, update_jobs
from .paging import Cursor
from .privacy import PRIVATE_DIR, make_dir, private_sqlite_file
from .records import JobKind, StoreChange
from .rows import DecisionRow, JobRow, MetaRow, PlanRow, TransitionRow

log = logging.getLogger(__name__)
MIGRATIONS = Path(__file__).with_name("migrations")
T = TypeVar("T")
IN_BATCH = 512  # ids in one IN list at most
KEY_BATCH = 64  # (user, key) pairs in one query: an OR of each, SQLite's parse depth is 1000


def in_batches(ids: list[T], limit: int = IN_BATCH) -> Iterator[list[T]]:
    """``ids`` as IN lists of at most ``limit``, each padded to a power of two with its last
    id (the rows found are the same). Each length of list is a statement of its own, which a
    SQLite connection prepares and keeps (128 a connection): about 80 bytes for each id it has
    room for, 40 KiB for 500. The cycle asks with every length (``fold_facts``,
    ``commit_cycle``), so the writer's connection filled its 128 as new lengths came, in the
    store's threads' memory (docs/service.md "Memory over 100,000 jobs"); padded, there are
    ten."""
    for start in range(0, len(ids), limit):
        batch = ids[start : start + limit]
        size = 1 << (len(batch) - 1).bit_length()
        yield batch + batch[-1:] * (size - len(batch))


@functools.lru_cache(maxsize=8)
def _key_query(size: int) -> Select:
    """``size`` (user, key) pairs as an OR of each (SQLite searches the unique index once per
    pair; a row-value IN scans the table), built once per padded size: building it per call
    cost more than the query."""
    jobs = JobRow.__table__
    match = or_(
        *(
            and_(jobs.c.user == bindparam(f"u{i}"), jobs.c.idempotency_key == bindparam(f"k{i}"))
            for i in range(size)
        )
    )
    return select(jobs.c.id, jobs.c.user, jobs.c.idempotency_key).where(match)


# -- plain values handed out of the store ---------------------------------------------------------
@dataclass(frozen=True)
class FoldFacts:
    cancel_requested: bool
    reason: str
    preemptions: int
    # a stop for the runtime limit under way, the limit and the start (the TIMEOUT reason)
    timeout_requested: bool = False
    max_runtime: float | None = None
    started: float | None = None


@dataclass
class PlanRecord:
    path: str
    share: float = 1.0
    limit: Resources = Resources(UNLIMITED, UNLIMITED, UNLIMITED)
    user_leaf: bool = False
    users: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    # seconds; None: no default / no maximum on this plan (runtime_limits.py)
    runtime_default: float | None = None
    runtime_max: float | None = None


def _limit_col(value: float) -> float | None:
    return None if value == UNLIMITED or math.isinf(value) else float(value)


def _limit_val(value: float | None) -> float:
    return UNLIMITED if value is None else value


def migrate(url: str) -> None:
    """Bring the database at ``url`` to the newest schema revision (creates it when new)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(cfg, "head")


def sqlite_url(path: str | Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL; None for other databases and in-memory ones."""
    parsed = make_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    if database.startswith("file:"):  # a SQLite URI filename (uri=true): SQLite's business
        return None
    return Path(database)


def make_private_sqlite(path: Path) -> None:
    """Create the database's directory (0700 when made now) and the file itself 0600 before
    SQLAlchemy opens it: the store holds every job's environment (secrets), and SQLite gives
    the -wal and -shm files it adds the database file's mode."""
    make_dir(path.parent, PRIVATE_DIR)
    for name, outcome in private_sqlite_file(path).items():
        if outcome == "fixed":
            log.warning("wmla: %s was readable by other accounts; now 0600", name)
        elif outcome in ("symlink", "other"):
            log.warning(
                "wmla: %s is a %s; its mode is left alone: make sure only this account can "
                "read it", name, "symbolic link" if outcome == "symlink" else "special file"
            )  # fmt: skip


class Store:
    """Every read and write of the service's state goes through here (one process owns it)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._session = sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str, busy_timeout: float = 2.0) -> Store:
        """``busy_timeout``: seconds a write waits for a lock another process holds before it
        fails (the service then answers 503 and retries; it never waits on the loop)."""
        db_file = sqlite_file(url)
        if db_file is not None:
            make_private_sqlite(db_file)
        migrate(url)
        if make_url(url).get_backend_name() == "sqlite":
            engine = create_engine(url, connect_args={"timeout": busy_timeout})
        else:  # a server: find out at checkout that a connection died (a database restart)
            engine = create_engine(url, pool_pre_ping=True)
        if engine.dialect.name == "sqlite":

            @event.listens_for(engine, "connect")
            def _sqlite_pragmas(conn: Any, _record: Any) -> None:
                cursor = conn.cursor()
                cursor.execute("PRAGMA foreign_keys=ON")
                cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the loop
                # 256 KiB of pages a connection instead of 2 MiB: the pool's six connections
                # each filled theirs as the file grew (RSS +4 MiB over 40,000 jobs); the kernel's
                # page cache serves the rest at the same submission rate
                cursor.execute("PRAGMA cache_size=-256")
                cursor.close()

        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back on any error."""
        with self._session() as session:
            with session.begin():
                yield session

    # -- meta ------------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        with self.session() as s:
            row = s.get(MetaRow, key)
            return None if row is None else row.value

    def set_meta(self, key: str, value: str) -> None:
        with self.session() as s:
            row = s.get(MetaRow, key)
            if row is None:
                s.add(MetaRow(key=key, value=value))
            else:
                row.value = value

    # -- plans -----------------------------------------------------------------------------------
    def plans(self) -> list[PlanRecord]:
        with self.session() as s:
            rows = s.scalars(select(PlanRow).order_by(PlanRow.path)).all()
            return [
                PlanRecord(
                    path=r.path,
                    share=r.share,
                    limit=Resources(
                        _limit_val(r.limit_gpu), _limit_val(r.limit_cpu), _limit_val(r.limit_memory)
                    ),
                    user_leaf=r.user_leaf,
                    users=list(r.member_users or []),
                    groups=list(r.member_groups or []),
                    runtime_default=r.runtime_default,
                    runtime_max=r.runtime_max,
                )
                for r in rows
            ]

    def save_plans(self, records: Iterable[PlanRecord], now: float, delete: Iterable[str] = ()):
        """Insert or update ``records`` and delete the ``delete`` paths, in one transaction."""
        with self.session() as s:
            for path in delete:
                row = s.get(PlanRow, path)
                if row is not None:
                    s.delete(row)
            for rec in records:
                row = s.get(PlanRow, rec.path)
                if row is None:
                    row = PlanRow(path=rec.path, created=now)
                    s.add(row)
                row.share = rec.share
                row.limit_gpu = _limit_col(rec.limit.gpu)
                row.limit_cpu = _limit_col(rec.limit.cpu)
                row.limit_memory = _limit_col(rec.limit.memory)
                row.user_leaf = rec.user_leaf
                row.member_users = list(rec.users)
                row.member_groups = list(rec.groups)
                row.runtime_default = rec.runtime_default
                row.runtime_max = rec.runtime_max
                row.updated = now

    # -- jobs ------------------------------------------------------------------------------------
    def add_job(self, row: JobRow, at: float) -> None:
        with self.session() as s:
            s.add(row)
            s.flush()
            s.add(_transition(row, at, Transition.SUBMITTED, ""))

    def jobs(
        self,
        user: str | None = None,
        states: Iterable[str] | None = None,
        limit: int = 0,
        after: Cursor | None = None,
    ) -> list[JobRow]:
        """Jobs in submission order (ties by id), from just past ``after`` when given."""
        with self.session() as s:
            query = select(JobRow).order_by(JobRow.submitted, JobRow.id)
            if user is not None:
                query = query.where(JobRow.user == user)
            if states is not None:
                query = query.where(JobRow.state.in_(list(states)))
            if after is not None:
                query = query.where(
                    or_(
                        JobRow.submitted > after.submitted,
                        and_(JobRow.submitted == after.submitted, JobRow.id > after.job_id),
                    )
                )
            if limit:
                query = query.limit(limit)
            return list(s.scalars(query).all())

    def job(self, job_id: str) -> JobRow | None:
        with self.session() as s:
            return s.get(JobRow, job_id)

    def jobs_by_id(self, ids: Iterable[str]) -> dict[str, JobRow]:
        ids = list(ids)
        out: dict[str, JobRow] = {}
        with self.session() as s:
            for batch in in_batches(ids):
                out.update((r.id, r) for r in s.scalars(select(JobRow).where(JobRow.id.in_(batch))))
        return out

    def jobs_by_keys(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], JobRow]:
        """The jobs made with these (user, Idempotency-Key) pairs, by pair: one indexed query
        for up to ``KEY_BATCH`` pairs (a new key, the usual case, is found in none)."""
        found = {}
        with self.engine.connect() as conn:
            for batch in in_batches(pairs, KEY_BATCH):
                values = {}
                for i, (user, key) in enumerate(batch):
                    values[f"u{i}"], values[f"k{i}"] = user, key
                rows = conn.execute(_key_query(len(batch)), values)
                found.update({(user, key): job_id for job_id, user, key in rows})
        rows = self.jobs_by_id(found.values())
        return {pair: rows[job_id] for pair, job_id in found.items() if job_id in rows}

    def fold_facts(self, ids: Iterable[str]) -> dict[str, FoldFacts]:
        """What folding a backend event needs of each job beyond the live one: whether a
        cancel is under way, the reason written, the preemptions counted, whether a stop for
        the runtime limit is under way (with the limit and the start it counts from)."""
        jobs, ids = JobRow.__table__, list(ids)
        out: dict[str, FoldFacts] = {}
        with self.engine.connect() as conn:
            for batch in in_batches(ids):
                query = select(
                    jobs.c.id,
                    jobs.c.cancel_requested,
                    jobs.c.reason,
                    jobs.c.preemptions,
                    jobs.c.timeout_requested,
                    jobs.c.max_runtime,
                    jobs.c.started,
                ).where(jobs.c.id.in_(batch))
                out.update((r.id, FoldFacts(*r[1:])) for r in conn.execute(query))
        return out

    def update_jobs(
        self,
        changes: list[StoreChange],
        at: float,
        decisions: Iterable[tuple[str, str, dict]] = (),
    ) -> list[JobRow]:
        """Apply the changes in one transaction.

        A change with a transition writes a transition row with the job's values after the
        change. Returns the updated rows.
        """
        with self.session() as s:
            out = _change_rows(s, changes, at)
            for job_id, kind, detail in decisions:
                s.add(DecisionRow(at=at, job_id=job_id, kind=kind, detail=detail))
        return out

    def commit_cycle(
        self,
        events: list[tuple[float, StoreChange]],
        changes: list[StoreChange],
        at: float,
        decisions: Iterable[tuple[str, str, dict]] = (),
        new_rows: Iterable[JobRow] = (),
    ) -> None:
        """A whole scheduling cycle in one transaction: the jobs submitted since the last one
        (``new_rows``, each with its ``submitted`` transition), the backend events it folded,
        each stamped with when it happened, then its own changes and decisions at ``at``. Either
        all of it is stored or none (the loop then keeps the events and tries again).

        One commit per cycle, however many submissions and events it carries (group commit),
        written with executemany statements rather than the ORM's unit of work: the writes are
        the service's cost per submission (benchmarks/bench_service.py). ``new_rows`` come back
        with the cycle's changes applied (the submitter's answer)."""
        new_rows = list(new_rows)
        jobs, trans = JobRow.__table__, TransitionRow.__table__
        state = {r.id: {c: getattr(r, c) for c in ROW_COLUMNS} for r in new_rows}
        submitted = Transition.SUBMITTED
        history = [transition_values(state[r.id], r.submitted, submitted, "") for r in new_rows]
        todo = [*events, *((at, change) for change in changes)]
        with self.engine.begin() as conn:
            if new_rows:
                conn.execute(insert(jobs), [job_values(r) for r in new_rows])
            wanted = list({change.job_id for _, change in todo} - set(state))
            for batch in in_batches(wanted):
                query = select(*(jobs.c[c] for c in ROW_COLUMNS)).where(jobs.c.id.in_(batch))
                state.update((row.id, dict(row._mapping)) for row in conn.execute(query))
            updates: dict[str, dict] = {}
            for when, change in todo:
                row = state.get(change.job_id)
                if row is None:
                    continue
                row.update(change.values)
                updates.setdefault(change.job_id, {}).update(change.values)
                if change.transition is not None:
                    history.append(transition_values(row, when, change.transition, change.reason))
            update_jobs(conn, updates)
            if history:
                conn.execute(insert(trans), history)
            decided = [{"at": at, "job_id": j, "kind": k, "detail": d} for j, k, d in decisions]
            if decided:
                conn.execute(insert(DecisionRow.__table__), decided)
        for row in new_rows:
            for key, value in updates.get(row.id, {}).items():
                setattr(row, key, value)

    # -- the lease: one service per database -------------------------------------------------------
    def ran_their_course(self, limit: int) -> list[tuple[str, str, str, float, float]]:
        """(user, plan, kind, started, ended) of the latest ``limit`` jobs that ran their course,
        the most recent first: training jobs that finished (or reached their limit), notebook
        servers their users stopped (the spawner cancels the job). The waiting line's history."""
        ended = [JobState.FINISHED.value, JobState.TIMEOUT.value]
        ran_out = or_(
            JobRow.state.in_(ended),
            and_(JobRow.kind == JobKind.NOTEBOOK.value, JobRow.state == JobState.CANCELLED.value),
        )
        query = (
            select(JobRow.user, JobRow.plan, JobRow.kind, JobRow.started, JobRow.ended)
            .where(JobRow.started.is_not(None), ran_out)
            .order_by(JobRow.ended.desc())
            .limit(limit)
        )
        with self.session() as s:
            return [tuple(row) for row in s.execute(query)]

    def take_lease(self, owner: str, holder: dict, now: float, ttl: float) -> dict | None:
        """Take the service lease for ``owner`` unless another live owner holds it; returns
        None when taken, else what the other holder wrote. Compare-and-set on the meta row, so
        two services racing for it cannot both win (on SQLite and PostgreSQL alike)."""
        with self.session() as s:
            row = s.get(MetaRow, LEASE)
            value = json.dumps({**holder, "owner": owner, "until": now + ttl})
            if row is None:
                s.add(MetaRow(key=LEASE, value=value))
                return None
            current = _lease(row.value)
            if current.get("owner") not in (owner, None) and current.get("until", 0) > now:
                return current
            done = s.execute(
                update(MetaRow)
                .where(MetaRow.key == LEASE, MetaRow.value == row.value)
                .values(value=value)
            )
            return None if done.rowcount == 1 else {"owner": "?", "note": "lost a race"}

    def renew_lease(self, owner: str, now: float, ttl: float) -> bool:
        """Extend ``owner``'s lease; False when another service holds it now."""
        with self.session() as s:
            row = s.get(MetaRow, LEASE)
            current = _lease(row.value) if row is not None else {}
            if current.get("owner") != owner:
                return False
            current["until"] = now + ttl
            s.execute(
                update(MetaRow)
                .where(MetaRow.key == LEASE, MetaRow.value == row.value)
                .values(value=json.dumps(current))
            )
            return True

    def release_lease(self, owner: str) -> None:
        with self.session() as s:
            row = s.get(MetaRow, LEASE)
            if row is not None and _lease(row.value).get("owner") == owner:
                s.delete(row)

    def transitions(
        self,
        job_id: str | None = None,
        since_id: int = 0,
        leaf_prefix: str | None = None,
    ) -> list[TransitionRow]:
        """Transitions in the order they were written (per job, the order they happened).

        ``since_id``: only rows with a larger id (to follow the table incrementally);
        ``leaf_prefix``: only jobs charged to that plan or below it (e.g. ``/project1``).
        """
        with self.session() as s:
            query = select(TransitionRow).order_by(TransitionRow.id)
            if job_id is not None:
                query = query.where(TransitionRow.job_id == job_id)
            if since_id:
                query = query.where(TransitionRow.id > since_id)
            if leaf_prefix is not None:
                prefix = leaf_prefix.rstrip("/")
                # a plain prefix test, not LIKE: '_' and '%' are wildcards there, and SQLite's
                # LIKE ignores case (/a_b would have matched /axb, /P matched /p)
                below = func.substr(TransitionRow.leaf, 1, len(prefix) + 1) == prefix + "/"
                query = query.where((TransitionRow.leaf == prefix) | below)
            return list(s.scalars(query).all())

    def transition_facts(self, after: int = 0) -> list[tuple]:
        """What metering folds (extension/metering/accounting.py ``Fact``), per transition
        written after id ``after``, in write order: (id, at, job, leaf, user, event, state,
        workers, max workers, gpu, cpu, memory)."""
        t = TransitionRow
        query = (
            select(
                t.id,
                t.at,
                t.job_id,
                t.leaf,
                JobRow.user,
                t.event,
                t.state,
                t.workers,
                JobRow.max_workers,
                t.gpu,
                t.cpu,
                t.memory,
            )  # fmt: skip
            .join(JobRow, JobRow.id == t.job_id)
            .where(t.id > after)
            .order_by(t.id)
        )
        with self.session() as s:
            return [tuple(row) for row in s.execute(query)]

    def preemption_details(self) -> list[tuple[str, dict]]:
        """(leaf, detail) of every Preempt stored, in order: the churn counters' history
        (extension/metering/churn.py)."""
        d = DecisionRow
        query = (
            select(JobRow.leaf, d.detail)
            .join(JobRow, JobRow.id == d.job_id)
            .where(d.kind == "preempt")
            .order_by(d.id)
        )
        with self.engine.connect() as conn:
            return [(leaf, detail) for leaf, detail in conn.execute(query)]

    def decisions(self, job_id: str) -> list[DecisionRow]:
        with self.session() as s:
            query = select(DecisionRow).where(DecisionRow.job_id == job_id)
            return list(s.scalars(query.order_by(DecisionRow.id)).all())


LEASE = "service_lease"


def _lease(value: str) -> dict:
    try:
        found = json.loads(value)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _change_rows(s: Session, changes: Iterable[StoreChange], at: float) -> list[JobRow]:
    out = []
    for change in changes:
        row = s.get(JobRow, change.job_id)
        if row is None:
            continue
        for key, value in change.values.items():
            setattr(row, key, value)
        if change.transition is not None:
            s.add(_transition(row, at, change.transition, change.reason))
        out.append(row)
    return out


def _transition(row: JobRow, at: float, kind: Transition, reason: str) -> TransitionRow:
    return TransitionRow(
        at=at,
        job_id=row.id,
        leaf=row.leaf,
        event=kind.value,
        state=row.state,
        workers=len(row.placement or []),
        gpu=row.gpu,
        cpu=row.cpu,
        memory=row.memory,
        placement=list(row.placement or []),
        reason=reason or "",
    )


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
