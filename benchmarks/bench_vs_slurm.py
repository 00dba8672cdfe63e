"""wmla beside Slurm: the same jobs through a throwaway Slurm and through wmla as root.

    .venv/bin/python benchmarks/bench_vs_slurm.py [--jobs N] [--clients C] [--rounds R]
        [--commands python,true] [--json-out FILE]

Root only. Slurm comes from Debian's packages (``apt-get install -y slurm-wlm munge``; without
slurmctld the benchmark says so and exits 0): munged with its own key and socket, slurmctld and
one slurmd with 4 x 8 fake GPUs as gres, on loopback, by PID, all state in a temporary folder,
no accounting database (``slurm_cluster.py``). wmla is started as ``bench_service.py --as-root``
starts it: the real hub, proxy and service (tests/service/hub.py), the real ``LocalBackend``,
a system account per client (made here, removed after), jobs of 0 GPUs, 250m cpu, 64Mi.

The jobs, the same on both sides, per command:
- ``python``: the users' ``models/bench/main.py`` (it appends its start time and job id to a
  file beside it: how the start is seen on both sides), run by the interpreter a wmla job of
  that account gets, with that job's environment (PYTHONPATH included; read from a first wmla
  job, a probe, then given to sbatch with ``--export=ALL``);
- ``true``: ``/bin/true main.py`` (``c.WmlaService.python = "/bin/true"``).
A Slurm job is ``sbatch --wrap "exec <command>"`` (a batch job always starts through its
script), submitted as the client's account, 1 CPU, its output in the user's folder.

Submitted the same way on both sides: one client one by one (``sbatch`` each, vs one requests
session to the REST API), then ``--clients`` clients at once (each its own account); those
submit as fast as they are answered, so a job's start there is mostly its wait behind the
backlog. Then (``--paced``, 2/s: below both systems' throughput) the python job from one
client at that pace, 30 s of them: the start without a backlog. The systems alternate,
``--rounds`` times. For each: submissions per second; jobs finished per
second end to end (first submission until the last job is seen ended, polled every 0.2 s on
both sides); p50/p99 from submission to the job's start (``python`` only: the job's own
clock), and the p50 of the starts on the run's clock (from its first submission: with a
backlog, a system that takes submissions faster than the other has its jobs wait longer from
their own submission even where each starts sooner); CPU per job of the daemons (slurmctld +
slurmd and its slurmstepds + munged) or of wmla (service and its helpers + node's launcher's
launchers + hub + proxy), less the job's own CPU, which is measured apart (the same command run
alone, 20 times) and reported beside. Then the ratios wmla/Slurm, and the goals: jobs finished
per second at least Slurm's for both commands; start p50 at most Slurm's, from submission and
on the run's clock.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from benchmarks import bench_service as bs  # noqa: E402
from benchmarks.slurm_cluster import SlurmCluster, missing, which  # noqa: E402
from tests.service.hub import PROXY, Hub  # noqa: E402

INSTALL = "apt-get install -y slurm-wlm munge"
POLL = 0.2
JOB_SCRIPT = """\
import os, time
with open({log!r}, "a") as f:
    job = os.environ.get("WMLA_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    f.write(f"{{time.time()}} {{job}}\\n")
"""
PROBE = """\
import json, os, sys
with open({out!r}, "w") as f:
    json.dump({{"argv": sys.orig_argv, "executable": sys.executable, "env": dict(os.environ)}}, f)
"""
# a wmla worker's own variables, not the job's environment
WMLA_ONLY = ("WMLA_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
             "CUDA_VISIBLE_DEVICES")  # fmt: skip


class Users:
    """The hub's users with their accounts, folders, tokens, for one wmla start."""

    def __init__(self, hub: Hub, names: list[str], template: str) -> None:
        from extension.userfs.accounts import find_account

        self.names, self.template = names, template
        self.tokens = bs.make_users(hub, names, template)
        self.accounts = [find_account(template.format(username=n)) for n in names]
        self.folders = [hub.storage / n / "models" / "bench" for n in names]
        for folder, account in zip(self.folders, self.accounts):
            (folder / "main.py").write_text(JOB_SCRIPT.format(log=str(folder / "starts.log")))
            (folder / "slurm-out").mkdir(exist_ok=True)
            for p in (folder / "main.py", folder / "slurm-out"):
                os.chown(p, account.uid, account.gid)

    def starts(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for folder in self.folders:
            try:
                for line in (folder / "starts.log").read_text().splitlines():
                    t, _, job = line.partition(" ")
                    out.setdefault(job, float(t))
            except OSError:
                pass
        return out


# -- submitting -------------------------------------------------------------------------------
def submit_all(
    n: int, clients: int, submit, pace: float = 0.0
) -> tuple[list[tuple[str, float]], float, float]:
    """``submit(client, k) -> id`` for k < n from ``clients`` threads; ([(id, t0)], first, last).
    ``pace``: submissions a second at most (the k-th not before k / pace), 0: at once."""
    lock, counter, out, errors = threading.Lock(), iter(range(n)), [], []
    begin = time.time()

    def client(c: int) -> None:
        while True:
            with lock:
                k = next(counter, None)
            if k is None:
                return
            if pace:
                time.sleep(max(0.0, begin + k / pace - time.time()))
            t0 = time.time()
            try:
                job = submit(c, k)
            except Exception as err:  # counted, shown
                errors.append(repr(err)[:200])
                continue
            out.append((job, t0))

    t0 = time.time()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print(f"  {len(errors)} submissions failed, first: {errors[0]}", file=sys.stderr)
    return out, t0, time.time()


def wait_until(done, timeout: float) -> float:
    t0 = time.monotonic()
    while not done():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"jobs not ended after {timeout} s")
        time.sleep(POLL)
    return time.time()


class SlurmSide:
    name = "Slurm"

    def __init__(self, slurm: SlurmCluster, users: Users, prefix: list[str], env: dict) -> None:
        """``prefix``: the interpreter (or /bin/true) before each client's main.py."""
        self.slurm, self.users, self.prefix, self.env = slurm, users, prefix, env

    def submit(self, c: int, k: int) -> str:
        account, folder = self.users.accounts[c], self.users.folders[c]
        env = {**self.env, "HOME": account.home, "USER": account.name, "LOGNAME": account.name,
               "SLURM_CONF": str(self.slurm.conf)}  # fmt: skip
        command = "exec " + " ".join([*self.prefix, str(folder / "main.py")])
        r = subprocess.run(
            [which("sbatch"), "--parsable", "-J", f"bench-{k}", "-n1", "-c1",
             f"--chdir={folder}", f"--output={folder}/slurm-out/%j.out", "--export=ALL",
             "--wrap", command],
            env=env, capture_output=True, text=True, user=account.uid, group=account.gid,
            extra_groups=[], cwd=folder,
        )  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(r.stderr.strip())
        return r.stdout.strip().split(";")[0]

    def live(self) -> bool:
        r = subprocess.run(
            [which("squeue"), "-h", "-t", "PD,R,CG,CF,S", "-o", "%i"],
            env=self.slurm.env, capture_output=True, text=True,
        )  # fmt: skip
        return r.returncode != 0 or bool(r.stdout.strip())

    def states(self, ids: list[str]) -> dict[str, int]:
        r = subprocess.run(
            [which("squeue"), "-h", "-t", "all", "-o", "%T", "-j", ",".join(ids)],
            env=self.slurm.env, capture_output=True, text=True,
        )  # fmt: skip
        counts: dict[str, int] = {}
        for s in r.stdout.split():
            counts[s] = counts.get(s, 0) + 1
        return counts

    def cpu(self) -> dict[str, float]:
        return self.slurm.cpu_seconds()


class WmlaSide:
    name = "wmla"

    def __init__(self, hub: Hub, users: Users, pids: dict[str, int]) -> None:
        self.hub, self.users, self.pids = hub, users, pids
        self.sessions = []
        for token in users.tokens:
            s = requests.Session()
            s.headers["Authorization"] = f"token {token}"
            self.sessions.append(s)
        self.admin = requests.Session()
        self.admin.headers["Authorization"] = f"token {hub.user_token('padmin')}"

    def submit(self, c: int, k: int) -> str:
        r = self.sessions[c].post(
            self.hub.api + "/jobs",
            json=bs.job_body(k),
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        if r.status_code != 201:
            raise RuntimeError(f"{r.status_code} {r.text[:200]}")
        return r.json()["id"]

    def live(self) -> bool:
        r = self.admin.get(self.hub.api + "/jobs", params={"state": "PENDING,RUNNING", "limit": 1})
        return r.status_code != 200 or bool(r.json()["jobs"])

    def states(self, ids: list[str]) -> dict[str, int]:
        want, counts = set(ids), {}
        import asyncio

        from tests.service.pages import every_job

        for j in asyncio.run(every_job(bs.admin_get, self.hub.api + "/jobs", self.admin_token())):
            if j["id"] in want:
                counts[j["state"]] = counts.get(j["state"], 0) + 1
        return counts

    def admin_token(self) -> str:
        return self.admin.headers["Authorization"].split()[1]

    def cpu(self) -> dict[str, float]:
        node = bs.node_launcher_pid(self.pids["service"])
        return {
            "service+helpers": bs.cpu_seconds(self.pids["service"])
            + bs.helpers_cpu_seconds(self.pids["service"], node),
            "launchers+jobs": bs.tree_cpu_seconds(node) if node else 0.0,
            "hub+proxy": bs.cpu_seconds(self.pids["hub"]) + bs.cpu_seconds(self.pids["proxy"]),
        }


def phase(
    side, n: int, clients: int, job_cpu: float, timed_starts: bool, pace: float = 0.0
) -> dict:
    cpu0 = side.cpu()
    answers, first, last = submit_all(n, clients, side.submit, pace)
    ended = wait_until(lambda: not side.live(), timeout=max(120, n / 2))
    cpu1 = side.cpu()
    ids = [a[0] for a in answers]
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu0}
    done = max(1, len(ids))
    out = {
        "jobs": len(ids),
        "submissions_per_second": round(len(ids) / (last - first), 1),
        "finished_per_second": round(len(ids) / (ended - first), 1),
        "cpu_ms_per_job": {k: round(1000 * v / done, 2) for k, v in cpu.items()},
        "system_cpu_ms_per_job": round(1000 * (sum(cpu.values()) / done - job_cpu), 2),
    }
    if timed_starts:
        starts = side.users.starts()
        lat = [starts[i] - t0 for i, t0 in answers if i in starts]
        out["started_seen"] = len(lat)
        out["start_p50_ms"] = round(1000 * bs.pct(lat, 50), 1)
        out["start_p99_ms"] = round(1000 * bs.pct(lat, 99), 1)
        # on the run's clock: a system that takes submissions faster than it runs them has its
        # jobs wait longer from their own submission, even when each starts sooner in the run
        since = [starts[i] - first for i, _ in answers if i in starts]
        out["start_in_run_p50_ms"] = round(1000 * bs.pct(since, 50), 1)
    out["states"] = side.states(ids)
    return out


def job_cpu_alone(argv: list[str], env: dict, account, cwd: Path, times: int = 20) -> float:
    """CPU seconds of one run of the command alone (as the account, same env): the job's own."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(times):
        subprocess.run(argv, env=env, user=account.uid, group=account.gid, extra_groups=[],
                       cwd=cwd, stdout=subprocess.DEVNULL, check=True)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / times


def probe(hub: Hub, users: Users) -> tuple[list[str], dict]:
    """The interpreter and environment a wmla job of users[0] gets: one job that writes them."""
    folder, account = users.folders[0], users.accounts[0]
    out = folder / "probe.json"
    (folder / "probe.py").write_text(PROBE.format(out=str(out)))
    os.chown(folder / "probe.py", account.uid, account.gid)
    body = {**bs.job_body(0), "name": "probe"}
    body["command"] = {"model_dir": "models/bench", "model_main": "probe.py"}
    r = requests.post(
        hub.api + "/jobs", json=body, headers={"Authorization": f"token {users.tokens[0]}"}
    )
    assert r.status_code == 201, r.text
    wait_until(out.exists, 60)
    time.sleep(0.2)
    seen = json.loads(out.read_text())
    env = {k: v for k, v in seen["env"].items() if not k.startswith(WMLA_ONLY)}
    return seen["argv"][:-1], env  # the interpreter (and its options), without probe.py


def unmount_under(folder: Path) -> None:
    """The users' storage images the service mounted (storage quotas) and left: unmounted."""
    inside = str(folder.resolve()) + "/"
    points = [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith(inside)
    ]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


# -- the run ----------------------------------------------------------------------------------
def run(args: argparse.Namespace, tmp: Path) -> dict:
    os.chmod(tmp, 0o711)
    bs.RESOURCES.clear()
    bs.RESOURCES.update(bs.REAL_JOB)
    report: dict = {"jobs": args.jobs, "clients": args.clients, "rounds": args.rounds}
    report.update(cores=os.cpu_count(), load_before=os.getloadavg(), commands={})
    names = [f"vs{i:02d}" for i in range(args.clients)]
    with SlurmCluster(tmp / "slurm") as slurm:
        interpreter, env = None, None
        for command in args.commands:
            template = f"ws{uuid.uuid4().hex[:4]}-{{username}}"
            sub = tmp / command
            sub.mkdir()
            os.chmod(sub, 0o711)
            traits = bs.service_traits(sub, 0.0, template)
            if args.cpu_oversubscription:
                traits["cpu_oversubscription"] = args.cpu_oversubscription
            if command == "true":
                traits["python"] = "/bin/true"
            hub = Hub(sub, traits, bs.UNLIMITED)
            hub.env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
            )
            try:
                print(f"[{command}] starting the hub and the wmla service ...", file=sys.stderr)
                hub.start(timeout=120)
                pids = {"service": hub.service_pid(), "hub": hub.proc.pid,
                        "proxy": bs.proxy_pid(hub)}  # fmt: skip
                users = Users(hub, names, template)
                if command == "python" and interpreter is None:
                    interpreter, env = probe(hub, users)
                    report["interpreter"] = interpreter
                    report["pythonpath"] = env.get("PYTHONPATH", "")
                prefix = interpreter if command == "python" else ["/bin/true"]
                if env is None:  # /bin/true alone: no Python's environment to match
                    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
                argv = [*prefix, str(users.folders[0] / "main.py")]
                job_cpu = job_cpu_alone(
                    argv, {**env, "HOME": users.accounts[0].home}, users.accounts[0],
                    users.folders[0],
                )  # fmt: skip
                sides = [SlurmSide(slurm, users, prefix, env), WmlaSide(hub, users, pids)]
                result = {"job_cpu_ms": round(1000 * job_cpu, 2), "argv": argv, "runs": []}
                for r in range(args.rounds):
                    modes = [("one by one", 1, args.jobs, 0.0)]
                    modes.append((f"{args.clients} clients", args.clients, args.jobs, 0.0))
                    if args.paced and command == "python":  # the start unhurried: no backlog
                        n = min(args.jobs, int(30 * args.paced))
                        modes.append((f"paced {args.paced:g}/s", 1, n, args.paced))
                    for mode, clients, n, pace in modes:
                        order = sides if r % 2 == 0 else sides[::-1]
                        for side in order:
                            print(
                                f"[{command}] round {r + 1} {mode}: {side.name} ...",
                                file=sys.stderr,
                            )
                            got = phase(side, n, clients, job_cpu, command == "python", pace)
                            got.update(system=side.name, mode=mode, round=r + 1)
                            print(f"    {json.dumps(got)}", file=sys.stderr)
                            result["runs"].append(got)
                report["commands"][command] = result
            finally:
                hub.stop()
                bs.remove_accounts(names, template)
                unmount_under(sub)
    report["load_after"] = os.getloadavg()
    return report


