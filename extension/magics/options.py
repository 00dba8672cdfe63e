"""The training options shared by ``%wmla_train`` and ``wmla exec-start`` (dlicmd spellings too).

Pure: parsing, the submission body and path checks touch no network and no IPython, so they are
tested as tables. Everything after ``--`` belongs to the training script.

========================================  =================================================
option (aliases)                          meaning
========================================  =================================================
``--plan`` (``--consumer``)               resource plan, e.g. ``/project1/dev-team``
``--workers`` (``--workerDeviceNum``,     number of workers (a rigid gang)
``--numWorker``)
``--elastic MIN:MAX``                     elastic: start with MIN, grow to MAX
``--gpus-per-worker``                     GPUs per worker (default: the instance's default)
``--cpus`` (``--workerCpu``)              CPU per worker: ``2``, ``0.5``, ``500m``
``--memory`` (``--workerMemory``)         memory per worker: ``512Mi``, ``4Gi``
``--priority``                            whole number; higher runs first within a plan
``--model-dir`` (``--model_dir``)         folder with the code, inside your folder
``--model-main`` (``--model_main``)       the script in that folder, e.g. ``main.py``
``--name``                                a label for the job
``--env NAME=VALUE``                      extra environment for the workers (repeatable)
``--runtime-limit DURATION``              stop the job after this long (TIMEOUT): seconds or
                                          ``90m``, ``2h``, ``1h30m``, ``1d``; default: the
                                          plan's
``--wait``                                block until the job ends
========================================  =================================================

``wmla exec-start`` also takes ``--json`` and ``--retry-seconds S`` (how long to keep trying
while the service is unavailable; default ``$WMLA_RETRY_SECONDS``, else 60; 0: one try).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extension.durations import DurationError, parse_duration
from extension.scheduler.resources import QuantityError, parse_quantity

FRAMEWORKS = {"pytorch": "PyTorch", "distpytorch": "PyTorch", "torch": "PyTorch"}
ELASTIC = re.compile(r"\s*(\d{1,6})\s*:\s*(\d{1,6})\s*\Z")
# extension.retry.MAX_RETRY_SECONDS, spelled again: this module stays pure (no requests)
MAX_RETRY_SECONDS = 24 * 3600.0
ENV = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z", re.S)


class OptionsError(ValueError):
    """Bad options: the message says which option and what to write instead."""


@dataclass
class TrainOptions:
    plan: str | None = None
    workers: int | None = None
    elastic: tuple[int, int] | None = None
    gpus_per_worker: int | None = None
    cpus: str | None = None
    memory: str | None = None
    priority: int | None = None
    model_dir: str | None = None
    model_main: str | None = None
    name: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    runtime_limit: float | None = None  # seconds; None: the plan's default
    wait: bool = False
    json: bool = False
    retry_seconds: float | None = None
    framework: str | None = None
    args: list[str] = field(default_factory=list)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print and exit: raise instead
        message = message.replace("the following arguments are required", "missing")
        raise OptionsError(f"{message}. {self.epilog or ''}".strip())


def _positive(name: str):
    def check(text: str) -> int:
        if not re.fullmatch(r"\d{1,6}", text.strip()) or int(text) < 1:
            raise argparse.ArgumentTypeError(f"{name} takes a whole number >= 1, got {text!r}")
        return int(text)

    return check


def _count(text: str) -> int:
    if not re.fullmatch(r"\d{1,4}", text.strip()):
        raise argparse.ArgumentTypeError(
            f"--gpus-per-worker takes a whole number of devices (0, 1, 2, ...), got {text!r}"
        )
    return int(text)


def _priority(text: str) -> int:
    if not re.fullmatch(r"-?\d{1,9}", text.strip()):
        raise argparse.ArgumentTypeError(f"--priority takes a whole number, got {text!r}")
    return int(text)


def _quantity(resource: str, flag: str):
    def check(text: str) -> str:
        try:
            parse_quantity(resource, text.strip(), where=flag)
        except QuantityError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return text.strip()

    return check


def _elastic(text: str) -> tuple[int, int]:
    match = ELASTIC.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"--elastic takes MIN:MAX such as 1:4, got {text!r}")
    lo, hi = int(match.group(1)), int(match.group(2))
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(
            f"--elastic {text}: MIN must be at least 1 and MAX at least MIN, e.g. 1:4"
        )
    return lo, hi


def retry_seconds(text: str) -> float:
    """``--retry-seconds``: how long the client keeps trying while the service is unavailable."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 <= seconds <= MAX_RETRY_SECONDS:  # also NaN and inf
        raise argparse.ArgumentTypeError(
            f"--retry-seconds takes the seconds to keep trying while the service is "
            f"unavailable, 0 (one try) to {MAX_RETRY_SECONDS:g}, e.g. 120; got {text!r}"
        )
    return seconds


