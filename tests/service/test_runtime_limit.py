"""Runtime limits (issue 19): a job's ``max_runtime``, a plan's ``runtime_default`` and
``runtime_max``, and the TIMEOUT the service ends a job in when it reaches its limit.

Three layers:
- the duration parser (``extension/durations.py``) and the plans' rules
  (``extension/service/runtime_limits.py``) as tables;
- the scheduling loop running for real (its own task, tick 60 s, so a stop on time proves it
  woke at the deadline) over a real store and the real LocalBackend: worker processes that
  checkpoint through ``extension.runtime`` on SIGTERM, finish within the grace, or ignore it;
  a service restart in the middle of the stop; notebook jobs;
- a real hub, proxy and service: the API's 400s and 403s and what it shows, the admin page's
  form, and ``wmla exec-start --runtime-limit ... --wait``.

Every worker is stopped by PID at the end, whatever happened (tests/backends/conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
import time
from pathlib import Path

import pytest
import requests

from extension import cli
from extension.backends.capacity import detect_nodes
from extension.backends.local import LocalBackend
from extension.durations import DurationError, format_duration, parse_duration
from extension.magics.options import OptionsError, parse_train, submission_body
from extension.scheduler import UNLIMITED, PlanError, Resources, SchedulerConfig
from extension.service import runtime_limits
from extension.service.cancels import Conflict
from extension.service.handlers import job_json
from extension.service.records import InstanceBounds
from extension.service.scheduling import Scheduler
from extension.service.store import Store, sqlite_url
from extension.service.submission import LimitRange, SubmissionError, parse_submission
from extension.webapi import Caller
from tests.backends.conftest import kill_everything_under, remove_cgroups_of

from .hub import PROXY, Client, Hub
from .openapi_schema import schema_checker

WAIT = 60.0  # a guard against hangs, not a timing assertion


# -- the parser --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, seconds",
    [
        (90, 90.0),
        (2.5, 2.5),
        ("45s", 45.0),
        ("90m", 5400.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("1d", 86400.0),
        ("1d2h3m4s", 93784.0),
        ("1.5h", 5400.0),
        ("3600", 3600.0),
        (" 2H ", 7200.0),
        ("365d", 365 * 86400.0),
    ],
)
def test_durations_people_write_are_seconds(value, seconds) -> None:
    assert parse_duration(value) == seconds
    assert parse_duration(format_duration(seconds)) == seconds  # what is shown reads back


@pytest.mark.parametrize(
    "value, words",
    [
        ("2x", "max_runtime '2x' is not a duration: use seconds or e.g. 90m, 2h, 1h30m, 1d"),
        ("", "is not a duration"),
        ("h", "is not a duration"),
        ("1e3", "is not a duration"),
        ("30m1h", "write each unit once, largest first"),
        ("1h1h", "write each unit once"),
        ("0s", "must be more than 0"),
        (0, "is not a positive number of seconds"),
        (-5, "is not a positive number of seconds"),
        (float("nan"), "is not a positive number of seconds"),
        (float("inf"), "is not a positive number of seconds"),
        (True, "true is not a duration"),
        (None, "null is not a duration"),
        ([1], "list is not a duration"),
        ("0.5", "too short: give from 1s to 365d"),
        (366 * 86400, "too long: give from 1s to 365d (leave it out for no limit)"),
        ("9" * 100, "is not a duration"),
    ],
)
def test_what_is_not_a_duration_is_refused_naming_the_field(value, words) -> None:
    with pytest.raises(DurationError, match="^max_runtime ") as err:
        parse_duration(value)
    assert words in str(err.value)


def test_durations_are_shown_the_way_they_are_written() -> None:
    assert [format_duration(s) for s in (7200, 5400, 86400, 90061, 2.5, 45)] == [
        "2h", "1h30m", "1d", "1d1h1m1s", "2.5s", "45s"
    ]  # fmt: skip


# -- the plans' rules --------------------------------------------------------------------------
H = 3600.0


@pytest.mark.parametrize(
    "runtimes, path, expected",
    [
        ({}, "/a/b/u", (None, None)),
        ({"/a": (2 * H, None)}, "/a/b/u", (2 * H, None)),
        ({"/a": (2 * H, None), "/a/b": (H, None)}, "/a/b/u", (H, None)),  # nearest default
        ({"/a": (None, 4 * H), "/a/b": (None, 8 * H)}, "/a/b/u", (None, 4 * H)),  # smallest max
        ({"/a": (4 * H, None), "/a/b": (None, 2 * H)}, "/a/b/u", (2 * H, 2 * H)),  # capped
        ({"/a/c": (H, H)}, "/a/b/u", (None, None)),  # a sibling's settings are not ours
    ],
    ids=["none", "inherited", "nearest", "smallest-max", "default-capped", "sibling"],
)
def test_a_job_gets_the_nearest_default_and_the_smallest_maximum(runtimes, path, expected):
    found = runtime_limits.effective(runtimes, path)
    assert (found.default, found.maximum) == expected


def test_asking_more_than_the_maximum_names_the_plan_the_limit_and_the_fix() -> None:
    runtimes = {"/a": (H, 2 * H), "/a/b": (None, None)}
    assert runtime_limits.job_limit(runtimes, "/a/b/u", "/a/b", None) == H
    assert runtime_limits.job_limit(runtimes, "/a/b/u", "/a/b", 2 * H) == 2 * H
    with pytest.raises(SubmissionError) as err:
        runtime_limits.job_limit(runtimes, "/a/b/u", "/a/b", 3 * H)
    message = str(err.value)
    assert message.startswith("max_runtime 3h is more than the runtime maximum of 2h of plan /a")
    assert "(on the path of /a/b)" in message and "ask for at most 2h" in message
    assert "runtime_max" in message


def test_a_default_above_the_maximum_in_force_is_refused() -> None:
    runtime_limits.check_plans({"/a": (H, 2 * H), "/a/b": (2 * H, None)})
    own = r"plan /a: runtime_default 3h .*2h in force there \(its own runtime_max\)"
    with pytest.raises(PlanError, match=own):
        runtime_limits.check_plans({"/a": (3 * H, 2 * H)})
    above = r"plan /a/b: runtime_default 3h .*\(the runtime_max of /a above it\); set runtime_d"
    with pytest.raises(PlanError, match=above):
        runtime_limits.check_plans({"/a": (None, 2 * H), "/a/b": (3 * H, None)})


def test_the_timeout_reason_says_the_limit_and_the_start_in_utc() -> None:
    started = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
    assert runtime_limits.timeout_reason(7200, started) == (
        "runtime limit of 2h reached (started 2027-01-15 08:00:00 UTC)"
    )


# -- the loop over the real local backend ------------------------------------------------------
# rank 0 writes its pid, resumes from its checkpoint, counts; on SIGTERM: "save" checkpoints
# and leaves (exit 143, extension.runtime), "finish" completes its work within the grace (exit
# 0), "ignore" ignores SIGTERM (SIGKILL after the grace)
WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    from extension import runtime

    mode = sys.argv[1]
    here = runtime.job_dir()
    open(os.path.join(here, f"pid-{os.getpid()}"), "w").close()
    if mode == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    step = (runtime.checkpoint.load() or {"step": 0})["step"]
    while True:
        step += 1
        time.sleep(0.05)
        if runtime.should_stop(sync=False):
            if mode == "finish":
                open(os.path.join(here, "done.txt"), "w").write(str(step))
                runtime.leave(0)
            runtime.exit_stopped({"step": step})
    """
)
PLANS = {
    "/sample-project": {},
    "/sample-project/training": {},
    "/sample-project/notebooks": {},
    "/rt": {},
    "/rt/team": {},
}


