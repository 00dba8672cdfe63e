"""The ``%wmla_*`` magics. Option parsing lives in :mod:`extension.magics.options` (pure).

While the service is unavailable the client keeps trying (``$WMLA_RETRY_SECONDS``, default 60;
0: one try) and each wait shows in the cell's output as a line ``wmla: the wmla service is
unavailable (HTTP 503 from the hub's proxy), retrying in 2 s (giving up in 58 s) ...``; when it
gives up the cell stops with ``UsageError: <what happened and what to do>``, no traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.display import display

from extension.client import WmlaClient, WmlaError
from extension.retry import Retrying
from extension.scheduler import FINAL_STATES
from extension.tables import jobs_table, plans_table

from .options import (
    OptionsError,
    TrainOptions,
    inside_folder,
    parse_train,
    submission_body,
    timeout_text,
)

CELL_FOLDER = "wmla-cells"


def user_folder(client: WmlaClient | None = None) -> Path:
    """The user's folder: ``$WMLA_USER_DIR`` (set by the spawner), else the folder the service
    reports when this machine sees it (the embedded default), else the working directory."""
    folder = os.environ.get("WMLA_USER_DIR")
    if folder:
        return Path(folder)
    if client is not None:
        try:
            storage = client.whoami().get("storage")
        except WmlaError:
            storage = None
        if storage and Path(storage).is_dir():
            return Path(storage)
    return Path.cwd()


def show_retry(notice: Retrying) -> None:
    """A wait of the client while the service is unavailable, in the cell's output."""
    sys.stdout.write(f"wmla: {notice}\n")
    sys.stdout.flush()


def resolve_code(
    opts: TrainOptions, root: Path, cwd: Path, cell: str | None = None
) -> tuple[str, str]:
    """(model_dir relative to the user's folder, model_main inside it); writes a cell script.

    ``--model-main a/b/main.py`` without ``--model-dir`` means the folder ``a/b``. A cell is
    saved as ``<model-dir or wmla-cells/<name or hash>>/<model-main or main.py>``.
    """
    model_dir, model_main = opts.model_dir, opts.model_main
    if cell is not None:
        if not cell.strip():
            raise OptionsError("%%wmla_train: the cell is empty; write the training script in it")
        if not model_dir:
            label = opts.name or hashlib.sha256(cell.encode()).hexdigest()[:10]
            model_dir = os.path.join(str(root), CELL_FOLDER, label.replace(" ", "_"))
        model_main = model_main or "main.py"
    elif not model_dir:
        if not model_main:
            raise OptionsError(
                "say what to run: --model-dir DIR --model-main main.py (paths inside your "
                "folder), or write the script in a %%wmla_train cell"
            )
        model_dir = os.path.dirname(model_main) or "."
        model_main = os.path.basename(model_main)
    elif not model_main:
        raise OptionsError("--model-main is required with --model-dir: the script, e.g. main.py")
    rel_dir = inside_folder(root, model_dir, cwd=cwd, what="--model-dir")
    folder = Path(os.path.realpath(root)) / rel_dir
    inside_folder(folder, model_main, cwd=folder, what="--model-main")
    if cell is not None:
        script = folder / model_main
        inside_folder(root, str(script), what="--model-main")
        script.parent.mkdir(parents=True, exist_ok=True)
        tmp = script.with_name(f".{script.name}.tmp")
        tmp.write_text(cell)
        os.replace(tmp, script)  # never a half-written script
    return rel_dir, model_main


def _args(line: str, prog: str, spec: dict[str, dict]) -> argparse.Namespace:
    class Parser(argparse.ArgumentParser):
        def error(self, message: str):
            raise UsageError(f"{prog}: {message}")

    parser = Parser(prog=prog, add_help=False)
    for flags, kwargs in spec.items():
        parser.add_argument(*flags.split(), **kwargs)
    try:
        return parser.parse_args(shlex.split(line))
    except ValueError as err:
        raise UsageError(f"{prog}: {err}") from None


