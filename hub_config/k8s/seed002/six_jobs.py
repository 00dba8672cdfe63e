"""Seed 002 on a real cluster: six 2-worker PyTorchJobs (1 GPU per worker) at once.

The seed (Abe Sharp, "Training a PyTorch Model") creates six PyTorchJobs from six Python threads
on a cluster with fewer GPUs than 12: without gang scheduling the pods of different jobs split
the GPUs between them and every job hangs half started; with the training operator started with
``--gang-scheduler-name=volcano`` the jobs run one gang after the other. docs/kubernetes.md is
the runbook. Three modes:

``--mode plain``   six PyTorchJobs without schedulingPolicy (pods use the default scheduler):
                   reproduces the deadlock when the operator runs without the gang flag.
``--mode volcano`` the same six jobs with schedulingPolicy (minAvailable 2, a queue) and
                   ``schedulerName: volcano``: Volcano admits whole gangs only.
``--mode wmla``    six jobs submitted to the wmla service's REST API from six threads; wmla's
                   scheduler admits whole gangs and its Kubernetes backend creates the
                   PyTorchJobs.

In every mode it then watches the pods of the six jobs (``--watch`` seconds, read-only) and
prints, per sample, how many workers of each job hold a node (bound, not ended); ``partial``
counts samples where some job held 1 of its 2 workers while another job waited: the
deadlock's signature. Expected:
plain > 0 and stuck; volcano and wmla 0, all six jobs Succeeded.

On nodes that run containers, ``--job rendezvous`` makes each worker do what the seed's
deadlock is made of, and nothing else: join its gang through torch.distributed (gloo, the
operator's MASTER_ADDR/RANK/WORLD_SIZE) within ``--rendezvous-timeout`` seconds, then one
all_reduce. A half-started job then holds its GPU in the rendezvous until that timeout fails it.
``--masters-first`` (plain) has the default scheduler take every job's master before any worker
(a PriorityClass that preempts nothing): the race of the seed's six threads at its worst, every
run, wherever the pods come in together (e.g. while someone else's pods hold the GPUs).

``--dry-run`` prints the manifests of ``plain``/``volcano`` as YAML and touches nothing.
Needs ``kubernetes_asyncio`` (and ``requests`` for ``--mode wmla``).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
import threading
import time
from dataclasses import dataclass, field

import yaml

from extension.backends import manifests as m
from extension.scheduler import Resources
from extension.scheduler.resources import parse_quantity

IMAGE = "kubeflowkatib/pytorch-mnist-gpu:latest"  # the seed's mnist example image
REPLICA_TYPE = "training.kubeflow.org/replica-type"
COMMAND = ["python3", "/opt/pytorch-mnist/mnist.py", "--epochs=1"]
MASTERS_FIRST = "seed002-masters-first"  # the PriorityClass of --masters-first
TIMEOUT_ENV = "SEED002_RENDEZVOUS_TIMEOUT"
# --job rendezvous: the gang meets or the worker fails after the timeout (torch's TCPStore
# master waits for every rank, the others retry their connection to it)
RENDEZVOUS = """import datetime, os, time
import torch, torch.distributed as dist
rank, size = os.environ["RANK"], os.environ["WORLD_SIZE"]
timeout = datetime.timedelta(seconds=float(os.environ.get("SEED002_RENDEZVOUS_TIMEOUT", "60")))
print(f"rank {rank} of {size}: joining the gang", flush=True)
start = time.monotonic()
dist.init_process_group("gloo", timeout=timeout)
total = torch.ones(1)
dist.all_reduce(total)
print(f"rank {rank}: the gang met in {time.monotonic() - start:.1f} s, sum {total.item():.0f}")
dist.destroy_process_group()
"""


@dataclass
class Workload:
    """What each of the twelve workers runs and asks for, and where it may go."""

    image: str = IMAGE
    command: list[str] = field(default_factory=lambda: list(COMMAND))
    env: dict[str, str] = field(default_factory=dict)
    per_worker: Resources = Resources(1, 1000, 2 * 2**30)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict] = field(default_factory=list)
    masters_first: bool = False


def seed_jobs(mode: str, namespace: str, queue: str, work: Workload | None = None) -> list[dict]:
    """The six PyTorchJobs of the seed, as ``plain`` (no gang) or ``volcano`` (gang) asks."""
    work = work or Workload()
    jobs = []
    for i in range(6):
        name = f"pytorch-t{i}"
        labels = {"app": "seed002", "seed002/job": name}
        container = m.make_container(
            name=m.PYTORCH_CONTAINER,
            image=work.image,
            command=work.command,
            per_worker=work.per_worker,
            env=work.env,
            image_pull_policy="IfNotPresent",
        )
        template = m.make_pod_template(
            containers=[container],
            labels=labels,
            # plain names the default scheduler: a training operator started with the gang flag
            # would otherwise hand every pod without a scheduler to Volcano
            scheduler_name="volcano" if mode == "volcano" else "default-scheduler",
            restart_policy="OnFailure",
            node_selector=work.node_selector,
            tolerations=work.tolerations,
        )
        job = m.make_pytorchjob(
            name=name,
            namespace=namespace,
            template=template,
            workers=2,
            queue=queue,
            labels=labels,
            ttl_seconds_after_finished=None,
        )
        if mode == "plain":
            del job["spec"]["runPolicy"]["schedulingPolicy"]
        if work.masters_first:
            master = job["spec"]["pytorchReplicaSpecs"]["Master"]
            master["template"] = copy.deepcopy(master["template"])
            master["template"]["spec"]["priorityClassName"] = MASTERS_FIRST
        jobs.append(job)
    return jobs


def masters_first_class() -> dict:
    """Above the default priority 0 so the masters are taken first; never preempting."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": MASTERS_FIRST},
        "value": 1000,
        "preemptionPolicy": "Never",
        "description": "seed 002: every job's master before any worker (six_jobs.py)",
    }