# -- output -----------------------------------------------------------------------------------
FIGURES = (
    ("submissions_per_second", "submits/s"),
    ("finished_per_second", "finished/s"),
    ("start_p50_ms", "start p50 ms"),
    ("start_p99_ms", "start p99 ms"),
    ("start_in_run_p50_ms", "in run p50 ms"),
    ("system_cpu_ms_per_job", "sys CPU ms/job"),
)


def summary(report: dict) -> dict:
    """Per command and mode: each system's median over the rounds, and wmla/Slurm."""
    out: dict = {}
    for command, result in report["commands"].items():
        for mode in dict.fromkeys(r["mode"] for r in result["runs"]):
            row: dict = {"job_cpu_ms": result["job_cpu_ms"]}
            for system in ("Slurm", "wmla"):
                runs = [r for r in result["runs"] if r["mode"] == mode and r["system"] == system]
                row[system] = {
                    key: round(statistics.median(r[key] for r in runs), 1)
                    for key, _ in FIGURES
                    if runs and key in runs[0]
                }
            row["ratio"] = {
                key: round(row["wmla"][key] / row["Slurm"][key], 2)
                for key in row["wmla"]
                if row["Slurm"].get(key)
            }
            out[f"{command}, {mode}"] = row
    return out


def goals(table: dict) -> dict:
    return {
        "finished_per_second_at_least_slurm": {
            k: v["ratio"].get("finished_per_second", 0) >= 1.0
            for k, v in table.items()
            if "paced" not in k  # paced: the pace, not the system, sets it
        },
        "start_p50_at_most_slurm": {
            k: v["ratio"]["start_p50_ms"] <= 1.0
            for k, v in table.items()
            if "start_p50_ms" in v["ratio"]
        },
        "start_in_run_p50_at_most_slurm": {
            k: v["ratio"]["start_in_run_p50_ms"] <= 1.0
            for k, v in table.items()
            if "start_in_run_p50_ms" in v["ratio"]
        },
    }


