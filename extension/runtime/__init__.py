"""What a training script imports to run under jupyterhub-wmla.

    from extension import runtime

    device = runtime.init_distributed()          # joins the gang's process group
    state = runtime.checkpoint.load()            # None on the first run, else where we were
    for step in ...:
        ...
        runtime.report(step=step, loss=loss.item())   # -> $WMLA_JOB_DIR/metrics.jsonl
        if runtime.should_stop():                # SIGTERM: preempted, cancelled or resized
            runtime.exit_stopped(state)          # save the checkpoint now, exit 143
    runtime.checkpoint.save(state, progress=step)  # and tells the service it has one
    runtime.cleanup()                            # leave the process group
    runtime.leave(0)                             # exit (see leave(): never through teardown)

Importing the package under the backend (``WMLA_JOB_ID`` set) installs the SIGTERM handler, so a
signal that arrives before the loop starts is not lost, and enables ``faulthandler``. Outside the
service the same script runs as a world of one worker in the current directory.
"""

from __future__ import annotations

import faulthandler
import os

from . import checkpoint
from .channel import report_checkpoint
from .distributed import barrier, cleanup, init_distributed, leave
from .env import WorkerInfo, info, is_main, job_dir, rank, world_size
from .metrics import report
from .stop import (
    STOPPED_EXIT_CODE,
    exit_stopped,
    install_stop_handler,
    request_stop,
    should_stop,
    stop_requested,
)

if os.environ.get("WMLA_JOB_ID"):
    install_stop_handler()
    # A crash in native code (gloo, nccl, CUDA) then leaves every thread's Python stack in the
    # worker's log instead of a bare "Aborted".
    faulthandler.enable(all_threads=True)

__all__ = [
    "STOPPED_EXIT_CODE",
    "WorkerInfo",
    "barrier",
    "checkpoint",
    "cleanup",
    "exit_stopped",
    "info",
    "init_distributed",
    "install_stop_handler",
    "is_main",
    "job_dir",
    "leave",
    "rank",
    "report",
    "report_checkpoint",
    "request_stop",
    "should_stop",
    "stop_requested",
    "world_size",
]
