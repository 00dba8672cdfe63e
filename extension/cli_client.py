"""The ``wmla`` client subcommands, with dlicmd's spellings.

======================================  ==============================================
wmla                                    dlicmd
======================================  ==============================================
``wmla logon --url URL --username U``   ``--logon --username U --password P``
``wmla exec-start PyTorch [options]``   ``--exec-start PyTorch --consumer /p ...``
``wmla exec-get [JOB]``                 ``--exec-get [JOB]`` (Slurm's ``squeue``, ``sacct``)
``wmla exec-stop JOB``                  ``--exec-stop JOB`` (also ``--exec-delete``)
``wmla exec-outLogs JOB``               ``--exec-outLogs JOB``
``wmla plans``, ``wmla usage``          (none)
``wmla shares [--plan P] [--reset]``    (Slurm's ``sshare``)
======================================  ==============================================

Training options are those of ``%wmla_train`` (``extension/magics/options.py``); the script's own
arguments follow ``--``. Every command prints a table, or JSON with ``--json``. Bad flags exit 2
with a message; a refusal by the service exits 1 with the service's explanation.

``exec-start --wait`` prints one line per change as the job goes (:func:`watch`): its state (the
service's reason while PENDING, the placement once RUNNING, the exit code at the end) and the
latest line of metrics the script reported; with ``--json`` these go to stderr and the job's JSON
to stdout. It exits 1 when the job did not finish. ``exec-get`` lists one line per job, newest
first, with its USER (a plan admin sees everyone's; ``--user`` and ``--state`` filter) and its
reason cut to one line (``exec-get JOB`` shows it whole); notebook servers (kind ``notebook``)
show as ``notebook (running)`` / ``notebook (ended)`` with their end time, not as cancelled
jobs. ``exec-stop`` says ``cancelling`` for a job whose workers are being stopped. Slurm's
words (``submit``, ``list``, ``squeue``, ``cancel``, ``scancel``, ...) answer with the wmla
command to use (exit 2).

While the service is unavailable (the hub restarting it, its store locked) every command keeps
trying for ``--retry-seconds`` (default ``$WMLA_RETRY_SECONDS``, else 60; 0: one try) and says
so on stderr, one line per wait (``wmla plans: the wmla service is unavailable (HTTP 503 from
the hub's proxy), retrying in 2 s (giving up in 58 s) ...``); ``exec-start`` sends one
``Idempotency-Key`` on all its tries, so a retry never makes a second job.

``extension/cli.py`` calls :func:`add_commands` from ``build_parser``, :func:`dlicmd_argv` on the
arguments, and :func:`run` for the commands in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from extension.client import WmlaClient, WmlaError
from extension.clientconfig import api_url, save_config
from extension.logon_token import DEFAULT_DAYS, expiry_text, request_token
from extension.magics.options import (
    OptionsError,
    inside_folder,
    parse_train,
    retry_seconds,
    submission_body,
    timeout_text,
)
from extension.retry import Retrying
from extension.scheduler import FINAL_STATES
from extension.tables import (
    job_details,
    jobs_table,
    metrics_text,
    plain_text,
    plans_table,
    quota_table,
    shares_table,
    state_line,
    usage_table,
)

COMMANDS = frozenset(
    {
        "logon",
        "exec-start",
        "exec-get",
        "exec-stop",
        "exec-outLogs",
        "plans",
        "usage",
        "shares",
        "quota",
    }
)
# dlicmd's spellings: ``dlicmd --exec-start PyTorch ...`` -> ``wmla exec-start PyTorch ...``
DLICMD = {
    "--logon": "logon",
    "--exec-start": "exec-start",
    "--exec-get": "exec-get",
    "--exec-stop": "exec-stop",
    "--exec-delete": "exec-stop",
    "--exec-outLogs": "exec-outLogs",
    "--exec-outlogs": "exec-outLogs",
    "--plans": "plans",
    "--usage": "usage",
    "--shares": "shares",
}


# what Slurm users type first, and the wmla command that does it
SLURM = {
    "submit": "wmla exec-start PyTorch --plan PLAN --model-dir DIR --model-main main.py -- ARGS",
    "list": "wmla exec-get --state PENDING,RUNNING (what is alive), wmla exec-get (history)",
    "cancel": "wmla exec-stop JOB",
    "logs": "wmla exec-outLogs JOB",
}
SLURM |= {
    "sbatch": SLURM["submit"],
    "srun": SLURM["submit"],
    "squeue": SLURM["list"],
    "sacct": "wmla exec-get (newest first; --user, --state; one job in full: exec-get JOB)",
    "scancel": SLURM["cancel"],
    "sshare": "wmla shares",
    "sinfo": "wmla plans",
}


def slurm_hint(argv: Sequence[str]) -> str | None:
    """The message for a Slurm spelling (``wmla squeue``), or None: argparse would only say
    "invalid choice" and list the commands."""
    word = argv[0] if argv else ""
    if word not in SLURM:
        return None
    return f"wmla: {word!r} is not a wmla command; use: {SLURM[word]}"


def dlicmd_argv(argv: Sequence[str] | None) -> list[str]:
    """Rewrite a leading dlicmd-style ``--exec-start`` into the subcommand ``exec-start``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DLICMD:
        argv[0] = DLICMD[argv[0]]
    elif argv and argv[0].lower() == "exec-outlogs":
        argv[0] = "exec-outLogs"
    if argv[:1] == ["exec-start"] and len(argv) > 1 and argv[1].startswith("-"):
        if argv[1] not in ("-h", "--help"):
            argv.insert(1, "")  # no framework: argparse would call the first option unknown
    return argv


