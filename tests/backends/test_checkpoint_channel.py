"""Checkpoint reports through the local backend's channel (worker_launcher.py "Checkpoint
reports"): real launchers and workers, the reports arriving as ``checkpoint`` events.

What must hold: a report reaches the backend with its time and progress; it is about the job
whose worker sent it whatever the worker claims; a flood costs the worker nothing and the
backend a handful of events; the channel outlives the service (a new backend over the same state
directory keeps relaying); and an account's worker can reach neither another job's channel nor
the file the launcher relays to.
"""

from __future__ import annotations

import json
import os
import pwd
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from extension.backends.local.worker_launcher import REPORT_INTERVAL

# Reports a checkpoint (rank 0 through save, every rank through report_checkpoint), writes
# what each call returned, then reports again every PERIOD seconds with a growing progress.
REPORTER = textwrap.dedent(
    """
    import os, sys, time
    from extension import runtime

    me = runtime.info()
    here = runtime.job_dir()
    runtime.checkpoint.save({"step": 1}, progress=0.25)
    sent = runtime.report_checkpoint(progress=0.5)
    open(os.path.join(here, f"sent-{me.rank}"), "w").write(repr(sent))
    period = float(os.environ.get("PERIOD", "0"))
    step = 1
    while period:
        time.sleep(period)
        step += 1
        runtime.report_checkpoint(progress=step)
        if runtime.should_stop(sync=False):
            runtime.exit_stopped({"step": step})
    time.sleep(60)
    """
)

# A worker that lies: it claims to be another job, and names it in a raw datagram too.
LIAR = textwrap.dedent(
    """
    import json, os, socket, time
    from extension import runtime

    os.environ["WMLA_JOB_ID"] = os.environ["VICTIM"]
    runtime.report_checkpoint(progress=7)
    raw = socket.socket(fileno=os.dup(int(os.environ["WMLA_REPORT_FD"])))
    claim = {"at": time.time(), "progress": 9, "job_id": os.environ["VICTIM"],
             "job": os.environ["VICTIM"], "report_file": os.environ["VICTIM_FILE"]}
    raw.send(json.dumps(claim).encode())
    open(os.path.join(runtime.job_dir(), "done"), "w").close()
    time.sleep(60)
    """
)

# A flood: garbage and oversized datagrams, then N reports as fast as the loop goes; how long
# that took; then, once the queue has drained, one last report that must get through.
FLOOD = textwrap.dedent(
    """
    import os, socket, sys, time
    from extension import runtime

    raw = socket.socket(fileno=os.dup(int(os.environ["WMLA_REPORT_FD"])))
    for junk in (b"not json", b"[1, 2]", b'{"at": "soon"}', b'{"at": 1e400}',
                 b'{"at": ' + b"9" * 5000 + b"}", b"{" * 100000, b'{"at": true}'):
        try:
            raw.send(junk, socket.MSG_DONTWAIT)
        except OSError:
            pass
    n = int(os.environ["FLOOD"])
    began = time.monotonic()
    took = sum(runtime.report_checkpoint(progress=i) for i in range(n))
    spent = time.monotonic() - began
    time.sleep(1.5)
    last = runtime.report_checkpoint(progress=-1.0)
    with open(os.path.join(runtime.job_dir(), "flood.txt"), "w") as out:
        out.write(f"{spent} {took} {last}")
    time.sleep(60)
    """
)


def last_progress(rig, job: str) -> float | None:
    reports = [e for e in rig.events.of(job) if e.kind == "checkpoint"]
    return reports[-1].progress if reports else None


def script(rig, name: str, text: str) -> str:
    path = rig.shared / f"{name}.py"
    path.write_text(text)
    path.chmod(0o644)
    return str(path)


async def test_a_checkpoint_reaches_the_backend_with_its_time_and_progress(local_rig) -> None:
    backend = local_rig.backend()
    spec = local_rig.spec("ckpt", ["python", script(local_rig, "reporter", REPORTER)])
    before = time.time()
    await backend.start(spec, ("local", "local"))
    event = await local_rig.events.wait("ckpt", "checkpoint")
    assert before <= event.at <= time.time()
    assert event.progress in (0.25, 0.5)  # save's, or the report right after it (coalesced)
    workdir = local_rig.workdir("ckpt")
    await local_rig.wait_until(lambda: (workdir / "sent-1").exists(), "both ranks to report")
    # rank 0's report went out; rank 1 has no channel (only rank 0 writes checkpoints)
    assert (workdir / "sent-0").read_text() == "True"
    assert (workdir / "sent-1").read_text() == "False"
    await local_rig.wait_until(lambda: last_progress(local_rig, "ckpt") == 0.5, "the second")
    assert "WMLA_REPORT_FD" not in (workdir / "logs" / "worker-1.log").read_text()
    await backend.stop("ckpt", 5, "test over")


