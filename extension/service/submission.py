"""Reading a job submission: the body's shape, the instance limit range, the user's folder.

Everything here is checked by the service itself, whatever the client sends; a refused body
raises ``SubmissionError`` with a message that says what was wrong and how to fix it, and
nothing is written before every check passed.

Body (docs/service.md and the OpenAPI document describe it too)::

    {
      "plan": "/sample-project/training",          # required; charged to <plan>/<user>
      "name": "mnist",                              # optional; default e.g. "mnist-main"
      "workers": 2,                                 # rigid gang, or "1:4" / {"min": 1, "max": 4}
      "resources": {"gpu": 1, "cpu": "500m", "memory": "1Gi"},   # per worker request
      "limits": {"cpu": "1", "memory": "2Gi"},      # per worker limits (optional)
      "priority": 0,                                # higher first inside the user's leaf
      "preemptible": true,
      "command": {"model_dir": "models/mnist", "model_main": "main.py",
                  "args": ["--epochs", "4"]},
      "env": {"MY_SETTING": "1"},
      "max_runtime": "2h"                           # seconds or a duration; default: the plan's
    }
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from extension.durations import DurationError, parse_duration
from extension.scheduler import QuantityError, Resources, parse_quantity
from extension.scheduler.names import user_name_problem
from extension.scheduler.resources import RESOURCES, format_amount
from extension.userfs.errors import UserFileError
from extension.userfs.files import UserFiles

from .records import JobKind

KEYS = {
    "plan",
    "name",
    "workers",
    "resources",
    "limits",
    "priority",
    "preemptible",
    "command",
    "env",
    "kind",
    "max_runtime",  # seconds or "2h", "1h30m": the service stops the job at it (TIMEOUT)
    "user",  # plan admins only: submit on behalf of this hub user (the spawner does)
}
COMMAND_KEYS = {"model_dir", "model_main", "args"}
MAX_PRIORITY = 1_000_000
MAX_ARGS = 256
MAX_ARG_LEN = 4096
MAX_PATH = 1024  # characters of command.model_dir / model_main
# A job's env is an allow-list by pattern: upper-case names only (what programs read).
ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,127}\Z")
# What the service and the backend set for every worker; a job may not override them.
RESERVED_ENV = re.compile(
    r"(WMLA_.*|JUPYTERHUB_.*|MASTER_ADDR|MASTER_PORT|RANK|WORLD_SIZE|LOCAL_RANK|"
    r"LOCAL_WORLD_SIZE|CUDA_VISIBLE_DEVICES|PATH|HOME|USER|LOGNAME|SHELL)\Z"
)
# What makes a loader, libc or an interpreter run code or read files it was not asked to. The
# launcher applies a job's env only to the worker's own exec, after it dropped to the user, so
# none of these could reach root; they are refused anyway (defence in depth, and they would
# break the worker's Python: PYTHON* over the service's packages).
LOADER_ENV = re.compile(
    r"(LD_.*|GLIBC_.*|MALLOC_.*|GCONV_PATH|GETCONF_DIR|HOSTALIASES|LOCALDOMAIN|LOCPATH|"
    r"NIS_PATH|NLSPATH|RESOLV_HOST_CONF|RES_OPTIONS|TMPDIR|TZDIR|PYTHON.*|PERL5.*|PERLLIB|"
    r"PERLIO.*|RUBY.*|NODE_OPTIONS|NODE_PATH|BASH_ENV|BASH_FUNC_.*|ENV|IFS|CDPATH|"
    r"SHELLOPTS|BASHOPTS|PS4|PROMPT_COMMAND|JAVA_TOOL_OPTIONS|_JAVA_OPTIONS|JDK_JAVA_OPTIONS|"
    r"OPENSSL_CONF|OPENSSL_ENGINES|SSLKEYLOGFILE|GIT_.*)\Z"
)
NAME = re.compile(r"[A-Za-z0-9 ._-]{0,100}\Z")


class SubmissionError(ValueError):
    """A submission refused before anything was written."""


class Rejected(SubmissionError):
    """A well-formed job that can never run as asked (over a plan limit, the instance, a node)."""


@dataclass(frozen=True)
class LimitRange:
    """Per-worker bounds and defaults, as a Kubernetes LimitRange of type Container.

    Amounts are in the scheduler's units (gpu devices, cpu millicores, memory bytes); a missing
    entry means no bound (min 0, max unlimited) or no default.
    """

    min: Mapping[str, float] = field(default_factory=dict)
    max: Mapping[str, float] = field(default_factory=dict)
    default: Mapping[str, float] = field(default_factory=dict)  # default limits
    default_request: Mapping[str, float] = field(default_factory=dict)
    max_limit_request_ratio: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_config(cls, spec: Mapping[str, Any] | None) -> LimitRange:
        """Read ``{"min": {"cpu": "100m"}, "max": {...}, "default": {...},
        "default_request": {...}, "max_limit_request_ratio": {"cpu": 2}}``."""
        spec = dict(spec or {})
        aliases = {
            "defaultRequest": "default_request",
            "maxLimitRequestRatio": "max_limit_request_ratio",
        }
        spec = {aliases.get(k, k): v for k, v in spec.items()}
        known = {"min", "max", "default", "default_request", "max_limit_request_ratio"}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(
                f"limit_range: unknown entry {unknown[0]!r}; use {', '.join(sorted(known))}"
            )
        parsed: dict[str, dict[str, float]] = {}
        for key in known - {"max_limit_request_ratio"}:
            amounts = spec.get(key) or {}
            parsed[key] = {}
            for name, value in amounts.items():
                parsed[key][name] = parse_quantity(name, value, where=f"limit_range.{key}")
        ratios = {}
        for name, value in (spec.get("max_limit_request_ratio") or {}).items():
            if name not in RESOURCES or not isinstance(value, (int, float)) or value < 1:
                raise ValueError(
                    f"limit_range.max_limit_request_ratio: {name}: give a number >= 1, "
                    f"got {value!r}"
                )
            ratios[name] = float(value)
        return cls(
            min=parsed["min"],
            max=parsed["max"],
            default=parsed["default"],
            default_request=parsed["default_request"],
            max_limit_request_ratio=ratios,
        )

    def to_dict(self) -> dict:
        def plain(amounts: Mapping[str, float]) -> dict:
            return {k: _plain(v) for k, v in amounts.items()}

        return {
            "min": plain(self.min),
            "max": plain(self.max),
            "default": plain(self.default),
            "default_request": plain(self.default_request),
            "max_limit_request_ratio": dict(self.max_limit_request_ratio),
            "units": {"gpu": "devices", "cpu": "millicores", "memory": "bytes"},
        }

    def apply(self, request: Mapping[str, Any] | None, limits: Mapping[str, Any] | None):
        """Fill in defaults and check bounds; returns (request, limits) as Resources.

        As in Kubernetes, a missing request takes ``default_request`` (else the limit) and a
        missing limit takes ``default`` (at least the request). One choice of ours: a limit that
        was defaulted is capped at request x ``max_limit_request_ratio``, so the seed's own
        LimitRange (default 900m over a 200m request, ratio 2) does not refuse a body that asked
        for nothing; a limit the user gave is checked as given.
        """
        req = _amounts(request, "resources")
        lim = _amounts(limits, "limits")
        values, lim_values = [], []
        for name in RESOURCES:
            r, li = self._filled(name, req, lim)
            self._check(name, r, li)
            values.append(r)
            lim_values.append(li)
        return Resources(*values), Resources(*lim_values)

    def _filled(self, name: str, req: dict, lim: dict) -> tuple[float, float]:
        """(request, limit) of one resource with the defaults filled in."""
        if name in req:
            r = req[name]
        elif name in self.default_request:
            r = self.default_request[name]
        elif name in lim:  # Kubernetes: a limit without a request is also the request
            r = lim[name]
        elif name in self.default:
            r = self.default[name]
        else:
            r = 0
        ratio = self.max_limit_request_ratio.get(name)
        if name in lim:
            li = lim[name]
        elif name in self.default:
            li = max(self.default[name], r)
            if ratio is not None and r > 0:  # a defaulted limit never breaks the ratio
                li = min(li, int(r * ratio))
        else:
            li = r
        return r, li

    def _check(self, name: str, r: float, li: float) -> None:
        """The instance's bounds on one resource's request and limit, per worker."""
        low = self.min.get(name)
        high = self.max.get(name)
        if low is not None and r < low:
            raise SubmissionError(
                f"each worker asks for {format_amount(name, r)}, below the instance's "
                f"minimum of {format_amount(name, low)} per worker; ask for at least that"
            )
        if high is not None and r > high:
            raise SubmissionError(
                f"each worker asks for {format_amount(name, r)}, above the instance's "
                f"maximum of {format_amount(name, high)} per worker; ask for at most that"
            )
        if high is not None and li > high:
            raise SubmissionError(
                f"the per-worker {name} limit {format_amount(name, li)} is above the "
                f"instance's maximum of {format_amount(name, high)}"
            )
        if li < r:
            raise SubmissionError(
                f"the per-worker {name} limit {format_amount(name, li)} is below its "
                f"request {format_amount(name, r)}; a limit must be at least the request"
            )
        ratio = self.max_limit_request_ratio.get(name)
        if ratio is not None and r > 0 and li / r > ratio + 1e-9:
            raise SubmissionError(
                f"the per-worker {name} limit {format_amount(name, li)} is more than "
                f"{_plain(ratio)} times the request {format_amount(name, r)} "
                f"(the instance's max limit/request ratio)"
            )


@dataclass(frozen=True)
class Submission:
    plan: str
    name: str
    min_workers: int
    max_workers: int
    per_worker: Resources
    limits: Resources
    priority: int
    preemptible: bool
    kind: JobKind
    env: dict[str, str]
    # seconds asked for; None: the plan's default (runtime_limits.py decides, at submit)
    max_runtime: float | None = None
    model_dir: str = ""  # as given until resolved, then absolute ("" for a notebook)
    model_main: str = ""  # as given until resolved, then absolute, inside model_dir
    args: tuple[str, ...] = ()
    resolved: bool = True  # the paths are resolved (resolve_command), or a notebook has none


def user_root(storage_root: str | Path, user: str) -> Path:
    """``<storage_root>/<user>``, refusing user names that would not be one folder."""
    problem = user_name_problem(user)
    if problem:
        raise SubmissionError(f"{problem}: it names the user's storage folder and plan leaf")
    return _resolved(str(storage_root)) / user


@functools.lru_cache(maxsize=16)
def _resolved(storage_root: str) -> Path:
    """The storage root as an absolute path (resolved once: it is called per request)."""
    return Path(storage_root).resolve()


def _path_arg(value: Any, what: str, example: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SubmissionError(f"{what} must be a non-empty path inside your folder, e.g. {example}")
    if "\x00" in value:
        raise SubmissionError(f"{what} contains a NUL byte")
    if len(value) > MAX_PATH:
        raise SubmissionError(f"{what} is {len(value)} characters long; at most {MAX_PATH}")
    return value


def parse_submission(
    body: Any,
    *,
    user: str,
    storage_root: str | Path,
    limit_range: LimitRange,
    max_workers: int,
) -> Submission:
    """The submission, checked; pure: it creates nothing and reads no file. A training job's
    command paths are as given until ``resolve_command`` resolves them with the user's own
    rights (the submission action does, once the user has an account)."""
    if not isinstance(body, dict):
        raise SubmissionError("the body must be a JSON object; see GET api/v1/openapi.json")
    unknown = sorted(set(body) - KEYS)
    if unknown:
        raise SubmissionError(
            f"unknown field {unknown[0]!r}; the fields are {', '.join(sorted(KEYS))}"
        )
    asked, name = _asked(body, limit_range, max_workers)
    user_root(storage_root, user)  # a user name that is no folder name is refused here
    command = body.get("command")
    if asked["kind"] is JobKind.NOTEBOOK:
        if command not in (None, {}):
            raise SubmissionError("a notebook job has no command: the spawner starts the server")
        return Submission(**asked, name=name or "notebook")
    model_dir, main, args = _command(command)
    return Submission(
        **asked, name=name, model_dir=model_dir, model_main=main, args=tuple(args), resolved=False
    )


def resolve_command(
    sub: Submission, files: UserFiles, storage_root: str | Path, user: str
) -> Submission:
    """``sub`` with its command's paths resolved inside ``user``'s folder with the user's own
    rights (``files``; refused outside it), and named after its script when it has no name.
    Blocking when it runs a helper: call it from a thread on an event loop."""
    if sub.resolved:
        return sub
    root = str(user_root(storage_root, user))
    try:
        folder, script = files.resolve_command(root, sub.model_dir, sub.model_main)
    except UserFileError as err:
        raise SubmissionError(str(err)) from None
    name = sub.name or default_name(root, script)
    return replace(sub, name=name, model_dir=folder, model_main=script, resolved=True)


def _asked(body: dict, limit_range: LimitRange, max_workers: int) -> tuple[dict[str, Any], str]:
    """The fields every job has, checked in the order the errors are reported, as
    ``Submission``'s keywords; and the name as given ("" when none)."""
    plan, name, kind = _plan(body), _name(body), _kind(body)
    lo, hi = _workers(body.get("workers", 1), max_workers)
    try:
        per_worker, limits = limit_range.apply(body.get("resources"), body.get("limits"))
    except QuantityError as err:
        raise SubmissionError(str(err)) from None
    priority, preemptible = _priority(body), _preemptible(body, kind)
    if kind is JobKind.NOTEBOOK and (preemptible or lo != 1 or hi != 1):
        # the spawner runs the server, so nothing could stop or resize it on a decision
        raise SubmissionError("a notebook job is one worker and not preemptible")
    asked = {
        "plan": plan,
        "min_workers": lo,
        "max_workers": hi,
        "per_worker": per_worker,
        "limits": limits,
        "priority": priority,
        "preemptible": preemptible,
        "kind": kind,
        "env": _env(body.get("env")),
        "max_runtime": _max_runtime(body),
    }
    return asked, name


