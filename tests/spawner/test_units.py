"""The spawner's pure parts: plan mapping, request body, user names, folders, kernel startup.

The plan-mapping table runs the real mixin methods on a WmlaLocalSpawner whose ``user`` is a
plain object with a name and groups (no hub is needed to pick a plan). The kernel test starts a
real IPython kernel with the IPYTHONDIR the spawner prepares.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import types
from pathlib import Path

import pytest

from extension.userfs.accounts import AccountError
from spawner.kernel import STARTUP_NAME, install_startup, startup_script
from spawner.local import WmlaLocalSpawner
from spawner.mixin import AdmissionError
from spawner.profiles import initialize
from spawner.storage import ensure_folder, user_folder, validate_username

PROFILES = [  # KubeSpawner's profile_list shape (spawner/profiles.py)
    {"slug": "cpu", "display_name": "CPU only", "default": True},
    {
        "slug": "gpu",
        "display_name": "1 GPU",
        "kubespawner_override": {"gpus": 1, "notebook_cpu": "2", "notebook_memory": "4Gi"},
    },
    {
        "slug": "qa",
        "display_name": "QA box",
        "kubespawner_override": {"wmla_plan": "/project1/qa-team"},
    },
]


def make(user: str = "alice", groups=(), options=None, **config) -> WmlaLocalSpawner:
    """A spawner with the picked profile applied, as start() applies it."""
    if "profiles" in config and "profile_list" not in config:
        config["profile_list"] = config.pop("profiles")
    spawner = WmlaLocalSpawner(**config)
    spawner.user = types.SimpleNamespace(
        name=user, groups=[types.SimpleNamespace(name=g) for g in groups], settings={}
    )
    spawner.user_options = options or {}
    return spawner


def picked(spawner: WmlaLocalSpawner) -> WmlaLocalSpawner:
    asyncio.run(spawner.wmla_load_profile())
    return spawner


MAPPING = {
    "group_plans": {"dev": "/project1/dev-team", "qa": "/project1/qa-team"},
    "user_plans": {"carol": "/project2/research"},
}


@pytest.mark.parametrize(
    ("user", "groups", "options", "extra", "plan"),
    [
        ("alice", (), None, {}, "/sample-project/notebooks"),
        ("alice", ("dev",), None, {}, "/project1/dev-team"),
        ("alice", ("qa", "dev"), None, {}, "/project1/dev-team"),  # mapping order decides
        ("alice", ("other",), None, {}, "/sample-project/notebooks"),
        ("carol", ("dev",), None, {}, "/project2/research"),  # user override beats group
        ("carol", ("dev",), None, {"wmla_plan": "/forced"}, "/forced"),
        ("alice", ("dev",), {"profile": "qa"}, {"profiles": PROFILES}, "/project1/qa-team"),
        ("alice", ("dev",), {"profile": "gpu"}, {"profiles": PROFILES}, "/project1/dev-team"),
        ("bob", (), None, {"default_plan": "/p/nb"}, "/p/nb"),
    ],
    ids=[
        "default",
        "group",
        "first-mapped-group",
        "unmapped-group",
        "user-override",
        "forced-plan",
        "profile-plan",
        "profile-without-plan",
        "configured-default",
    ],
)
def test_plan_mapping(user, groups, options, extra, plan) -> None:
    spawner = picked(make(user, groups, options, **MAPPING, **extra))
    assert spawner.wmla_plan_path() == plan


def test_job_body_is_a_one_worker_non_preemptible_notebook_for_the_user() -> None:
    spawner = picked(make("alice", ("dev",), {"profile": "gpu"}, profiles=PROFILES, **MAPPING))
    spawner.cpu_limit = 4
    spawner.mem_limit = 8 * 2**30
    assert spawner.wmla_job_body("/project1/dev-team") == {
        "plan": "/project1/dev-team",
        "kind": "notebook",
        "user": "alice",
        "name": "notebook",
        "workers": 1,
        "preemptible": False,
        "resources": {"gpu": 1, "cpu": "2", "memory": "4Gi"},
        "limits": {"cpu": "4000m", "memory": 8 * 2**30},
    }
    plain = make("bob", cpu_guarantee=0.5, notebook_memory="1Gi")
    assert plain.wmla_job_body("/p")["resources"] == {"gpu": 0, "cpu": "500m", "memory": "1Gi"}


@pytest.mark.parametrize(
    ("config", "options", "message"),
    [
        ({"profiles": PROFILES}, {"profile": "nope"}, "there is no profile 'nope'"),
        ({"profiles": [{"slug": "x"}]}, None, "needs a display_name"),
        ({"profiles": [{"display_name": "x", "gpus": 1}]}, None, "misconfigured: unknown gpus"),
        ({"profiles": [{"display_name": "x", "gpu": 1}]}, None, "go in kubespawner_override"),
        ({"user_plans": {"alice": "project1"}}, None, "is not a plan path"),
        (
            {"profiles": [{"display_name": "x", "kubespawner_override": {"gpus": "many"}}]},
            None,
            "kubespawner_override gpus='many' does not fit",
        ),
    ],
    ids=[
        "unknown-profile",
        "profile-without-display-name",
        "unknown-profile-key",
        "old-shape-key",
        "relative-plan",
        "bad-override-value",
    ],
)
def test_bad_choices_are_refused_with_a_message(config, options, message) -> None:
    with pytest.raises(AdmissionError, match=message):
        picked(make("alice", (), options, **config)).wmla_plan_path()


def test_options_form_lists_profiles_and_reads_the_pick() -> None:
    spawner = make(profiles=PROFILES)
    form = spawner.wmla_options_form([], initialize(PROFILES))
    assert form.count('type="radio"') == 3 and 'value="cpu" checked' in form
    assert spawner.run_options_from_form({"profile": ["gpu"]}) == {"profile": "gpu"}
    assert make().wmla_options_form() == ""


def test_each_plan_on_the_spawn_page_has_its_description_beside_it() -> None:
    described = {"/project1/dev-team": "dev team <GPUs> & notebooks"}
    spawner = make("carol", plan_descriptions=described, **MAPPING)
    form = spawner.wmla_options_form(["/project1/dev-team", "/project2/research"])
    rows = form.split("</label>")
    dev = next(r for r in rows if 'value="/project1/dev-team"' in r)
    research = next(r for r in rows if 'value="/project2/research"' in r)
    assert dev.endswith(
        '/project1/dev-team <span class="text-muted">dev team &lt;GPUs&gt; &amp; notebooks</span>'
    )
    assert research.endswith("> /project2/research")  # none configured: the path alone


async def test_the_spawn_pages_plans_say_what_they_hold_now() -> None:
    """Beside each plan: its configured description, then the service's figures of it."""

    class Service:  # the service as the spawner asks it: the user's plans, then the tree
        async def call(self, method, path, body=None, what="", retry=5.0):
            if path.startswith("?"):
                return {"plans": ["/project1/dev-team", "/project2/research"]}
            assert (method, path) == ("GET", "plans")
            return {
                "plans": [
                    {"path": "/project1/dev-team", "allocated": {"gpu": 1},
                     "limit": {"gpu": 2}, "pending": 3},
                    {"path": "/project2/research", "allocated": {"gpu": 1}, "limit": {},
                     "pending": 0},
                ]
            }  # fmt: skip

    spawner = make("carol", plan_descriptions={"/project1/dev-team": "dev team"}, **MAPPING)
    spawner.wmla_service_client = lambda: Service()
    form = await spawner.wmla_spawn_form()
    assert (
        '/project1/dev-team <span class="text-muted">dev team — 1 of 2 GPUs in use, 3 jobs '
        "waiting</span>" in form
    )
    assert '/project2/research <span class="text-muted">1 GPU in use</span>' in form


