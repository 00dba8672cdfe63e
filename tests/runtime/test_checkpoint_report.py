"""extension.runtime's checkpoint report (channel.py): what it sends, and that it never blocks
or fails training when the channel is missing, closed, full or not a channel at all."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from extension import runtime
from extension.runtime import channel, checkpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def job_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", channel.ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WMLA_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("WMLA_JOB_ID", "job-1")
    return tmp_path


@pytest.fixture
def launcher_end(job_env: Path, monkeypatch: pytest.MonkeyPatch):
    """The launcher's end of a channel whose other end this process holds as WMLA_REPORT_FD."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    monkeypatch.setenv(channel.ENV, str(theirs.fileno()))
    try:
        yield ours
    finally:
        ours.close()
        theirs.close()


def received(sock: socket.socket) -> list[dict]:
    out = []
    while True:
        try:
            out.append(json.loads(sock.recv(4096, socket.MSG_DONTWAIT)))
        except BlockingIOError:
            return out


def test_save_reports_after_the_file_is_in_place(launcher_end) -> None:
    before = time.time()
    target = checkpoint.save({"step": 3}, progress=3)
    [report] = received(launcher_end)
    assert report == {"at": pytest.approx(report["at"]), "progress": 3.0}
    assert before <= report["at"] <= time.time()
    assert report["at"] >= os.stat(target).st_mtime - 0.01  # after the file was written
    assert runtime.report_checkpoint() is True
    assert received(launcher_end) == [{"at": pytest.approx(time.time(), abs=5), "progress": None}]


def test_only_rank_zero_saves_and_reports(launcher_end, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert checkpoint.save({"step": 1}, progress=1) is None
    assert received(launcher_end) == []


def test_a_bad_progress_fails_before_anything_is_written(launcher_end) -> None:
    with pytest.raises(ValueError, match="progress must be a number"):
        checkpoint.save({"step": 1}, progress="epoch 3")
    assert not checkpoint.exists()
    assert runtime.report_checkpoint(progress=float("nan")) is True  # JSON has no NaN
    assert received(launcher_end)[-1]["progress"] is None


def test_without_a_channel_the_report_is_dropped_and_training_goes_on(job_env, monkeypatch):
    assert runtime.report_checkpoint(progress=1) is False  # run by hand, under torchrun
    assert checkpoint.save({"step": 1}, progress=1)
    read_end, write_end = os.pipe()
    for value in ("not-a-number", "99999", str(write_end)):  # garbage, not open, not a socket
        monkeypatch.setenv(channel.ENV, value)
        assert runtime.report_checkpoint() is False
    os.close(read_end)
    os.close(write_end)
    stream, peer = socket.socketpair()  # a socket, but a stream: not the launcher's kind
    monkeypatch.setenv(channel.ENV, str(stream.fileno()))
    assert runtime.report_checkpoint() is False
    stream.close()
    peer.close()


def test_a_closed_channel_drops_the_report(launcher_end) -> None:
    launcher_end.close()  # the launcher (and the service behind it) is gone
    assert runtime.report_checkpoint(progress=2) is False
    assert checkpoint.save({"step": 2}, progress=2)  # the checkpoint itself is written
    assert checkpoint.load() == {"step": 2}


def test_a_full_channel_never_blocks(launcher_end) -> None:
    began = time.monotonic()
    results = [runtime.report_checkpoint(progress=n) for n in range(20000)]  # nobody reads
    assert time.monotonic() - began < 10
    assert results[0] is True and results[-1] is False  # the queue filled up: dropped
    assert received(launcher_end)[0]["progress"] == 0


def test_a_worker_with_default_sigpipe_survives_a_dead_channel(tmp_path: Path) -> None:
    """A script (or a library) may restore SIGPIPE's default, which kills on a broken pipe."""
    code = textwrap.dedent(
        """
        import os, signal, socket
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        os.environ["WMLA_REPORT_FD"] = str(theirs.fileno())
        ours.close()
        from extension import runtime
        print(runtime.report_checkpoint(progress=1), runtime.checkpoint.save({"a": 1}) is not None)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WMLA_JOB_DIR": str(tmp_path)}
    env.pop("WMLA_JOB_ID", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