class LocalRig:
    """A Scheduler with its loop running, its store, the real LocalBackend (1x4 virtual GPUs,
    workers as the service's account) and the wall clock, in a temp folder."""

    def __init__(self, tmp: Path, url: str, grace: float, notebooks: bool = False) -> None:
        self.tmp, self.url, self.grace, self.notebooks = tmp, url, grace, notebooks
        self.storage = tmp / "storage"
        folder = self.storage / "user1" / "models"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "worker.py").write_text(WORKER)
        self.open()

    def open(self) -> None:
        self.store = Store.open(self.url)
        self.sched = Scheduler(
            self.store,
            InstanceBounds(Resources(UNLIMITED, UNLIMITED, UNLIMITED)),
            SchedulerConfig(grace=self.grace, min_runtime=0.0),
            storage_root=self.storage,
            python="python3",
            tick=60.0,  # a stop on time is the loop waking at the deadline, not a tick
        )
        self.sched.limits.notebooks = self.notebooks  # c.WmlaService.notebook_runtime_limit
        self.sched.load(PLANS)
        nodes = detect_nodes("1x4", cpu_millicores=4000, memory_bytes=8 * 2**30)
        self.backend = LocalBackend(
            self.sched.emit,
            nodes,
            str(self.tmp / "backend"),
            run_as_user=False,
            real_gpus=False,
            poll_interval=0.05,
        )

    async def start(self) -> None:
        await self.sched.start(self.backend)

    async def stop(self) -> None:
        await self.sched.stop()
        self.store.close()

    async def plan(self, path: str, default: float | None, most: float | None) -> None:
        old = self.sched.record(path)
        old.runtime_default, old.runtime_max = default, most
        await self.sched.change_plans([old], create=False)

    async def submit(self, mode: str = "save", plan: str = "/rt/team", **extra) -> str:
        body = {
            "plan": plan,
            "resources": {"gpu": 1, "cpu": "100m", "memory": "64Mi"},
            "command": {"model_dir": "models", "model_main": "worker.py", "args": [mode]},
            **extra,
        }
        if extra.get("kind") == "notebook":
            body.pop("command")
            body["preemptible"] = False
        sub = parse_submission(
            body,
            user="user1",
            storage_root=self.storage,
            limit_range=LimitRange.from_config({}),
            max_workers=8,
        )
        return (await self.sched.submit(Caller("user1"), sub)).id

    async def wait(self, job_id: str, *states: str) -> object:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            row = self.store.job(job_id)
            if row.state in states:
                return row
            await asyncio.sleep(0.05)
        raise AssertionError(f"{job_id} never reached {states}: {self.store.job(job_id)}")

    def events(self, job_id: str) -> list[str]:
        return [t.event for t in self.store.transitions(job_id)]

    def pids(self, job_id: str) -> list[int]:
        folder = self.storage / "user1" / "jobs" / job_id
        return [int(p.name[4:]) for p in folder.glob("pid-*")]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie not reaped yet is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