async def test_the_checkpoint_written_on_sigterm_is_reported_before_released(local_rig) -> None:
    backend = local_rig.backend()
    spec = local_rig.spec("term", ["python", script(local_rig, "reporter", REPORTER)])
    spec = type(spec)(**{**spec.__dict__, "env": {"PERIOD": "0.2"}})
    await backend.start(spec, ("local",))
    await local_rig.events.wait("term", "checkpoint")
    asked = time.time()
    await backend.stop("term", 10, "preempted")
    kinds = local_rig.events.kinds("term", checkpoints=True)
    assert kinds[-1] == "released" and kinds[-2] == "checkpoint"
    last = local_rig.events.of("term")[-2]
    assert last.at >= asked  # exit_stopped's save, after the SIGTERM


async def test_a_report_is_about_the_senders_job_whatever_it_claims(local_rig) -> None:
    backend = local_rig.backend()
    victim = local_rig.spec("victim", ["python", "-c", "import time; time.sleep(60)"])
    await backend.start(victim, ("local",))
    victim_file = Path(backend.state_dir) / "jobs" / "victim"
    env = {"VICTIM": "victim", "VICTIM_FILE": str(victim_file)}
    liar = local_rig.spec("liar", ["python", script(local_rig, "liar", LIAR)], env=env)
    await backend.start(liar, ("local",))
    await local_rig.wait_until(lambda: (local_rig.workdir("liar") / "done").exists(), "the liar")
    await local_rig.wait_until(
        lambda: any(e.progress == 9 for e in local_rig.events.of("liar")), "its raw report"
    )
    reports = [e.progress for e in local_rig.events.of("liar") if e.kind == "checkpoint"]
    assert set(reports) <= {7, 9} and 9 in reports
    assert "checkpoint" not in local_rig.events.kinds("victim", checkpoints=True)
    for job in ("victim", "liar"):
        await backend.stop(job, 2, "test over")


async def test_a_flood_costs_the_worker_nothing_and_the_service_a_few_events(local_rig) -> None:
    backend = local_rig.backend()
    spec = local_rig.spec(
        "flood", ["python", script(local_rig, "flood", FLOOD)], env={"FLOOD": "200000"}
    )
    await backend.start(spec, ("local",))
    began = time.monotonic()
    result = local_rig.workdir("flood") / "flood.txt"
    await local_rig.wait_until(result.exists, "the flood to end")
    spent, took, last = result.read_text().split()
    assert float(spent) < 30  # 200,000 sends that never block
    assert last == "True"
    await local_rig.wait_until(lambda: last_progress(local_rig, "flood") == -1.0, "the last")
    elapsed = time.monotonic() - began
    events = [e for e in local_rig.events.of("flood") if e.kind == "checkpoint"]
    # the launcher writes its file at most every REPORT_INTERVAL; the backend emits per write
    assert len(events) <= elapsed / REPORT_INTERVAL + 3, len(events)
    [launcher] = backend.worker_pids("flood")
    cpu = psutil.Process(launcher).cpu_times()
    print(f"{took} of 200000 reports taken in {spent}s; launcher cpu {cpu.user + cpu.system}s")
    assert cpu.user + cpu.system < 10  # it read batches and paused, it did not spin
    record = json.loads(next(Path(backend.state_dir).rglob("*worker-0.checkpoint")).read_text())
    assert record["progress"] == -1.0 and record["reports"] <= int(took) + 1
    await backend.stop("flood", 2, "test over")


async def test_the_channel_outlives_the_service(local_rig) -> None:
    first = local_rig.backend()
    spec = local_rig.spec("kept", ["python", script(local_rig, "reporter", REPORTER)])
    spec = type(spec)(**{**spec.__dict__, "env": {"PERIOD": "0.3"}})
    await first.start(spec, ("local",))
    await local_rig.events.wait("kept", "checkpoint")
    await first.close()  # the service goes away; its workers and their launchers stay
    seen = len(local_rig.events.of("kept"))
    time.sleep(1.0)
    second = local_rig.backend()
    await second.recover([spec])
    await local_rig.wait_until(
        lambda: len([e for e in local_rig.events.of("kept")[seen:] if e.kind == "checkpoint"]) >= 2,
        "reports through the new backend",
    )
    progress = [e.progress for e in local_rig.events.of("kept")[seen:] if e.kind == "checkpoint"]
    assert progress == sorted(progress) and progress[-1] > 2
    await second.stop("kept", 5, "test over")