def test_the_spawn_page_offers_the_users_plans_and_reads_the_pick() -> None:
    spawner = make("carol", **MAPPING)  # mapped to /project2/research
    plans = ["/project1/dev-team", "/project2/research", "/sample-project/notebooks"]
    form = spawner.wmla_options_form(plans)
    assert form.count('name="plan"') == 3 and 'value="/project2/research" checked' in form
    assert spawner.run_options_from_form({"plan": ["/project1/dev-team"]}) == {
        "plan": "/project1/dev-team"
    }
    assert make().wmla_options_form(["/only/one"]) == ""  # one plan: nothing to choose
    pick = picked(make("carol", (), {"plan": "/project1/dev-team"}, **MAPPING))
    assert pick.wmla_plan_path() == "/project1/dev-team"
    options = {"plan": "/project1/dev-team", "profile": "qa"}
    fixed = picked(make("carol", (), options, profiles=PROFILES))
    assert fixed.wmla_plan_path() == "/project1/qa-team"  # the profile's wmla_plan wins
    off = make("carol", (), {"plan": "/project1/dev-team"}, plan_choice=False, **MAPPING)
    assert off.wmla_plan_path() == "/project2/research"


@pytest.mark.parametrize(
    "name", ["../x", "a/b", "", ".", "..", "Alice", "-x", "x-", "a" * 64, "bob smith"]
)
def test_user_names_that_cannot_be_one_folder_are_refused(name: str, tmp_path: Path) -> None:
    with pytest.raises(AccountError, match="cannot name a private folder"):
        validate_username(name)
    with pytest.raises(AccountError):
        user_folder(tmp_path, name)