@pytest.fixture
async def local(tmp_path: Path):
    rigs: list[LocalRig] = []

    def make(grace: float = 5.0, notebooks: bool = False) -> LocalRig:
        rig = LocalRig(tmp_path, sqlite_url(tmp_path / "wmla.sqlite"), grace, notebooks)
        rigs.append(rig)
        return rig

    try:
        yield make
    finally:
        for rig in rigs:
            try:
                await rig.stop()
            except Exception:  # teardown goes on: the processes must die
                pass
        kill_everything_under(str(tmp_path))
        remove_cgroups_of(tmp_path / "backend")


@pytest.mark.parametrize(
    "mode, state, last",
    [
        ("save", "TIMEOUT", "timed-out"),  # SIGTERM: checkpoint, exit 143, released
        ("finish", "FINISHED", "finished"),  # done within the grace: its own end stands
        ("ignore", "TIMEOUT", "timed-out"),  # SIGKILL after the grace, released
    ],
)
async def test_a_job_at_its_limit_gets_the_usual_stop_and_ends_timeout(
    local, mode: str, state: str, last: str
) -> None:
    rig = local(grace=1.0 if mode == "ignore" else 5.0)
    await rig.start()
    job = await rig.submit(mode, max_runtime="2s")
    running = await rig.wait(job, "RUNNING")
    shown = job_json(running)
    assert shown["max_runtime"] == 2.0 and shown["deadline"] == running.started + 2.0
    row = await rig.wait(job, "TIMEOUT", "FINISHED", "FAILED", "CANCELLED")
    assert row.state == state, row.reason
    assert rig.events(job)[-2:] == ["timing-out", last]
    # on time, though the loop's tick is 60 s: it slept until the deadline
    assert 2.0 <= row.ended - row.started < 2.0 + rig.grace + 3.0
    assert job_json(row)["deadline"] is None and job_json(row)["max_runtime"] == 2.0
    assert all(gone(pid) for pid in rig.pids(job))
    workdir = Path(row.workdir)
    if mode == "save":
        assert row.reason.startswith("runtime limit of 2s reached (started ")
        assert row.reason.endswith(" UTC)") and row.exit_code is None
        assert (workdir / "checkpoints" / "latest.pt").exists()  # saved on SIGTERM
        assert row.checkpointed is not None and row.checkpointed >= row.started + 2.0
    if mode == "finish":
        assert (workdir / "done.txt").exists() and row.exit_code == 0
    if mode == "ignore":
        assert not (workdir / "checkpoints" / "latest.pt").exists()


