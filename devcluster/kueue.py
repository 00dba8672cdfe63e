"""Kueue v0.17 (sigs.k8s.io/kueue) beside a ``LocalCluster``, started and stopped by PID, for the
benchmark that compares wmla with it (benchmarks/bench_k8s.py).

Out of a cluster no Service reaches Kueue's webhook server, and Kueue's own certificate
management (``internalCertManagement``, on: without it Kueue insists on a metrics certificate
under ``/etc/kueue``) makes a certificate for ``kueue-webhook-service.kueue-system.svc`` only.
So, before Kueue starts, its certificate Secret is filled with a CA and a server certificate of
ours (valid for that name *and* for 127.0.0.1, ten years, RSA keys as its rotator writes them):
the rotator finds them valid and keeps them, injects that CA into the webhook configurations and
the conversion webhooks of its CRDs, and the webhook server serves the same files from its
``certDir`` (what a kubelet would mount from the Secret). Every webhook is called by URL on
127.0.0.1. Only the webhooks of Kueue's own kinds and of PyTorchJob are installed (the only
integration enabled), with Kueue's own ``failurePolicy: Fail``; ``down()`` removes them again, so
a stopped Kueue never blocks a PyTorchJob. CRDs, webhook manifests and configuration come from
Kueue's module in the Go module cache; nothing of it is copied here.

Kueue admits, it does not bind: with ``plain_operator`` (the default) the training operator is
restarted without ``--gang-scheduler-name`` while Kueue runs, so PyTorchJobs get no Volcano
PodGroup and their pods go to the default kube-scheduler, one at a time; ``down()`` restarts it
with Volcano again.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, TextIO

import yaml

from . import components as c
from .build import Builder, BuildError, module_dir
from .cluster import ClusterError, LocalCluster, _base_env, _free_ports
from .processes import Processes

NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"  # the name Kueue's certificate must be valid for
SECRET = "kueue-webhook-server-cert"
WEBHOOK_CONFIGS = {  # the names Kueue's rotator injects its CA into
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
}
# The CRDs whose conversion webhook the rotator injects (it fails on one without any).
CONVERTED = ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")
FRAMEWORK = "kubeflow.org/pytorchjob"
# Webhooks kept: Kueue's own kinds and PyTorchJob (the one integration enabled).
KEPT_PATHS = ("kueue-x-k8s-io", "kubeflow-org-v1-pytorchjob")
OPERATOR = "training-operator"
GANG_FLAG = "--gang-scheduler-name"


class Kueue:
    """Kueue's controller against ``cluster``; its state under ``<cluster var>/kueue``."""

    def __init__(
        self,
        cluster: LocalCluster,
        log: TextIO = sys.stderr,
        start_timeout: float = 120.0,
        plain_operator: bool = True,
    ) -> None:
        self.cluster = cluster
        self.log = log
        self.start_timeout = start_timeout
        self.plain_operator = plain_operator
        self.var = cluster.var / "kueue"
        self.processes = Processes(self.var / "run", self.var / "logs")
        self.cert_dir = self.var / "certs"
        self._operator_changed = False

    # -- up ----------------------------------------------------------------------------------
    def up(self) -> None:
        """Build Kueue if missing, install its CRDs and webhooks, start it and wait until it is
        ready; ``ClusterError`` with one line naming what failed."""
        try:
            binary = Builder(log=self.log).build((c.KUEUE,))[c.KUEUE.binary]
            module = module_dir("sigs.k8s.io/kueue")
        except BuildError as err:
            raise ClusterError(str(err)) from None
        self.stop_process()
        self.var.mkdir(mode=0o700, parents=True, exist_ok=True)
        webhook_port, health_port = _free_ports(2)
        started = time.monotonic()
        deadline = started + self.start_timeout
        try:
            ca_pem, ca_key, crt_pem, key_pem = self._certificates()
            self.cluster.apply(
                [
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                    _secret(ca_pem, ca_key, crt_pem, key_pem),
                ]
            )
            self._apply_crds(module, webhook_port, ca_pem, deadline)
            self.cluster.apply(webhooks(module, webhook_port, ca_pem))
            if self.plain_operator:
                self._restart_operator(gang=False)
            config = self.var / "config.yaml"
            config.write_text(yaml.safe_dump(configuration(webhook_port, health_port, self)))
            env = {**_base_env(), "KUBECONFIG": str(self.cluster.kubeconfig)}
            self.processes.start(
                "kueue",
                [
                    str(binary),
                    f"--config={config}",
                    "--feature-gates=VisibilityOnDemand=false",
                    "--zap-log-level=info",
                ],
                env=env,
                cwd=self.var,
            )
            self._wait_ready(health_port, deadline)
        except ClusterError:
            self.down()
            raise
        print(
            f"devcluster: kueue up in {time.monotonic() - started:.0f} s "
            f"(webhooks on 127.0.0.1:{webhook_port})",
            file=self.log,
        )

    def pid(self) -> int | None:
        running = self.processes.running("kueue")
        return running.pid if running else None

    def _certificates(self) -> tuple[bytes, bytes, bytes, bytes]:
        """The CA and server certificate, made once per folder (cryptography, RSA 2048)."""
        self.cert_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        files = [self.cert_dir / n for n in ("ca.crt", "ca.key", "tls.crt", "tls.key")]
        if not all(f.exists() for f in files):
            for f, data in zip(files, make_certificates(), strict=True):
                fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
        ca_pem, ca_key, crt_pem, key_pem = (f.read_bytes() for f in files)
        return ca_pem, ca_key, crt_pem, key_pem

    def _apply_crds(self, module: Path, port: int, ca_pem: bytes, deadline: float) -> None:
        bases = module / "config" / "components" / "crd" / "bases"
        docs = []
        for f in sorted(bases.glob("*.yaml")):
            crd = yaml.safe_load(f.read_text())
            if crd["spec"]["names"]["plural"] in CONVERTED:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{port}/convert",
                            "caBundle": base64.b64encode(ca_pem).decode(),
                        },
                        "conversionReviewVersions": ["v1"],
                    },
                }
            docs.append(crd)
        self.cluster.apply(docs)
        names = [f"crd/{d['metadata']['name']}" for d in docs]
        while True:
            try:
                self.cluster.kubectl("wait", "--for=condition=Established", "--timeout=5s", *names)
                return
            except ClusterError:
                if time.monotonic() > deadline:
                    raise

    def _wait_ready(self, port: int, deadline: float) -> None:
        url = f"http://127.0.0.1:{port}/readyz"
        while True:
            if not self.processes.alive("kueue"):
                raise ClusterError(
                    f"devcluster: kueue exited while starting; see {self.processes.log('kueue')}"
                )
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"devcluster: kueue not ready within {self.start_timeout:.0f} s; "
                    f"see {self.processes.log('kueue')}"
                )
            time.sleep(0.3)

    def _restart_operator(self, gang: bool) -> None:
        """The training operator again, with or without Volcano as its gang scheduler."""
        cluster = self.cluster
        ports = cluster.ports()
        if ports is None:
            raise ClusterError("devcluster: no cluster to run Kueue against")
        cluster.processes.stop(OPERATOR)
        self._operator_changed = not gang
        deadline = time.monotonic() + cluster.start_timeout
        if gang:
            cluster._start_operator(ports, deadline)
            return
        start = cluster._start

        def without_gang(
            name: str, argv: list[str], env: dict[str, str] | None = None, binary: str | None = None
        ) -> None:
            start(name, [a for a in argv if not a.startswith(GANG_FLAG)], env, binary)

        cluster._start = without_gang  # type: ignore[method-assign]
        try:
            cluster._start_operator(ports, deadline)
        finally:
            del cluster._start

    # -- down --------------------------------------------------------------------------------
    def stop_process(self) -> None:
        self.processes.stop("kueue")

    def down(self) -> None:
        """Stop Kueue by PID, remove its webhook configurations (a stopped Kueue must not
        refuse PyTorchJobs) and give the training operator its gang scheduler back; what the
        cluster no longer answers is left (the cluster is going too)."""
        self.stop_process()
        if self.cluster.ports() is None or not self.cluster.is_up():
            return
        for kind, name in WEBHOOK_CONFIGS.items():
            with contextlib.suppress(ClusterError):
                self.cluster.kubectl("delete", kind.lower(), name, "--ignore-not-found")
        if self._operator_changed:
            self._restart_operator(gang=True)


