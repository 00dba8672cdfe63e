"""The site's settings file outside the repository (issue 38, item 6): where it is found, that
it is loaded after the shipped jupyterhub_config.py (its values win), and that a file others
could change is refused, since the hub runs it as root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from traitlets.config.loader import PyFileConfigLoader

from hub_config.settings import SettingsError, check_settings_file, settings_file

REPO = Path(__file__).resolve().parents[2]
SETTINGS = "c = get_config()\nc.JupyterHub.port = 18123\nc.WmlaLocalSpawner.cpu_limit = 7.0\n"


def private(path: Path, text: str = SETTINGS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o755)
    path.write_text(text)
    path.chmod(0o644)
    return path


def test_wmla_settings_then_etc_then_var(tmp_path: Path) -> None:
    var, system = tmp_path / "var", tmp_path / "etc" / "config.py"
    assert settings_file(var, {}, system) is None  # none anywhere: nothing loaded
    local = private(var / "local_config.py")
    assert settings_file(var, {}, system) == local
    private(system)
    assert settings_file(var, {}, system) == system
    named = private(tmp_path / "site" / "hub.py")
    assert settings_file(var, {"WMLA_SETTINGS": str(named)}, system) == named
    with pytest.raises(SettingsError, match=r"\$WMLA_SETTINGS is '/nowhere.py', and that is not"):
        settings_file(var, {"WMLA_SETTINGS": "/nowhere.py"}, system)


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_a_file_others_may_change_is_refused_naming_the_fix(tmp_path: Path, mode: int) -> None:
    path = private(tmp_path / "etc" / "config.py")
    path.chmod(mode)
    with pytest.raises(SettingsError) as err:
        check_settings_file(path)
    assert str(err.value) == (
        f"refusing the settings file {path}: mode {mode:04o} lets others than its owner change "
        f"it, and the hub runs what it says; chmod go-w {path}"
    )


def test_a_folder_others_may_write_is_refused_unless_sticky(tmp_path: Path) -> None:
    path = private(tmp_path / "shared" / "config.py")
    path.parent.chmod(0o777)  # anyone could replace the file
    with pytest.raises(SettingsError, match=r"settings folder .*mode 0777 .*chmod go-w"):
        check_settings_file(path)
    path.parent.chmod(0o1777)  # /tmp's way: only the owner may rename or remove it
    check_settings_file(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    path = private(tmp_path / "etc" / "config.py")
    os.chown(path, 65534, -1)
    with pytest.raises(SettingsError, match=r"belongs to uid 65534, not to root or to the hub's"):
        check_settings_file(path)
    check_settings_file(path, uid=65534)  # a hub that runs as that user may use its own


def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("WMLA_VAR", str(tmp_path / "var"))
    monkeypatch.delenv("WMLA_SETTINGS", raising=False)
    umask = os.umask(0o022)  # the config sets the hub's umask: not this test process's
    try:
        return PyFileConfigLoader("jupyterhub_config.py", path=str(REPO)).load_config()
    finally:
        os.umask(umask)


def test_jupyterhub_config_loads_var_local_config_last(tmp_path, monkeypatch) -> None:
    assert load(tmp_path, monkeypatch).JupyterHub.port == 8000  # the shipped value
    private(tmp_path / "var" / "local_config.py")
    config = load(tmp_path, monkeypatch)
    assert config.JupyterHub.port == 18123 and config.WmlaLocalSpawner.cpu_limit == 7.0
    assert config.JupyterHub.services[0]["name"] == "wmla"  # the rest stays the shipped one


def test_jupyterhub_config_stops_at_an_unsafe_settings_file(tmp_path, monkeypatch) -> None:
    path = private(tmp_path / "var" / "local_config.py")
    path.chmod(0o666)
    with pytest.raises(SystemExit) as err:
        load(tmp_path, monkeypatch)
    assert str(err.value).startswith(f"jupyterhub_config.py: refusing the settings file {path}")
