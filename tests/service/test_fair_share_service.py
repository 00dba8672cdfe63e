"""Fair over days in the service (docs/scheduling.md "Deserved share 2", "Admission 6"): the
usage history is charged from what the leaves held, weighs the deserved shares, survives a
restart through the store; a starved gang's start is stored and keeps it from reclaim."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from extension.scheduler import UNLIMITED, Node, Resources, SchedulerConfig
from extension.service.fair_share import FairShareSettings
from extension.service.records import InstanceBounds
from extension.service.scheduling import Scheduler
from extension.service.store import Store, sqlite_url

from .backend_double import InProcessBackend
from .test_scheduling import Rig

DAY = 86400.0
PLANS = {
    "/t": {},
    "/t/a": {"members": {"users": ["user1"]}},
    "/t/b": {"members": {"users": ["user2"]}},
}


class FairRig(Rig):
    """The scheduling rig with the usage history on (half-life a day) and ``max_gang_wait``."""

    def __init__(self, tmp: Path, max_gang_wait: float = 0.0) -> None:
        self.max_gang_wait = max_gang_wait
        super().__init__(tmp, sqlite_url(tmp / "wmla.sqlite"), gpus=4)

    def open(self) -> None:
        self.store = Store.open(self.url)
        settings = FairShareSettings(half_life=DAY, max_gang_wait=self.max_gang_wait)
        self.sched = Scheduler(
            self.store,
            InstanceBounds(Resources(UNLIMITED, UNLIMITED, UNLIMITED)),
            SchedulerConfig(grace=0.0, fair_share_half_life=DAY, max_gang_wait=self.max_gang_wait),
            storage_root=self.storage,
            python="python3",
            clock=self.clock,
            fair_share=settings,
        )
        self.sched.load(PLANS)
        nodes = [Node("local", Resources(self.gpus, 8000, 64 * 2**30))]
        self.backend = InProcessBackend(self.sched.emit, nodes, str(self.tmp / "backend"))

    async def reopen(self) -> None:
        await self.sched.stop()
        self.store.close()
        self.open()
        await self.start()


@pytest.fixture
async def rig(tmp_path: Path):
    rig = FairRig(tmp_path)
    await rig.start()
    yield rig
    await rig.sched.stop()
    rig.store.close()


async def test_a_plan_that_used_the_gpus_alone_deserves_less_and_it_survives_a_restart(
    rig: FairRig,
) -> None:
    # user1 holds all 4 GPUs alone for six hours
    alone = [await rig.submit("user1", "/t/a") for _ in range(4)]
    await rig.cycle()
    assert {rig.state(j) for j in alone} == {"RUNNING"}
    rig.clock.offset += 6 * 3600
    await rig.cycle()
    usage = dict(rig.sched.fair_share.history.usage)
    # 4 GPUs for 6 h, decayed within the window: h/ln2 * (1 - 2^(-6h/1d)) per GPU
    expected = 4 * DAY / 0.6931471805599453 * (1 - 0.5 ** (6 / 24))
    assert usage["/t/a/user1"] == pytest.approx(expected, rel=1e-3)
    # now both contend: /t/b's four jobs against /t/a's four (running) and four more pending
    for _ in range(4):
        await rig.submit("user2", "/t/b")
        await rig.submit("user1", "/t/a")
    await rig.cycle()
    plans = rig.sched.figures
    # U_a = 1, S_a = 1/2: F_a = 1/4, F_b = 1, weights F ** 3: /t/a deserves 4 x 1/65 of the 4
    assert plans["/t/a"].deserved.gpu == pytest.approx(4 / 65)
    assert plans["/t/b"].deserved.gpu == pytest.approx(4 * 64 / 65)
    waiting = [
        r.reason for r in rig.store.jobs(states=("PENDING",)) if r.plan == "/t/a" and r.reason
    ]
    assert waiting and all("a used 2.0x its share over the last 1d" in w for w in waiting)
    # a restart takes the usage back from the store (saved at the cycle 6 h later)
    saved = rig.sched.fair_share.history.to_json()
    await rig.reopen()
    assert rig.sched.fair_share.history.to_json()["usage"] == pytest.approx(
        saved["usage"], rel=1e-4
    )


async def test_history_off_is_the_default_and_reads_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path, sqlite_url(tmp_path / "wmla.sqlite"))
    await rig.start()
    try:
        assert rig.sched.fair_share.history is None
        await rig.submit("user1", "/project1/dev-team")
        await rig.cycle()
        assert rig.store.get_meta("usage_history") is None
    finally:
        await rig.sched.stop()
        rig.store.close()


async def test_a_starved_gangs_start_is_stored_and_no_reclaim_stops_it(tmp_path: Path) -> None:
    rig = FairRig(tmp_path, max_gang_wait=30.0)
    await rig.start()
    try:
        # /t/b holds all four GPUs with jobs that end in a moment
        short = {"DOUBLE_RUN_SECONDS": "0.3"}
        first = [await rig.submit("user2", "/t/b", env=short) for _ in range(4)]
        await rig.cycle()
        assert {rig.state(j) for j in first} == {"RUNNING"}
        gang = await rig.submit("user1", "/t/a", workers="4")  # its share is 2: no reclaim
        await rig.submit("user2", "/t/b")  # a one-GPU job, within /t/b's share
        rig.clock.offset += 60  # the gang is starved now
        await asyncio.sleep(0.5)  # /t/b's four jobs end
        await rig.cycle()
        await rig.cycle()
        assert rig.state(gang) == "RUNNING"
        assert rig.store.job(gang).aged
        # /t/b's pending job is within its share and the gang borrows 2: it still runs
        rig.clock.offset += 600
        await rig.cycle()
        assert rig.state(gang) == "RUNNING" and not rig.store.job(gang).terminating
        await rig.reopen()  # the mark is the store's
        await rig.cycle()
        assert rig.state(gang) == "RUNNING" and rig.sched.jobs[gang].aged
    finally:
        await rig.sched.stop()
        rig.store.close()


@pytest.mark.parametrize(
    ("trait", "value", "words"),
    [
        ("fair_share_half_life", "a week", "is not a duration"),
        ("fair_share_half_life", -5, "not a positive number of seconds"),
        ("max_gang_wait", "400d", "too long"),
        ("usage_reset_period", "1h30", "is not a duration"),
        ("fair_share_weights", {"gpus": 1}, "unknown resource 'gpus'; use gpu, cpu or memory"),
        ("fair_share_weights", {"gpu": -1}, "must be a finite number >= 0"),
        ("fair_share_weights", {"gpu": 0}, "all 0"),
    ],
)
def test_bad_fair_share_knobs_are_refused_naming_the_knob(trait, value, words) -> None:
    from traitlets import TraitError

    from extension.service.app import WmlaService

    app = WmlaService()
    with pytest.raises(TraitError) as err:
        setattr(app, trait, value)
    assert words in str(err.value) and f"c.WmlaService.{trait}" in str(err.value)
    assert app.fair_share_half_life == 0.0  # the default stands


@pytest.mark.parametrize(("value", "seconds"), [("7d", 7 * DAY), (3600, 3600.0), ("0", 0.0)])
def test_fair_share_knobs_take_durations(value, seconds) -> None:
    from extension.service.app import WmlaService

    app = WmlaService()
    app.fair_share_half_life = value
    assert app.fair_share_half_life == seconds
