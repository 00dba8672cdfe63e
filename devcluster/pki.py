"""The cluster's certificates and keys, made once with openssl into a private folder: a CA, the
API server's serving certificate, an admin client certificate and the service-account key pair.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The first address of --service-cluster-ip-range: the `kubernetes` Service's.
SERVICE_IP = "10.96.0.1"
SERVICE_CIDR = "10.96.0.0/16"


@dataclass(frozen=True)
class Pki:
    """Where each file lies."""

    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def server_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def server_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def admin_crt(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"


def _openssl(*args: str, cwd: Path) -> None:
    out = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"devcluster: openssl {args[0]} failed: {out.stderr.strip()[-300:]}")


def _key(path: Path) -> None:
    _openssl("genrsa", "-out", str(path), "2048", cwd=path.parent)
    os.chmod(path, 0o600)


def _signed(pki: Pki, name: str, subject: str, extensions: str) -> None:
    """``name.key`` and ``name.crt`` signed by the CA, with the given v3 extensions."""
    key, csr, crt = (pki.dir / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    ext = pki.dir / f"{name}.ext"
    ext.write_text(extensions)
    _key(key)
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr), cwd=pki.dir)
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki.ca_crt), "-CAkey", str(pki.ca_key),
        "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", str(ext), "-out", str(crt),
        cwd=pki.dir,
    )  # fmt: skip
    csr.unlink()
    ext.unlink()


def ensure(directory: Path) -> Pki:
    """The PKI in ``directory`` (mode 0700), made on the first call only."""
    pki = Pki(Path(directory))
    pki.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(pki.dir, 0o700)
    if pki.sa_pub.exists():
        return pki
    _key(pki.ca_key)
    _openssl(
        "req", "-x509", "-new", "-key", str(pki.ca_key), "-subj", "/CN=wmla-devcluster-ca",
        "-days", "3650", "-sha256", "-out", str(pki.ca_crt), cwd=pki.dir,
    )  # fmt: skip
    names = "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    _signed(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={names},IP:127.0.0.1,IP:{SERVICE_IP}\n",
    )
    _signed(
        pki,
        "admin",
        "/O=system:masters/CN=wmla-devcluster-admin",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n",
    )
    _key(pki.sa_key)
    _openssl("rsa", "-in", str(pki.sa_key), "-pubout", "-out", str(pki.sa_pub), cwd=pki.dir)
    return pki