@pytest.mark.skipif(os.geteuid() != 0, reason="another account's worker needs root to start")
async def test_another_accounts_worker_reaches_no_channel_nor_the_relayed_file(local_rig) -> None:
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no system python that another account could run")
    victims = local_rig.backend()
    victim = local_rig.spec("held", ["python", script(local_rig, "reporter", REPORTER)])
    await victims.start(victim, ("local",))
    await local_rig.events.wait("held", "checkpoint")
    [launcher] = victims.worker_pids("held")
    worker = psutil.Process(launcher).children()[0].pid
    relayed = next(Path(victims.state_dir).rglob("*worker-0.checkpoint"))
    probe = textwrap.dedent(
        f"""
        import json, os
        out = {{}}
        for pid in ({launcher}, {worker}):
            try:
                out[str(pid)] = os.listdir(f"/proc/{{pid}}/fd")
            except OSError as err:
                out[str(pid)] = type(err).__name__
            for fd in range(3, 16):
                try:
                    os.open(f"/proc/{{pid}}/fd/{{fd}}", os.O_WRONLY)
                    out[f"{{pid}}/{{fd}}"] = "opened"
                except OSError:
                    pass
        try:
            open({str(relayed)!r}).read()
            out["file"] = "read"
        except OSError as err:
            out["file"] = type(err).__name__
        for name, where in (("plant", {str(relayed)!r} + ".tmp"), ("swap", {str(relayed)!r})):
            try:
                os.symlink("/etc/shadow", where)
                out[name] = "planted"
            except OSError as err:
                out[name] = type(err).__name__
        from extension import runtime
        out["own"] = runtime.report_checkpoint(progress=3)
        done = os.path.join(runtime.job_dir(), "probe.json")  # whole once it is there
        open(done + ".tmp", "w").write(json.dumps(out))
        os.replace(done + ".tmp", done)
        import time; time.sleep(60)
        """
    )
    attackers = local_rig.backend(run_as_user=True, python="/usr/bin/python3")
    folder = local_rig.shared / "nobody"
    folder.mkdir(mode=0o700, exist_ok=True)
    entry = pwd.getpwnam("nobody")
    os.chown(folder, entry.pw_uid, entry.pw_gid)
    spec = local_rig.spec(
        "probe", ["python", script(local_rig, "probe", probe)], user="nobody",
        workdir=folder / "jobs" / "probe",
    )  # fmt: skip
    await attackers.start(spec, ("local",))
    result = folder / "jobs" / "probe" / "probe.json"
    await local_rig.wait_until(result.exists, "the probe to run")
    found = json.loads(result.read_text())
    assert found[str(launcher)] == "PermissionError" and found[str(worker)] == "PermissionError"
    assert not [k for k, v in found.items() if v == "opened"]
    assert found["file"] == "PermissionError"
    # no link where the root launcher writes its report, nor in place of the report it relays
    assert (found["plant"], found["swap"]) == ("PermissionError", "PermissionError")
    assert found["own"] is True  # its own channel works: the report is about its own job
    await local_rig.events.wait("probe", "checkpoint")
    held = [e for e in local_rig.events.of("held") if e.kind == "checkpoint"]
    assert {e.progress for e in held} <= {0.25, 0.5}  # nothing of the probe's reached it
    await attackers.stop("probe", 2, "test over")
    await victims.stop("held", 2, "test over")


def test_the_relay_and_its_reader_follow_no_link(tmp_path: Path) -> None:
    # the report file lives in root's private state directory, where no user can write; if a
    # link stood there anyway, the launcher (root) must not write through it nor the backend
    # (root) read through it
    from extension.backends.local.records import read_report
    from extension.backends.local.worker_launcher import Relay

    target = tmp_path / "target"
    target.write_text("untouched")
    report = tmp_path / "worker-0.checkpoint"
    (tmp_path / "worker-0.checkpoint.tmp").symlink_to(target)
    relay = Relay(str(report))
    relay.latest = {"at": 1.0, "progress": None, "received": 1.0, "reports": 1}
    relay.flush(force=True)
    assert target.read_text() == "untouched" and not report.exists()
    target.write_text(json.dumps({"at": 5.0, "progress": 0.5}))
    report.symlink_to(target)
    assert read_report(str(report)) is None  # a link is refused, not followed
    report.unlink()
    report.write_text(json.dumps({"at": 5.0, "progress": 0.5}))
    assert read_report(str(report)) == {"at": 5.0, "progress": 0.5}
