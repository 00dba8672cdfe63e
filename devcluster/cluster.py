"""A Kubernetes cluster on loopback, every process started and stopped by PID: etcd, the API
server, controller manager and scheduler, KWOK's GPU nodes, Volcano's scheduler and controllers,
and the Kubeflow training operator with Volcano as its gang scheduler.

``up()`` builds what is missing, is idempotent, and raises ``ClusterError`` with one line that
names the component that failed and its log; ``down()`` leaves no process behind.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from . import components as c
from . import objects, pki, realnode
from .build import Builder, BuildError, module_dir
from .processes import Processes

SERVICE_NAMESPACE = "wmla"
SERVICE_ACCOUNT = "hub"
# where the training operator's cert controller reads its webhook certificate, under /tmp
OPERATOR_CERT_DIR = Path("k8s-webhook-server/serving-certs")
# Stopped in this order (the reverse of the start), etcd last.
ORDER = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "vc-controller-manager",
    "vc-scheduler",
    "kwok",
    "training-operator",
)


class ClusterError(RuntimeError):
    """The cluster did not come up; one line naming the component and its log."""


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    vc_scheduler_metrics: int
    vc_scheduler_healthz: int
    vc_controller_metrics: int
    vc_controller_healthz: int
    operator_metrics: int
    operator_probe: int
    operator_webhook: int
    kwok: int


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class LocalCluster:
    """The cluster whose state lives in ``var_dir`` (``var/k8s`` for ``make k8s-up``)."""

    def __init__(
        self,
        var_dir: Path,
        layout: str = "1x4",
        builder: Builder | None = None,
        log: TextIO = sys.stderr,
        start_timeout: float = 90.0,
        user_data: str | Path | None = None,
    ) -> None:
        self.var = Path(var_dir).resolve()
        # the storage claims' host folders: beside var (0700, it holds the keys), as the wmla
        # service running as root reaches users' folders as their uids (docs/security.md)
        self.user_data = Path(user_data or self.var.with_name(f"{self.var.name}-user-data"))
        self.user_data = self.user_data.resolve()
        self.layout = objects.Layout.parse(layout)
        self.builder = builder or Builder(log=log)
        self.log = log
        self.start_timeout = start_timeout
        self.processes = Processes(self.var / "run", self.var / "logs")
        self.pki = pki.Pki(self.var / "pki")
        self.kubeconfig = self.var / "kubeconfig"
        self.service_kubeconfig = self.var / "wmla-service.kubeconfig"
        self.spawner_kubeconfig = self.var / "hub-spawner.kubeconfig"
        self._binaries: dict[str, Path] = {}

    # -- paths and state -------------------------------------------------------------------------
    @property
    def _state_file(self) -> Path:
        return self.var / "state.json"

    def ports(self) -> Ports | None:
        with contextlib.suppress(OSError, ValueError, TypeError):
            return Ports(**json.loads(self._state_file.read_text())["ports"])
        return None

    def binary(self, name: str) -> Path:
        if not self._binaries:
            self._binaries = {p.binary: self.builder.path(p) for p in c.ALL}
        return self._binaries[name]

    def _running_ports(self) -> Ports:
        """The ports of the cluster in ``var``; ``ClusterError`` when there is none."""
        ports = self.ports()
        if ports is None:
            raise ClusterError(f"devcluster: no cluster in {self.var} (run `make k8s-up`)")
        return ports

    def server(self) -> str:
        ports = self._running_ports()
        return f"https://127.0.0.1:{ports.apiserver}"

    # -- up ----------------------------------------------------------------------------------------
    def up(self) -> None:
        """Build what is missing, then start what is not running; nothing if all is up."""
        try:
            self._binaries = self.builder.build(c.CLUSTER)
        except BuildError as err:
            raise ClusterError(str(err)) from None
        if self.is_up():
            for path, write in (
                (self.service_kubeconfig, self.write_service_kubeconfig),
                (self.spawner_kubeconfig, self.write_spawner_kubeconfig),
            ):
                if not path.exists():
                    write(SERVICE_NAMESPACE, path)
            print(f"devcluster: already up ({self.server()})", file=self.log)
            if realnode.wanted():
                self._up_real_node()
            return
        self.down(keep_data=True)  # what is left of a half-started one
        self.var.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.var, 0o700)
        pki.ensure(self.pki.dir)
        ports = self._choose_ports()
        self.user_data.mkdir(mode=0o711, parents=True, exist_ok=True)
        self._state_file.write_text(
            json.dumps(
                {
                    "ports": asdict(ports),
                    "layout": asdict(self.layout),
                    "user_data": str(self.user_data),
                }
            )
        )
        deadline = time.monotonic() + self.start_timeout
        started = time.monotonic()
        try:
            self._start_etcd(ports, deadline)
            self._start_apiserver(ports, deadline)
            self._write_kubeconfig(self.kubeconfig, self._admin_user(), SERVICE_NAMESPACE)
            self._start_controllers()
            self._apply_crds(deadline)
            self.apply(objects.service_rbac(SERVICE_NAMESPACE, SERVICE_ACCOUNT))
            self._start_volcano(ports, deadline)
            self._start_kwok(ports)
            self.apply(objects.nodes(self.layout))
            self._start_operator(ports, deadline)
            self._wait_nodes_ready(deadline)
            self.write_service_kubeconfig(SERVICE_NAMESPACE, self.service_kubeconfig)
            self.write_spawner_kubeconfig(SERVICE_NAMESPACE, self.spawner_kubeconfig)
            if realnode.wanted():
                self._up_real_node()
        except ClusterError:
            self.down(keep_data=True)
            raise
        print(
            f"devcluster: up in {time.monotonic() - started:.0f} s at {self.server()}, "
            f"{self.layout.nodes} KWOK node(s) x {self.layout.gpus} GPU; "
            f"KUBECONFIG={self.kubeconfig}",
            file=self.log,
        )

    def real_node(self) -> realnode.RealNode:
        """The kubelet + containerd node of this cluster (devcluster/realnode.py)."""
        return realnode.RealNode(self)

    def _up_real_node(self) -> None:
        node = self.real_node()
        try:
            node.up()
        except realnode.RealNodeError as err:
            raise ClusterError(str(err)) from None
        try:  # what WMLA_BACKEND=kubernetes make run serves notebooks with
            node.notebook_image()
        except realnode.RealNodeError as err:
            print(f"devcluster: real node without the notebook image: {err}", file=self.log)

    def is_up(self) -> bool:
        if any(self.processes.running(name) is None for name in ORDER):
            return False
        return self.ports() is not None and self._ready("/readyz")

    def _choose_ports(self) -> Ports:
        """The ports of the last run when they are all free (the kubeconfig keeps working),
        else fresh ones."""
        kept = self.ports()
        if kept is not None and all(_port_free(p) for p in asdict(kept).values()):
            return kept
        return Ports(*_free_ports(len(Ports.__dataclass_fields__)))

    def _wait(
        self, what: str, check: Callable[[], bool], deadline: float, log: str | None = None
    ) -> None:
        while True:
            if log and not self.processes.alive(log):
                raise ClusterError(
                    f"devcluster: {log} exited while waiting for {what}; "
                    f"see {self.processes.log(log)}"
                )
            with contextlib.suppress(Exception):
                if check():
                    return
            if time.monotonic() > deadline:
                where = f"; see {self.processes.log(log)}" if log else ""
                raise ClusterError(
                    f"devcluster: {what} not ready within {self.start_timeout:.0f} s{where}"
                )
            time.sleep(0.2)

    def _start(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        binary: str | None = None,
    ) -> None:
        self.processes.start(name, argv, env=env or _base_env(), cwd=self.var, binary=binary)

    def _start_etcd(self, ports: Ports, deadline: float) -> None:
        client = f"http://127.0.0.1:{ports.etcd_client}"
        peer = f"http://127.0.0.1:{ports.etcd_peer}"
        data = self.var / "etcd"
        data.mkdir(mode=0o700, exist_ok=True)
        self._start(
            "etcd",
            [
                str(self.binary("etcd")),
                "--name=default",
                f"--data-dir={data}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync=true",  # a throw-away development store; faster on a busy disk
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client}/health", timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"

        self._wait("etcd", healthy, deadline, "etcd")

    def _start_apiserver(self, ports: Ports, deadline: float) -> None:
        p = self.pki
        audit = self.var / "audit-policy.yaml"
        audit.write_text(
            # Metadata of the requests of service accounts only: what the benchmark counts
            # (API calls per job); the control plane's own chatter is left out.
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n"
            "rules:\n- level: Metadata\n  userGroups: ['system:serviceaccounts']\n"
            "- level: None\n"
        )
        self._start(
            "kube-apiserver",
            [
                str(self.binary("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={ports.apiserver}",
                f"--tls-cert-file={p.server_crt}",
                f"--tls-private-key-file={p.server_key}",
                f"--client-ca-file={p.ca_crt}",
                # pod logs come from KWOK's server, which stands in for each node's kubelet
                f"--kubelet-certificate-authority={p.ca_crt}",
                f"--kubelet-client-certificate={p.admin_crt}",
                f"--kubelet-client-key={p.admin_key}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--service-account-key-file={p.sa_pub}",
                f"--service-account-signing-key-file={p.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-cluster-ip-range={pki.SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                f"--audit-policy-file={audit}",
                f"--audit-log-path={self.var / 'logs' / 'audit.log'}",
                "--audit-log-maxsize=200",
                "--audit-log-maxbackup=1",
            ],
        )
        self._wait("kube-apiserver", lambda: self._ready("/readyz"), deadline, "kube-apiserver")

    def stop_apiserver(self) -> None:
        """Stop the API server alone (the rest keeps running), as an outage would."""
        self.processes.stop("kube-apiserver")

    def start_apiserver(self) -> None:
        """Start the API server again on its ports, over the same store."""
        ports = self._running_ports()
        self._start_apiserver(ports, time.monotonic() + self.start_timeout)

    def restart_controllers(self) -> None:
        """Restart Volcano and the training operator. After an API server restart their
        informers here take minutes to see new objects (Volcano 1.14, the operator 1.9: both
        back off on the 429s of a server whose caches are warming up); a test that means to
        watch our backend through an outage restarts them rather than wait."""
        ports = self._running_ports()
        for name in ("training-operator", "vc-scheduler", "vc-controller-manager"):
            self.processes.stop(name)
        deadline = time.monotonic() + self.start_timeout
        self._start_volcano(ports, deadline)
        self._start_operator(ports, deadline)

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_crt))
        ctx.load_cert_chain(str(self.pki.admin_crt), str(self.pki.admin_key))
        return ctx

    def _ready(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(
                self.server() + path, timeout=3, context=self._ssl_context()
            ) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError, ClusterError, ssl.SSLError):
            return False

    def _admin_user(self) -> dict[str, str]:
        return {
            "client-certificate-data": _b64(self.pki.admin_crt),
            "client-key-data": _b64(self.pki.admin_key),
        }

    def _write_kubeconfig(self, path: Path, user: dict[str, str], namespace: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "wmla-dev",
                    "cluster": {
                        "server": self.server(),
                        "certificate-authority-data": _b64(self.pki.ca_crt),
                    },
                }
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [
                {
                    "name": "wmla-dev",
                    "context": {"cluster": "wmla-dev", "user": "user", "namespace": namespace},
                }
            ],
            "current-context": "wmla-dev",
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(config, f)

    def _start_controllers(self) -> None:
        kc = str(self.kubeconfig)
        self._start(
            "kube-controller-manager",
            [
                str(self.binary("kube-controller-manager")),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca_crt}",
                "--leader-elect=false",
                "--secure-port=0",
                "--controllers=*,-nodeipam,-route,-service,-cloud-node-lifecycle",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
        )
        self._start(
            "kube-scheduler",
            [
                str(self.binary("kube-scheduler")),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--secure-port=0",
            ],
        )

    def _apply_crds(self, deadline: float) -> None:
        """Volcano's and the training operator's CRDs, from their modules' own files."""
        try:
            volcano = module_dir("volcano.sh/volcano")
            operator = module_dir("github.com/kubeflow/training-operator")
        except BuildError as err:
            raise ClusterError(str(err)) from None
        # every controller of vc-controller-manager shares one informer factory: without the
        # jobflow CRDs its cache never syncs, and no queue is ever opened
        crd = volcano / "config" / "crd"
        files = sorted((crd / "volcano" / "bases").glob("*.yaml"))
        files += sorted((crd / "jobflow" / "bases").glob("*.yaml"))
        files += [operator / "manifests" / "base" / "crds" / "kubeflow.org_pytorchjobs.yaml"]
        for f in files:
            self.kubectl("apply", "--server-side", "-f", str(f))
        self._wait(
            "the CRDs",
            lambda: (
                self.kubectl(
                    "wait",
                    "--for=condition=Established",
                    "--timeout=5s",
                    "crd/queues.scheduling.volcano.sh",
                    "crd/podgroups.scheduling.volcano.sh",
                    "crd/pytorchjobs.kubeflow.org",
                    "crd/jobs.batch.volcano.sh",
                )  # fmt: skip
                is not None
            ),
            deadline,
            "kube-apiserver",
        )

    def _start_volcano(self, ports: Ports, deadline: float) -> None:
        conf = self.var / "volcano-scheduler.conf"
        conf.write_text(objects.volcano_scheduler_conf())
        kc = str(self.kubeconfig)
        self._start(
            "vc-controller-manager",
            [
                str(self.binary("vc-controller-manager")),
                f"--kubeconfig={kc}",
                "--leader-elect=false",
                f"--listen-address=127.0.0.1:{ports.vc_controller_metrics}",
                "--enable-healthz",
                f"--healthz-address=127.0.0.1:{ports.vc_controller_healthz}",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
        )
        self._start(
            "vc-scheduler",
            [
                str(self.binary("vc-scheduler")),
                f"--kubeconfig={kc}",
                f"--scheduler-conf={conf}",
                "--leader-elect=false",
                f"--listen-address=127.0.0.1:{ports.vc_scheduler_metrics}",
                "--enable-healthz",
                f"--healthz-address=127.0.0.1:{ports.vc_scheduler_healthz}",
                "--schedule-period=200ms",
            ],
        )

        def default_queue_open() -> bool:
            out = self.kubectl("get", "queue", "default", "-o", "jsonpath={.status.state}")
            return out.strip() == "Open"

        self._wait("Volcano's default queue", default_queue_open, deadline, "vc-controller-manager")

    def _start_kwok(self, ports: Ports) -> None:
        try:
            kwok_dir = module_dir("sigs.k8s.io/kwok")
        except BuildError as err:
            raise ClusterError(str(err)) from None
        config = self.var / "kwok.yaml"
        pod_log = self.var / "kwok-pod.log"
        pod_log.write_text(objects.KWOK_POD_LOG)
        config.write_text(objects.kwok_config(kwok_dir, pod_log))
        self._start(
            "kwok",
            [
                str(self.binary("kwok")),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={config}",
                f"--manage-nodes-with-label-selector={objects.NODE_LABEL}",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{ports.kwok}",
                "--node-ip=127.0.0.1",
                f"--node-port={ports.kwok}",
                f"--tls-cert-file={self.pki.server_crt}",
                f"--tls-private-key-file={self.pki.server_key}",
            ],
        )

    def _start_operator(self, ports: Ports, deadline: float) -> None:
        try:
            operator = module_dir("github.com/kubeflow/training-operator")
        except BuildError as err:
            raise ClusterError(str(err)) from None
        rendered = self.kubectl("kustomize", str(operator / "manifests" / "base" / "webhook"))
        self.apply(objects.operator_webhook(rendered))
        # Its cert controller writes the webhook's certificates to a fixed folder under /tmp:
        # a private /tmp of its own, so no other user's /tmp/k8s-webhook-server is ever followed.
        private_tmp = self.var / "operator-tmp"
        private_tmp.mkdir(mode=0o700, exist_ok=True)
        binary = str(self.binary("training-operator"))
        # its workers' init container waits for the master's name: ours runs the python image
        # the real node holds (upstream's pulls alpine; KWOK pods never run it either way)
        (private_tmp / "init-container.yaml").write_text(objects.PYTORCH_INIT_CONTAINER)
        init_dir = Path("/tmp") if os.geteuid() == 0 else private_tmp
        argv = [
            binary,
            "--gang-scheduler-name=volcano",
            "--enable-scheme=pytorchjob",
            f"--pytorch-init-container-image={realnode.images.PYTHON}",
            f"--pytorch-init-container-template-file={init_dir / 'init-container.yaml'}",
            f"--metrics-bind-address=127.0.0.1:{ports.operator_metrics}",
            f"--health-probe-bind-address=127.0.0.1:{ports.operator_probe}",
            f"--webhook-server-port={ports.operator_webhook}",
            "--zap-log-level=info",
        ]
        env = {
            **_base_env(),
            "KUBECONFIG": str(self.kubeconfig),
            "MY_POD_NAMESPACE": objects.OPERATOR_NAMESPACE,
        }
        if os.geteuid() == 0:
            # the bind hides the rest of /tmp, where var may be: it reads its own copy
            copy = private_tmp / "kubeconfig"
            copy.write_bytes(self.kubeconfig.read_bytes())
            copy.chmod(0o600)
            env["KUBECONFIG"] = "/tmp/kubeconfig"
            argv = [
                "unshare", "--mount", "--propagation", "private", "--",
                "sh", "-c", 'mount --bind "$0" /tmp && exec "$@"', str(private_tmp), *argv,
            ]  # fmt: skip
        else:
            env["TMPDIR"] = str(private_tmp)
        self._start("training-operator", argv, env=env, binary=binary)

        cert_base = private_tmp if os.geteuid() == 0 else Path("/tmp")
        shutil.rmtree(private_tmp / OPERATOR_CERT_DIR, ignore_errors=True)  # the last run's

        def ready() -> bool:
            self._mount_operator_certs(cert_base)
            url = f"http://127.0.0.1:{ports.operator_probe}/readyz"
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200

        self._wait("the training operator", ready, deadline, "training-operator")

    def _mount_operator_certs(self, base: Path) -> None:
        """Do what a kubelet does for the operator's pod: put its webhook Secret's certificate
        where its cert controller waits for it (it starts the job controllers only then)."""
        if (base / OPERATOR_CERT_DIR / "tls.crt").exists():
            return
        out = self.kubectl(
            "get", "secret", objects.OPERATOR_SECRET, "-n", objects.OPERATOR_NAMESPACE,
            "-o", "json",
        )  # fmt: skip
        data = json.loads(out).get("data") or {}
        if "tls.crt" not in data or "tls.key" not in data:
            return  # not written yet
        made = base
        for part in OPERATOR_CERT_DIR.parts:
            made = made / part
            made.mkdir(mode=0o700, exist_ok=True)
            info = made.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                raise ClusterError(f"devcluster: {made} is not a folder of ours; remove it")
        cert_dir = base / OPERATOR_CERT_DIR
        for key in ("tls.key", "tls.crt"):  # the controller waits for tls.crt: it comes last
            (cert_dir / key).unlink(missing_ok=True)
        for key in ("tls.key", "tls.crt"):
            fd = os.open(
                cert_dir / key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
            )
            with os.fdopen(fd, "wb") as f:
                f.write(base64.b64decode(data[key]))

    def _wait_nodes_ready(self, deadline: float) -> None:
        def all_ready() -> bool:
            out = self.kubectl(
                "get", "nodes", "-l", objects.NODE_LABEL,
                "-o", "jsonpath={range .items[*]}"
                '{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}',
            )  # fmt: skip
            states = out.split()
            return len(states) >= self.layout.nodes and all(s == "True" for s in states)

        self._wait("the KWOK nodes", all_ready, deadline, "kwok")

    # -- use ---------------------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, kubeconfig: Path | None = None) -> str:
        """kubectl's output; ``ClusterError`` with its message when it fails."""
        out = subprocess.run(
            [str(self.binary("kubectl")), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args[:3])}: {out.stderr.strip()[-500:]}")
        return out.stdout

    def apply(self, docs: Iterable[dict[str, Any]]) -> None:
        body = {"apiVersion": "v1", "kind": "List", "items": list(docs)}
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(body)
        )

    def write_service_kubeconfig(
        self, namespace: str, path: Path, account: str = SERVICE_ACCOUNT
    ) -> Path:
        """A kubeconfig for the service account ``account`` of ``namespace``, which holds only
        what hub_config/k8s/rbac.yaml grants, with the users' storage claim (both made there
        first if they are not)."""
        self.apply(objects.service_rbac(namespace, account))
        self._bind_user_storage(namespace)
        token = self.kubectl(
            "create", "token", account, "-n", namespace, "--duration=8760h"
        ).strip()
        self._write_kubeconfig(Path(path), {"token": token}, namespace)
        return Path(path)

    def write_spawner_kubeconfig(self, namespace: str, path: Path) -> Path:
        """A kubeconfig for the hub's KubeSpawner in ``namespace`` (objects.spawner_rbac)."""
        self.apply(objects.spawner_rbac(namespace))
        token = self.kubectl(
            "create", "token", objects.SPAWNER_ACCOUNT, "-n", namespace, "--duration=8760h"
        ).strip()
        self._write_kubeconfig(Path(path), {"token": token}, namespace)
        return Path(path)

    def _bind_user_storage(self, namespace: str) -> None:
        """The namespace's storage claim, bound to its volume before any pod needs it (Volcano
        places no pod whose claim is unbound). We bind them as the volume controller would,
        so the binding never waits for its resync."""
        volume, claim = objects.user_storage(namespace, self.user_data / namespace)
        self._replace_moved_volume(volume, claim)
        self.apply([volume, claim])
        live = json.loads(self.kubectl("get", "pvc", "-n", namespace, claim["metadata"]["name"],
                                       "-o", "json"))  # fmt: skip
        if live.get("status", {}).get("phase") == "Bound":
            return
        name = volume["metadata"]["name"]
        ref = {**volume["spec"]["claimRef"], "uid": live["metadata"]["uid"]}
        self.kubectl("patch", "pv", name, "--type=merge", "-p",
                     json.dumps({"spec": {"claimRef": ref}}))  # fmt: skip
        self.kubectl("patch", "pv", name, "--subresource=status", "--type=merge", "-p",
                     json.dumps({"status": {"phase": "Bound"}}))  # fmt: skip
        self.kubectl("annotate", "pvc", "-n", namespace, claim["metadata"]["name"],
                     "--overwrite", "pv.kubernetes.io/bind-completed=yes")  # fmt: skip
        status = {"phase": "Bound", "accessModes": claim["spec"]["accessModes"],
                  "capacity": volume["spec"]["capacity"]}  # fmt: skip
        self.kubectl("patch", "pvc", "-n", namespace, claim["metadata"]["name"],
                     "--subresource=status", "--type=merge", "-p",
                     json.dumps({"status": status}))  # fmt: skip

    def _replace_moved_volume(self, volume: dict, claim: dict) -> None:
        """A volume kept from a cluster whose ``user_data`` was elsewhere: its hostPath cannot
        be changed, so it and its claim go (their folder stays) and are made again."""
        name = volume["metadata"]["name"]
        out = self.kubectl("get", "pv", "--ignore-not-found", name, "-o", "json").strip()
        if not out or json.loads(out)["spec"].get("hostPath") == volume["spec"]["hostPath"]:
            return
        namespace = claim["metadata"]["namespace"]
        unfinalize = '{"metadata":{"finalizers":null}}'
        for kind, where in (("pvc", ["-n", namespace]), ("pv", [])):
            obj = name if kind == "pv" else claim["metadata"]["name"]
            self.kubectl("delete", kind, *where, obj, "--ignore-not-found", "--wait=false")
            with contextlib.suppress(ClusterError):  # gone already
                self.kubectl("patch", kind, *where, obj, "--type=merge", "-p", unfinalize)
            deadline = time.monotonic() + 30
            while self.kubectl("get", kind, *where, obj, "--ignore-not-found", "-o", "name"):
                if time.monotonic() > deadline:
                    raise ClusterError(f"the {kind} {obj} of an old user_data did not go")
                time.sleep(0.2)

    # -- down --------------------------------------------------------------------------------------
    def down(self, keep_data: bool = False) -> None:
        """Stop every component by PID (the last started first); the store goes too unless
        ``keep_data``."""
        self.real_node().down(keep_images=keep_data)  # first, while the API server answers
        names = [n for n in reversed(ORDER)] + [n for n in self.processes.names() if n not in ORDER]
        for name in names:
            self.processes.stop(name)
        if not keep_data:
            shutil.rmtree(self.var / "etcd", ignore_errors=True)
            self._state_file.unlink(missing_ok=True)


def _b64(path: Path) -> str:
    """A kubeconfig embeds its certificates: it stays whole wherever it is read from."""
    return base64.b64encode(path.read_bytes()).decode()


def _base_env() -> dict[str, str]:
    """A small environment for the components: no proxies, nothing of the caller's."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL")
    return {k: os.environ[k] for k in keep if k in os.environ}