def test_the_folder_is_private_and_created_once(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    folder = ensure_folder(root, "alice", None)
    assert folder == root / "alice" and stat.S_IMODE(folder.stat().st_mode) == 0o700
    (folder / "keep.txt").write_text("x")
    os.chmod(folder, 0o755)
    assert ensure_folder(root, "alice", None) == folder
    assert (folder / "keep.txt").read_text() == "x"  # content kept, mode made private again
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_the_startup_file_is_never_written_through_a_symlink(tmp_path: Path) -> None:
    """The folder is the user's: a planted symlink must not make the hub write elsewhere."""
    folder, elsewhere = tmp_path / "alice", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    (folder / ".ipython" / "profile_default").mkdir(parents=True)
    (folder / ".ipython" / "profile_default" / "startup").symlink_to(elsewhere)
    with pytest.raises(AccountError, match="is not a folder"):
        install_startup(folder / ".ipython", folder, None)
    assert list(elsewhere.iterdir()) == []
    (folder / ".ipython" / "profile_default" / "startup").unlink()
    path = install_startup(folder / ".ipython", folder, None)
    assert path == folder / ".ipython/profile_default/startup" / STARTUP_NAME
    assert path.read_text() == startup_script()


def test_the_kernel_loads_the_magics_without_load_ext(tmp_path: Path) -> None:
    """A real ipykernel with the spawner's IPYTHONDIR has the %wmla_* magics."""
    from jupyter_client.manager import start_new_kernel

    ipython_dir = tmp_path / ".ipython"
    path = install_startup(ipython_dir, tmp_path, None)
    assert path.name == STARTUP_NAME
    env = {**os.environ, "IPYTHONDIR": str(ipython_dir)}
    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(tmp_path))
    try:
        code = (
            "ip = get_ipython()\n"
            "print('extension.magics' in ip.extension_manager.loaded, ip.find_line_magic("
            "'wmla_jobs') is not None, sorted(k for k in globals() if 'wmla' in k))"
        )
        out = []
        reply = kc.execute_interactive(
            code,
            timeout=60,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
        )
        assert reply["content"]["status"] == "ok"
        assert "".join(out).strip() == "True True []"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_missing_magics_module_leaves_a_note_and_ipython_starts(tmp_path: Path) -> None:
    ipython_dir = tmp_path / ".ipython"
    install_startup(ipython_dir, tmp_path, None, script=startup_script("no_such_wmla_module"))
    done = subprocess.run(
        [sys.executable, "-m", "IPython", "--no-banner", "-c", "print('alive')"],
        env={**os.environ, "IPYTHONDIR": str(ipython_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "alive" in done.stdout
    assert "wmla: magics not available" in done.stderr


def test_a_server_cmd_the_hubs_account_cannot_start_runs_on_the_hubs_interpreter(
    tmp_path: Path,
) -> None:
    """Not root (or system_users off), the servers run as the hub's own account: a
    jupyterhub-singleuser it cannot start (not on PATH here; elsewhere a venv script whose
    interpreter it may not run) becomes `<the hub's python> -m jupyterhub.singleuser` with the
    hub's packages and Jupyter paths, instead of a FileNotFoundError at spawn."""
    spawner = make("alice", system_users=False, autoload_magics=False, getting_started=False)
    spawner.storage_root = str(tmp_path)
    spawner.cmd = ["no-such-jupyterhub-singleuser"]
    spawner.wmla_prepare()
    assert spawner.cmd == [sys.executable, "-m", "jupyterhub.singleuser"]
    assert spawner.wmla_command.python == sys.executable
    paths = spawner.wmla_command.pythonpath.split(os.pathsep)
    assert str(Path(__file__).resolve().parents[2]) in paths  # the project
    import jupyterhub

    assert str(Path(jupyterhub.__file__).resolve().parents[1]) in paths
    assert Path(spawner.wmla_command.jupyter_env["JUPYTERLAB_DIR"], "static").is_dir()
    runnable = make("bob", system_users=False, autoload_magics=False, getting_started=False)
    runnable.storage_root = str(tmp_path)
    runnable.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
    runnable.wmla_prepare()
    assert runnable.wmla_command.pythonpath == "" and runnable.wmla_command.jupyter_env == {}


def test_jupyter_paths_follow_the_packages_not_the_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A system Python over a virtualenv's site-packages (PYTHONPATH): sys.prefix is /usr, and
    JupyterLab, its extensions and the server config are the virtualenv's."""
    from spawner.server_python import hub_jupyter_paths, hub_package_paths

    env = tmp_path / "env"
    site = env / "lib" / "python3.11" / "site-packages"
    (env / "share" / "jupyter" / "lab").mkdir(parents=True)
    (env / "etc" / "jupyter").mkdir(parents=True)
    site.mkdir(parents=True)
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{tmp_path / 'missing'}")
    assert hub_package_paths()[0] == str(site)  # first, and a missing folder left out
    paths = hub_jupyter_paths()
    assert paths["JUPYTERLAB_DIR"] == str(env / "share" / "jupyter" / "lab")
    assert paths["JUPYTER_PATH"].split(os.pathsep)[0] == str(env / "share" / "jupyter")
    assert paths["JUPYTER_CONFIG_PATH"].split(os.pathsep)[0] == str(env / "etc" / "jupyter")
