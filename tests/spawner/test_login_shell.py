"""``wmla`` and the server's Python in every kind of shell of a spawned server, as its user.

A real hub (tests/spawner/test_local.py's fixture: the repository's jupyterhub_config.py, the
wmla local spawner, the real service; as root, one system account per hub user) spawns a user's
server. Then, through the server's own terminal and kernel APIs (what JupyterLab does), as that
user: login shells (``bash -lc``, ``sh -lc``, an interactive ``bash -l``, a ``#!/bin/bash -l``
script), a non-login shell, a notebook's ``!`` command and ``subprocess`` calls from a kernel all
find ``wmla`` and reach the service with the server's token (``wmla exec-get`` lists the user's
running notebook job), and ``python`` imports the product's packages. Before the login profile,
/etc/profile reset PATH and a login shell answered "wmla: command not found".
"""

from __future__ import annotations

import asyncio
import os
import pwd
import stat

import pytest

from spawner.kernel import LOGIN_MARKER, login_profile
from tests.service.hub import Hub
from tests.spawner.helpers import server_model
from tests.spawner.test_local import (
    PROXY,
    account,
    run_in_kernel,
    run_in_terminal,
    spawn,
    wait_ready,
)
from tests.spawner.test_local import hub as _local_hub  # noqa: F401 - the fixture

pytestmark = pytest.mark.skipif(
    not PROXY.exists(), reason="configurable-http-proxy is missing: run `make install`"
)


@pytest.fixture(scope="module")
def server_hub(request: pytest.FixtureRequest) -> Hub:
    """test_local's real hub (its fixture, by name): accounts, spawner, service."""
    return request.getfixturevalue("_local_hub")


# what `wmla exec-get` prints for a user whose only job is their running server
NOTEBOOK_JOB = "notebook (running)"
# double quotes only: it goes inside the single quotes of `bash -lc '...'`; what it prints is
# not in its own text, which the terminal echoes
PY_CODE = "import extension, spawner; print(spawner.__name__, extension.__name__, 42)"
PY_CHECK = f'python -c "{PY_CODE}"'
PY_OK = "spawner extension 42"


def _ready(hub: Hub, user: str) -> None:
    if server_model(hub, user) is None:
        assert spawn(hub, user).status_code in (201, 202)
    wait_ready(hub, user)


def _found(out: str) -> None:
    assert "not found" not in out and "No module named" not in out, out


async def test_login_shells_in_a_terminal_find_wmla_and_the_products_python(
    server_hub: Hub,
) -> None:
    hub = server_hub
    _ready(hub, "user1")
    folder = hub.storage / "user1"
    script = folder / "job-script.sh"
    script.write_text("#!/bin/bash -l\nwmla exec-get\n")
    script.chmod(0o755)
    if hub.os_isolation:
        entry = pwd.getpwnam(account("user1"))
        os.chown(script, entry.pw_uid, entry.pw_gid)
    commands = {
        "bash -lc": "bash -lc 'id -u; wmla --help | head -3; wmla exec-get; " + PY_CHECK + "'",
        "sh -lc": f"sh -lc 'wmla exec-get; {PY_CHECK}'",
        "bash -l (interactive)": f"bash -l -i -c 'wmla exec-get; {PY_CHECK}'",
        "#!/bin/bash -l": "./job-script.sh",
        "non-login": f"wmla exec-get; {PY_CHECK}",
    }
    for kind, command in commands.items():
        # the helper waits for output without a deadline of its own
        out = await asyncio.wait_for(run_in_terminal(hub, "user1", command), 120)
        _found(out)
        assert NOTEBOOK_JOB in out and "/project1/dev-team" in out, (kind, out)
        if PY_CHECK in command:
            assert PY_OK in out, (kind, out)
        if kind == "bash -lc":
            assert "usage" in out.lower(), out
            if hub.os_isolation:  # the terminal runs as the user's account
                assert str(pwd.getpwnam(account("user1")).pw_uid) in out, out


async def test_a_kernel_finds_wmla_in_bang_commands_and_subprocesses(server_hub: Hub) -> None:
    hub = server_hub
    _ready(hub, "user1")
    # `!` is IPython's system(); then argv, a shell, a login shell, and the server's Python
    code = (
        "import subprocess\n"
        "get_ipython().system('wmla exec-get')\n"
        "for argv, shell in ((['wmla', 'exec-get'], False), ('wmla exec-get', True),\n"
        "                    (['bash', '-lc', 'wmla exec-get'], False),\n"
        f"                    (['python', '-c', {PY_CODE!r}], False)):\n"
        "    done = subprocess.run(argv, shell=shell, capture_output=True, text=True)\n"
        "    print(argv, done.returncode, done.stdout, done.stderr)\n"
    )
    out = await asyncio.wait_for(run_in_kernel(hub, "user1", code), 240)
    _found(out)
    assert out.count(NOTEBOOK_JOB) == 4, out  # `!`, argv, shell=True, bash -lc
    assert PY_OK in out, out
    assert " 127 " not in out, out  # no "command not found" exit status


def test_the_profile_is_the_users_own_and_never_over_theirs(server_hub: Hub) -> None:
    hub = server_hub
    _ready(hub, "user1")
    profile = hub.storage / "user1" / ".profile"
    assert profile.read_text() == login_profile()
    assert (hub.storage / "user1" / LOGIN_MARKER).is_file()
    info = profile.stat()
    assert not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if hub.os_isolation:  # written by the helper as the user's account, not by root
        assert info.st_uid == pwd.getpwnam(account("user1")).pw_uid
    # a user with a profile of their own before their first spawn keeps it as it is
    mine = hub.storage / "user2" / ".profile"
    if server_model(hub, "user2") is None and not mine.exists():
        mine.parent.mkdir(mode=0o700, exist_ok=True)
        mine.write_text("# mine\n")
        if hub.os_isolation:
            entry = pwd.getpwnam(account("user2"))
            os.chown(mine.parent, entry.pw_uid, entry.pw_gid)
            os.chown(mine, entry.pw_uid, entry.pw_gid)
        _ready(hub, "user2")
        assert mine.read_text() == "# mine\n"
