"""A real node beside the KWOK ones (``WMLA_K8S_REAL_NODE=1``): a kubelet v1.34.1 built from its
Go module over Debian's containerd, both started by PID with their state under ``<var>/node``.

- containerd: its own --root/--state/--address, runc with cgroupfs (``SystemdCgroup = false``)
  and its own runc root, CNI bridge + host-local from Debian's plugins (no DNS, no masquerade),
  the sandbox image built from Kubernetes' pause.c and imported, never pulled.
- kubelet: ``cgroupDriver: cgroupfs``, ``failCgroupV1: false`` (these machines are cgroup v1),
  a cgroup root of its own (``/wmla-<id>``), serving on its bridge's gateway address with a
  certificate of the cluster's CA (``kubectl logs`` works), image GC off so the imported
  images stay, tainted ``wmla.jupyter.org/real-node=true:NoSchedule``: only pods that ask for
  it come here.
- The node advertises ``nvidia.com/gpu: 4`` (its status patched, as a device plugin would).

``down()`` stops the kubelet, kills every container of this containerd, stops containerd and
the shims, unmounts what they mounted under ``<var>/node`` and the pods' network namespaces,
deletes the bridge and its veths and removes the cgroups: nothing is left on the machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import components as c
from . import images, pki
from .build import BuildError, module_dir
from .notebook_image import NOTEBOOK, notebook_image

if TYPE_CHECKING:
    from .cluster import LocalCluster

NODE_NAME = "wmla-real-node"
NODE_LABEL = "wmla.jupyter.org/real-node"
TAINT = {"key": NODE_LABEL, "value": "true", "effect": "NoSchedule"}
GPUS = 4
REPO = Path(__file__).resolve().parent.parent  # devcluster's parent: nodedns runs from here
CNI_BIN = Path("/usr/lib/cni")
SHIM = "containerd-shim-runc-v2"
CGROUP_BASE = Path("/sys/fs/cgroup")
NETNS_DIR = Path("/var/run/netns")
CNI_CACHE = Path("/var/lib/cni")
ENV_FLAG = "WMLA_K8S_REAL_NODE"


def wanted() -> bool:
    """Whether ``make k8s-up`` starts the real node too."""
    return os.environ.get(ENV_FLAG, "").strip().lower() in ("1", "true", "yes")


class RealNodeError(RuntimeError):
    """The real node did not come up; one line naming the component, the reason and its log."""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RealNode:
    """The real node of the cluster in ``cluster.var``."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.dir = cluster.var / "node"
        self.processes = cluster.processes
        ident = hashlib.sha256(str(cluster.var).encode()).hexdigest()
        self.id = ident[:8]
        self.cgroup_root = f"/wmla-{self.id}"
        self.bridge = f"wmla{self.id[:8]}"  # at most 15 characters (IFNAMSIZ)
        self.network = f"wmla-{self.id}"  # libcni's cache (/var/lib/cni) is keyed by it
        self.socket = self.dir / "containerd" / "containerd.sock"
        self.state_file = self.dir / "state.json"
        self._containers: set[str] = set()  # the containers down() removed

    # -- paths -------------------------------------------------------------------------------
    @property
    def kubelet_log(self) -> Path:
        return self.processes.log("kubelet")

    @property
    def containerd_log(self) -> Path:
        return self.processes.log("containerd")

    def _fail(self, component: str, reason: str, log: Path | None = None) -> RealNodeError:
        where = f"; see {log}" if log else ""
        tail = ""
        if log and log.exists():
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            errors = [ln for ln in lines if " E" in ln[:30] or "level=error" in ln or "rror" in ln]
            if errors or lines:
                tail = f" (last: {(errors or lines)[-1].strip()[:300]})"
        return RealNodeError(f"devcluster: real node: {component}: {reason}{where}{tail}")

    # -- up ----------------------------------------------------------------------------------
    def is_up(self) -> bool:
        return (
            self.processes.running("containerd") is not None
            and self.processes.running("kubelet") is not None
            and self._node_ready()
        )

    def up(self, timeout: float = 120.0) -> None:
        """Start containerd and the kubelet (nothing if both run and the node is Ready);
        ``RealNodeError`` names the component that failed, why, and its log."""
        if self.is_up():
            return
        self.down()
        started = time.monotonic()
        deadline = started + timeout
        self._check_host()
        try:
            kubelet = self.cluster.builder.build([c.KUBELET])["kubelet"]
        except BuildError as err:
            raise self._fail("kubelet build", str(err)) from None
        cache = self.cluster.builder.cache / "images"
        try:
            kube_dir = module_dir("k8s.io/kubernetes")
            image_tars = [images.pause_image(cache, kube_dir), images.python_image(cache)]
        except (images.ImageError, BuildError, OSError) as err:
            raise self._fail("images", str(err)) from None
        try:  # the training worker too, when this environment has what it holds (torch)
            image_tars.append(images.worker_image(cache, REPO))
        except (images.ImageError, OSError) as err:
            print(f"devcluster: real node without the worker image: {err}", file=self.cluster.log)
        for sub in ("containerd", "kubelet", "pod-logs", "cni/net.d", "cni/ipam", "runc"):
            (self.dir / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        ports = {"kubelet": _free_port(), "healthz": _free_port()}
        subnet = self._free_subnet()
        self.state_file.write_text(json.dumps({"ports": ports, "subnet": subnet}))
        self._make_cgroups()
        self._write_cni(subnet)
        node_ip = self._make_bridge(subnet)
        self._serving_cert(node_ip)
        self._start_dns(node_ip, deadline)
        seeded = self._plant_seed(image_tars)
        deadline = time.monotonic() + timeout  # a first seed can take minutes
        self._start_containerd(deadline)
        if not seeded:
            for tar in image_tars:
                self.import_image(tar)
        self._start_kubelet(kubelet, ports, node_ip, deadline)
        self._advertise_gpus(deadline)
        state = {"ports": ports, "subnet": subnet, "node_ip": node_ip, "images": {}}
        if images.WORKER in self._ctr("images", "ls", "-q", timeout=30).stdout.split():
            state["images"]["worker"] = images.WORKER
        self.state_file.write_text(json.dumps(state))
        print(
            f"devcluster: real node {NODE_NAME} up in {time.monotonic() - started:.0f} s "
            f"(kubelet :{ports['kubelet']}, pods {subnet})",
            file=self.cluster.log,
        )

    def _check_host(self) -> None:
        if os.geteuid() != 0:
            raise self._fail("host", "needs root (containerd, runc and the kubelet run as root)")
        for tool, package in (
            ("containerd", "containerd"),
            ("ctr", "containerd"),
            (SHIM, "containerd"),
            ("runc", "runc"),
        ):
            if not shutil.which(tool):
                raise self._fail(
                    tool,
                    f"not installed (apt-get install containerd runc "
                    f"containernetworking-plugins; Debian's {package})",
                )
        for plugin in ("bridge", "host-local", "loopback"):
            if not (CNI_BIN / plugin).exists():
                raise self._fail(
                    "CNI", f"no {CNI_BIN / plugin} (apt-get install containernetworking-plugins)"
                )
        if not (CGROUP_BASE / "memory" / "memory.limit_in_bytes").exists():
            raise self._fail("host", f"no cgroup v1 memory hierarchy at {CGROUP_BASE}/memory")

    def _free_subnet(self) -> str:
        """A /24 of 10.88.0.0/16 no route of this machine uses (other clusters' bridges)."""
        out = subprocess.run(["ip", "-j", "route"], capture_output=True, text=True)
        used = []
        with contextlib.suppress(ValueError):
            for route in json.loads(out.stdout or "[]"):
                with contextlib.suppress(ValueError):
                    used.append(ipaddress.ip_network(route.get("dst", ""), strict=False))
        start = int(self.id, 16) % 250
        for i in range(250):
            net = ipaddress.ip_network(f"10.88.{(start + i) % 250 + 1}.0/24")
            if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
                return str(net)
        raise self._fail("CNI", "no free /24 in 10.88.0.0/16")

    def _cgroup_dirs(self) -> list[Path]:
        return [
            d / self.cgroup_root.lstrip("/")
            for d in sorted(CGROUP_BASE.iterdir())
            if d.is_dir() and not d.is_symlink() and (d / "cgroup.procs").exists()
        ]

    def _make_cgroups(self) -> None:
        for d in self._cgroup_dirs():
            d.mkdir(exist_ok=True)
            if d.parent.name == "cpuset":  # a new cpuset is empty until given its parent's
                for key in ("cpuset.cpus", "cpuset.mems"):
                    (d / key).write_text((d.parent / key).read_text())

    def _write_cni(self, subnet: str) -> None:
        gateway = str(next(ipaddress.ip_network(subnet).hosts()))
        conf = {
            "cniVersion": "0.4.0",
            "name": self.network,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": subnet, "gateway": gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.dir / "cni" / "ipam"),
                    },
                }
            ],
        }
        (self.dir / "cni" / "net.d" / "10-wmla.conflist").write_text(json.dumps(conf, indent=1))

    def _make_bridge(self, subnet: str) -> str:
        """The pods' bridge, made before the first pod with the subnet's gateway address: the
        node's InternalIP (the kubelet refuses a loopback one), where the API server reaches
        the kubelet for logs."""
        net = ipaddress.ip_network(subnet)
        gateway = str(next(net.hosts()))
        for cmd in (
            ["ip", "link", "add", self.bridge, "type", "bridge"],
            ["ip", "addr", "add", f"{gateway}/{net.prefixlen}", "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
        ):
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                raise self._fail("CNI", f"{' '.join(cmd)}: {out.stderr.strip()}")
        return gateway

    def _serving_cert(self, node_ip: str) -> None:
        """The kubelet's serving certificate, signed by the cluster's CA for its address."""
        try:
            pki._signed(
                self.cluster.pki,
                "kubelet",
                f"/CN=system:node:{NODE_NAME}",
                "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                f"extendedKeyUsage=serverAuth\nsubjectAltName=DNS:{NODE_NAME},"
                f"IP:{node_ip},IP:127.0.0.1\n",
            )
        except RuntimeError as err:
            raise self._fail("kubelet certificate", str(err)) from None

    def _start_dns(self, node_ip: str, deadline: float) -> None:
        """The cluster DNS the pods' resolv.conf names (devcluster/nodedns.py)."""
        p = self.cluster.pki
        self.processes.start(
            "node-dns",
            [
                sys.executable, "-m", "devcluster.nodedns", f"--listen={node_ip}",
                f"--server={self.cluster.server()}", f"--ca={p.ca_crt}",
                f"--cert={p.admin_crt}", f"--key={p.admin_key}",
            ],
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(REPO)},
            cwd=REPO,
            binary=sys.executable,
        )  # fmt: skip

        def serving() -> bool:
            return "serving" in self.processes.log("node-dns").read_text()

        self._wait("the DNS", serving, deadline, "node-dns")

    # -- images: a seed of containerd's root, hard-linked into each node ----------------------
    def _seed_config(self, where: Path) -> str:
        return f"""version = 2
root = "{where / "root"}"
state = "{where / "state"}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{where / "c.sock"}"
[ttrpc]
  address = "{where / "t.sock"}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{where / "opt"}"
"""

    def _seed(self, tars: list[Path]) -> Path:
        """A containerd root with these images imported and unpacked, made once per set of
        images in ``.cache/k8s/containerd-seed/``: importing the 4 GB worker image takes
        minutes, hard-linking its files into a node's root a second."""
        digest = hashlib.sha256()
        for tar in tars:
            digest.update(tar.name.encode() + tar.with_suffix(".stamp").read_bytes())
        key = digest.hexdigest()[:16]
        base = self.cluster.builder.cache / "containerd-seed"
        seed = base / key
        if (seed / "done").exists():
            return seed / "root"
        tmp = base / f"tmp-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700, parents=True)
        (tmp / "config.toml").write_text(self._seed_config(tmp))
        print(f"devcluster: importing {len(tars)} images into a containerd seed ...",
              file=self.cluster.log, flush=True)  # fmt: skip
        started = time.monotonic()
        self.processes.start(
            "containerd-seed",
            [shutil.which("containerd") or "containerd", f"--config={tmp / 'config.toml'}"],
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"},
            cwd=tmp,
        )
        ctr = [shutil.which("ctr") or "ctr", f"--address={tmp / 'c.sock'}", "-n", "k8s.io"]
        try:
            deadline = time.monotonic() + 60
            while subprocess.run([*ctr, "version"], capture_output=True).returncode != 0:
                if time.monotonic() > deadline or not self.processes.alive("containerd-seed"):
                    raise self._fail("containerd", "the seed's containerd did not start",
                                     self.processes.log("containerd-seed"))  # fmt: skip
                time.sleep(0.3)
            for tar in tars:
                out = subprocess.run(
                    [*ctr, "images", "import", str(tar)], capture_output=True, text=True,
                    timeout=1200,
                )  # fmt: skip
                if out.returncode != 0:
                    raise self._fail("containerd", f"ctr images import {tar.name}: "
                                     f"{out.stderr.strip()[-300:]}")  # fmt: skip
        finally:
            self.processes.stop("containerd-seed")
        self._unmount_under(tmp)
        shutil.rmtree(tmp / "state", ignore_errors=True)
        (tmp / "done").write_text(f"{time.monotonic() - started:.0f} s\n")
        try:
            os.rename(tmp, seed)
        except OSError:  # another session made it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
        for old in base.iterdir():  # seeds of images that changed since: gigabytes
            if old.name.startswith("tmp-"):  # one being made, unless its maker is gone
                maker = old.name.rsplit("-", 1)[-1]
                if not maker.isdigit() or Path(f"/proc/{maker}").exists():
                    continue
            if old.name != key:
                shutil.rmtree(old, ignore_errors=True)
        print(f"devcluster: containerd seed made in {time.monotonic() - started:.0f} s",
              file=self.cluster.log, flush=True)  # fmt: skip
        return seed / "root"

    def _plant_seed(self, tars: list[Path]) -> bool:
        """The node's containerd root as hard links to the seed's files (its databases
        copied); False (import instead) when that cannot be done."""
        root = self.dir / "containerd" / "root"
        try:
            seed = self._seed(tars)
        except RealNodeError:
            raise
        except (OSError, subprocess.SubprocessError) as err:
            print(f"devcluster: no containerd seed ({err}); importing", file=self.cluster.log)
            return False
        shutil.rmtree(root, ignore_errors=True)
        out = subprocess.run(["cp", "-al", str(seed), str(root)], capture_output=True, text=True)
        if out.returncode != 0:  # another filesystem: no hard links
            shutil.rmtree(root, ignore_errors=True)
            print(f"devcluster: cannot link the seed ({out.stderr.strip()}); importing",
                  file=self.cluster.log)  # fmt: skip
            return False
        for db in root.rglob("*.db"):  # written by this containerd: its own copies
            data = db.read_bytes()
            db.unlink()
            db.write_bytes(data)
        return True

    def import_image(self, tar: Path, timeout: float = 600) -> None:
        """Import a docker-archive into the node's containerd (``RealNodeError`` if not)."""
        out = self._ctr("images", "import", str(tar), timeout=timeout)
        if out.returncode != 0:
            raise self._fail(
                "containerd", f"ctr images import {tar.name}: {out.stderr.strip()[-300:]}"
            )

    def worker_image(self) -> str:
        """The training worker image (devcluster/images.py), built if its inputs changed and
        imported into this node; its tag."""
        try:
            tar = images.worker_image(self.cluster.builder.cache / "images", REPO)
        except (images.ImageError, OSError) as err:
            raise self._fail("worker image", str(err)) from None
        listed = self._ctr("images", "ls", "-q", timeout=30).stdout.split()
        if images.WORKER not in listed:  # in the seed, unless it could not be built then
            self.import_image(tar)
        return images.WORKER

    def notebook_image(self) -> str:
        """The notebook image (devcluster/notebook_image.py), built if its inputs changed and
        imported into this node, once per start (not seeded: it changes with the project's
        files, the seed with the venv; about 15 s, so only for who serves notebooks here);
        recorded in the node's state for the hub's config. Its tag."""
        try:
            tar = notebook_image(self.cluster.builder.cache / "images", REPO)
        except (images.ImageError, OSError) as err:
            raise self._fail("notebook image", str(err)) from None
        state = json.loads(self.state_file.read_text())
        stamp = tar.with_suffix(".stamp").read_text()
        if state["images"].get("notebook_stamp") != stamp:
            self.import_image(tar)
            state["images"].update(notebook=NOTEBOOK, notebook_stamp=stamp)
            self.state_file.write_text(json.dumps(state))
        return NOTEBOOK

    def _containerd_config(self) -> str:
        d = self.dir / "containerd"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{d / "ttrpc.sock"}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"
