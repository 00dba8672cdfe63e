"""The local backend: a job's workers as OS processes on this machine, gang-launched for DDP.

One worker per entry of the placement (rank i on node ``placement[i]``; a node may be one of the
virtual nodes a layout such as ``4x8`` cuts the machine into). Every worker is started by a
launcher (``worker_launcher.py``, forked by the node's launcher) that leads its own session,
with the torch.distributed variables and exactly the devices it was given, in the job's
directory, its output in ``<workdir>/logs/worker-<rank>.log``. When the service runs as root,
nothing of the job (its directory, log, environment) is touched by a root process: the job
directory is made and read by a helper running as the user's account (``userfs.UserFiles``), and
the launcher's child drops to the account before it opens the log and executes the command
(docs/security.md).

The gang lives and dies whole. A worker that exits non-zero makes the backend stop the others
(SIGTERM, ``failure_grace``, SIGKILL) and report ``failed`` with that exit code and the tail of
its log; all workers exiting 0 is ``finished``. ``stop`` sends SIGTERM to every worker's process
group, waits up to ``grace`` seconds for them to checkpoint and leave, kills what is left, then
reports ``released``. ``resize`` is a stop followed by a start at the new size: the training
runtime resumes from the checkpoint written on SIGTERM.

Workers outlive the service (own session, and nothing of theirs depends on the service's pipes).
For every gang the backend keeps ``<state_dir>/jobs/<job>/record.json`` with each worker's pid
and start time; a new backend over the same ``state_dir`` re-adopts them in ``recover`` (the
start time tells a recycled pid from the worker), and learns the exit codes of those that ended
meanwhile from the launcher's exit files. A job it cannot find is reported ``lost``.

Devices: node ``k`` owns device indexes ``[offset_k, offset_k + gpus_k)`` where ``offset_k`` is
the sum of the GPUs of the nodes before it, so virtual nodes on one machine never share a device.
A worker asking for ``g`` GPUs on a node takes the ``g`` lowest free indexes there, in rank order;
they are free again when the gang is gone. ``CUDA_VISIBLE_DEVICES`` holds exactly those (empty
when the worker has none), on real and virtual devices alike.

``LocalBackend`` (backend.py) is built from collaborators, one module each, and delegates the
Backend protocol's calls to them:
- ``allocation``   ``DeviceTable`` (device indexes, taken and free), ``RendezvousPorts``
- ``records``      ``GangRecords``: the gangs' records and the launchers' exit files in
                   ``state_dir``; ``Gang``/``Worker`` and the ``GangState`` of a gang
- ``users``        ``UserAccounts``: the account a user's workers run as; logs read with its rights
- ``confining``    ``WorkerCgroups``: each worker's cgroup, made with its grant
- ``holds``        ``DeviceHolds``: devices held for notebook servers, on record
- ``launching``    ``Launcher``: prepare a start as the user, start one launcher per worker
- ``node_launcher`` ``NodeLauncher``: the node's launcher, which forks every worker's launcher
- ``offload``      ``Offload``: the threads of the starts' and the ends' blocking calls
- ``supervision``  ``Supervisor``: watch the workers; fail, finish or stop a gang whole
- ``recovery``     ``Recovery``: re-adopt the workers after a service restart
- ``events``       ``Emitter``: the backend's events, ``EventKind`` only
- ``errors``       ``StartError``
"""

from __future__ import annotations

from .backend import LocalBackend
from .errors import StartError
from .launching import DEFAULT_ENV_KEEP, PROJECT_ROOT
from .node_launcher import LAUNCHER, LAUNCHER_ENV
from .supervision import STOPPED_EXIT_CODE

__all__ = [
    "DEFAULT_ENV_KEEP",
    "LAUNCHER",
    "LAUNCHER_ENV",
    "PROJECT_ROOT",
    "STOPPED_EXIT_CODE",
    "LocalBackend",
    "StartError",
]
