"""The embedded default's configuration, read as JupyterHub reads it (jupyterhub_config.py)."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest
from traitlets.config.loader import PyFileConfigLoader

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("WMLA_VAR", str(tmp_path / "var"))
    monkeypatch.delenv("WMLA_ACCOUNT_TEMPLATE", raising=False)
    umask = os.umask(0o022)  # the config sets the hub's umask: not this test process's
    try:
        return PyFileConfigLoader("jupyterhub_config.py", path=str(REPO)).load_config()
    finally:
        os.umask(umask)


def test_no_hub_user_can_claim_an_account_the_machine_already_has(config) -> None:
    """Anyone signs up under any name not yet taken: a hub user called like an
    existing account (nobody, root, the machine's own users) must get an account of wmla's."""
    notebooks = config.WmlaLocalSpawner.system_user_template
    service = json.loads(config.JupyterHub.services[0]["environment"]["WMLA_SERVICE_CONFIG"])
    jobs = service["WmlaService"]["backend_options"]["account_template"]
    assert notebooks == jobs  # a user's notebook and jobs run as one account
    for entry in pwd.getpwall():
        assert notebooks.format(username=entry.pw_name) != entry.pw_name