async def test_the_plan_default_applies_and_the_maximum_refuses_nothing_stored(local) -> None:
    rig = local()
    await rig.start()
    await rig.plan("/rt", 3.0, 3600.0)
    assert rig.sched.limits.plans["/rt"] == (3.0, 3600.0)
    before = len(rig.store.jobs())
    with pytest.raises(SubmissionError, match=r"runtime maximum of 1h of plan /rt \(on the pa"):
        await rig.submit(max_runtime="2h")
    assert len(rig.store.jobs()) == before  # refused before anything was written
    job = await rig.submit()  # no limit asked: /rt's default, inherited by /rt/team
    assert rig.store.job(job).max_runtime == 3.0
    row = await rig.wait(job, "TIMEOUT")
    assert row.reason.startswith("runtime limit of 3s reached")
    # a narrower maximum below caps the inherited default for a job that asks for nothing
    await rig.plan("/rt/team", None, 2.0)
    capped = await rig.submit()
    assert rig.store.job(capped).max_runtime == 2.0
    with pytest.raises(PlanError, match="runtime_default 3s is more than the runtime maximum"):
        await rig.plan("/rt/team", 3.0, 2.0)
    assert rig.sched.limits.plans["/rt/team"] == (None, 2.0)  # unchanged
    stored = {p.path: (p.runtime_default, p.runtime_max) for p in rig.store.plans()}
    assert stored["/rt/team"] == (None, 2.0) and stored["/rt"] == (3.0, 3600.0)
    await rig.wait(capped, "TIMEOUT")


async def test_a_job_without_any_limit_runs_on_and_a_cancel_during_the_stop_is_refused(
    local,
) -> None:
    rig = local(grace=30.0)
    await rig.start()
    free = await rig.submit("save", plan="/sample-project/training")
    limited = await rig.submit("ignore", max_runtime=2)
    await rig.wait(limited, "RUNNING")
    await asyncio.sleep(3.0)
    assert rig.store.job(limited).timeout_requested  # stopping, ignoring SIGTERM for 30 s
    with pytest.raises(Conflict, match="already stopping .*runtime limit of 2s.*ends TIMEOUT"):
        await rig.sched.cancel(Caller("user1"), limited)
    assert rig.store.job(free).max_runtime is None and rig.store.job(free).state == "RUNNING"
    await rig.sched.cancel(Caller("user1"), free)
    assert (await rig.wait(free, "CANCELLED")).reason == "cancelled by user1"


async def test_a_restart_during_the_timeout_stop_still_ends_timeout(local) -> None:
    """The service goes away while a job at its limit is in its grace period (the worker
    ignores SIGTERM): the next service over the same store and state sends the stop again and
    the job ends TIMEOUT, as a cancel under way ends CANCELLED."""
    first = local(grace=30.0)
    await first.start()
    job = await first.submit("ignore", max_runtime="2s")
    await first.wait(job, "RUNNING")
    deadline = time.monotonic() + WAIT
    while not first.store.job(job).timeout_requested:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    pids = first.pids(job)
    for task in first.sched.calls.under_way():  # the service dies mid-grace
        task.cancel()
    await first.stop()
    assert pids and not any(gone(pid) for pid in pids)  # the worker outlived the service
    row = Store.open(first.url).job(job)
    assert (row.state, row.terminating, row.timeout_requested) == ("RUNNING", True, True)
    second = local(grace=1.0)
    await second.start()  # re-adopts the worker, sends the stop again
    row = await second.wait(job, "TIMEOUT", "FAILED", "CANCELLED", "PENDING")
    assert row.state == "TIMEOUT" and row.reason.startswith("runtime limit of 2s reached")
    assert all(gone(pid) for pid in pids)
    assert second.events(job)[-2:] == ["timing-out", "timed-out"]


