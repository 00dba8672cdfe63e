"""The getting-started notebook's terminal command (spawner/getting_started.py) runs as printed:
it is the first command a new user copies (issue 38: it exited 2, "say the framework first")."""

from __future__ import annotations

import json
import re
import shlex

from tests.client.stub import Stub

from .test_retry import stub, wmla  # noqa: F401 - the stub service and `wmla` against it


def printed_command() -> list[str]:
    from spawner.getting_started import getting_started_notebook

    cells = json.loads(getting_started_notebook("/p"))["cells"]
    text = next("".join(c["source"]) for c in cells if "From a terminal" in "".join(c["source"]))
    (command,) = re.findall(r"`(wmla exec-start[^`]*)`", text)
    return shlex.split(command)


def test_the_notebooks_exec_start_command_runs_as_printed(stub: Stub, wmla) -> None:  # noqa: F811
    argv = printed_command()
    assert argv[0] == "wmla"
    stub.state = "FINISHED"
    code, out, err = wmla(*argv[1:])
    assert code == 0, err
    assert list(stub.jobs) == ["j1"] and stub.jobs["j1"]["plan"] == "/p"
    assert "FINISHED" in out + err
