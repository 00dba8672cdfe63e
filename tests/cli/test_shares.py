"""``wmla shares`` against a real JupyterHub, proxy and wmla service with the usage history on.

The service runs with ``c.WmlaService.fair_share_half_life = "10m"``; under /fs (two children of
share 1) user1's 2-GPU gang in /fs/a runs beside user2's 1-GPU job in /fs/b, both submitted with
``wmla exec-start``. Then ``wmla shares`` prints sshare's columns with non-zero usage and the
factors in order (a < b < 1), a user sees only their own leaf, bad flags exit 2 with a message,
the service's refusals exit 1 with its reason, and a plan admin's ``--reset`` forgets the usage.
(The history off: tests/cli/test_cli.py.)
"""

from __future__ import annotations

import json

import pytest

from tests.cli import test_cli
from tests.service.hub import PROXY, Client, Hub
from tests.service.shares_hub import shares_hub

pytestmark = pytest.mark.skipif(
    not PROXY.exists(), reason="configurable-http-proxy is missing: run `make install`"
)
as_user = test_cli.as_user  # the fixture: ``wmla ARGS`` as a user, with this module's hub
HEADER = ["Plan", "RawShares", "NormShares", "RawUsage", "EffectvUsage", "FairShare"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("cli-shares-hub")
    with shares_hub(tmp, ("user1", "user2"), "sleeper") as hub:
        hub.tokens = {name: hub.user_token(name) for name in ("padmin", "user1", "user2")}
        admin = Client(hub, hub.tokens["padmin"])
        for path in ("/fs", "/fs/a", "/fs/b"):
            assert admin.post("/plans", json={"path": path}).status_code == 201
        yield hub


@pytest.fixture(scope="module")
def ran(hub: Hub) -> None:
    """Both jobs submitted with ``wmla exec-start`` (in-process, as ``as_user``), finished."""
    from extension import cli

    for user, plan, workers in (("user1", "/fs/a", "2"), ("user2", "/fs/b", "1")):
        with pytest.MonkeyPatch.context() as env:
            env.setenv("WMLA_URL", hub.url)
            env.setenv("WMLA_TOKEN", hub.tokens[user])
            code = cli.main(["exec-start", "PyTorch", "--consumer", plan, "--workerDeviceNum",
                             workers, "--cpus", "100m", "--model-dir", "models/sleeper",
                             "--model-main", "main.py", "--json", "--", "6"])  # fmt: skip
        assert code == 0
    for user in ("user1", "user2"):
        client = Client(hub, hub.tokens[user])
        mine = client.get("/jobs").json()["jobs"]
        assert len(mine) == 1
        assert client.wait_state(mine[0]["id"], {"FINISHED", "FAILED"})["state"] == "FINISHED"


def table_rows(out: str) -> tuple[str, dict[str, list[str]]]:
    """The message line and the rows by plan (``(user)`` dropped) of ``wmla shares``' table."""
    message, header, rule, *rest = out.splitlines()
    assert header.split() == HEADER and set(rule.replace(" ", "")) == {"-"}
    rows = {}
    for line in rest:
        if line.startswith("("):
            continue
        cells = line.replace(" (user)", "").split()
        rows[cells[0]] = cells[1:]
    return message, rows


def test_shares_print_sshares_columns_with_the_usage_and_factors(as_user, ran) -> None:
    code, out, err = as_user("padmin", "shares")
    assert code == 0, err
    message, rows = table_rows(out)
    assert message.startswith("usage decays by half every 10m; usage in GPU-seconds")
    a, b = rows["/fs/a"], rows["/fs/b"]
    assert a[:2] == ["1", "0.500000"] and b[:2] == ["1", "0.500000"]
    assert float(a[2]) >= 10 and float(b[2]) >= 5  # GPU-seconds: 2 x 6 s and 1 x 6 s
    assert float(a[4]) < float(b[4]) < 1.0  # the gang used more: its factor is lower
    assert float(rows["/fs"][2]) == pytest.approx(float(a[2]) + float(b[2]), abs=1)
    assert rows["/fs/a/user1"][2] == a[2] and rows["/fs/b/user2"][2] == b[2]
    assert rows["/sample-project"][2:] == ["0", "0.000000", "1.000000"]
    # the JSON is the service's answer; the dlicmd spelling and --plan narrow it
    code, out, _ = as_user("padmin", "--shares", "--plan", "/fs/a", "--json")
    answer = json.loads(out)
    assert code == 0 and [r["plan"] for r in answer["plans"]] == ["/fs/a", "/fs/a/user1"]
    row = answer["plans"][0]
    assert row["fair_share_factor"] == pytest.approx(2 ** (-row["effective_usage"] / 0.5))
    assert answer["history"] is True and answer["half_life"] == 600


def test_a_user_sees_their_own_leaf_and_not_the_others(as_user, ran) -> None:
    code, out, _ = as_user("user1", "shares")
    assert code == 0
    _, rows = table_rows(out)
    assert "/fs/a/user1" in rows and "/fs/b/user2" not in rows and float(rows["/fs/b"][2]) > 0
    assert "(1 other users' leaves not shown; their usage counts in their plans)" in out
    code, out, err = as_user("user1", "shares", "--plan", "/fs/b/user2")
    assert (code, out) == (1, "") and "not found: there is no plan '/fs/b/user2'" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["--plan", "fs"], "--plan: give a plan path that starts with /, e.g. "
                     "--plan /project1/dev-team; got 'fs'", id="relative"),
        pytest.param(["--plan", "/fs//a"], "give a plan path that starts with /", id="empty"),
        pytest.param(["--plan"], "argument --plan: expected one argument", id="no-value"),
        pytest.param(["--bogus"], "unrecognized arguments: --bogus", id="unknown"),
        pytest.param(["--retry-seconds", "soon"], "--retry-seconds", id="retry"),
    ],
)  # fmt: skip
def test_bad_flags_exit_2_with_a_message(as_user, argv, message) -> None:
    code, out, err = as_user("user1", "shares", *argv)
    assert (code, out) == (2, "") and message in err, err


def test_only_a_plan_admin_resets_and_the_usage_is_gone(as_user, ran) -> None:
    code, out, err = as_user("user1", "shares", "--reset")
    assert (code, out) == (1, "")
    assert "not allowed: only plan admins may reset the usage history; user1 needs" in err
    code, out, err = as_user("padmin", "shares", "--plan", "/fs", "--reset")
    assert code == 0, err
    _, rows = table_rows(out)
    assert {r[2] for r in rows.values()} == {"0"} and {r[4] for r in rows.values()} == {"1.000000"}
