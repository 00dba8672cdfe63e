"""The spawn page while a notebook job waits: its place in line, estimated start and reason.

The admission loop runs for real on a WmlaLocalSpawner and (when kubespawner is
installed) a WmlaKubeSpawner; only the service is replaced, by a script of the job's JSON as
``GET /jobs/<id>`` answers it, one answer per look (the ``queue`` object of docs/service.md "Why
a job waits, and until when", as literal dicts). The progress events are read from the spawner's
own ``progress()`` stream, as JupyterHub reads them for the spawn page.
"""

from __future__ import annotations

import asyncio
import copy
import types

import pytest

from spawner.local import WmlaLocalSpawner
from spawner.mixin import AdmissionError
from spawner.mixin.admission import waiting_message

PLAN = "/project1/dev-team"
ASSUMES = "running jobs end at their runtime limits; no new submissions"
CORE = "waiting for capacity: needs 1 worker x 1 gpu, each worker on one node; room now for 0"


def queue(plan_place=2, leaf=1, instance=5, text="in about 12 minutes", start=1764660000.0):
    return {
        "position": {"leaf": leaf, "plan": plan_place, "instance": instance},
        "plan": PLAN,
        "reason": f"{_nth(plan_place)} in line in {PLAN}; dev-team holds 2 of its 2 deserved "
        f"GPUs; {CORE}",
        "estimate": {
            "start": start,
            "in_seconds": 720,
            "text": text,
            "assumption": ASSUMES,
            "exact": False,
        },
        "updated": 1764659280.0,
    }


