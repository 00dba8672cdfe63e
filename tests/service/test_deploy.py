"""Running it as a service (issue 38, item 6): the systemd unit passes ``systemd-analyze
verify``, and the hub serves HTTPS with a certificate of a CA made here by openssl, set through
the settings file (docs/deploy.md). Every process is stopped by PID at the end."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import requests

from .hub import PROXY, Client, Hub

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "hub_config" / "systemd" / "jupyterhub-wmla.service"
INSTALLED = "/opt/jupyterhub-wmla"  # where the unit expects the checkout


def unit_here(tmp_path: Path) -> Path:
    """The unit as the docs install it, with this checkout in place of /opt/jupyterhub-wmla."""
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace(INSTALLED, str(ROOT)))
    return unit


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed on this machine (Debian: apt-get install systemd)",
)
def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = unit_here(tmp_path)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0 and UNIT.name not in said, said
    broken = tmp_path / "broken" / UNIT.name  # the check does see mistakes
    broken.parent.mkdir()
    broken.write_text(unit.read_text().replace("KillMode=", "KillMod="))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(broken)], capture_output=True, text=True, timeout=60
    )
    assert "Unknown key 'KillMod'" in done.stdout + done.stderr


def test_the_unit_says_what_the_docs_say() -> None:
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED}/.venv/bin/jupyterhub -f {INSTALLED}/jupyterhub_config.py" in text
    assert "KillMode=process" in text and "EnvironmentFile=-/etc/jupyterhub-wmla/env" in text
    docs = (ROOT / "docs" / "deploy.md").read_text()
    assert "hub_config/systemd/jupyterhub-wmla.service" in docs
    assert "systemctl enable --now jupyterhub-wmla" in docs
    assert "c.JupyterHub.ssl_cert" in docs and "pg_dump" in docs and "wmla backup" in docs


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, hub certificate, hub key): a CA of our own and a certificate it signed
    for 127.0.0.1 and localhost."""
    folder.mkdir(mode=0o700)
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=wmla test CA",
        "-keyout", "ca.key", "-out", "ca.crt", cwd=folder,
    )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", "hub.key", "-out", "hub.csr", cwd=folder,
    )  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        "x509", "-req", "-in", "hub.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "hub.crt", cwd=folder,
    )  # fmt: skip
    return folder / "ca.crt", folder / "hub.crt", folder / "hub.key"


@pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing")
@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_the_hub_serves_https_with_the_certificate_from_the_settings_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, cert, key = make_certificates(tmp_path / "tls")
    settings = tmp_path / "site" / "config.py"
    settings.parent.mkdir(mode=0o755)
    settings.write_text(
        f"c = get_config()\nc.JupyterHub.ssl_cert = {str(cert)!r}\n"
        f"c.JupyterHub.ssl_key = {str(key)!r}\n"
    )
    settings.chmod(0o644)
    hub = Hub(tmp_path, {"tick": 1})
    hub.env["WMLA_SETTINGS"] = str(settings)
    hub.url = hub.url.replace("http://", "https://")
    hub.api = hub.api.replace("http://", "https://")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))  # Hub's own requests trust our CA
    try:
        hub.start()
        assert f"settings loaded from {settings}" in hub.log_path.read_text()
        r = requests.get(hub.url + "/hub/login", verify=str(ca), timeout=30)
        assert r.status_code == 200 and "password" in r.text.lower()
        client = Client(hub, hub.user_token("user1"))
        assert client.get("/plans").status_code == 200  # the API over HTTPS
        plain = requests.Session()
        plain.trust_env = False  # without our CA (REQUESTS_CA_BUNDLE) the certificate fails
        with pytest.raises(requests.exceptions.SSLError):
            plain.get(hub.url + "/hub/login", timeout=30)
    finally:
        hub.stop()