def configuration(webhook_port: int, health_port: int, kueue: Kueue) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2): no leader election, webhooks on
    127.0.0.1 with the certificates of ``kueue.cert_dir``, no metrics server, PyTorchJob only."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(kueue.cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": SERVICE,
            "webhookSecretName": SECRET,
        },
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": [FRAMEWORK]},
    }


def webhooks(module: Path, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations from its module, cut to its own kinds and PyTorchJob,
    each called by URL on 127.0.0.1 with our CA."""
    manifests = module / "config" / "components" / "webhook" / "manifests.yaml"
    out = []
    for doc in yaml.safe_load_all(manifests.read_text()):
        if not doc or doc.get("kind") not in WEBHOOK_CONFIGS:
            continue
        kept = []
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            if not any(part in path for part in KEPT_PATHS):
                continue
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca_pem).decode(),
            }
            hook["timeoutSeconds"] = 5
            kept.append(hook)
        doc["metadata"] = {"name": WEBHOOK_CONFIGS[doc["kind"]]}
        doc["webhooks"] = kept
        out.append(doc)
    return out


def _secret(ca_pem: bytes, ca_key: bytes, crt_pem: bytes, key_pem: bytes) -> dict[str, Any]:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": SECRET, "namespace": NAMESPACE},
        "data": {
            "ca.crt": b64(ca_pem),
            "ca.key": b64(ca_key),
            "tls.crt": b64(crt_pem),
            "tls.key": b64(key_pem),
        },
    }


def make_certificates() -> tuple[bytes, bytes, bytes, bytes]:
    """(CA cert, CA key, server cert, server key) as PEM, the way Kueue's rotator
    (open-policy-agent/cert-controller) checks them: the CA valid for the name ``kueue-ca``,
    the server certificate for ``kueue-webhook-service.kueue-system.svc`` (so it is kept) and
    127.0.0.1 (so the API server can call it by URL), PKCS#1 RSA keys, ten years."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    begin, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=3650)

    def pem_key(key: rsa.RSAPrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,  # PKCS#1, as the rotator parses
            serialization.NoEncryption(),
        )

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "kueue-ca"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kueue"),
        ]
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("kueue-ca")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    dns = f"{SERVICE}.{NAMESPACE}.svc"
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(dns), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    encoding = serialization.Encoding.PEM
    return (
        ca.public_bytes(encoding),
        pem_key(ca_key),
        server.public_bytes(encoding),
        pem_key(key),
    )
