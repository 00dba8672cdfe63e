"""A real notebook, run by nbclient in a python3 kernel of the project's environment, against a
real JupyterHub + proxy + wmla service (tests/service/hub.py) with the LocalBackend.

The kernel gets the environment a notebook server spawned by that hub has: its user's token in
JUPYTERHUB_API_TOKEN, the hub's own API URL in JUPYTERHUB_API_URL, JUPYTERHUB_USER, its working
directory in the user's folder, and WMLA_URL (the hub's public address, which the spawner must
add: a user's token may not ask the hub where services live). It loads the magics, trains the
example on 2 DDP workers with ``--wait``, runs a ``%%wmla_train`` cell, and the widget state the
front end would get is checked in ``nb.metadata.widgets``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import nbformat
import pytest
import requests
from nbclient import NotebookClient

from tests.service.hub import PROXY, REPO, Client, Hub

pytestmark = pytest.mark.skipif(
    not PROXY.exists(), reason="configurable-http-proxy is missing: run `make install`"
)
EXAMPLE = REPO / "examples" / "pytorch_mnist" / "main.py"

CELLS = [
    "%load_ext extension.magics",
    "%wmla_plans",
    "%wmla_train --plan /sample-project/training --workers 2 --cpus 250m --name nbmnist "
    "--model-dir models/pytorch_mnist --model-main main.py --wait -- --batch-size 64 --epochs 2",
    "import json; print(json.dumps(wmla_last_job))",
    "%%wmla_train --plan /sample-project/training --workers 1 --cpus 100m --name cell1 --wait\n"
    "from extension import runtime\n"
    "for step in range(1, 4):\n"
    "    runtime.report(step=step, loss=1.0 / step)\n"
    "print('cell script done', runtime.info().world_size)\n",
    "print(json.dumps(wmla_last_job))",
    "%wmla_train --plan /sample-project/training --model-dir ../user2 --model-main x.py",
    "%wmla_train --workers 0",
    "%wmla_jobs",
    "%wmla_logs {cell_job} --tail 5",
    "%wmla_usage --plan /sample-project/training --range 'last hour'",
    # the seed's S2: 4 workers x 1 GPU refused in qa-team (GPU limit 2), finished in dev-team
    "%wmla_train --consumer /project1/qa-team --workerDeviceNum 4 --gpus-per-worker 1 "
    "--cpus 100m --model-dir models/hi --model-main main.py --wait",
    "%wmla_train --consumer /project1/dev-team --workerDeviceNum 4 --gpus-per-worker 1 "
    "--cpus 100m --model-dir models/hi --model-main main.py --wait",
    "print(json.dumps(wmla_last_job))",
    # without --wait the monitor watches on a thread; its cancel button stops the job
    "%wmla_train --plan /sample-project/training --cpus 100m --name bg --model-dir models/hi "
    "--model-main sleep.py -- 120",
    "import time\n"
    "m = wmla_last_monitor\n"
    "deadline = time.time() + 120\n"
    "while m.job.get('state') != 'RUNNING' and time.time() < deadline:\n"
    "    time.sleep(0.3)\n"
    "m.cancel_button.click()\n"
    "m._thread.join(120)\n"
    "print(m.job['state'], m.cancel_button.disabled, m.message.value)",
]
RAISES = {6, 7, 11}  # cells expected to stop with a UsageError


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("nbhub")
    hub = Hub(tmp, {"tick": 1, "grace": 2, "device_layout": "1x4", "cpu_oversubscription": 2})
    try:
        hub.start()
        yield hub
    finally:
        hub.stop()


def kernel_env(hub: Hub, token: str, user: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WMLA_", "JUPYTERHUB_"))}
    env.update(
        {
            "JUPYTERHUB_API_TOKEN": token,
            "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub.env['WMLA_HUB_API_PORT']}/hub/api",
            "JUPYTERHUB_USER": user,
            "JUPYTERHUB_BASE_URL": "/",
            "WMLA_URL": hub.url,  # what the spawner (issue 4) adds
            "WMLA_CONFIG": str(hub.tmp / "no-logon.json"),
        }
    )
    return env


def outputs_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}")
        elif "text/plain" in out.get("data", {}):
            parts.append(out["data"]["text/plain"])
    return "".join(parts)


def widget_states(nb) -> list[dict]:
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    return list(state.values())


def run_notebook(hub: Hub, cells: list[str], folder: Path, env: dict) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    for i, source in enumerate(cells):
        cell = nbformat.v4.new_code_cell(source)
        if i in RAISES:
            cell.metadata["tags"] = ["raises-exception"]
        nb.cells.append(cell)
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(folder)}},
    )
    client.execute(env=env)
    return nb


def test_a_notebook_trains_watches_and_meters(hub: Hub) -> None:
    admin = Client(hub, hub.user_token("padmin"))
    for path, body in (
        ("/project1", {"share": 1}),
        ("/project1/dev-team", {"share": 4, "limit": {"gpu": 4}}),
        ("/project1/qa-team", {"share": 2, "limit": {"gpu": 2}}),
    ):
        r = admin.post("/plans", json={"path": path, **body})
        assert r.status_code == 201, r.text
    token = hub.user_token("user1")
    folder = hub.storage / "user1"
    (folder / "models" / "pytorch_mnist").mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLE, folder / "models" / "pytorch_mnist" / "main.py")
    (folder / "models" / "hi").mkdir(exist_ok=True)
    (folder / "models" / "hi" / "sleep.py").write_text(
        "import sys, time\nprint('sleeping', flush=True)\ntime.sleep(float(sys.argv[1]))\n"
    )
    (folder / "models" / "hi" / "main.py").write_text(
        "import os\nprint('rank', os.environ['RANK'])\n"
    )
    (hub.storage / "user2").mkdir(parents=True, exist_ok=True)
    cells = list(CELLS)
    cells[9] = "%wmla_logs {} --tail 5".format("{wmla_last_job['id']}")
    nb = run_notebook(hub, cells, folder, kernel_env(hub, token, "user1"))
    text = [outputs_text(c) for c in nb.cells]

    assert "/sample-project/training" in text[1]
    job = json.loads(text[3])
    assert job["state"] == "FINISHED", text[2]
    assert f"job {job['id']} FINISHED" in text[2] and job["name"] == "nbmnist"
    workdir = Path(job["workdir"])
    assert workdir.is_relative_to(folder) and (workdir / "model.pt").stat().st_size > 0
    assert json.loads((workdir / "result.json").read_text())["world_size"] == 2

    cell_job = json.loads(text[5])
    assert cell_job["state"] == "FINISHED" and cell_job["name"] == "cell1"
    script = folder / "wmla-cells" / "cell1" / "main.py"
    assert "runtime.report" in script.read_text()
    assert "cell script done 1" in text[9]

    assert text[6].startswith("UsageError: --model-dir '../user2' is outside your folder")
    assert text[7].startswith("UsageError: argument --workers")
    assert ">= 1, got '0'" in text[7]
    rows = {line.split()[0]: line for line in text[8].splitlines()[2:]}
    assert "FINISHED" in rows[job["id"]] and "FINISHED" in rows[cell_job["id"]]

    states = widget_states(nb)
    bars = [s["state"] for s in states if s["model_name"] == "FloatProgressModel"]
    # mnist, the cell, S2 in dev-team, then the cancelled one
    assert [(b["value"], b["bar_style"]) for b in bars] == [(100.0, "success")] * 3 + [
        (0.0, "warning")
    ]
    htmls = [s["state"].get("value", "") for s in states if s["model_name"] == "HTMLModel"]
    assert sum("FINISHED" in h for h in htmls) == 3
    assert any("2 workers running" in h and "each" in h for h in htmls)
    logs = [s["state"]["value"] for s in states if s["model_name"] == "TextareaModel"]
    assert any("final test accuracy" in v for v in logs)
    charts = [s["state"] for s in states if "_widget_data" in s["state"]]
    losses = [
        t
        for c in charts
        for t in c["_widget_data"]
        if t.get("name") == "loss" and len(t.get("y", [])) > 0
    ]
    assert len(losses) == 2  # the example's and the cell's loss curves
    assert [round(y, 3) for y in losses[1]["y"]] == [1.0, 0.5, 0.333]

    assert text[11].startswith("UsageError: job rejected: plan /project1/qa-team has a gpu limit")
    assert "limit of 2 gpu" in text[11]
    s2 = json.loads(text[13])
    assert (s2["plan"], s2["state"], s2["workers"]["max"]) == ("/project1/dev-team", "FINISHED", 4)

    assert text[15].startswith("CANCELLED True cancel requested"), text[15]

    usage = requests.get(
        f"{hub.api}/usage",
        params={"plan": "/sample-project/training"},
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    if usage.status_code == 404:  # metering (issue 6) not served yet: the widget says so
        assert any("not found" in h or "not running" in h for h in htmls), htmls
    else:
        assert usage.status_code == 200, usage.text
        used = [
            y
            for c in charts
            for t in c["_widget_data"]
            if t.get("name") == "GPU used"
            for y in t.get("y", [])
        ]
        assert max(used) > 0, used  # the jobs' GPUs show as used (averaged over each step)
        table = next(h for h in htmls if "GPU-hours</th>" in h)
        row = table.split("/sample-project/training/user1</td><td>", 1)[1]
        assert float(row.split("<", 1)[0]) > 0  # GPU-hours charged to user1's leaf