def _plan(body: dict) -> str:
    plan = body.get("plan")
    if not isinstance(plan, str) or not plan.startswith("/"):
        raise SubmissionError(
            "plan is required: the path of a resource plan such as /sample-project/training"
        )
    return plan


def _name(body: dict) -> str:
    name = body.get("name", "")
    if not isinstance(name, str) or not NAME.match(name):
        raise SubmissionError(
            f"name: up to 100 letters, digits, spaces, '.', '_' or '-', got {name!r}; "
            "or leave it out for a name from the script (e.g. pytorch_mnist-main)"
        )
    return name.strip()


def _kind(body: dict) -> JobKind:
    kind = body.get("kind", "train")
    if kind not in ("train", "notebook"):
        raise SubmissionError(f"kind must be 'train' or 'notebook', got {kind!r}")
    return JobKind(kind)


def _priority(body: dict) -> int:
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > MAX_PRIORITY:
        raise SubmissionError(
            f"priority must be a whole number from -{MAX_PRIORITY} to "
            f"{MAX_PRIORITY}, got {priority!r}"
        )
    return priority


def _max_runtime(body: dict) -> float | None:
    """Seconds, from a number or a duration such as "2h"; null or left out: the plan's
    default. Whether the plans allow it is decided at submit (runtime_limits.job_limit)."""
    value = body.get("max_runtime")
    if value is None:
        return None
    try:
        return parse_duration(value, "max_runtime")
    except DurationError as err:
        raise SubmissionError(str(err)) from None


