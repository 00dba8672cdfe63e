"""extension.runtime: worker info from the environment, checkpoints, metrics, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from extension import runtime
from extension.runtime import checkpoint, metrics
from extension.runtime.env import info

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def job_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process as worker ``RANK`` of a job whose directory is ``tmp_path``."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WMLA_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WMLA_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("WMLA_JOB_ID", "job-1")
    return tmp_path


def test_info_reads_the_variables_the_backend_sets() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
        "WMLA_JOB_ID": "job-7",
        "WMLA_JOB_DIR": "/data/u/jobs/job-7",
        "WMLA_USER": "u",
        "WMLA_BACKEND": "nccl",
        "CUDA_VISIBLE_DEVICES": "2,3",
    }
    me = info(env)
    assert (me.rank, me.world_size, me.local_rank, me.local_world_size) == (3, 4, 1, 2)
    assert (me.master_addr, me.master_port) == ("10.0.0.1", 29400)
    assert (me.job_id, me.job_dir, me.user, me.backend, me.devices) == (
        "job-7",
        "/data/u/jobs/job-7",
        "u",
        "nccl",
        "2,3",
    )
    assert not me.is_main and me.distributed


def test_run_by_hand_it_is_a_world_of_one_in_the_current_directory() -> None:
    me = info({})
    assert (me.rank, me.world_size, me.backend, me.job_dir) == (0, 1, "gloo", os.getcwd())
    assert me.is_main and not me.distributed


@pytest.mark.parametrize(
    "env, message",
    [
        pytest.param({"RANK": "one"}, "RANK='one' is not a whole number", id="not-a-number"),
        pytest.param({"RANK": "2", "WORLD_SIZE": "2"}, "must be below WORLD_SIZE=2", id="rank"),
        pytest.param({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1", id="world"),
        pytest.param({"WMLA_BACKEND": "mpi"}, "must be gloo or nccl", id="backend"),
        pytest.param(
            {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2 must be below", id="local"
        ),
    ],
)
def test_bad_variables_are_named_in_the_error(env: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        info(env)


def test_checkpoint_round_trip_is_atomic_and_written_by_rank_zero(job_env, monkeypatch) -> None:
    assert checkpoint.load() is None
    assert checkpoint.load(default={"step": 0}) == {"step": 0}
    path = checkpoint.save({"step": 5, "weights": [1.0, 2.0]})
    assert path == str(job_env / "checkpoints" / "latest.pt")
    assert checkpoint.load() == {"step": 5, "weights": [1.0, 2.0]}
    assert os.listdir(job_env / "checkpoints") == ["latest.pt"]  # no temporary left behind

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert checkpoint.save({"step": 6}) is None  # only rank 0 writes...
    assert checkpoint.load()["step"] == 5  # ...every rank reads
    assert checkpoint.save({"step": 6}, name="rank-1", all_ranks=True)
    assert checkpoint.load("rank-1") == {"step": 6}


def test_a_failed_save_keeps_the_previous_checkpoint(job_env) -> None:
    checkpoint.save({"step": 1})

    class Unpicklable:
        def __reduce__(self):  # noqa: ANN204
            raise RuntimeError("cannot pickle this")

    with pytest.raises(RuntimeError, match="cannot pickle"):
        checkpoint.save({"step": 2, "bad": Unpicklable()})
    assert checkpoint.load() == {"step": 1}
    assert os.listdir(job_env / "checkpoints") == ["latest.pt"]


def test_checkpoints_with_tensors_use_torch(job_env) -> None:
    import torch

    checkpoint.save({"w": torch.arange(3.0)})
    assert (job_env / "checkpoints" / "latest.pt").read_bytes()[:2] == b"PK"
    assert torch.equal(checkpoint.load()["w"], torch.arange(3.0))


def test_a_checkpoint_name_that_is_a_path_is_refused(job_env) -> None:
    with pytest.raises(ValueError, match="checkpoint name '../x'"):
        checkpoint.save({}, name="../x")


def test_report_appends_one_json_line_per_call_from_rank_zero(job_env, monkeypatch) -> None:
    import torch

    runtime.report(step=1, loss=torch.tensor(0.5), accuracy=0.25, note="warm-up")
    runtime.report(step=2, loss=float("nan"))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert runtime.report(step=2, loss=1.0) is None  # rank 1 does not write by default
    runtime.report(step=2, loss=2.0, all_ranks=True)

    raw = (job_env / "metrics.jsonl").read_text().splitlines()
    lines = [json.loads(r) for r in raw]
    assert [(x["step"], x["rank"]) for x in lines] == [(1, 0), (2, 0), (2, 1)]
    assert lines[0]["loss"] == 0.5 and lines[0]["accuracy"] == 0.25
    assert lines[0]["note"] == "warm-up" and isinstance(lines[0]["time"], float)
    assert lines[1]["loss"] is None  # NaN: JSON has none
    assert metrics.read(str(job_env / "metrics.jsonl")) == lines


@pytest.mark.parametrize(
    "kwargs, message",
    [
        pytest.param({"step": 1, "time": 3}, "'time' is reserved", id="reserved"),
        pytest.param({"step": 1, "loss": [1, 2]}, "'loss' has type list", id="list"),
        pytest.param({"step": "1"}, "step must be a whole number", id="step"),
    ],
)
def test_report_refuses_what_cannot_be_plotted(job_env, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        runtime.report(**kwargs)
    assert not (job_env / "metrics.jsonl").exists()


def test_report_refuses_a_tensor_that_is_not_a_scalar(job_env) -> None:
    import torch

    with pytest.raises(ValueError, match="'loss' is not a single number"):
        runtime.report(step=1, loss=torch.ones(3))


def test_read_skips_a_line_still_being_written(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo')
    assert metrics.read(str(path)) == [{"step": 1}]


SIGTERM_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from extension import runtime
    state = runtime.checkpoint.load() or {"step": 0}
    print("ready", flush=True)
    step = state["step"]
    while True:
        step += 1
        time.sleep(0.01)
        if runtime.should_stop():
            runtime.exit_stopped({"step": step})
    """
)