def add_commands(sub: Any) -> None:
    """Register the client subcommands on ``build_parser``'s subparsers."""
    logon = _add_logon(sub)
    start = sub.add_parser(
        "exec-start",
        help="submit a training job: exec-start PyTorch --consumer PLAN --workerDeviceNum N "
        "--model-dir DIR --model-main main.py -- ARGS",
        description="Submit a training job. Options (then -- and the script's arguments):\n"
        + exec_start_options(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    start.add_argument("rest", nargs=argparse.REMAINDER, help="options, then -- script args")

    get = _add_exec_get(sub)

    stop = sub.add_parser("exec-stop", help="cancel a job")
    stop.add_argument("job")
    stop.add_argument("--json", action="store_true")

    logs = sub.add_parser("exec-outLogs", help="print a job's worker logs")
    logs.add_argument("job")
    logs.add_argument("--worker", type=int, help="one worker's log (rank)")
    logs.add_argument("--tail", type=int, help="only the last N lines")
    logs.add_argument("--json", action="store_true")

    plans = sub.add_parser("plans", help="the resource plans and their figures")
    plans.add_argument("--json", action="store_true")

    usage = sub.add_parser("usage", help="requested vs used resources and GPU-hours")
    usage.add_argument("--plan", help="plan subtree, e.g. /project1")
    usage.add_argument("--user", help="one user's usage")
    usage.add_argument(
        "--hours",
        type=_hours,
        default=24.0,
        help=f"how far back from now, more than 0, at most {MAX_HOURS:g} (default 24)",
    )
    usage.add_argument("--step", type=_step, help="seconds between points (at least 1)")
    usage.add_argument("--json", action="store_true")
    shares = _add_shares(sub)
    quota = sub.add_parser(
        "quota",
        help="your storage quota: used, soft, hard, grace and files (as GPFS's mmlsquota)",
        description="Your folder's storage quota as the kernel holds it. Plan admins see "
        "every user's (as mmrepquota), or one with --user.",
    )
    quota.add_argument("--user", help="one user's (plan admins only)")
    quota.add_argument("--json", action="store_true")
    for parser in (logon, get, stop, logs, plans, usage, shares, quota):
        parser.add_argument(
            "--retry-seconds",
            type=retry_seconds,
            metavar="S",
            help="keep trying this long while the service is unavailable (default "
            "$WMLA_RETRY_SECONDS, else 60; 0: one try)",
        )


# The service's usage API spans at most 400 days (extension/metering/handlers.py MAX_RANGE).
MAX_HOURS = 400 * 24.0


def _hours(text: str) -> float:
    """``--hours``: how far back from now; 0 would be an empty range, which the API refuses."""
    try:
        hours = float(text)
    except ValueError:
        hours = float("nan")
    if not 0 < hours <= MAX_HOURS:  # also NaN and inf
        raise argparse.ArgumentTypeError(
            f"give the hours to look back, more than 0 and at most {MAX_HOURS:g} (400 days), "
            f"e.g. --hours 24; got {text!r}"
        )
    return hours


def _step(text: str) -> float:
    try:
        step = float(text)
    except ValueError:
        step = float("nan")
    if not 1 <= step < float("inf"):
        raise argparse.ArgumentTypeError(
            f"give the seconds between points, at least 1, e.g. --step 300; got {text!r}"
        )
    return step


def _add_logon(sub: Any) -> argparse.ArgumentParser:
    logon = sub.add_parser("logon", help="remember the hub's address and your token")
    logon.add_argument("--url", help="the hub's address, e.g. http://127.0.0.1:8000")
    logon.add_argument("--username", help="hub user name (asks for the password)")
    logon.add_argument("--password", help="password (prompted when left out)")
    logon.add_argument("--token", help="an existing hub API token instead of a password")
    logon.add_argument(
        "--days",
        type=float,
        default=DEFAULT_DAYS,
        help=f"the new token expires after this many days (default {DEFAULT_DAYS:g}; a hub "
        "with a shorter maximum gives its maximum; 0: as long as the hub allows)",
    )
    logon.add_argument("--json", action="store_true")
    return logon


def _add_exec_get(sub: Any) -> argparse.ArgumentParser:
    """``wmla exec-get [JOB] [--state S,...] [--user U] [--json]``."""
    get = sub.add_parser(
        "exec-get",
        help="show one job, or list jobs newest first (a plan admin: everyone's)",
        description="One job in full (wmla exec-get JOB), or one line per job, newest first, "
        "its reason cut to one line. A plan admin lists every user's jobs; --user one's. What "
        "is alive (Slurm's squeue): --state PENDING,RUNNING.",
    )
    get.add_argument("job", nargs="?")
    get.add_argument("--state", help="only these states, e.g. RUNNING,PENDING")
    get.add_argument("--user", help="only this user's jobs (plan admins: anyone's)")
    get.add_argument("--json", action="store_true")
    return get


def _add_shares(sub: Any) -> argparse.ArgumentParser:
    """``wmla shares [--plan P] [--reset] [--json]``."""
    shares = sub.add_parser(
        "shares",
        help="each plan's share, usage over days and fair-share factor (as Slurm's sshare)",
        description="sshare's columns for every plan: RawShares (its share), NormShares (its "
        "part of its siblings' shares), RawUsage (its decayed usage), EffectvUsage (its part "
        "of its siblings' usage) and FairShare (2^(-EffectvUsage/NormShares): 1 unused, 0.5 "
        "exactly its share, less when it used more).",
    )
    shares.add_argument("--plan", type=_plan, help="only this plan and those under it")
    shares.add_argument(
        "--reset", action="store_true", help="forget all usage first (plan admins only)"
    )
    shares.add_argument("--json", action="store_true")
    return shares


def _plan(text: str) -> str:
    """``--plan``: a plan path, checked here so that a typo is not sent to the service."""
    parts = text.rstrip("/").split("/")
    if text == "/" or (text.startswith("/") and all(parts[1:]) and " " not in text):
        return text
    raise argparse.ArgumentTypeError(
        f"give a plan path that starts with /, e.g. --plan /project1/dev-team; got {text!r}"
    )


def client_for(
    name: str, err: TextIO, retry_seconds: float | None = None, **kwargs: Any
) -> WmlaClient:
    """The client of command ``name``: its retries are told on ``err``, one line per wait."""

    def on_retry(notice: Retrying) -> None:
        err.write(f"wmla {name}: {notice}\n")
        err.flush()

    return WmlaClient(retry_seconds=retry_seconds, on_retry=on_retry, **kwargs)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    name = args.command
    try:
        if name == "logon":
            return _logon(args, out, err)
        if name == "exec-start":
            return _exec_start(args.rest, out, err)
        client = client_for(name, err, getattr(args, "retry_seconds", None))
        if name == "exec-get":
            return _exec_get(client, args, out)
        if name == "exec-stop":
            job = client.cancel(args.job)
            _emit(out, args.json, job, lambda: stop_text(job))
            return 0
        if name == "exec-outLogs":
            text = client.logs(args.job, tail=args.tail, worker=args.worker)
            if args.json:
                json.dump({"job": args.job, "logs": text}, out)
                out.write("\n")
            else:
                out.write(text)
            return 0
        if name == "plans":
            tree = client.plans()
            _emit(out, args.json, tree, lambda: plans_table(tree))
            return 0
        if name == "usage":
            # "now-Ns": the range ends at the service's now, whatever this machine's clock says
            answer = client.usage(
                plan=args.plan,
                user=args.user,
                start=f"now-{args.hours * 3600:.3f}s",  # type: ignore[arg-type]
                step=args.step,
            )
            _emit(out, args.json, answer, lambda: usage_table(answer))
            return 0
        if name == "shares":
            return _shares(client, args, out)
        if name == "quota":
            answer = client.storage(user=args.user)
            _emit(out, args.json, answer, lambda: quota_table(answer))
            return 0
    except OptionsError as e:
        text = str(e)
        print(text if text.startswith("wmla ") else f"wmla {name}: {text}", file=err)
        return 2
    except WmlaError as e:
        print(f"wmla {name}: {e}", file=err)
        return 1
    return 2  # pragma: no cover - argparse refuses unknown commands


def _emit(out: TextIO, as_json: bool, data: Any, text: Any) -> None:
    if as_json:
        json.dump(data, out, indent=1, sort_keys=True)
        out.write("\n")
    else:
        out.write(text() + "\n")


# -- commands ----------------------------------------------------------------------------------
def _logon(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    url = args.url or os.environ.get("WMLA_URL")
    if not url:
        raise OptionsError("--url is required: the hub's address, e.g. http://127.0.0.1:8000")
    api = api_url(url)
    hub = api.split("/services/", 1)[0]
    token, expiry, expires_at = args.token, "", None
    if not token:
        if not args.username:
            raise OptionsError("give --username NAME (and --password, or type it) or --token")
        if args.days < 0:
            raise OptionsError("--days takes a number of days, 0 or more")
        password = args.password if args.password is not None else getpass.getpass()
        made = request_token(hub, args.username, password, args.days)
        token, expires_at = made.token, made.expires_at
        expiry = f"; the token {expiry_text(expires_at)}"
    client = client_for("logon", err, args.retry_seconds, url=api, token=token)
    me = client.whoami()  # check before writing anything
    path = save_config({"url": api, "token": token, "user": me["name"]})
    info = {"user": me["name"], "url": api, "config": str(path), "plans": me.get("plans", [])}
    if expires_at is not None:  # a token made here (one given with --token: not known)
        info["expires_at"] = expires_at
    text = f"logged on as {me['name']} at {api} (saved in {path}{expiry})"
    _emit(out, args.json, info, lambda: text)
    return 0


def exec_start_options() -> str:
    """``exec-start``'s options as ``--help`` prints them: %wmla_train's table, plain text."""
    from extension.magics import options

    return plain_text((options.__doc__ or "").split("\n\n", 2)[-1]) + "\n--json prints JSON."


def stop_text(job: Mapping[str, Any]) -> str:
    """What ``exec-stop`` says, once: a running job is being cancelled (its workers get their
    grace to checkpoint), an ended one is in its final state."""
    if job["state"] in FINAL_STATES:
        return f"job {job['id']} is {job['state']}"
    return f"job {job['id']}: cancelling (`wmla exec-get {job['id']}` shows when it has stopped)"


def _exec_start(rest: Sequence[str], out: TextIO, err: TextIO) -> int:
    rest = list(rest)
    mine = rest[: rest.index("--")] if "--" in rest else rest
    if "-h" in mine or "--help" in mine:
        out.write("wmla exec-start PyTorch [options] -- [script arguments]\n")
        out.write(exec_start_options() + "\n")
        return 0
    if not rest or not rest[0] or rest[0].startswith("-"):
        raise OptionsError(
            "say the framework first: wmla exec-start PyTorch --consumer PLAN "
            "--model-dir DIR --model-main main.py -- ARGS"
        )
    opts = parse_train(rest, prog="wmla exec-start", framework=True, cli=True)
    if not opts.model_dir or not opts.model_main:
        raise OptionsError(
            "--model-dir and --model-main are required: the folder with your code (inside your "
            "folder on the hub) and the script in it, e.g. --model-dir models/mnist "
            "--model-main main.py"
        )
    client = client_for("exec-start", err, opts.retry_seconds)
    model_dir = opts.model_dir
    if os.path.isabs(model_dir):
        model_dir = inside_folder(client.whoami()["storage"], model_dir)
    body = submission_body(opts, model_dir, opts.model_main)
    job = client.submit(body)
    if not opts.wait:
        _emit(out, opts.json, job, lambda: f"job {job['id']} submitted to {job['plan']}: "
              f"{job['state']}" + (f" ({job['reason']})" if job.get("reason") else ""))  # fmt: skip
        return 0
    progress = err if opts.json else out  # --json: stdout is the job's JSON alone
    name = f" ({job['name']})" if job.get("name") else ""
    _say(progress, f"job {job['id']}{name} submitted to {job['plan']}")
    job_id = job["id"]
    try:
        job = watch(client, job, progress)
    except KeyboardInterrupt:
        _say(progress, f"stopped waiting; job {job_id} keeps running: `wmla exec-get {job_id}`, "
             f"cancel it with `wmla exec-stop {job_id}`")  # fmt: skip
        return 130
    except WmlaError as e:
        raise WmlaError(
            f"stopped waiting for job {job_id}, which keeps running (`wmla exec-get {job_id}` "
            f"once the service answers): {e}",
            e.status,
        ) from None
    if opts.json:
        _emit(out, True, job, str)
    if job["state"] == "TIMEOUT":  # said on stderr too: a script's log shows why it stopped
        print(f"wmla exec-start: {timeout_text(job, '`wmla plans --json`')}", file=err)
    return 0 if job["state"] == "FINISHED" else 1


POLL = 1.0  # seconds between polls of exec-start --wait


def _say(stream: TextIO, text: str) -> None:
    stream.write(f"{time.strftime('%H:%M:%S')} {text}\n")
    stream.flush()


def watch(
    client: WmlaClient, job: Mapping[str, Any], out: TextIO, poll: float | None = None
) -> dict:
    """Poll ``job`` until it ends, writing one line per change to ``out``: the state with the
    service's reason (PENDING), the placement (RUNNING, again when it grows or shrinks), the
    latest metrics line, and the final state with the exit code. Returns the final job."""
    job = dict(job)
    shown: str | None = None
    since, last_metric = 0, ""
    while True:
        final = job["state"] in FINAL_STATES
        # the line itself is the key: a new place in line or estimate is worth a line too
        line = state_line(job)
        if line != shown and not final:
            _say(out, line)
            shown = line
        if job["state"] != "PENDING":
            try:
                lines, since = client.metrics(job["id"], since)
            except WmlaError:  # no metrics yet, or the files are gone: progress is optional
                lines = []
            text = metrics_text(lines[-1]) if lines else ""
            if text and text != last_metric:
                _say(out, text)
                last_metric = text
        if final:
            _say(out, state_line(job))
            return job
        time.sleep(POLL if poll is None else poll)
        job = client.job(job["id"])


def _exec_get(client: WmlaClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.job:
        job = client.job(args.job)
        _emit(out, args.json, job, lambda: job_details(job))
        return 0
    states = [s.strip().upper() for s in args.state.split(",")] if args.state else None
    jobs = client.jobs(states, user=args.user)
    _emit(out, args.json, {"jobs": jobs}, lambda: jobs_table(jobs))
    return 0


def _shares(client: WmlaClient, args: argparse.Namespace, out: TextIO) -> int:
    """``wmla shares``: the rows (after a reset with ``--reset``), as a table or JSON."""
    if args.reset:
        client.reset_shares()
    answer = client.shares(plan=args.plan)
    _emit(out, args.json, answer, lambda: shares_table(answer))
    return 0
