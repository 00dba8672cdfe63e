"""The admin page's view model over a real Scheduler and store, SQLite and PostgreSQL (no hub).

The figures come from the real core: ``schedule`` over the scheduler's own tree and jobs, as a
cycle computes them; the backend is not needed because nothing is carried out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from extension.backends.base import JobSpec
from extension.scheduler import (
    UNLIMITED,
    IndexCache,
    Instance,
    Job,
    JobState,
    Node,
    PlanError,
    Resources,
    SchedulerConfig,
    Snapshot,
    schedule,
)
from extension.service.admin import views
from extension.service.live import LiveJob
from extension.service.records import InstanceBounds, JobKind
from extension.service.scheduling import Scheduler
from extension.service.store import PlanRecord, Store

GPU = Resources(1, 250, 2**29)
PLANS = {
    "/project1": {"limit": {"gpu": 8}},
    "/project1/dev": {"share": 4, "limit": {"gpu": 4}, "members": {"users": ["alice"]}},
    "/project1/qa": {"share": 2, "limit": {"gpu": 2}},
    "/project1/support": {"share": 2, "limit": {"gpu": 2}},
    "/other": {},
}


@pytest.fixture
def sched(tmp_path: Path, store_url: str) -> Scheduler:
    store = Store.open(store_url)
    s = Scheduler(
        store,
        InstanceBounds(Resources(UNLIMITED, UNLIMITED, UNLIMITED)),
        SchedulerConfig(),
        storage_root=tmp_path / "storage",
        python="python3",
        clock=lambda: 1000.0,
    )
    s.load(PLANS)
    s.instance = Instance((Node("n0", Resources(4, 4000, 16 * 2**30)),
                           Node("n1", Resources(4, 4000, 16 * 2**30))))  # fmt: skip
    yield s
    store.close()


def run_cycle(s: Scheduler) -> None:
    """The figures a cycle would publish, from the same core."""
    s.result = schedule(Snapshot(s.plans, s.instance, list(s.jobs.values()), s.config), 1000)


def set_live(s: Scheduler, jobs: dict[str, Job], kinds: dict[str, str] | None = None) -> None:
    """``jobs`` become the scheduler's live jobs (train jobs unless ``kinds`` says otherwise)."""
    s.live.clear()
    for job_id, j in jobs.items():
        spec = JobSpec(j.id, j.user, j.leaf, j.per_worker, (), "")
        s.live.add(LiveJob(j, JobKind((kinds or {}).get(job_id, "train")), spec))


def job(id: str, plan: str, workers: int, placement: tuple[str, ...] = ()) -> Job:
    state = JobState.RUNNING if placement else JobState.PENDING
    return Job(id, "alice", plan, GPU, workers, workers, submitted=1.0, state=state,
               placement=placement)  # fmt: skip


def test_rows_show_the_tree_with_each_childs_share_of_its_parent(sched: Scheduler) -> None:
    run_cycle(sched)
    rows = {r["path"]: r for r in views.plan_rows(sched)}
    assert [r["path"] for r in views.plan_rows(sched)] == [
        "/other", "/project1", "/project1/dev", "/project1/qa", "/project1/support",
    ]  # fmt: skip
    assert [(s["name"], s["pct"]) for s in rows["/project1"]["bar"]] == [
        ("dev", 50.0), ("qa", 25.0), ("support", 25.0),
    ]  # fmt: skip
    assert rows["/project1/dev"]["limit"] == {"gpu": "4", "cpu": "-", "memory": "-"}
    assert rows["/project1/dev"]["users"] == ["alice"]
    assert rows["/project1/qa"]["depth"] == 1 and rows["/project1"]["share_pct"] == 50.0
    assert [s["pct"] for s in views.root_bar(sched)] == [50.0, 50.0]


def test_live_figures_come_from_the_last_cycle(sched: Scheduler) -> None:
    set_live(sched, {"j1": job("j1", "/project1/dev", 3, ("n0", "n0", "n1")),
                     "j2": job("j2", "/project1/qa", 1)})  # fmt: skip
    run_cycle(sched)
    rows = {r["path"]: r for r in views.plan_rows(sched)}
    assert rows["/project1/dev"]["allocated"]["gpu"] == "3"
    assert rows["/project1/dev"]["running"] == 1
    assert rows["/project1/qa"]["running"] == 1  # the cycle started it: there was room
    assert rows["/project1"]["demand"]["gpu"] == "4"


def test_form_fields_become_the_apis_body() -> None:
    body = views.plan_body(
        {"path": "/p/x", "share": "4", "gpu": " 4 ", "cpu": "", "memory": "8Gi",
         "users": "alice, bob,", "groups": ""},
        with_path=True,
    )  # fmt: skip
    assert body == {
        "path": "/p/x",
        "share": 4,
        "limit": {"gpu": "4", "memory": "8Gi"},
        "members": {"users": ["alice", "bob"], "groups": []},
    }
    # a share that is not a number goes through as text so the core's message names it
    assert views.plan_body({"share": "lots"}, with_path=False)["share"] == "lots"
    assert views.plan_body({"share": "0.5"}, with_path=False)["share"] == 0.5


def test_edit_form_round_trips_limits(sched: Scheduler) -> None:
    values = views.form_values(sched, "/project1/dev")
    assert values["gpu"] == "4" and values["cpu"] == "" and values["users"] == "alice"
    assert views.limit_form_value("cpu", 250) == "250m"
    assert views.limit_form_value("cpu", 500) == "0.5"
    assert views.limit_form_value("cpu", 2000) == "2"
    assert views.limit_form_value("memory", 8 * 2**30) == "8Gi"
    assert views.limit_form_value("memory", 1001) == "1001"