def _preemptible(body: dict, kind: JobKind) -> bool:
    preemptible = body.get("preemptible", kind is JobKind.TRAIN)
    if not isinstance(preemptible, bool):
        raise SubmissionError(f"preemptible must be true or false, got {preemptible!r}")
    return preemptible


def _command(command: Any) -> tuple[str, str, list[str]]:
    """(model_dir, model_main, args) as given; the paths are resolved later, as the user."""
    if not isinstance(command, dict):
        raise SubmissionError(
            'command is required: {"model_dir": "models/x", "model_main": "main.py", '
            '"args": [...]}, paths inside your folder'
        )
    unknown = sorted(set(command) - COMMAND_KEYS)
    if unknown:
        raise SubmissionError(
            f"command: unknown field {unknown[0]!r}; use model_dir, model_main and args"
        )
    model_dir = _path_arg(command.get("model_dir", "."), "command.model_dir", "models/mnist")
    if command.get("model_main") in (None, ""):
        raise SubmissionError("command.model_main is required: the script to run, e.g. main.py")
    main = _path_arg(command.get("model_main"), "command.model_main", "main.py")
    args = command.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise SubmissionError('command.args must be a list of strings, e.g. ["--epochs", "4"]')
    if len(args) > MAX_ARGS or any(len(a) > MAX_ARG_LEN or "\x00" in a for a in args):
        raise SubmissionError(
            f"command.args: at most {MAX_ARGS} arguments of {MAX_ARG_LEN} characters, no NUL"
        )
    return model_dir, main, args


