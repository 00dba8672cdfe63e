"""The store itself on both databases it is tested on, SQLite and PostgreSQL (``store_url``):
the migrations up, down and up again, data kept across an upgrade, values that come back as
written (floats, JSON, text), and the same answers to the same queries.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from extension.metering.transitions import Transition
from extension.scheduler import UNLIMITED, Resources
from extension.service.paging import Cursor
from extension.service.records import StoreChange
from extension.service.rows import Base, JobRow
from extension.service.store import MIGRATIONS, PlanRecord, Store

TABLES = {"plans", "jobs", "transitions", "decisions", "meta"}


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def tables(url: str) -> set[str]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def schema_diff(url: str) -> list:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()


def test_migrations_go_up_down_and_up_again(store_url: str) -> None:
    cfg = alembic_config(store_url)
    head = ScriptDirectory.from_config(cfg).get_current_head()
    command.upgrade(cfg, "head")
    assert TABLES <= tables(store_url)
    assert schema_diff(store_url) == []
    command.downgrade(cfg, "base")
    assert tables(store_url) & TABLES == set()
    command.upgrade(cfg, "head")
    assert schema_diff(store_url) == []
    store = Store.open(store_url)  # at head already: opens without changing anything
    try:
        with store.engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() == head
    finally:
        store.close()


def test_an_upgrade_from_the_first_revision_keeps_the_data(store_url: str) -> None:
    """A database written by the first release, opened by this one: migrated in place."""
    command.upgrade(alembic_config(store_url), "0001")
    engine = sa.create_engine(store_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            meta = sa.MetaData()
            plans = sa.Table("plans", meta, autoload_with=conn)
            jobs = sa.Table("jobs", meta, autoload_with=conn)
            conn.execute(
                plans.insert().values(
                    path="/old",
                    share=2.0,
                    limit_gpu=3.0,
                    limit_cpu=None,
                    limit_memory=None,
                    user_leaf=False,
                    member_users=["zoë"],
                    member_groups=[],
                    created=1.0,
                    updated=1.0,
                )
            )
            conn.execute(jobs.insert().values(**_job_values("job-old")))
    finally:
        engine.dispose()
    store = Store.open(store_url)
    try:
        (plan,) = store.plans()
        assert (plan.path, plan.share, plan.limit.gpu, plan.users) == ("/old", 2.0, 3.0, ["zoë"])
        assert plan.limit.cpu == UNLIMITED
        row = store.job("job-old")
        assert row is not None and row.state == "RUNNING" and row.placement == ["n0", "n0"]
    finally:
        store.close()
    assert schema_diff(store_url) == []


def _job_values(job_id: str, **extra) -> dict:
    """A job row's columns as the first revision has them."""
    values = dict(
        id=job_id,
        user="user1",
        plan="/p",
        leaf="/p/user1",
        kind="train",
        state="RUNNING",
        gpu=1.0,
        cpu=250.0,
        memory=float(2**29),
        limits={},
        min_workers=2,
        max_workers=2,
        priority=0,
        preemptible=True,
        command=["python", "main.py"],
        request={"plan": "/p"},
        workdir="/s/user1/jobs/" + job_id,
        env={},
        name="old",
        submitted=1_800_000_000.0,
        started=1_800_000_001.0,
        ended=None,
        placement=["n0", "n0"],
        terminating=False,
        cancel_requested=False,
        reason="",
        exit_code=None,
        preemptions=0,
    )
    values.update(extra)
    return values


def test_values_come_back_as_written(store_url: str) -> None:
    """Floats to the last bit (epoch microseconds, 2**60 bytes), JSON with nesting, unicode and
    escapes, text with quotes and line breaks, NULL limits as unlimited: after a reopen too."""
    weird = "quote ' \" back\\slash % _ \n tab\t ünïcødé ✓ \u2028 \U0001f600"
    store = Store.open(store_url)
    try:
        store.save_plans(
            [
                PlanRecord(
                    "/a",
                    0.001,
                    Resources(2.5, UNLIMITED, float(2**40)),
                    False,
                    ["zoë", "o'brien"],
                    ["ml-team"],
                ),
                PlanRecord("/a/b", 1_000_000.0, Resources(UNLIMITED, UNLIMITED, UNLIMITED)),
            ],
            now=1_800_000_000.123456,
        )
        request = {"nested": {"list": [1, 2.5, None, True, "x"], "empty": {}}, "text": weird}
        row = JobRow(
            **_job_values(
                "job-1",
                memory=float(2**60),
                submitted=1_800_000_000.123456,
                exit_code=-9,
                env={"WEIRD": weird},
                request=request,
                reason=weird,
                name="n" * 100,
                placement=[],
            )
        )
        store.add_job(row, at=1_800_000_000.123456)
        store.update_jobs(
            [
                StoreChange(
                    "job-1",
                    {"state": "FAILED", "ended": 1_800_000_099.000001},
                    Transition.FAILED,
                    weird,
                )
            ],
            at=1_800_000_099.000001,
        )
        store.set_meta("weird", weird)
    finally:
        store.close()
    store = Store.open(store_url)
    try:
        a, b = store.plans()
        assert (a.share, a.limit, a.users, a.groups) == (
            0.001,
            Resources(2.5, UNLIMITED, float(2**40)),
            ["zoë", "o'brien"],
            ["ml-team"],
        )
        assert (b.share, b.limit) == (1_000_000.0, Resources(UNLIMITED, UNLIMITED, UNLIMITED))
        job = store.job("job-1")
        assert job.memory == float(2**60) and job.submitted == 1_800_000_000.123456
        assert job.ended == 1_800_000_099.000001 and job.exit_code == -9
        assert job.env == {"WEIRD": weird} and job.request == request and job.reason == weird
        submitted, failed = store.transitions("job-1")
        assert submitted.id < failed.id and failed.at == 1_800_000_099.000001
        assert (failed.event, failed.state, failed.reason) == ("failed", "FAILED", weird)
        assert store.get_meta("weird") == weird
    finally:
        store.close()