def _runtime_limit(text: str) -> float:
    """``--runtime-limit``: checked here so a typo costs no round trip; the service decides
    whether the plan allows it."""
    try:
        return parse_duration(text.strip(), "--runtime-limit")
    except DurationError as err:  # argparse names the option itself
        raise argparse.ArgumentTypeError(str(err).removeprefix("--runtime-limit ")) from None


def _env(text: str) -> tuple[str, str]:
    match = ENV.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"--env takes NAME=VALUE, got {text!r}")
    return match.group(1), match.group(2)


def build_parser(prog: str, framework: bool = False, cli: bool = False) -> _Parser:
    parser = _Parser(
        prog=prog,
        add_help=False,
        allow_abbrev=False,
        epilog=f"See `{prog} --help`; the script's own arguments go after `--`.",
    )
    if framework:
        parser.add_argument("framework", metavar="FRAMEWORK", help="PyTorch")
    add = parser.add_argument
    add("--plan", "--consumer", dest="plan", metavar="PLAN", help="resource plan path")
    add(
        "--workers",
        "--workerDeviceNum",
        "--numWorker",
        dest="workers",
        type=_positive("--workers"),
        metavar="N",
        help="number of workers (rigid gang)",
    )
    add("--elastic", type=_elastic, metavar="MIN:MAX", help="elastic workers")
    add("--gpus-per-worker", dest="gpus_per_worker", type=_count, metavar="N")
    add("--cpus", "--workerCpu", dest="cpus", type=_quantity("cpu", "--cpus"), metavar="CPU")
    add("--memory", "--workerMemory", dest="memory", type=_quantity("memory", "--memory"),
        metavar="MEM")  # fmt: skip
    add("--priority", type=_priority, metavar="N")
    add("--model-dir", "--model_dir", dest="model_dir", metavar="DIR")
    add("--model-main", "--model_main", dest="model_main", metavar="FILE")
    add("--name", metavar="NAME")
    add("--env", action="append", type=_env, default=[], metavar="NAME=VALUE")
    add("--runtime-limit", dest="runtime_limit", type=_runtime_limit, metavar="DURATION",
        help="stop the job after this long: seconds, 90m, 2h, 1h30m, 1d")  # fmt: skip
    add("--wait", action="store_true", help="block until the job ends")
    if cli:
        add("--json", action="store_true", help="print JSON")
        add("--retry-seconds", dest="retry_seconds", type=retry_seconds, metavar="S",
            help="keep trying this long while the service is unavailable")  # fmt: skip
    return parser


def parse_train(
    argv: list[str] | str,
    prog: str = "%wmla_train",
    framework: bool = False,
    cli: bool = False,
) -> TrainOptions:
    """Parse options (a list, or a magic's line split like a shell) up to ``--``."""
    mine, script_args = _split_script_args(_words(argv))
    parser = build_parser(prog, framework=framework, cli=cli)
    ns, extra = parser.parse_known_args(mine)
    _refuse_extra(extra, prog)
    opts = _options(ns, script_args)
    if framework:
        opts.framework = _framework(ns.framework, prog)
    _check(opts, prog)
    return opts


def _words(argv: list[str] | str) -> list[str]:
    """The words of ``argv``: a magic's line is split as a shell would."""
    if isinstance(argv, str):
        try:
            argv = shlex.split(argv)
        except ValueError as err:
            raise OptionsError(f"cannot split the line: {err} (unbalanced quotes?)") from None
    return list(argv)