def test_preview_runs_the_core_on_a_copy(sched: Scheduler) -> None:
    # demand 4, 4 (capped at 2 by qa's limit), 2: the 8 devices of /project1 are contended once
    # qa may take 4
    wanted = [("/project1/dev", 4), ("/project1/qa", 2), ("/project1/qa", 2),
              ("/project1/support", 2)]  # fmt: skip
    set_live(sched, {f"j{i}": job(f"j{i}", p, n) for i, (p, n) in enumerate(wanted)})
    run_cycle(sched)
    before = sched.plans.copy()
    rec = PlanRecord("/project1/qa", 4, Resources(4, UNLIMITED, UNLIMITED), False, [], [])
    rows = {r["path"]: r for r in views.preview(sched, [rec], False, [], 1000)}
    assert rows["/project1/qa"]["pct_before"] == 25.0
    assert rows["/project1/qa"]["pct_after"] == 40.0
    assert rows["/project1/qa"]["changed"] and not rows["/other"]["changed"]
    assert rows["/project1/qa"]["gpu_before"] == "2"
    assert rows["/project1/qa"]["gpu_after"] == "3.2"  # 4:4:2 of 8
    assert rows["/project1/support"]["gpu_after"] == "1.6"
    # with every plan busy, on the 8 devices: /project1 and /other at 1:1, 4 each; inside
    # /project1 4:2:2 before, 4:4:2 after (qa's limit raised to 4)
    assert [rows[p]["busy_before"] for p in ("/other", "/project1/dev", "/project1/qa")] == [
        "4", "2", "1",
    ]  # fmt: skip
    assert rows["/project1/qa"]["busy_after"] == "1.6"
    assert [p.to_dict() for p in sched.plans] == [p.to_dict() for p in before]  # not saved
    gone = {r["path"]: r for r in views.preview(sched, [], False, ["/project1/support"], 1000)}
    assert gone["/project1/support"]["state"] == "removed"
    assert gone["/project1/dev"]["pct_after"] == pytest.approx(66.7)


def test_preview_refuses_what_the_core_refuses(sched: Scheduler) -> None:
    rec = PlanRecord("/project1/dev", 4, Resources(16, UNLIMITED, UNLIMITED), False, [], [])
    with pytest.raises(PlanError, match="gpu limit 16 gpu is above the limit 8 gpu"):
        views.preview(sched, [rec], False, [], 1000)


def test_move_recreates_the_subtree_and_drops_user_leaves(sched: Scheduler) -> None:
    sched.plans.ensure_user_leaf("/project1/qa", "bob")
    records, delete = views.move_plan(sched, "/project1", "/other")
    assert [r.path for r in records] == [
        "/other/project1", "/other/project1/dev", "/other/project1/qa", "/other/project1/support",
    ]  # fmt: skip
    assert records[1].users == ["alice"] and records[1].share == 4
    assert delete[0] == "/project1/qa/bob" and delete[-1] == "/project1"
    tree = views.apply_to_copy(sched.plans, records, True, delete)
    assert "/other/project1/dev" in tree and "/project1" not in tree
    with pytest.raises(PlanError, match="under itself"):
        views.move_plan(sched, "/project1", "/project1/dev")
    with pytest.raises(PlanError, match="no plan '/nope'"):
        views.move_plan(sched, "/project1/dev", "/nope")


def test_instance_view_counts_free_devices_per_node(sched: Scheduler) -> None:
    set_live(sched, {"j1": job("j1", "/project1/dev", 3, ("n0", "n0", "n1"))})
    run_cycle(sched)
    lr = {"default_request": {"gpu": 1, "cpu": 250, "memory": 512 * 2**20}, "min": {"cpu": 10}}
    view = views.instance_view(sched, lr)
    assert [(n["name"], n["gpu_free"], n["gpu_total"]) for n in view["nodes"]] == [
        ("n0", 2, 4), ("n1", 3, 4),
    ]  # fmt: skip
    assert view["capacity"]["gpu"] == "8" and view["allocated"]["gpu"] == "3"
    assert view["limit_range"]["default_request"] == {"gpu": "1", "cpu": "250m", "memory": "512Mi"}
    assert view["limit_range"]["max"]["cpu"] == "-" and view["limit_range"]["default"]["gpu"] == "-"
    assert view["limit_range"]["min"]["gpu"] == "0"
    assert views.amount("memory", 24683652 * 1024) == "23.5Gi"


def test_every_plan_busy_counts_plans_whose_users_have_leaves(sched: Scheduler) -> None:
    """Issue 38: the preview skipped every plan with children, user leaves included, so a plan
    that anyone had used showed 0 deserved GPUs with every plan busy."""
    cache = IndexCache()
    fresh = views.saturated(sched.plans, sched, 1000, cache)
    for plan, user in (("/project1/qa", "bob"), ("/project1/dev", "alice"), ("/other", "carol")):
        sched.plans.ensure_user_leaf(plan, user)
    used = views.saturated(sched.plans, sched, 1000, cache)
    for path in ("/other", "/project1/dev", "/project1/qa", "/project1/support"):
        assert used[path] == fresh[path] > 0, (path, used, fresh)
