"""What both wmla spawners share: hub user -> plan leaf, admission, folder, kernel environment.

A notebook server is a job like any other (docs/scheduling.md "Words"): a rigid, non-preemptible
gang of one worker, charged to ``<plan>/<user>``. The spawner submits it through the service as a
plan admin on the user's behalf (``"user"`` in the body), waits while it is PENDING (the spawn
page's progress shows the service's reason, e.g. "/project1/dev-team at its gpu limit: 2 of 2 in
use"), fails at once when the service answers 422 (it can never fit), and cancels the job when
the server stops, which releases the plan's resources. A server whose job the service ended (an
admin cancelled it) is stopped at the hub's next poll.

The service is reached over HTTP through ``extension.client`` (blocking, so in a thread: the
hub's event loop never waits on a socket).

:class:`WmlaSpawnerMixin` holds every trait (the configuration and the state of one spawn) and is
composed of parts, one module each; each part's docstring names the attributes it reads:

- ``plans``: the profile and the plan a notebook is charged to, and the spawn page;
- ``admission``: the notebook job's body, its submission and the wait while it is PENDING;
- ``release``: cancelling the job when the server stops, and the orphans a failed release leaves;
- ``poll``: stopping a server whose job the service ended;
- ``gpu_group``: the hub group of users whose servers hold GPUs;
- ``state``: the kernel's environment and the state kept across hub restarts;
- ``service``: the service's address, the spawner's token, one request.
"""

from __future__ import annotations

import os

from traitlets import Any as AnyTrait
from traitlets import Bool, Dict, Float, Integer, List, Unicode, default
from traitlets.config import LoggingConfigurable

from .admission import Admission
from .common import DEFAULT_PLAN, GPU_GROUP, NOTEBOOK_KIND, SPAWNER_SERVICE, AdmissionError
from .gpu_group import GpuGroup
from .plans import PlanChoice
from .poll import JobPoll
from .release import Release
from .service import ServiceAccess
from .state import SpawnState

__all__ = [
    "DEFAULT_PLAN",
    "GPU_GROUP",
    "NOTEBOOK_KIND",
    "SPAWNER_SERVICE",
    "AdmissionError",
    "WmlaSpawnerMixin",
]