async def test_notebook_jobs_get_limits_only_when_the_admin_turns_them_on(local) -> None:
    off = local()
    await off.start()
    await off.plan("/sample-project/notebooks", 2.0, None)
    with pytest.raises(SubmissionError, match="notebook_runtime_limit is off"):
        await off.submit(plan="/sample-project/notebooks", kind="notebook", max_runtime=5)
    free = await off.submit(plan="/sample-project/notebooks", kind="notebook")
    assert off.store.job(free).max_runtime is None  # the plan's default is for training jobs
    await off.stop()
    on = local(notebooks=True)
    await on.start()
    job = await on.submit(plan="/sample-project/notebooks", kind="notebook")
    assert on.store.job(job).max_runtime == 2.0
    row = await on.wait(job, "TIMEOUT")
    # ended at once (the spawner runs the server: its poll sees TIMEOUT and stops it)
    assert row.reason.startswith("runtime limit of 2s reached") and row.placement == []
    assert 2.0 <= row.ended - row.started < 4.0
    assert on.events(job)[-1] == "timed-out"
    assert on.store.job(free).state == "RUNNING"  # submitted while it was off: no limit


# -- the CLI and magic flag --------------------------------------------------------------------
def test_the_runtime_limit_flag_sends_max_runtime_in_seconds() -> None:
    for prog, framework in (("%wmla_train", False), ("wmla exec-start", True)):
        argv = ["PyTorch"] if framework else []
        argv += ["--plan", "/p", "--runtime-limit", "1h30m", "--model-main", "m.py"]
        opts = parse_train(argv, prog=prog, framework=framework, cli=framework)
        assert submission_body(opts, ".", "m.py")["max_runtime"] == 5400
    opts = parse_train("--plan /p --runtime-limit 2.5")
    assert submission_body(opts, ".", "m.py")["max_runtime"] == 2.5
    assert "max_runtime" not in submission_body(parse_train("--plan /p"), ".", "m.py")
    with pytest.raises(OptionsError, match=r"--runtime-limit: '2x' is not a duration: use sec"):
        parse_train("--plan /p --runtime-limit 2x")


# -- through a real hub ------------------------------------------------------------------------
SLEEPER = "import sys, time\ntime.sleep(float(sys.argv[1]))\n"
needs_hub = pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    if not PROXY.exists():
        pytest.skip("configurable-http-proxy is missing: run `make install`")
    hub = Hub(
        tmp_path_factory.mktemp("runtime-hub"),
        {"tick": 1, "grace": 1, "device_layout": "1x4", "min_runtime": 0},
    )
    try:
        hub.start()
        hub.tokens = {n: hub.user_token(n) for n in ("admin", "user1")}
        hub.clients = {n: Client(hub, t) for n, t in hub.tokens.items()}
        for user in ("admin", "user1"):
            folder = hub.storage / user / "models" / "sleeper"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "main.py").write_text(SLEEPER)
        admin = hub.clients["admin"]
        for path, body in (("/rt", {"runtime_default": "90m", "runtime_max": "2h"}),
                           ("/rt/team", {})):  # fmt: skip
            r = admin.post("/plans", json={"path": path, **body})
            assert r.status_code == 201, r.text
        yield hub
    finally:
        hub.stop()


def sleeper(plan: str = "/rt/team", seconds: float = 60, **extra) -> dict:
    return {
        "plan": plan,
        "resources": {"gpu": 0, "cpu": "100m", "memory": "64Mi"},
        "command": {"model_dir": "models/sleeper", "model_main": "main.py",
                    "args": [str(seconds)]},
        **extra,
    }  # fmt: skip


def error(r: requests.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text[:500])
    assert r.headers["Content-Type"].startswith("application/json")
    return r.json()["error"]


def job_count(client: Client) -> int:
    return len(client.get("/jobs").json()["jobs"])


@needs_hub
def test_plans_show_their_runtime_settings_and_what_a_job_there_gets(hub: Hub) -> None:
    plans = {p["path"]: p for p in hub.clients["user1"].get("/plans").json()["plans"]}
    assert (plans["/rt"]["runtime_default"], plans["/rt"]["runtime_max"]) == (5400, 7200)
    team = plans["/rt/team"]
    assert (team["runtime_default"], team["runtime_max"]) == (None, None)
    assert team["runtime"] == {"default": 5400, "default_from": "/rt", "max": 7200,
                               "max_from": "/rt"}  # fmt: skip
    assert hub.clients["user1"].get("/plans/rt").json()["runtime_max"] == 7200