[{cri}]
  sandbox_image = "{images.PAUSE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true  # this root cannot lower oom_score_adj
  max_container_log_line_size = 16384
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
  discard_unpacked_layers = false
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{shutil.which("runc")}"
  Root = "{self.dir / "runc"}"
[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{self.dir / "cni" / "net.d"}"
  max_conf_num = 1
"""

    def _ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [shutil.which("ctr") or "ctr", f"--address={self.socket}", "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def _start_containerd(self, deadline: float) -> None:
        config = self.dir / "containerd" / "config.toml"
        config.write_text(self._containerd_config())
        binary = shutil.which("containerd") or "containerd"
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
        self.processes.start(
            "containerd",
            [binary, f"--config={config}", "--log-level=warn"],
            env=env,
            cwd=self.dir,
        )
        self._wait(
            "containerd",
            lambda: self._ctr("version", timeout=5).returncode == 0,
            deadline,
            "containerd",
        )

    def _kubelet_config(self, ports: dict[str, int], node_ip: str) -> str:
        p = self.cluster.pki
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": node_ip,
            "port": ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": ports["healthz"],
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "tlsCertFile": str(p.dir / "kubelet.crt"),
            "tlsPrivateKeyFile": str(p.dir / "kubelet.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(p.ca_crt)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "resolvConf": "",  # nothing of this machine's: the pods' only DNS is nodedns
            "clusterDNS": [node_ip],
            "clusterDomain": "cluster.local",
            "registerWithTaints": [TAINT],
            # the images are imported once and never pulled: GC must keep them
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "podLogsDir": str(self.dir / "pod-logs"),
            "makeIPTablesUtilChains": False,
            "serializeImagePulls": False,
            "maxPods": 30,
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "0s",
            "enforceNodeAllocatable": ["pods"],
            "localStorageCapacityIsolation": True,
            "containerLogMaxSize": "10Mi",
            "containerLogMaxFiles": 2,
        }
        return json.dumps(config, indent=1)

    def _start_kubelet(
        self, kubelet: Path, ports: dict[str, int], node_ip: str, deadline: float
    ) -> None:
        config = self.dir / "kubelet" / "config.json"
        config.write_text(self._kubelet_config(ports, node_ip))
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
        self.processes.start(
            "kubelet",
            [
                str(kubelet),
                f"--config={config}",
                f"--kubeconfig={self.cluster.kubeconfig}",
                f"--root-dir={self.dir / 'kubelet'}",
                f"--cert-dir={self.dir / 'kubelet' / 'pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={node_ip}",
                f"--node-labels={NODE_LABEL}=true",
                "--v=1",
            ],
            env=env,
            cwd=self.dir,
        )
        self._wait("the node to be Ready", self._node_ready, deadline, "kubelet")

    def _node_ready(self) -> bool:
        try:
            out = self.cluster.kubectl(
                "get", "node", NODE_NAME, "-o",
                'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
            )  # fmt: skip
        except Exception:
            return False
        return out.strip() == "True"

    def _advertise_gpus(self, deadline: float) -> None:
        patch = [
            {"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(GPUS)},
        ]

        def advertised() -> bool:
            self.cluster.kubectl(
                "patch", "node", NODE_NAME, "--subresource=status", "--type=json",
                "-p", json.dumps(patch),
            )  # fmt: skip
            out = self.cluster.kubectl(
                "get", "node", NODE_NAME, "-o", r"jsonpath={.status.allocatable.nvidia\.com/gpu}"
            )
            return out.strip() == str(GPUS)

        self._wait("nvidia.com/gpu on the node", advertised, deadline, "kubelet")

    def _wait(self, what: str, check, deadline: float, component: str) -> None:
        log = self.processes.log(component)
        while True:
            if not self.processes.alive(component):
                raise self._fail(component, f"exited while waiting for {what}", log)
            with contextlib.suppress(Exception):
                if check():
                    return
            if time.monotonic() > deadline:
                raise self._fail(component, f"{what} not ready in time", log)
            time.sleep(0.3)

    # -- down --------------------------------------------------------------------------------
    def down(self, keep_images: bool = True) -> None:
        """Stop everything of the node and leave nothing of it on the machine; the imported
        images (containerd's root) stay unless ``keep_images`` is false."""
        if not self.dir.is_dir():
            return  # never started here
        self.processes.stop("kubelet")
        netns: set[int] = set()
        if self.processes.running("containerd") is not None:
            netns = self._kill_containers()
        self._forget_cni_results()
        self.processes.stop("containerd")
        self.processes.stop("node-dns")
        for pid in self._shims():
            netns |= _netns_of_children(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._kill_cgroup_processes()
        self._remove_netns(netns)
        self._delete_links()
        self._unmount_under(self.dir)
        self._remove_cgroups()
        shutil.rmtree(self.dir / "cni" / "ipam", ignore_errors=True)  # the pods' addresses
        shutil.rmtree(self.dir / "containerd" / "state", ignore_errors=True)
        if not keep_images:  # gigabytes (the worker image): a temporary cluster's go
            shutil.rmtree(self.dir / "containerd" / "root", ignore_errors=True)

    def _kill_containers(self) -> set[int]:
        """Kill and delete every task and container of this containerd; the network
        namespaces their processes were in."""
        netns: set[int] = set()
        out = self._ctr("tasks", "ls", timeout=20)
        tasks = []
        for line in out.stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 2:
                tasks.append(fields[0])
                with contextlib.suppress(ValueError, OSError):
                    netns.add(os.stat(f"/proc/{int(fields[1])}/ns/net").st_ino)
        for task in tasks:
            self._ctr("tasks", "kill", "-a", "-s", "SIGKILL", task, timeout=20)
        for task in tasks:
            self._ctr("tasks", "delete", "-f", task, timeout=20)
        listed = self._ctr("containers", "ls", "-q", timeout=20).stdout.split()
        self._containers = set(listed)
        for container in listed:
            self._ctr("containers", "delete", container, timeout=20)
        return netns

    def _forget_cni_results(self) -> None:
        """libcni's cached results of our pods' networks (no CNI DEL ran for them)."""
        cache = CNI_CACHE / "results"
        with contextlib.suppress(OSError):
            for entry in cache.iterdir():
                sandbox = entry.name.rsplit("-", 2)[-2] if entry.name.count("-") >= 2 else ""
                if entry.name.startswith(f"{self.network}-") or sandbox in self._containers:
                    entry.unlink()

    def _shims(self) -> list[int]:
        """The shims this containerd started (they name its address), by PID."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if not os.readlink(entry / "exe").endswith(SHIM):
                    continue
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(self.socket).encode() in argv:
                found.append(int(entry.name))
        return found

    def _kill_cgroup_processes(self) -> None:
        """Whatever still runs in the node's cgroups (a container whose shim was killed)."""
        root = CGROUP_BASE / "pids" / self.cgroup_root.lstrip("/")
        if not root.is_dir():
            root = CGROUP_BASE / "memory" / self.cgroup_root.lstrip("/")
        for _ in range(3):
            pids = set()
            for procs in root.rglob("cgroup.procs") if root.is_dir() else []:
                with contextlib.suppress(OSError):
                    pids |= {int(p) for p in procs.read_text().split()}
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.3)

    def _remove_netns(self, inodes: set[int]) -> None:
        """The pods' network namespaces containerd pinned under /var/run/netns (ours: the
        namespaces our containers ran in)."""
        if not inodes or not NETNS_DIR.is_dir():
            return
        for entry in NETNS_DIR.iterdir():
            with contextlib.suppress(OSError):
                if os.stat(entry).st_ino in inodes:
                    subprocess.run(["umount", "-l", str(entry)], capture_output=True)
                    entry.unlink()

    def _delete_links(self) -> None:
        """The bridge's veths, then the bridge."""
        out = subprocess.run(
            ["ip", "-j", "link", "show", "master", self.bridge], capture_output=True, text=True
        )
        with contextlib.suppress(ValueError):
            for link in json.loads(out.stdout or "[]"):
                subprocess.run(["ip", "link", "del", link["ifname"]], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    @staticmethod
    def _unmount_under(top: Path) -> None:
        """Every mount under ``top`` (overlay rootfs, shm, secrets, bind mounts), deepest
        first."""
        prefix = str(top.resolve()) + "/"
        for _ in range(3):
            points = []
            with open("/proc/self/mountinfo", encoding="utf-8") as f:
                for line in f:
                    point = line.split()[4].replace("\\040", " ")
                    if point.startswith(prefix):
                        points.append(point)
            if not points:
                return
            for point in sorted(set(points), key=len, reverse=True):
                subprocess.run(["umount", "-l", point], capture_output=True)

    def _remove_cgroups(self) -> None:
        for top in self._cgroup_dirs():
            if not top.is_dir():
                continue
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for d in [*dirs, top]:
                with contextlib.suppress(OSError):
                    d.rmdir()


def _netns_of_children(shim: int) -> set[int]:
    """The network namespaces of a shim's children (the containers it runs)."""
    found = set()
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{shim}/task").iterdir():
            for child in (task / "children").read_text().split():
                with contextlib.suppress(OSError):
                    found.add(os.stat(f"/proc/{child}/ns/net").st_ino)
    return found