def _split_script_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(our options, the training script's arguments): everything after ``--`` is the script's."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def _refuse_extra(extra: list[str], prog: str) -> None:
    """A word argparse did not take is an error (most often a script argument before ``--``)."""
    if extra:
        flag = extra[0]
        hint = (
            " (the script's own arguments go after `--`, e.g. -- --epochs 4)"
            if flag.startswith("-")
            else ""
        )
        raise OptionsError(f"{prog}: unknown option or stray word {flag!r}{hint}")


def _options(ns: argparse.Namespace, script_args: list[str]) -> TrainOptions:
    """The parsed namespace as :class:`TrainOptions` (``--json``/``--retry-seconds``: CLI only)."""
    return TrainOptions(
        plan=ns.plan,
        workers=ns.workers,
        elastic=ns.elastic,
        gpus_per_worker=ns.gpus_per_worker,
        cpus=ns.cpus,
        memory=ns.memory,
        priority=ns.priority,
        model_dir=ns.model_dir,
        model_main=ns.model_main,
        name=ns.name,
        env=dict(ns.env),
        runtime_limit=ns.runtime_limit,
        wait=ns.wait,
        json=getattr(ns, "json", False),
        retry_seconds=getattr(ns, "retry_seconds", None),
        args=script_args,
    )


def _framework(name: str, prog: str) -> str:
    """The framework's proper name for a spelling such as ``pytorch``; only PyTorch is run."""
    key = name.lower()
    if key not in FRAMEWORKS:
        raise OptionsError(f"{prog}: framework {name!r} is not supported here; use PyTorch")
    return FRAMEWORKS[key]


def _check(opts: TrainOptions, prog: str) -> None:
    """The checks across options that argparse cannot make one option at a time."""
    if opts.workers is not None and opts.elastic is not None:
        raise OptionsError(
            f"{prog}: give either --workers N (a fixed gang) or --elastic MIN:MAX, not both"
        )
    if opts.plan is not None and (not opts.plan.startswith("/") or opts.plan.rstrip("/") == ""):
        raise OptionsError(
            f"{prog}: --plan {opts.plan!r} is not a plan path; plans look like /project1/dev-team"
        )
    if opts.name is not None and not re.fullmatch(r"[A-Za-z0-9 ._-]{1,100}", opts.name):
        raise OptionsError(f"{prog}: --name: up to 100 letters, digits, spaces, '.', '_' or '-'")


def submission_body(opts: TrainOptions, model_dir: str, model_main: str) -> dict[str, Any]:
    """The service's POST /jobs body (docs/service.md) for parsed options."""
    if not opts.plan:
        raise OptionsError(
            "choose a resource plan with --plan (alias --consumer), e.g. "
            "--plan /sample-project/training; `%wmla_plans` or `wmla plans` lists them"
        )
    body: dict[str, Any] = {"plan": opts.plan.rstrip("/")}
    if opts.elastic is not None:
        body["workers"] = {"min": opts.elastic[0], "max": opts.elastic[1]}
    else:
        body["workers"] = opts.workers or 1
    resources: dict[str, Any] = {}
    if opts.gpus_per_worker is not None:
        resources["gpu"] = opts.gpus_per_worker
    if opts.cpus is not None:
        resources["cpu"] = opts.cpus
    if opts.memory is not None:
        resources["memory"] = opts.memory
    if resources:
        body["resources"] = resources
    if opts.priority is not None:
        body["priority"] = opts.priority
    if opts.name:
        body["name"] = opts.name
    if opts.env:
        body["env"] = dict(opts.env)
    if opts.runtime_limit is not None:  # seconds; a whole number stays one in the JSON
        limit = opts.runtime_limit
        body["max_runtime"] = int(limit) if limit == int(limit) else limit
    body["command"] = {"model_dir": model_dir, "model_main": model_main, "args": list(opts.args)}
    return body


def timeout_text(job: dict[str, Any], plans: str) -> str:
    """What a job stopped at its runtime limit (TIMEOUT) means, and what to do about it;
    ``plans``: how this client lists the plans (their runtime_max is the most one may ask)."""
    return (
        f"job {job['id']} was stopped at its runtime limit ({job.get('reason') or 'TIMEOUT'}); "
        f"its last checkpoint is in {job.get('workdir')}/checkpoints. Ask for more time with "
        f"--runtime-limit, at most the plan's runtime_max ({plans} shows it)"
    )


def inside_folder(root: str | os.PathLike, path: str, cwd: str | os.PathLike | None = None,
                  what: str = "--model-dir") -> str:  # fmt: skip
    """``path`` (relative to ``cwd``, else absolute) as a path relative to ``root``.

    Symlinks are followed; anything that lands outside ``root`` is refused, so a job never
    reads code from another user's folder.
    """
    if not isinstance(path, str) or not path.strip():
        raise OptionsError(f"{what} must be a folder inside your folder {root}")
    if "\x00" in path:
        raise OptionsError(f"{what} contains a NUL byte")
    real_root = Path(os.path.realpath(root))
    base = Path(cwd) if cwd is not None else real_root
    target = Path(os.path.realpath(base / os.path.expanduser(path)))
    if target != real_root and real_root not in target.parents:
        raise OptionsError(
            f"{what} {path!r} is outside your folder {real_root}; jobs may only use code "
            f"inside it (copy the code there first)"
        )
    rel = target.relative_to(real_root)
    return str(rel) if str(rel) != "" else "."