@needs_hub
def test_only_plan_admins_set_or_raise_runtime_limits(hub: Hub) -> None:
    user1 = hub.clients["user1"]
    r = user1.patch("/plans/rt", json={"runtime_max": "10h"})
    assert "only plan admins may change plans" in error(r, 403)
    r = user1.post("/plans", json={"path": "/mine", "runtime_max": "10d"})
    assert "only plan admins" in error(r, 403)
    assert user1.get("/plans/rt").json()["runtime_max"] == 7200  # unchanged
    assert "/mine" not in {p["path"] for p in user1.get("/plans").json()["plans"]}


@pytest.mark.parametrize(
    "path, body, words",
    [
        ("/plans/rt", {"runtime_max": "soon"}, "/rt: runtime_max 'soon' is not a duration"),
        ("/plans/rt", {"runtime_default": -1}, "/rt: runtime_default -1 is not a positive"),
        ("/plans/rt/team", {"runtime_default": "3h"},
         "plan /rt/team: runtime_default 3h is more than the runtime maximum of 2h in force "
         "there (the runtime_max of /rt above it)"),
        ("/plans/rt", {"runtime_max": "1h"},
         "plan /rt: runtime_default 1h30m is more than the runtime maximum of 1h"),
    ],
    ids=["bad-max", "negative-default", "child-default-over-max", "max-under-own-default"],
)  # fmt: skip
@needs_hub
def test_bad_plan_runtime_settings_are_a_400_and_change_nothing(hub, path, body, words) -> None:
    admin = hub.clients["admin"]
    before = admin.get("/plans").json()["plans"]
    assert words in error(admin.patch(path, json=body), 400)
    assert admin.get("/plans").json()["plans"] == before


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"max_runtime": "2x"},
         "max_runtime '2x' is not a duration: use seconds or e.g. 90m, 2h, 1h30m, 1d"),
        ({"max_runtime": 0}, "max_runtime 0 is not a positive number of seconds"),
        ({"max_runtime": "3h"},
         "max_runtime 3h is more than the runtime maximum of 2h of plan /rt (on the path of "
         "/rt/team); ask for at most 2h"),
    ],
    ids=["not-a-duration", "zero", "over-the-maximum"],
)  # fmt: skip
@needs_hub
def test_a_refused_max_runtime_is_a_400_naming_it_and_stores_nothing(hub, extra, words) -> None:
    user1 = hub.clients["user1"]
    before = job_count(user1)
    assert words in error(user1.post("/jobs", json=sleeper(**extra)), 400)
    assert job_count(user1) == before


@needs_hub
def test_a_job_shows_its_limit_and_deadline_and_inherits_the_default(hub: Hub) -> None:
    user1 = hub.clients["user1"]
    r = user1.post("/jobs", json=sleeper())
    assert r.status_code == 201, r.text
    job = user1.wait_state(r.json()["id"], {"RUNNING"})
    assert job["max_runtime"] == 5400 and job["deadline"] == job["started"] + 5400
    ended = user1.delete(f"/jobs/{job['id']}").json()
    assert ended["max_runtime"] == 5400
    r = user1.post("/jobs", json=sleeper("/sample-project/training"))
    assert r.json()["max_runtime"] is None and r.json()["deadline"] is None  # no limit there
    user1.delete(f"/jobs/{r.json()['id']}")


@needs_hub
def test_the_admin_page_sets_a_plans_runtime_limits(hub: Hub) -> None:
    from tests.admin.test_admin_page import login, xsrf_of

    session = login(hub, "admin")
    assert session.admin_status == 200
    page = session.get(f"{hub.url}/services/wmla/admin?edit=%2Frt%2Fteam", timeout=30).text
    assert 'name="runtime_max"' in page and 'name="runtime_default"' in page
    form = {"_xsrf": xsrf_of(page), "action": "update", "path": "/rt/team", "share": "1",
            "runtime_default": "1h", "runtime_max": "90m"}  # fmt: skip
    r = session.post(f"{hub.url}/services/wmla/admin/plans", data=form, timeout=30)
    assert r.status_code == 200, r.text[:500]  # redirected to the page, saved
    team = hub.clients["user1"].get("/plans/rt/team").json()
    assert (team["runtime_default"], team["runtime_max"]) == (3600, 5400)
    page = session.get(f"{hub.url}/services/wmla/admin?edit=%2Frt%2Fteam", timeout=30).text
    assert 'value="1h30m"' in page  # shown back as written
    r = session.post(
        f"{hub.url}/services/wmla/admin/plans",
        data={**form, "_xsrf": xsrf_of(page), "runtime_default": "3h"},
        timeout=30,
    )
    assert r.status_code == 400 and "runtime_default 3h is more than" in r.text
    hub.clients["admin"].patch("/plans/rt/team", json={"runtime_default": None,
                                                       "runtime_max": None})  # fmt: skip