async def create_direct(jobs: list[dict], namespace: str, masters_first: bool = False) -> None:
    from kubernetes_asyncio import client, config
    from kubernetes_asyncio.client.exceptions import ApiException

    await config.load_kube_config()
    async with client.ApiClient() as api:
        custom = client.CustomObjectsApi(api)
        if masters_first:
            try:
                await client.SchedulingV1Api(api).create_priority_class(masters_first_class())
            except ApiException as err:
                if err.status == 403:
                    raise SystemExit(
                        f"--masters-first: this account may not create PriorityClass "
                        f"{MASTERS_FIRST}; a cluster admin can apply the first document of "
                        "`six_jobs.py --mode plain --masters-first --dry-run`"
                    ) from None
                if err.status != 409:  # 409: made by an earlier run
                    raise
        # Six threads in the seed; six concurrent requests here: the same race for the GPUs.
        await asyncio.gather(
            *(
                custom.create_namespaced_custom_object(
                    "kubeflow.org", "v1", namespace, "pytorchjobs", job
                )
                for job in jobs
            )
        )


def submit_wmla(
    url: str, token: str, plan: str, work: Workload, model_dir: str = "models/pytorch_mnist"
) -> list[str]:
    import requests

    cpu, memory = int(work.per_worker.cpu), int(work.per_worker.memory)

    ids: list[str] = []
    errors: list[str] = []

    def one(i: int) -> None:
        body = {
            "plan": plan,
            "name": f"seed002-t{i}",
            "workers": 2,
            "resources": {"gpu": 1, "cpu": f"{cpu}m", "memory": str(memory)},
            "command": {"model_dir": model_dir, "model_main": "main.py"},
            "env": work.env,
        }
        r = requests.post(
            f"{url.rstrip('/')}/api/v1/jobs",
            json=body,
            headers={"Authorization": f"token {token}"},
            timeout=30,
        )
        if r.status_code >= 400:
            errors.append(f"job {i}: {r.status_code} {r.text}")
        else:
            ids.append(r.json()["id"])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit("\n".join(errors))
    return ids


@dataclass
class Watched:
    """What the samples showed."""

    partial: int = 0  # samples with a job at 1/2 (in two samples in a row) while another waited
    longest_partial: float = 0.0  # seconds of the longest run of such samples
    ended: dict[str, str] = field(default_factory=dict)  # job -> Succeeded or Failed

    def count(self, phase: str) -> int:
        return sum(1 for p in self.ended.values() if p == phase)


def _ended(jobs: list[dict], pods: list) -> dict[str, str]:
    """The jobs that ended, from their conditions (the operator deletes a failed job's pods)
    and their masters' pods (kept after success): the operator's success policy is the
    master's."""
    ended = {}
    for job in jobs:
        for cond in (job.get("status") or {}).get("conditions") or []:
            if cond.get("type") in ("Succeeded", "Failed") and cond.get("status") == "True":
                ended[job["metadata"]["name"]] = cond["type"]
    for pod in pods:
        labels = pod.metadata.labels or {}
        if labels.get(REPLICA_TYPE) == "master" and pod.status.phase in ("Succeeded", "Failed"):
            ended.setdefault(labels.get("training.kubeflow.org/job-name", "?"), pod.status.phase)
    return ended