def default_name(root: str, script: str) -> str:
    """A job's name when the body gives none: the script's folder and stem, e.g.
    ``.../models/pytorch_mnist/main.py`` -> ``pytorch_mnist-main`` (only the stem for a script
    directly in the user's folder), made to fit :data:`NAME`.

    >>> default_name("/s/alice", "/s/alice/models/pytorch_mnist/main.py")
    'pytorch_mnist-main'
    >>> default_name("/s/alice", "/s/alice/train v2+.py")
    'train v2_'
    """
    path = Path(script)
    stem = path.stem if path.suffix else path.name
    parts = [stem] if str(path.parent) == root.rstrip("/") else [path.parent.name, stem]
    name = "-".join(re.sub(r"[^A-Za-z0-9 ._-]", "_", p).strip() for p in parts if p.strip())
    return name[:100].strip() or "job"


def _workers(value: Any, most: int) -> tuple[int, int]:
    """``2`` (rigid), ``"1:4"`` or ``{"min": 1, "max": 4}`` (elastic)."""
    if isinstance(value, str) and re.fullmatch(r"\s*\d{1,9}\s*(:\s*\d{1,9}\s*)?", value):
        parts = [int(p) for p in value.split(":")]
        lo, hi = parts[0], parts[-1]
    elif isinstance(value, dict) and set(value) <= {"min", "max"} and "min" in value:
        lo, hi = value.get("min"), value.get("max", value.get("min"))
    elif isinstance(value, int) and not isinstance(value, bool):
        lo = hi = value
    else:
        raise SubmissionError(
            f'workers must be a whole number, "MIN:MAX" or {{"min": .., "max": ..}}, got {value!r}'
        )
    for v in (lo, hi):
        if isinstance(v, bool) or not isinstance(v, int):
            raise SubmissionError(f"workers must be whole numbers, got {value!r}")
    if lo < 1:
        raise SubmissionError(f"workers must be at least 1, got {lo}")
    if hi < lo:
        raise SubmissionError(f"workers: max {hi} is below min {lo}; write it as MIN:MAX")
    if hi > most:
        raise SubmissionError(f"workers: at most {most} workers per job on this instance, got {hi}")
    return lo, hi