@needs_hub
def test_exec_start_with_a_runtime_limit_waits_for_the_timeout_and_exits_1(
    hub: Hub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    for name in ("WMLA_CONFIG", "WMLA_PLAN", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WMLA_CONFIG", str(hub.tmp / "no-logon.json"))
    monkeypatch.setenv("WMLA_URL", hub.url)
    monkeypatch.setenv("WMLA_TOKEN", hub.tokens["user1"])
    argv = ["exec-start", "PyTorch", "--plan", "/rt/team", "--model-dir", "models/sleeper",
            "--model-main", "main.py", "--cpus", "100m", "--gpus-per-worker", "0"]  # fmt: skip
    code = cli.main([*argv, "--runtime-limit", "2x", "--", "60"])
    assert code == 2 and "--runtime-limit: '2x' is not a duration" in capsys.readouterr().err
    code = cli.main([*argv, "--runtime-limit", "2s", "--wait", "--json", "--", "60"])
    out, err = capsys.readouterr()
    job = json.loads(out)
    assert code == 1 and job["state"] == "TIMEOUT" and job["max_runtime"] == 2
    assert "was stopped at its runtime limit (runtime limit of 2s reached (started " in err
    assert "Ask for more time with --runtime-limit" in err
    assert f"job {job['id']} TIMEOUT" in err  # the watch's final line


@needs_hub
def test_the_openapi_document_describes_the_runtime_fields(hub: Hub) -> None:
    import jsonschema

    user1 = hub.clients["user1"]
    doc = user1.get("/openapi.json").json()
    check = schema_checker(doc)

    body = sleeper(max_runtime="2s")
    check(body, "JobInput")
    check({**body, "max_runtime": 2}, "JobInput")
    check({**body, "max_runtime": None}, "JobInput")
    r = user1.post("/jobs", json=body)
    assert r.status_code == 201, r.text
    check(user1.wait_state(r.json()["id"], {"RUNNING", "TIMEOUT"}), "Job")
    ended = user1.wait_state(r.json()["id"], {"TIMEOUT"})
    assert ended["reason"].startswith("runtime limit of 2s reached (started ")
    check(ended, "Job")
    check(user1.get("/plans/rt").json(), "Plan")
    check({"path": "/x", "runtime_default": "90m", "runtime_max": None}, "PlanInput")
    with pytest.raises(jsonschema.ValidationError):
        check({**ended, "state": "EXPIRED"}, "Job")


async def test_a_deadline_during_a_shrink_waits_for_its_end_without_spinning_the_loop(
    tmp_path: Path,
) -> None:
    """A shrink's grace may outlast the deadline: the loop neither sleeps until a deadline
    already past (it would wake every 10 ms) nor stops the job mid-resize; once resized, the
    next cycle stops it."""
    from extension.service.changes import due_timeouts, next_deadline

    from .test_scheduling import Rig

    rig = Rig(tmp_path)
    await rig.start()
    try:
        job = await rig.submit("user1", "/sample-project/training", "1", max_runtime=60)
        await rig.cycle()
        running = rig.sched.jobs[job]
        assert next_deadline(rig.sched) == pytest.approx(running.started + 60)
        rig.sched.live[job].resize_to = ("local",)  # a shrink under way
        now = running.started + 61
        assert next_deadline(rig.sched) is None and due_timeouts(rig.sched, now) == []
        rig.sched.live[job].resize_to = None
        [change] = due_timeouts(rig.sched, now)
        assert (change.job_id, change.transition, change.values["timeout_requested"]) == (
            job,
            "timing-out",
            True,
        )
        assert change.reason.startswith("runtime limit of 1m reached")
        assert next_deadline(rig.sched) is None
    finally:
        rig.sched.calls.discard_queued()  # the queued stop is not carried out here
        await rig.sched.stop()
        rig.store.close()
