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

``--dry-run`` prints the manifests of ``plain``/``volcano`` as YAML and touches nothing.
Needs ``kubernetes_asyncio`` (and ``requests`` for ``--mode wmla``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time

import yaml

from extension.backends import manifests as m
from extension.scheduler import Resources

IMAGE = "kubeflowkatib/pytorch-mnist-gpu:latest"  # the seed's mnist example image
REPLICA_TYPE = "training.kubeflow.org/replica-type"
COMMAND = ["python3", "/opt/pytorch-mnist/mnist.py", "--epochs=1"]


def seed_jobs(
    mode: str, namespace: str, queue: str, image: str = IMAGE, env: dict[str, str] | None = None
) -> list[dict]:
    """The six PyTorchJobs of the seed, as ``plain`` (no gang) or ``volcano`` (gang) asks."""
    jobs = []
    for i in range(6):
        name = f"pytorch-t{i}"
        labels = {"app": "seed002", "seed002/job": name}
        container = m.make_container(
            name=m.PYTORCH_CONTAINER,
            image=image,
            command=COMMAND,
            per_worker=Resources(1, 1000, 2 * 2**30),
            env=env or {},
        )
        template = m.make_pod_template(
            containers=[container],
            labels=labels,
            # plain names the default scheduler: a training operator started with the gang flag
            # would otherwise hand every pod without a scheduler to Volcano
            scheduler_name="volcano" if mode == "volcano" else "default-scheduler",
            restart_policy="OnFailure",
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
        jobs.append(job)
    return jobs


async def create_direct(jobs: list[dict], namespace: str) -> None:
    from kubernetes_asyncio import client, config

    await config.load_kube_config()
    async with client.ApiClient() as api:
        custom = client.CustomObjectsApi(api)
        # Six threads in the seed; six concurrent requests here: the same race for the GPUs.
        await asyncio.gather(
            *(
                custom.create_namespaced_custom_object(
                    "kubeflow.org", "v1", namespace, "pytorchjobs", job
                )
                for job in jobs
            )
        )


def submit_wmla(url: str, token: str, plan: str, env: dict[str, str]) -> list[str]:
    import requests

    ids: list[str] = []
    errors: list[str] = []

    def one(i: int) -> None:
        body = {
            "plan": plan,
            "name": f"seed002-t{i}",
            "workers": 2,
            "resources": {"gpu": 1, "cpu": "1", "memory": "2Gi"},
            "command": {"model_dir": "models/pytorch_mnist", "model_main": "main.py"},
            "env": env,
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


async def watch(namespace: str, selector: str, seconds: float, every: float) -> tuple[int, int]:
    """Sample the pods until the six jobs ended or ``seconds`` passed; return the number of
    samples that show a partly running gang, and how many jobs succeeded.

    A job is partly running when it holds 1 of its 2 workers while another job waits, in two
    samples in a row: a scheduler binds a whole gang one pod after the other, and a sample may
    fall between two binds; a deadlock is still there at the next sample."""
    from kubernetes_asyncio import client, config

    await config.load_kube_config()
    partial = 0
    succeeded: dict[str, int] = {}
    half_before: set[str] = set()
    async with client.ApiClient() as api:
        core = client.CoreV1Api(api)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pods = (await core.list_namespaced_pod(namespace, label_selector=selector)).items
            running: dict[str, int] = {}
            succeeded = {}
            for pod in pods:
                job = (pod.metadata.labels or {}).get("training.kubeflow.org/job-name", "?")
                running.setdefault(job, 0)
                # the operator's success policy: the job succeeded when its master did
                master = (pod.metadata.labels or {}).get(REPLICA_TYPE) == "master"
                succeeded[job] = succeeded.get(job, 0) + (
                    master and pod.status.phase == "Succeeded"
                )
                # A pod holds its GPU from the moment it is bound to a node (Running may lag
                # behind on a slow image pull), until it ends.
                if pod.spec.node_name and pod.status.phase not in ("Succeeded", "Failed"):
                    running[job] += 1
            half = {j for j, n in running.items() if n == 1}
            waiting = sorted(j for j, n in running.items() if n == 0 and not succeeded[j])
            stuck = sorted(half & half_before)
            half_before = half
            if stuck and waiting:
                partial += 1
            print(
                time.strftime("%H:%M:%S"),
                " ".join(f"{j}={n}/2" for j, n in sorted(running.items())),
                f"partial={','.join(stuck) or '-'}",
                flush=True,
            )
            if sum(succeeded.values()) == 6:
                break
            await asyncio.sleep(every)
    return partial, sum(succeeded.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["plain", "volcano", "wmla"], required=True)
    parser.add_argument("--namespace", default="wmla")
    parser.add_argument("--queue", default="default", help="Volcano queue for --mode volcano")
    parser.add_argument("--image", default=IMAGE)
    parser.add_argument("--url", help="wmla service URL, e.g. https://hub.example/services/wmla")
    parser.add_argument("--token", help="a hub API token of the submitting user")
    parser.add_argument("--plan", default="/sample-project/training")
    parser.add_argument("--watch", type=float, default=600, help="seconds to watch the pods")
    parser.add_argument("--every", type=float, default=5)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument(
        "--kwok-runtime",
        help="on a KWOK cluster (make k8s-up): how long each worker pretends to run, e.g. 5s",
    )
    args = parser.parse_args(argv)

    env = {"KWOK_RUNTIME": args.kwok_runtime} if args.kwok_runtime else {}
    if args.mode == "wmla":
        if args.dry_run:
            parser.error("--dry-run prints the plain/volcano manifests; wmla builds its own")
        if not (args.url and args.token):
            parser.error("--mode wmla needs --url and --token")
        print("submitted", submit_wmla(args.url, args.token, args.plan, env))
        selector = "app.kubernetes.io/managed-by=jupyterhub-wmla"
    else:
        jobs = seed_jobs(args.mode, args.namespace, args.queue, args.image, env)
        if args.dry_run:
            yaml.safe_dump_all(jobs, sys.stdout, sort_keys=False)
            return 0
        asyncio.run(create_direct(jobs, args.namespace))
        selector = "app=seed002"
    partial, succeeded = asyncio.run(watch(args.namespace, selector, args.watch, args.every))
    print(f"samples with a partly running gang: {partial}")
    print(f"jobs succeeded: {succeeded}/6")
    return 0


if __name__ == "__main__":
    sys.exit(main())