# The parts hold methods only: the traits stay on this one class, so the configuration reads
# c.WmlaSpawnerMixin / c.WmlaLocalSpawner / c.WmlaKubeSpawner as before and no part becomes a
# config section of its own. Each method is defined in one part, so the parts' order does not
# matter; they all come before LoggingConfigurable, hence before the base spawner their super()
# calls (progress, poll, stop, the state hooks) reach.
class WmlaSpawnerMixin(
    PlanChoice,
    Admission,
    Release,
    JobPoll,
    GpuGroup,
    SpawnState,
    ServiceAccess,
    LoggingConfigurable,
):
    """Mix in before a JupyterHub spawner class (``class S(WmlaSpawnerMixin, BaseSpawner)``)."""

    # -- where the service is, and who the spawner is to it -----------------------------------
    service_name = Unicode(
        "wmla",
        help="""The wmla service's name in c.JupyterHub.services.

        c.WmlaLocalSpawner.service_name = "wmla"
        """,
    ).tag(config=True)

    service_url = Unicode(
        "",
        help="""Where the spawner (in the hub) reaches the wmla service: its own address, the hub's
        ``/services/wmla/`` or its API. Default: the url and prefix of the hub service named
        ``service_name``.

        c.WmlaLocalSpawner.service_url = "http://127.0.0.1:10101/services/wmla/"
        """,
    ).tag(config=True)

    kernel_service_url = Unicode(
        "",
        help="""``$WMLA_URL`` in the notebook: where the kernel reaches the service (on Kubernetes
        usually the hub's proxy service inside the cluster). Default: ``service_url``.

        c.WmlaKubeSpawner.kernel_service_url = "http://proxy-public/services/wmla/"
        """,
    ).tag(config=True)

    service_token = Unicode(
        "",
        help="""A hub API token with the ``custom:wmla:admin`` and ``access:services!service=wmla``
        scopes: the spawner submits notebook jobs on users' behalf. Default:
        ``$WMLA_SPAWNER_TOKEN``, else the api_token of the hub service named ``token_service``
        (``spawner.hubconfig.spawner_service()`` builds that service and its role).

        c.WmlaLocalSpawner.service_token = os.environ["WMLA_SPAWNER_TOKEN"]
        """,
    ).tag(config=True)

    token_service = Unicode(
        SPAWNER_SERVICE,
        help="""The hub service whose api_token the spawner uses when service_token is unset.

        c.WmlaLocalSpawner.token_service = "wmla-spawner"
        """,
    ).tag(config=True)

    # -- which plan ---------------------------------------------------------------------------
    default_plan = Unicode(
        DEFAULT_PLAN,
        help="""The plan of users with no override, no mapped group and no profile plan.

        c.WmlaLocalSpawner.default_plan = "/sample-project/notebooks"
        """,
    ).tag(config=True)

    group_plans = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        help="""Hub group -> plan path. A user in several mapped groups gets the first in this
        mapping's order.

        c.WmlaLocalSpawner.group_plans = {"dev": "/project1/dev-team", "qa": "/project1/qa-team"}
        """,
    ).tag(config=True)

    user_plans = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        help="""Hub user -> plan path; wins over group_plans.

        c.WmlaLocalSpawner.user_plans = {"alice": "/project1/dev-team"}
        """,
    ).tag(config=True)

    wmla_plan = Unicode(
        "",
        help="""Force one plan (wins over user_plans and group_plans; a picked profile's plan wins
        over it). Meant for KubeSpawner profile_list overrides:
        ``"kubespawner_override": {"wmla_plan": "/project1/dev-team", "gpus": 1}``.

        c.WmlaKubeSpawner.wmla_plan = "/project1/dev-team"
        """,
    ).tag(config=True)

    profiles = List(
        Dict(),
        help="""Deprecated: use ``profile_list``, KubeSpawner's shape (spawner/profiles.py), which
        both spawners read. Each entry here (``slug``, ``display_name``, ``description``,
        ``default``, ``plan``, ``gpu``, ``cpu``, ``memory``) is read as a profile_list entry
        whose ``kubespawner_override`` sets ``wmla_plan``, ``gpus``, ``notebook_cpu``,
        ``notebook_memory``; used only while ``profile_list`` is not set.

        c.WmlaLocalSpawner.profiles = [{"slug": "gpu", "display_name": "1 GPU", "gpu": 1}]
        """,
    ).tag(config=True)

    plan_choice = Bool(
        True,
        help="""Offer the plans the user may use on the spawn page (when there is more than
        one): the service says which (plan members and groups, as for the user's own
        submissions), and a pick outside them is refused at spawn. A picked profile that sets
        ``wmla_plan`` (its ``kubespawner_override`` or a choice's) wins over the pick. The
        pick arrives as ``user_options = {"plan": path}``.

        c.WmlaLocalSpawner.plan_choice = False
        """,
    ).tag(config=True)

    # -- what a notebook asks for --------------------------------------------------------------
    gpus = Integer(
        0,
        min=0,
        help="""GPUs a notebook server requests (a profile's ``kubespawner_override`` may set it).

        c.WmlaLocalSpawner.gpus = 1
        """,
    ).tag(config=True)

    notebook_cpu = Unicode(
        "",
        help="""The notebook's cpu request sent to the service ("500m", "2"); default:
        cpu_guarantee when set, else the instance limit range's default request.

        c.WmlaLocalSpawner.notebook_cpu = "500m"
        """,
    ).tag(config=True)

    notebook_memory = Unicode(
        "",
        help="""The notebook's memory request sent to the service ("2Gi"); default: mem_guarantee
        when set, else the instance limit range's default request.

        c.WmlaLocalSpawner.notebook_memory = "2Gi"
        """,
    ).tag(config=True)

    admission_poll_interval = Float(
        1.0,
        min=0.05,
        help="""Seconds between looks at a waiting notebook job. A wait for room counts against
        c.Spawner.start_timeout: raise it where notebooks may queue.

        c.WmlaLocalSpawner.admission_poll_interval = 1.0
        """,
    ).tag(config=True)

    gpu_group = Unicode(
        GPU_GROUP,
        help="""The hub group a user is in while one of their servers holds GPUs (the spawner adds
        them once the notebook job is admitted and removes them when its last GPU server stops).
        The GPU idle culler's scopes are filtered to it (hub_config.culler_services): idle GPU
        servers are stopped sooner. "": keep no group. Leave it out of an authenticator's
        manage_groups (it would drop the membership at the next login).

        c.WmlaLocalSpawner.gpu_group = "wmla-gpu-notebooks"
        """,
    ).tag(config=True)

    # -- storage --------------------------------------------------------------------------------
    storage_root = Unicode(
        help="""The shared root of users' private folders ``<storage_root>/<user>`` (the same
        as c.WmlaService.storage_root). Default: ``$WMLA_STORAGE_ROOT`` or ``./var/storage``.

        c.WmlaLocalSpawner.storage_root = "/gpfs/myresultfs"
        """,
    ).tag(config=True)

    @default("storage_root")
    def _storage_root_default(self) -> str:
        return os.environ.get("WMLA_STORAGE_ROOT") or os.path.abspath("var/storage")

    # state of one spawn (not config)
    wmla_job_id = Unicode("")
    wmla_leaf = Unicode("")
    wmla_gpus = Integer(0)  # GPUs the admitted notebook job holds
    wmla_granted = Dict()  # {"resources", "limits"} the service admitted the notebook job with
    _wmla_events = List()
    _wmla_changed = AnyTrait(None, allow_none=True)
    _wmla_waiting = AnyTrait(False)
    _wmla_stopping = AnyTrait(False)
    _wmla_orphans = List()  # job ids whose server is gone but whose release is still due
    _wmla_profile_plan = Unicode("")  # the plan the picked profile forces (wmla_plan override)