def _amounts(mapping: Any, where: str) -> dict[str, float]:
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise SubmissionError(
            f'{where} must be an object such as {{"gpu": 1, "cpu": "500m", "memory": "1Gi"}}'
        )
    out = {}
    for name, value in mapping.items():
        if name not in RESOURCES:
            raise SubmissionError(f"{where}: unknown resource {name!r}; use gpu, cpu or memory")
        if value is None:
            continue
        try:
            out[name] = parse_quantity(name, value, where=where)
        except QuantityError as err:
            raise SubmissionError(str(err)) from None
    return out


def _env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict) or len(env) > 100:
        raise SubmissionError('env must be an object of at most 100 {"NAME": "value"} pairs')
    out = {}
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME.match(key):
            raise SubmissionError(
                f"env: {key!r} is not an allowed variable name: use upper-case letters, digits "
                "and '_', starting with a letter (at most 128), e.g. MY_SETTING"
            )
        if not isinstance(value, str) or len(value) > MAX_ARG_LEN or "\x00" in value:
            raise SubmissionError(
                f"env: {key} needs a string value of at most {MAX_ARG_LEN} characters, no NUL"
            )
        if RESERVED_ENV.match(key):
            raise SubmissionError(f"env: {key} is set by the service and cannot be overridden")
        if LOADER_ENV.match(key):
            raise SubmissionError(
                f"env: {key} is refused: it changes how the loader, libc or an interpreter "
                "starts programs; set it inside your script instead"
            )
        out[key] = value
    return out


def _plain(value: float) -> float:
    return int(value) if value == int(value) else round(value, 4)