@magics_class
class WmlaMagics(Magics):
    poll = 2.0

    def client(self) -> WmlaClient:
        try:
            return WmlaClient(on_retry=show_retry)
        except WmlaError as err:
            raise UsageError(str(err)) from None

    # -- training -----------------------------------------------------------------------------
    @line_magic
    def wmla_train(self, line: str) -> None:
        """Submit a training job: %wmla_train --plan /p --workers 2 --model-dir DIR
        --model-main main.py [--gpus-per-worker N --cpus 1 --memory 2Gi --elastic 1:4
        --priority N --name NAME --env K=V --runtime-limit 2h --wait] -- SCRIPT ARGS"""
        self._train(line, None)

    @cell_magic("wmla_train")
    def wmla_train_cell(self, line: str, cell: str) -> None:
        """The cell is the training script; options as for %wmla_train."""
        self._train(line, cell)

    def _train(self, line: str, cell: str | None) -> None:
        from widgets.monitor import JobMonitor

        try:
            opts = parse_train(line, prog="%%wmla_train" if cell is not None else "%wmla_train")
            if not opts.plan:
                opts.plan = os.environ.get("WMLA_PLAN") or None
            submission_body(opts, ".", "main.py")  # plan and options checked before any write
            client = self.client()
            root = user_folder(client)
            model_dir, model_main = resolve_code(opts, root, Path.cwd(), cell)
            job = client.submit(submission_body(opts, model_dir, model_main))
        except (OptionsError, WmlaError) as err:
            raise UsageError(str(err)) from None
        print(f"job {job['id']} submitted to {job['plan']} ({model_dir}/{model_main})")
        monitor = JobMonitor(client, job["id"])
        self.shell.user_ns["wmla_last_job"] = job
        self.shell.user_ns["wmla_last_monitor"] = monitor
        display(monitor)
        if not opts.wait:
            monitor.watch(self.poll)
            return
        try:
            while True:
                job = monitor.refresh()
                if job["state"] in FINAL_STATES:
                    break
                time.sleep(self.poll)
        except WmlaError as err:
            raise UsageError(f"stopped waiting for job {job['id']}: {err}") from None
        except KeyboardInterrupt:
            print(f"stopped waiting; job {job['id']} keeps running (%wmla_cancel {job['id']})")
            return
        self.shell.user_ns["wmla_last_job"] = job
        print(f"job {job['id']} {job['state']}" + (f": {job['reason']}" if job["reason"] else ""))
        if job["state"] == "FINISHED":
            print(f"outputs in {job['workdir']}")
        elif job["state"] == "TIMEOUT":  # the runtime limit, not a failure of the script
            print(timeout_text(job, "%wmla_plans"))

    # -- reading ------------------------------------------------------------------------------
    @line_magic
    def wmla_jobs(self, line: str) -> None:
        """List your jobs: %wmla_jobs [--state RUNNING,PENDING]"""
        args = _args(line, "%wmla_jobs", {"--state": {"default": None}})
        states = [s.strip().upper() for s in args.state.split(",")] if args.state else None
        try:
            print(jobs_table(self.client().jobs(states)))
        except WmlaError as err:
            raise UsageError(str(err)) from None

    @line_magic
    def wmla_logs(self, line: str) -> None:
        """Print a job's logs: %wmla_logs JOB [--tail N] [--worker RANK]"""
        args = _args(
            line,
            "%wmla_logs",
            {"job": {}, "--tail": {"type": int, "default": None},
             "--worker": {"type": int, "default": None}},
        )  # fmt: skip
        try:
            print(self.client().logs(args.job, tail=args.tail, worker=args.worker), end="")
        except WmlaError as err:
            raise UsageError(str(err)) from None

    @line_magic
    def wmla_cancel(self, line: str) -> None:
        """Cancel a job: %wmla_cancel JOB"""
        args = _args(line, "%wmla_cancel", {"job": {}})
        try:
            job = self.client().cancel(args.job)
        except WmlaError as err:
            raise UsageError(str(err)) from None
        print(f"job {job['id']} is {job['state']}")

    @line_magic
    def wmla_plans(self, line: str) -> None:
        """The resource plans: %wmla_plans"""
        _args(line, "%wmla_plans", {})
        try:
            print(plans_table(self.client().plans()))
        except WmlaError as err:
            raise UsageError(str(err)) from None

    @line_magic
    def wmla_usage(self, line: str) -> Any:
        """Requested vs used GPU and CPU: %wmla_usage [--plan /p] [--user NAME]
        [--range 'my recent jobs'|'last 24 hours'|...] [--refresh SECONDS]

        Without --plan and --range: the plan and a window of your recent jobs (so a training
        run just done shows), else the last 24 hours."""
        from widgets.usage import RANGES, RECENT, UsageWidget

        args = _args(
            line,
            "%wmla_usage",
            {"--plan": {"default": None}, "--user": {"default": None},
             "--range": {"default": None, "choices": [RECENT, *RANGES]},
             "--refresh": {"type": int, "default": 30}},
        )  # fmt: skip
        client = self.client()
        try:
            widget = UsageWidget(
                client, plan=args.plan, user=args.user, time_range=args.range,
                refresh_seconds=args.refresh,
            )  # fmt: skip
        except ValueError as err:  # e.g. 'my recent jobs' without any recent job
            raise UsageError(f"%wmla_usage: {err}") from None
        widget.refresh()
        self.shell.user_ns["wmla_last_usage"] = widget
        return widget