def test_the_same_queries_give_the_same_answers(store_url: str) -> None:
    """Ordering, filters and incremental reads, as the scheduler and metering use them."""
    store = Store.open(store_url)
    try:
        for i, (user, plan) in enumerate([("u2", "/p"), ("u1", "/q"), ("u1", "/p")]):
            values = _job_values(
                f"job-{i}",
                user=user,
                plan=plan,
                leaf=f"{plan}/{user}",
                state="PENDING",
                submitted=100.0 - i,
                placement=[],
            )
            store.add_job(JobRow(**values), at=100.0 - i)
        assert [j.id for j in store.jobs()] == ["job-2", "job-1", "job-0"]  # by submit time
        assert [j.id for j in store.jobs(user="u1")] == ["job-2", "job-1"]
        assert [j.id for j in store.jobs(states=["RUNNING"])] == []
        assert [j.id for j in store.jobs(limit=1)] == ["job-2"]
        ids = [t.id for t in store.transitions()]
        assert ids == sorted(ids) and len(ids) == 3
        assert [t.job_id for t in store.transitions(since_id=ids[0])] == ["job-1", "job-2"]
        assert [t.job_id for t in store.transitions(leaf_prefix="/p")] == ["job-0", "job-2"]
        assert len(store.transitions(leaf_prefix="/")) == 3  # the root: every plan
    finally:
        store.close()


def test_a_plan_prefix_is_matched_exactly(store_url: str) -> None:
    store = Store.open(store_url)
    try:
        for job_id, plan in [("job-x", "/axb"), ("job-u", "/a_b"), ("job-P", "/P")]:
            values = _job_values(job_id, plan=plan, leaf=f"{plan}/user1", placement=[])
            store.add_job(JobRow(**values), at=1.0)
        assert [t.job_id for t in store.transitions(leaf_prefix="/a_b")] == ["job-u"]
        assert [t.job_id for t in store.transitions(leaf_prefix="/p")] == []
    finally:
        store.close()


def test_a_page_goes_on_just_past_the_last_one_listed(store_url: str) -> None:
    """GET /jobs's cursor (submitted, id): ties in time go by id, filters still apply."""
    store = Store.open(store_url)
    try:
        for job_id, user, at in [
            ("job-b", "u1", 99.0),
            ("job-a", "u2", 99.0),
            ("job-c", "u1", 98.0),
        ]:
            values = _job_values(job_id, user=user, leaf=f"/p/{user}", state="PENDING")
            store.add_job(JobRow(**{**values, "submitted": at, "placement": []}), at=at)
        assert [j.id for j in store.jobs()] == ["job-c", "job-a", "job-b"]
        assert [j.id for j in store.jobs(after=Cursor(98.0, "job-c"))] == ["job-a", "job-b"]
        assert [j.id for j in store.jobs(after=Cursor(99.0, "job-a"))] == ["job-b"]
        assert [j.id for j in store.jobs(after=Cursor(98.5, "zzz"))] == ["job-a", "job-b"]
        assert [j.id for j in store.jobs(user="u1", after=Cursor(98.0, "job-c"))] == ["job-b"]
        assert [j.id for j in store.jobs(after=Cursor(98.0, "job-c"), limit=1)] == ["job-a"]
        assert store.jobs(after=Cursor(99.0, "job-b")) == []
    finally:
        store.close()


def test_keys_are_found_only_as_their_own_users(store_url: str) -> None:
    """Idempotency-Key look-ups in one query per 64 pairs: a key is its user's own, a key no
    job has is found in none, and more pairs than one query holds are all answered."""
    store = Store.open(store_url)
    try:
        for job_id, user, key in [
            ("job-1", "u1", "k1"),
            ("job-2", "u2", "k1"),
            ("job-3", "u1", "k9"),
        ]:
            values = _job_values(job_id, user=user, leaf=f"/p/{user}", state="PENDING")
            store.add_job(JobRow(**{**values, "idempotency_key": key, "placement": []}), at=1.0)
        asked = [("u1", "k1"), ("u3", "k1"), *((f"u{i}", f"new{i}") for i in range(150))]
        found = store.jobs_by_keys([*asked, ("u2", "k1"), ("u1", "k9")])
        assert {pair: row.id for pair, row in found.items()} == {
            ("u1", "k1"): "job-1",
            ("u2", "k1"): "job-2",
            ("u1", "k9"): "job-3",
        }
        assert store.jobs_by_keys([]) == {}
    finally:
        store.close()
