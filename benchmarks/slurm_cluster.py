"""A throwaway Slurm on loopback for bench_vs_slurm.py: munged, slurmctld and one slurmd from
Debian's packages (``apt-get install -y slurm-wlm munge``), every file in one temporary folder,
every daemon held by its PID (nothing of the machine's own Slurm or munge is used or touched).

- munged with its own key, socket, PID, log and seed files in the folder;
- slurmctld and slurmd on free loopback ports, no accounting database (``accounting_storage/none``,
  ``jobcomp/none``), ``proctrack/linuxproc`` and ``task/none`` (no cgroups), ``select/cons_tres``
  by CPU, one node ``bench`` (``NodeAddr=127.0.0.1``) with 4 x 8 fake GPUs as gres (``gpu:32``,
  ``AutoDetect=off``, files ``/dev/null``-like: 32 empty files of the folder);
- slurmd runs under a subreaper (``python slurm_cluster.py --reap slurmd -D ...``): slurmd's
  slurmstepds double-fork away from it, so the reaper collects them, and its /proc stat's
  cutime/cstime plus slurmd's own give the CPU of the node's side, jobs included.

    with SlurmCluster(Path(tmp)) as slurm:
        slurm.env  # SLURM_CONF for sbatch/squeue
        slurm.cpu_seconds()  # {"slurmctld": ..., "slurmd+steps+jobs": ..., "munged": ...}
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36
GPUS = 32  # 4 x 8


def missing() -> list[str]:
    return [b for b in ("slurmctld", "slurmd", "sbatch", "squeue", "munged") if not which(b)]


def which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stat_cpu(pid: int, children: bool = False) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return sum(int(f) for f in fields[11 : 15 if children else 13]) / CLK_TCK


SLURM_CONF = """\
ClusterName=wmlabench
SlurmctldHost={host}(127.0.0.1)
MailProg=/bin/true
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={dir}/ctld
SlurmdSpoolDir={dir}/slurmd
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MaxJobCount=100000
MinJobAge=600
GresTypes=gpu
NodeName=bench NodeAddr=127.0.0.1 CPUs=128 RealMemory=64000 Gres=gpu:{gpus} State=UNKNOWN
PartitionName=bench Nodes=bench Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


class SlurmCluster:
    def __init__(self, folder: Path) -> None:
        self.dir = folder
        self.procs: dict[str, subprocess.Popen] = {}
        self.munge_socket = folder / "munge" / "munge.socket"
        self.conf = folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- life --------------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> None:
        d = self.dir
        for sub in ("munge", "ctld", "slurmd", "gpus"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)
        os.chmod(d / "munge", 0o755)  # the accounts reach the socket
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        m = d / "munge"
        self._spawn(
            "munged",
            [which("munged"), "-F", "--force", f"--socket={self.munge_socket}",
             f"--key-file={key}", f"--pid-file={m / 'munged.pid'}",
             f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"],
        )  # fmt: skip
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged's socket")
        gres = []
        for i in range(GPUS):
            (d / "gpus" / f"gpu{i}").touch()
            gres.append(f"NodeName=bench Name=gpu File={d / 'gpus' / f'gpu{i}'}")
        (d / "gres.conf").write_text("AutoDetect=off\n" + "\n".join(gres) + "\n")
        self.conf.write_text(
            SLURM_CONF.format(
                host=socket.gethostname().split(".")[0],
                ctld_port=free_port(),
                slurmd_port=free_port(),
                munge_socket=self.munge_socket,
                dir=d,
                gpus=GPUS,
            )
        )
        os.chmod(self.conf, 0o644)
        self._spawn("slurmctld", [which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._spawn(
            "slurmd",
            [sys.executable, os.path.abspath(__file__), "--reap",
             which("slurmd"), "-D", "-N", "bench", "-f", str(self.conf)],
        )  # fmt: skip
        self._wait(self._node_idle, timeout, "the node idle")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

    def _wait(self, ok, timeout: float, what: str) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} ended ({p.returncode}): {self.tail(name)}")
            if ok():
                return
            time.sleep(0.2)
        raise RuntimeError(f"waited {timeout} s for {what}: {self.tail('slurmctld')}")

    def tail(self, name: str) -> str:
        text = ""
        for f in (f"{name}.out", f"{name}.log"):
            try:
                text += (self.dir / f).read_text()[-1500:]
            except OSError:
                pass
        return text

    def _node_idle(self) -> bool:
        r = subprocess.run(
            [which("sinfo"), "-h", "-N", "-o", "%T"], env=self.env, capture_output=True, text=True
        )
        return r.returncode == 0 and r.stdout.strip() == "idle"

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- figures -----------------------------------------------------------------------------
    def slurmd_pid(self) -> int | None:
        reaper = self.procs["slurmd"].pid
        try:
            for line in Path(f"/proc/{reaper}/task/{reaper}/children").read_text().split():
                return int(line)
        except OSError:
            return None
        return None

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds so far: slurmctld (and what it reaped), the node's side (the reaper,
        every slurmstepd and job it reaped, slurmd itself and its reaped children), munged."""
        slurmd = self.slurmd_pid()
        node = stat_cpu(self.procs["slurmd"].pid, True) + (
            stat_cpu(slurmd, True) if slurmd else 0.0
        )
        return {
            "slurmctld": stat_cpu(self.procs["slurmctld"].pid, True),
            "slurmd+steps+jobs": node,
            "munged": stat_cpu(self.procs["munged"].pid, True),
        }


def reap(argv: list[str]) -> int:
    """Run ``argv`` as a child, adopting every orphan below it (a subreaper), reaping all until
    ``argv``'s process ends; SIGTERM/SIGINT go on to it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    child = subprocess.Popen(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    status = 0
    while True:
        try:
            pid, st = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child.pid:
            status = os.waitstatus_to_exitcode(st)
            child.returncode = status
    return status


if __name__ == "__main__":
    if sys.argv[1:2] == ["--reap"]:
        sys.exit(reap(sys.argv[2:]))
    print(__doc__)
