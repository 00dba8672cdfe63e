"""Exactly-once job ends (issue 38, item 8): a service killed with SIGKILL anywhere between its
job's workers' exit and the commit of the job's end leaves the end where the next service
finds it; the job is FINISHED every time, never "no record of job ...'s workers".

Each point is a real process killed by SIGKILL there (crash_rig.py says which points), then a
new service over the same database and state folder, in this process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from extension.backends.local.records import Gang, GangRecords
from tests.backends.conftest import kill_everything_under, remove_cgroups_of

from .crash_rig import POINTS, QuickRig

ROOT = Path(__file__).resolve().parents[2]
WAIT = 60.0  # a guard against hangs, not a timing assertion


@pytest.mark.parametrize("point", POINTS)
async def test_a_service_killed_before_the_end_is_stored_recovers_it_finished(
    tmp_path: Path, point: str
) -> None:
    rig = None
    try:
        child = subprocess.run(
            [sys.executable, "-m", "tests.service.crash_rig", str(tmp_path), point],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert child.returncode == -9, child.stderr[-3000:]
        job = (tmp_path / "job").read_text()
        rig = QuickRig(tmp_path)
        row = rig.store.job(job)
        stored_before = row.state
        assert stored_before == ("FINISHED" if point == "committed" else "RUNNING")
        await rig.start()
        deadline = time.monotonic() + WAIT
        while (row := rig.store.job(job)).state == "RUNNING" or rig.kept(job):
            assert time.monotonic() < deadline, (row, rig.kept(job))
            await asyncio.sleep(0.05)
        assert (row.state, row.exit_code) == ("FINISHED", 0), row.reason
        assert rig.events(job).count("finished") == 1
        assert not any(rig.backend.devices_in_use().values())
    finally:
        if rig is not None:
            await rig.stop()
        kill_everything_under(str(tmp_path))
        remove_cgroups_of(tmp_path / "backend")


def test_a_record_keeps_the_outcome_and_only_an_ended_one_is_dropped(tmp_path: Path) -> None:
    """``remove_ended`` drops a record that holds an outcome, never a new start's."""
    records = GangRecords(str(tmp_path))
    gang = Gang("j1", "u", str(tmp_path), ("node0",), 0, "l1", 0.0, [])
    records.write(gang)
    records.remove_ended("j1")
    assert "j1" in records.read()  # running: kept
    records.write(gang, {"kind": "finished", "exit_code": 0, "message": "", "at": 1.0})
    assert records.read()["j1"]["outcome"]["kind"] == "finished"
    records.remove_ended("j1")
    assert records.read() == {} and not Path(records.job_dir("j1")).exists()
    records.remove_ended("j1")  # gone already: nothing to do