def print_report(report: dict) -> None:
    table = report["summary"]
    print(
        f"wmla beside Slurm: {report['jobs']} jobs a run, {report['rounds']} round(s) alternated,"
        f" {report['cores']} cores, load average before {report['load_before'][0]:.2f},"
        f" after {report['load_after'][0]:.2f}"
    )
    if "interpreter" in report:
        print(f"python job: {' '.join(report['interpreter'])} main.py,"
              f" PYTHONPATH={report['pythonpath']}")  # fmt: skip
    head = f"{'':<26}{'':>6}" + "".join(f"{title:>16}" for _, title in FIGURES)
    print(head)
    for name, row in table.items():
        for who in ("Slurm", "wmla", "ratio"):
            cells = "".join(f"{row[who].get(key, '-'):>16}" for key, _ in FIGURES)
            print(f"{name if who == 'Slurm' else '':<26}{who:>6}{cells}")
        print(f"{'':<32}(the job's own CPU, apart: {row['job_cpu_ms']} ms)")
    g = goals(table)
    for goal, held in g.items():
        print(
            f"goal {goal}: " + ", ".join(f"{k} {'holds' if v else 'NOT'}" for k, v in held.items())
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs of each run")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commands", default="python,true")
    parser.add_argument(
        "--paced",
        type=float,
        default=2.0,
        help="also the python job one client at this many submissions a second (30 s of"
        " them): the start latency without a backlog; 0: not",
    )
    parser.add_argument(
        "--cpu-oversubscription",
        type=float,
        default=0.0,
        help="wmla's c.WmlaService.cpu_oversubscription (default: bench_service's, 16: as many"
        " jobs at once as Slurm's node of 128 CPUs)",
    )
    parser.add_argument("--json-out", default="")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (logs)")
    args = parser.parse_args()
    args.commands = [c for c in args.commands.split(",") if c]
    if os.geteuid() != 0 or not shutil.which("useradd"):
        # as `make bench` runs it: said, not failed
        print("bench_vs_slurm.py needs root and useradd (it runs wmla as root); nothing measured")
        return 0
    if missing():
        print(f"Slurm is missing ({', '.join(missing())}): `{INSTALL}`; nothing measured")
        return 0
    if not PROXY.exists():
        print("configurable-http-proxy is missing: run `make install`", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="wmla-bench-vs-slurm-"))
    try:
        report = run(args, tmp)
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    report["summary"] = summary(report)
    report["goals"] = goals(report["summary"])
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))
    print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