def test_sigterm_means_checkpoint_now_then_exit_143(tmp_path: Path) -> None:
    env = {**os.environ, "WMLA_JOB_ID": "job-1", "WMLA_JOB_DIR": str(tmp_path)}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_SCRIPT], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == runtime.STOPPED_EXIT_CODE == 143
    finally:
        proc.kill()
        proc.wait()
    os.environ["WMLA_JOB_DIR"] = str(tmp_path)
    try:
        assert checkpoint.load()["step"] >= 1
    finally:
        del os.environ["WMLA_JOB_DIR"]


def test_importing_outside_a_job_leaves_sigterm_alone(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WMLA_")}
    env["PYTHONPATH"] = str(ROOT)
    code = "import signal; from extension import runtime; "
    code += "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr


def test_should_stop_agrees_across_ranks_of_a_real_gloo_group(tmp_path: Path) -> None:
    """Rank 1 alone gets the signal; both ranks leave the loop at the same step."""
    script = textwrap.dedent(
        """
        import os, sys
        from extension import runtime
        runtime.init_distributed(timeout_s=60)
        me = runtime.info()
        for step in range(1, 1000):
            if me.rank == 1 and step == 5:
                runtime.request_stop()
            if runtime.should_stop():
                print(f"rank {me.rank} stops at {step}", flush=True)
                runtime.exit_stopped()
        sys.exit(1)
        """
    )
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    try:
        for rank in range(2):
            env = {
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "WMLA_JOB_ID": "job-1",
                "WMLA_JOB_DIR": str(tmp_path),
                "OMP_NUM_THREADS": "1",
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True
                )
            )
        outs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [143, 143]
        assert outs == ["rank 0 stops at 5\n", "rank 1 stops at 5\n"]
    finally:
        for p in procs:
            p.kill()
            p.wait()


LEAVE_SCRIPT = textwrap.dedent(
    """
    import logging, sys, threading, time
    from extension import runtime
    runtime.init_distributed(timeout_s=60)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    # a thread that would keep an orderly interpreter exit waiting: leave() does not wait
    threading.Thread(target=time.sleep, args=(600,)).start()
    print("done, not flushed")
    logging.info("logged")
    runtime.cleanup()
    runtime.leave(5)
    """
)


def test_a_worker_that_joined_a_group_leaves_at_once_with_its_output_flushed(
    tmp_path: Path,
) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0", "WORLD_SIZE": "1"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WMLA_JOB_ID="job-1")
    env.update(WMLA_JOB_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", LEAVE_SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 5, done.stderr
    assert done.stdout == "done, not flushed\n"
    assert "logged" in done.stderr


def test_leave_without_a_group_is_an_ordinary_exit() -> None:
    code = "from extension import runtime; print('bye'); runtime.leave(4)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WMLA_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (4, "bye\n"), done.stderr