async def watch(namespace: str, selector: str, seconds: float, every: float) -> Watched:
    """Sample the pods until the six jobs ended or ``seconds`` passed.

    A job is partly running when it holds 1 of its 2 workers while another job waits, in two
    samples in a row: a scheduler binds a whole gang one pod after the other, and a sample may
    fall between two binds; a deadlock is still there at the next sample."""
    from kubernetes_asyncio import client, config

    await config.load_kube_config()
    seen = Watched()
    half_before: set[str] = set()
    since: float | None = None
    async with client.ApiClient() as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pods = (await core.list_namespaced_pod(namespace, label_selector=selector)).items
            jobs = await custom.list_namespaced_custom_object(
                "kubeflow.org", "v1", namespace, "pytorchjobs", label_selector=selector
            )
            seen.ended.update(_ended(jobs["items"], pods))
            running = {job["metadata"]["name"]: 0 for job in jobs["items"]}
            finishing: set[str] = set()  # a pod of it ended: its gang met, it is not split
            for pod in pods:
                job = (pod.metadata.labels or {}).get("training.kubeflow.org/job-name", "?")
                # A pod holds its GPU from the moment it is bound to a node (Running may lag
                # behind on a slow image pull), until it ends.
                ended = pod.status.phase in ("Succeeded", "Failed")
                running[job] = running.get(job, 0) + bool(pod.spec.node_name and not ended)
                if ended:
                    finishing.add(job)
            half = {j for j, n in running.items() if n == 1 and j not in finishing}
            waiting = sorted(j for j, n in running.items() if n == 0 and j not in seen.ended)
            stuck = sorted(half & half_before)
            half_before = half
            now = time.monotonic()
            if stuck and waiting:
                seen.partial += 1
                since = now if since is None else since
                seen.longest_partial = max(seen.longest_partial, now - since)
            else:
                since = None
            print(
                time.strftime("%H:%M:%S"),
                " ".join(f"{j}={n}/2" for j, n in sorted(running.items())),
                f"partial={','.join(stuck) or '-'}",
                f"ended={len(seen.ended)}",
                flush=True,
            )
            if len(seen.ended) >= 6:
                break
            await asyncio.sleep(every)
    return seen


def _workload(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Workload:
    work = Workload(image=args.image, masters_first=args.masters_first)
    if args.kwok_runtime:
        work.env["KWOK_RUNTIME"] = args.kwok_runtime
    if args.job == "rendezvous":
        work.command = ["python", "-c", RENDEZVOUS]
        work.env[TIMEOUT_ENV] = str(args.rendezvous_timeout)
    try:
        work.per_worker = Resources(
            1, parse_quantity("cpu", args.cpu), parse_quantity("memory", args.memory)
        )
    except ValueError as err:
        parser.error(f"--cpu/--memory: {err}")
    for pair in args.node_selector:
        key, sep, value = pair.partition("=")
        if not (key and sep):
            parser.error(f"--node-selector {pair!r}: write it as KEY=VALUE")
        work.node_selector[key] = value
    work.tolerations = [{"key": key, "operator": "Exists"} for key in args.toleration]
    return work


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--mode", choices=["plain", "volcano", "wmla"], required=True)
    add("--namespace", default="wmla")
    add("--queue", default="default", help="Volcano queue for --mode volcano")
    add("--image", default=IMAGE)
    add(
        "--job",
        choices=["mnist", "rendezvous"],
        default="mnist",
        help="mnist: the seed's image and command; rendezvous: join the gang, one all_reduce",
    )
    add("--rendezvous-timeout", type=float, default=60, help="seconds a worker waits for its gang")
    add("--cpu", default="1", help="cpu per worker (e.g. 1, 400m)")
    add("--memory", default="2Gi", help="memory per worker (e.g. 2Gi)")
    add("--node-selector", action="append", default=[], metavar="KEY=VALUE")
    add("--toleration", action="append", default=[], metavar="KEY", help="tolerate taint KEY")
    add(
        "--masters-first",
        action="store_true",
        help="plain: every job's master is scheduled before any worker",
    )
    add("--url", help="wmla service URL, e.g. https://hub.example/services/wmla")
    add("--token", help="a hub API token of the submitting user")
    add("--plan", default="/sample-project/training")
    add("--model-dir", default="models/pytorch_mnist", help="wmla: the job's folder, the user's")
    add("--watch", type=float, default=600, help="seconds to watch the pods")
    add("--every", type=float, default=5)
    add("--dry-run", action="store_true")
    add(
        "--kwok-runtime",
        help="on a KWOK cluster (make k8s-up): how long each worker pretends to run, e.g. 5s",
    )
    return parser  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = _arguments()
    args = parser.parse_args(argv)
    work = _workload(args, parser)
    if args.mode == "wmla":
        if args.dry_run:
            parser.error("--dry-run prints the plain/volcano manifests; wmla builds its own")
        if not (args.url and args.token):
            parser.error("--mode wmla needs --url and --token")
        if args.masters_first:
            parser.error("--masters-first is for --mode plain: wmla schedules whole gangs")
        ids = submit_wmla(args.url, args.token, args.plan, work, args.model_dir)
        print("submitted", ids)
        selector = f"{m.LABEL_JOB} in ({','.join(m.job_object_name(i) for i in ids)})"
    else:
        jobs = seed_jobs(args.mode, args.namespace, args.queue, work)
        if args.dry_run:
            first = [masters_first_class()] if args.masters_first else []
            yaml.safe_dump_all(first + jobs, sys.stdout, sort_keys=False)
            return 0
        asyncio.run(create_direct(jobs, args.namespace, args.masters_first))
        selector = "app=seed002"
    seen = asyncio.run(watch(args.namespace, selector, args.watch, args.every))
    print(f"samples with a partly running gang: {seen.partial}")
    print(f"longest run of such samples: {seen.longest_partial:.1f} s")
    print(f"jobs succeeded: {seen.count('Succeeded')}/6")
    print(f"jobs failed: {seen.count('Failed')}/6")
    return 0


if __name__ == "__main__":
    sys.exit(main())