def _nth(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def job(state="PENDING", reason=CORE, **extra) -> dict:
    return {"id": "nb1", "state": state, "reason": reason, "plan": PLAN, **extra}


LINE_2ND = (
    f"2nd in line in {PLAN} (1st for you) — starts in about 12 minutes (estimated) — dev-team "
    "holds 2 of its 2 deserved GPUs"  # the core's reason would take the line past 160
)


class ScriptedService:
    """``POST jobs`` answers the first job; every ``GET jobs/nb1`` the next (the last repeats)."""

    def __init__(self, answers: list[dict]) -> None:
        self.answers = [copy.deepcopy(a) for a in answers]
        self.looks = 0

    async def call(self, method: str, path: str, body=None, what="", retry=5.0):
        if method == "POST":
            return self.answers[0]
        if method == "DELETE":  # a release
            return {**self.answers[-1], "state": "CANCELLED"}
        self.looks += 1
        return self.answers[min(self.looks, len(self.answers) - 1)]


def local_spawner() -> WmlaLocalSpawner:
    spawner = WmlaLocalSpawner(wmla_plan=PLAN, admission_poll_interval=0.05, gpu_group="")
    spawner.user = types.SimpleNamespace(name="alice", groups=[], settings={})
    spawner.user_options = {}
    return spawner


@pytest.fixture(params=["local", "kube"])
def make(request: pytest.FixtureRequest, tmp_path, monkeypatch):
    """Makes each spawner class (KubeSpawner is made inside a running loop); the Kubernetes one
    with a dummy kubeconfig (nothing connects: no start()) and without its pod-event stream,
    which would watch a cluster."""
    if request.param == "local":
        return local_spawner
    pytest.importorskip("kubespawner")
    from kubernetes_asyncio.config import kube_config

    from tests.spawner.test_kube import KUBECONFIG, make_spawner

    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    return lambda: make_spawner(
        "alice", wmla_plan=PLAN, admission_poll_interval=0.05, gpu_group="", events_enabled=False
    )


async def admit_and_watch(spawner, answers: list[dict]) -> tuple[list[str], object]:
    """Run the admission against the script; the messages of the progress stream, and how the
    admission ended (the plan, or the error)."""
    script = ScriptedService(answers)
    spawner.wmla_service_client = lambda: script
    admission = asyncio.ensure_future(spawner.wmla_admit())
    await asyncio.sleep(0)  # the admission is waiting before the page opens the stream
    messages = []
    async for event in spawner.progress():
        if event in spawner.wmla_spawn.events:  # the base spawner's own events come after
            messages.append(event["message"])
    try:
        outcome = await admission
    except AdmissionError as err:
        outcome = err
    return messages, outcome


async def test_the_spawn_page_follows_the_place_and_the_estimate_as_they_change(make) -> None:
    spawner = make()
    answers = [
        job(),  # the submission's answer: no forward run yet, the core's reason only
        job(queue={"position": None, "plan": PLAN, "reason": CORE, "estimate": None}),
        job(queue=queue(3)),
        job(queue=queue(3)),  # nothing changed: no new event
        job(queue=queue(2)),  # the place moved up, the same reason's words otherwise
        job(queue={**queue(2), "updated": 1764659290.0}),  # only the time stamp: no event
        job(queue=queue(2, text="in about 3 minutes")),  # the estimate's words changed
        job("RUNNING", reason="", queue=None),
    ]
    messages, outcome = await admit_and_watch(spawner, answers)
    assert outcome == PLAN
    assert messages[0].startswith(f"asking plan {PLAN} for room: gpu 0")
    assert messages[1:] == [
        CORE,
        LINE_2ND.replace("2nd", "3rd"),
        LINE_2ND,
        LINE_2ND.replace("12 minutes", "3 minutes"),
        f"admitted to {PLAN}/alice (job nb1)",
    ]


@pytest.mark.parametrize(
    ("answer", "line"),
    [
        (job(), CORE),  # the submission's answer: not placed in line yet
        (job(reason=""), f"waiting for room in {PLAN}"),
        (job(queue=None), CORE),
        (job(queue="soon"), CORE),
        (job(queue={}), CORE),  # nothing in it: the job's reason
        (job(queue={"position": "first", "estimate": [], "reason": 7}), CORE),
        (
            job(queue={"position": {"plan": 0, "leaf": True}, "reason": "r", "estimate": None}),
            "r",
        ),
        (
            job(queue={**queue(1), "estimate": {"start": "noon", "text": None}}),
            f"1st in line in {PLAN} (1st for you) — dev-team holds 2 of its 2 deserved GPUs; "
            + CORE.split("; ")[0],  # whole clauses, as many as fit in 160 characters
        ),
        (
            job(queue={**queue(4), "estimate": {"start": None, "text": "no start in sight",
                                                "assumption": ASSUMES}}),
            f"4th in line in {PLAN} (1st for you) — no start in sight — dev-team holds 2 of "
            "its 2 deserved GPUs",
        ),
        (
            job(queue={**queue(2), "reason": "held back by a reservation"}),
            f"2nd in line in {PLAN} (1st for you) — starts in about 12 minutes (estimated) — "
            "held back by a reservation",
        ),
    ],
    ids=[
        "no-queue-key",
        "no-reason-at-all",
        "queue-null",
        "queue-not-an-object",
        "queue-empty",
        "fields-of-the-wrong-type",
        "position-zero-and-bool",
        "unreadable-estimate",
        "beyond-the-horizon",
        "reason-not-starting-with-the-place",
    ],
)  # fmt: skip
def test_a_waiting_line_from_whatever_the_service_sends(answer: dict, line: str) -> None:
    assert waiting_message(answer, PLAN) == line


async def test_the_spawn_page_adds_each_short_line_once(make) -> None:
    """The service's answers go back and forth (an exact forward run, then a grouped one, whose
    assumption reads longer) and a reason runs long: the log gets each line once, none past 160
    characters, and no line carries the estimate's assumptions."""
    grouped = {**queue(2)["estimate"], "assumption": f"{ASSUMES}; later events are grouped"}
    long_reason = f"2nd in line in {PLAN}; " + "; ".join(
        f"clause {i} " + "x" * 40 for i in range(9)
    )
    answers = [
        job(),
        *[job(queue=queue(2) if i % 2 else {**queue(2), "estimate": grouped}) for i in range(6)],
        job(queue={**queue(2), "reason": long_reason}),
        job(queue={**queue(2), "reason": long_reason}),
        job("RUNNING", reason="", queue=None),
    ]
    messages, outcome = await admit_and_watch(make(), answers)
    assert outcome == PLAN
    assert messages[1:-1] == [
        "waiting for capacity: needs 1 worker x 1 gpu, each worker on one node; room now for 0",
        LINE_2ND,
        f"2nd in line in {PLAN} (1st for you) — starts in about 12 minutes (estimated) — clause 0 "
        + "x" * 40,
    ]
    assert all(len(m) <= 160 and "assumes" not in m for m in messages), messages


async def test_a_job_that_ends_while_waiting_fails_the_spawn_with_its_reason() -> None:
    spawner = local_spawner()
    answers = [job(queue=queue(1)), job("CANCELLED", reason="cancelled by admin", queue=None)]
    messages, outcome = await admit_and_watch(spawner, answers)
    assert isinstance(outcome, AdmissionError)
    assert str(outcome) == f"{PLAN}/alice: the notebook job is CANCELLED: cancelled by admin"
    assert messages[-1].startswith(f"1st in line in {PLAN} (1st for you) — starts in about")
