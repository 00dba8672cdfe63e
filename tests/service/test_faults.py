"""The scheduling loop while its SQLite database is locked by another process or read-only.

Nothing may be lost or invented: the backend events of that time are stored once the database
is back (a job whose workers exited 0 ends FINISHED, at its real exit time), writes of requests
fail at once with StoreUnavailable (the API's 503 with Retry-After) and change nothing, and the
event loop keeps turning (it never waits on the database).
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from extension.service.actions import KeyReused
from extension.service.storecalls import StoreUnavailable
from extension.service.submission import (
    LimitRange,
    Submission,
    SubmissionError,
    parse_submission,
)
from extension.webapi import Caller

from .test_scheduling import Rig

LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
db.execute("ROLLBACK")
"""


class Locker:
    """Another process holding the database's write lock (BEGIN EXCLUSIVE) until released."""

    def __init__(self, db: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LOCKER, str(db)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "locked"

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
async def rig(tmp_path: Path):
    rig = Rig(tmp_path)  # SQLite: the lock and the read-only file are SQLite's cases
    await rig.start()
    yield rig
    await rig.sched.stop()
    rig.store.close()


def submission(rig: Rig, user: str, seconds: float | None = None):
    folder = rig.storage / user / "models"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "main.py").write_text("print('hi')\n")
    env = {} if seconds is None else {"DOUBLE_RUN_SECONDS": str(seconds)}
    body = {
        "plan": "/sample-project/training",
        "resources": {"gpu": 1, "cpu": "250m"},
        "command": {"model_dir": "models", "model_main": "main.py"},
        "env": env,
    }
    return parse_submission(
        body,
        user=user,
        storage_root=rig.storage,
        limit_range=LimitRange.from_config({}),
        max_workers=64,
    )


class LoopWatch:
    """The longest the event loop went without running a 5 ms ticker while this ran."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task | None = None

    async def _tick(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            self.worst = max(self.worst, now - last)
            last = now

    def __enter__(self) -> LoopWatch:
        self._task = asyncio.ensure_future(self._tick())
        return self

    def __exit__(self, *exc) -> None:
        assert self._task is not None
        self._task.cancel()


def kinds(rig: Rig) -> list[str]:
    return [e.kind for e in rig.sched.events_waiting]


async def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def run_until_stored(rig: Rig, tries: int = 20) -> None:
    for _ in range(tries):
        if await rig.sched.run_cycle():
            await rig.sched.drain()
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the cycle kept failing: {rig.sched.last_error}")


async def test_a_locked_database_loses_no_event_and_never_blocks_the_loop(rig: Rig) -> None:
    row = await rig.sched.submit(Caller("alice"), submission(rig, "alice", seconds=0.3))
    await rig.cycle()
    assert rig.state(row.id) == "RUNNING"
    locker = Locker(rig.tmp / "wmla.sqlite")
    try:
        await wait_for(lambda: kinds(rig)[-1:] == ["finished"])  # its workers exit while locked
        exited_at = rig.sched.events_waiting[-1].at
        with LoopWatch() as watch:
            assert await rig.sched.run_cycle() is False
        assert "database" in rig.sched.last_error and not rig.sched.db.up
        assert watch.worst < 0.5, f"the loop stood still {watch.worst:.2f} s"
        assert kinds(rig) == ["running", "finished"]  # kept, not dropped
        # a request's write fails at once while the store is down, and changes nothing
        began = time.perf_counter()
        with pytest.raises(StoreUnavailable) as err:
            await rig.sched.submit(Caller("bob"), submission(rig, "bob"))
        assert time.perf_counter() - began < 0.5
        assert "try again" in str(err.value) and err.value.retry_after > 0
        assert await rig.sched.run_cycle() is False  # still locked: still kept
        assert rig.store.jobs(user="bob") == []
        assert rig.state(row.id) == "RUNNING"  # reads go on past the lock (WAL)
    finally:
        locker.release()
    await run_until_stored(rig)
    assert rig.sched.db.up and rig.sched.last_error is None
    job = rig.store.job(row.id)
    assert job.state == "FINISHED" and job.exit_code == 0
    assert job.ended == pytest.approx(exited_at)  # when it exited, not when it was stored
    assert [e for e, _ in rig.events(row.id)] == ["submitted", "started", "running", "finished"]


@pytest.mark.skipif(shutil.which("chattr") is None, reason="needs chattr (e2fsprogs)")
async def test_a_read_only_database_keeps_events_until_it_is_writable(rig: Rig) -> None:
    row = await rig.sched.submit(Caller("alice"), submission(rig, "alice", seconds=0.2))
    await rig.cycle()
    await wait_for(lambda: kinds(rig)[-1:] == ["finished"])
    rig.store.engine.dispose()  # the open connections would keep writing the WAL file
    files = [p for p in rig.tmp.glob("wmla.sqlite*")]
    frozen = subprocess.run(["chattr", "+i", *map(str, files)], capture_output=True)
    if frozen.returncode != 0:
        pytest.skip(f"chattr +i refused here: {frozen.stderr.decode().strip()}")
    try:
        for _ in range(3):
            assert await rig.sched.run_cycle() is False
        assert kinds(rig) == ["running", "finished"]
        with pytest.raises(StoreUnavailable):
            await rig.sched.cancel(Caller("alice"), row.id)
    finally:
        subprocess.run(["chattr", "-i", *map(str, files)], check=True)
    await run_until_stored(rig)
    assert rig.state(row.id) == "FINISHED"
    assert rig.sched.jobs == {}


async def test_the_same_idempotency_key_gives_the_same_job(rig: Rig) -> None:
    first, new = await rig.sched.submit_once(Caller("alice"), submission(rig, "alice"), "k1", "d")
    again, new_again = await rig.sched.submit_once(
        Caller("alice"), submission(rig, "alice"), "k1", "d"
    )
    assert new and not new_again and again.id == first.id
    assert len(rig.store.jobs(user="alice")) == 1
    with pytest.raises(KeyReused, match="different body"):
        await rig.sched.submit_once(Caller("alice"), submission(rig, "alice"), "k1", "other")
    # a key is the user's own: the same key from bob is bob's own new job
    other, new_other = await rig.sched.submit_once(Caller("bob"), submission(rig, "bob"), "k1", "d")
    assert new_other and other.id != first.id


async def test_concurrent_retries_with_one_key_make_one_job(rig: Rig) -> None:
    subs = [submission(rig, "alice") for _ in range(5)]
    results = await asyncio.gather(
        *(rig.sched.submit_once(Caller("alice"), s, "same", "d") for s in subs)
    )
    assert len({row.id for row, _ in results}) == 1
    assert sum(new for _, new in results) == 1
    assert len(rig.store.jobs(user="alice")) == 1


async def test_a_retry_gets_its_job_even_when_its_body_no_longer_parses(rig: Rig) -> None:
    """The body is parsed and resolved while the key is looked up: a key found makes that
    work moot, its error included (a limit lowered since, a script since removed)."""
    first, _ = await rig.sched.submit_once(Caller("alice"), submission(rig, "alice"), "k2", "d")
    parsed = []

    async def no_longer_valid() -> Submission:
        parsed.append(True)
        raise SubmissionError("model_main: no such file")

    again, new = await rig.sched.submit_once(Caller("alice"), no_longer_valid, "k2", "d")
    assert (again.id, new) == (first.id, False)
    with pytest.raises(SubmissionError, match="no such file"):  # a new key: the error is news
        await rig.sched.submit_once(Caller("alice"), no_longer_valid, "k3", "d")
    assert len(rig.store.jobs(user="alice")) == 1
    await asyncio.sleep(0)
    assert len(parsed) == 2


async def test_new_users_leaves_are_made_together(rig: Rig) -> None:
    """Twenty new users' first submissions at once: every user leaf is made and stored, in far
    fewer commits than users (the first to get the lock writes what the others queued)."""
    batches = []
    real = rig.store.save_plans

    def counted(records, *args, **kwargs):
        records = list(records)
        batches.append(len(records))
        return real(records, *args, **kwargs)

    rig.store.save_plans = counted
    users = [f"new{i}" for i in range(20)]
    subs = [submission(rig, u) for u in users]
    rows = await asyncio.gather(*(rig.sched.submit(Caller(u), s) for u, s in zip(users, subs)))
    assert len(rows) == 20
    leaves = {f"/sample-project/training/{u}" for u in users}
    assert leaves <= {p.path for p in rig.store.plans()}
    assert all(leaf in rig.sched.plans for leaf in leaves)
    assert sum(batches) == 20 and len(batches) < 10, batches


async def test_a_batch_of_leaves_that_fails_to_store_fails_only_its_writer(rig: Rig) -> None:
    """The second commit (the queued users' leaves together) fails: its writer's submission
    fails, and every user it carried still gets their leaf and their job."""
    calls = []
    real = rig.store.save_plans

    def failing(records, *args, **kwargs):
        calls.append(len(list(records)))
        if len(calls) == 2:
            raise sqlite3.OperationalError("database is locked")
        return real(records, *args, **kwargs)

    rig.store.save_plans = failing
    users = [f"late{i}" for i in range(10)]
    subs = [submission(rig, u) for u in users]
    results = await asyncio.gather(
        *(rig.sched.submit(Caller(u), s) for u, s in zip(users, subs)), return_exceptions=True
    )
    failed = [u for u, r in zip(users, results) if isinstance(r, BaseException)]
    assert len(failed) == 1 and calls[1] > 1, (failed, calls)
    stored = {p.path for p in rig.store.plans()}
    for user in users:
        leaf = f"/sample-project/training/{user}"
        assert (leaf in stored) == (user not in failed) == (leaf in rig.sched.plans)
    assert len(rig.store.jobs()) == 9


async def test_concurrent_submissions_are_stored_in_a_few_cycle_commits(tmp_path: Path) -> None:
    """Group commit: with the loop running, submissions wait for the next cycle, which stores
    them with its own writes in one transaction and decides on them before answering."""
    rig = Rig(tmp_path, gpus=64)
    commits = []
    real = rig.store.commit_cycle

    def counted(*args, **kwargs):
        commits.append(len(args[4]) if len(args) > 4 else len(kwargs.get("new_rows", ())))
        return real(*args, **kwargs)

    rig.store.commit_cycle = counted
    await rig.sched.start(rig.backend, run_loop=True)
    try:
        subs = [submission(rig, f"user{i % 5}") for i in range(30)]
        rows = await asyncio.gather(
            *(rig.sched.submit(Caller(f"user{i % 5}"), s) for i, s in enumerate(subs))
        )
        assert len({r.id for r in rows}) == 30
        assert all(r.state == "RUNNING" for r in rows)  # the answer is the cycle's decision
        stored = rig.store.jobs()
        assert len(stored) == 30 and all(j.state == "RUNNING" for j in stored)
        assert sum(commits) == 30 and len([n for n in commits if n]) < 10, commits
        kinds = {t.event for t in rig.store.transitions()}
        assert {"submitted", "started"} <= kinds
    finally:
        await rig.sched.stop()
        rig.store.close()
