"""Real torch.distributed (gloo) runs of examples/pytorch_mnist through the local backend."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

from extension.runtime import metrics

TARGET = 0.9  # the accuracy the example states it reaches


def build_model(example):  # noqa: ANN001, ANN201 - the example's own model definition
    spec = importlib.util.spec_from_file_location("pytorch_mnist_main", example)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_model()


@pytest.mark.parametrize(
    "workers, batch_size, epochs",
    [pytest.param(2, 32, 5, id="2-workers"), pytest.param(4, 16, 4, id="4-workers")],
)
async def test_the_example_trains_with_ddp_workers_to_the_stated_accuracy(
    local_rig, workers: int, batch_size: int, epochs: int
) -> None:
    backend = local_rig.backend()
    command = ["python", str(local_rig.example), "--epochs", str(epochs)]
    command += ["--batch-size", str(batch_size), "--target-accuracy", str(TARGET)]
    spec = local_rig.spec("mnist", command)
    await backend.start(spec, ("local",) * workers)
    event = await local_rig.events.wait("mnist", "finished", "failed")
    assert event.kind == "finished", event.message

    workdir = local_rig.workdir("mnist")
    result = json.loads((workdir / "result.json").read_text())
    assert result["test_accuracy"] >= TARGET and result["world_size"] == workers
    model = build_model(local_rig.example)
    model.load_state_dict(torch.load(workdir / "model.pt", weights_only=True))
    lines = metrics.read(str(workdir / "metrics.jsonl"))
    epochs_run = epochs
    epochs = [line for line in lines if "test_accuracy" in line]
    assert [line["epoch"] for line in epochs] == list(range(1, epochs_run + 1))
    assert epochs[-1]["test_accuracy"] >= TARGET
    losses = [line for line in lines if "loss" in line]
    assert [line["step"] for line in losses] == list(range(1, result["steps"] + 1))
    assert all(line["rank"] == 0 and line["world_size"] == workers for line in losses)
    # DDP really split the data: 1437 training images / (workers x batch) steps an epoch
    shard = math.ceil(1437 / workers)  # DistributedSampler pads every rank to the same share
    per_epoch = math.ceil(shard / batch_size)
    assert result["steps"] == epochs_run * per_epoch
    assert (workdir / "checkpoints" / "latest.pt").exists()
    assert "final test accuracy" in backend.logs("mnist", worker=0)
    assert backend.devices_in_use() == {}


async def test_the_example_resumes_across_resizes_two_one_two(local_rig) -> None:
    backend = local_rig.backend()
    command = ["python", str(local_rig.example), "--epochs", "5", "--step-delay", "0.03"]
    spec = local_rig.spec("elastic-mnist", command)
    workdir = local_rig.workdir("elastic-mnist")

    def losses() -> list[dict]:
        return [x for x in metrics.read(str(workdir / "metrics.jsonl")) if "loss" in x]

    await backend.start(spec, ("local", "local"))
    for size, after in ((1, 30), (2, 70)):
        await local_rig.wait_until(lambda n=after: len(losses()) >= n, f"{after} steps")
        await backend.resize(spec, ("local",) * size, grace=60)
        assert local_rig.events.of("elastic-mnist")[-1].kind == "resized"
    event = await local_rig.events.wait("elastic-mnist", "finished", "failed")
    assert event.kind == "finished", event.message

    lines = metrics.read(str(workdir / "metrics.jsonl"))
    steps = [x["step"] for x in losses()]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)  # continued, never restarted
    worlds = [x["world_size"] for x in losses()]
    changes = [w for i, w in enumerate(worlds) if i == 0 or worlds[i - 1] != w]
    assert changes == [2, 1, 2]
    epochs = [x["epoch"] for x in lines if "test_accuracy" in x]
    assert epochs == sorted(epochs) and epochs[-1] == 5  # the epoch counter went on to the end
    result = json.loads((workdir / "result.json").read_text())
    assert result["test_accuracy"] >= TARGET
    log0 = backend.logs("elastic-mnist", worker=0)
    assert log0.count("resuming at epoch") == 2
    assert log0.count("SIGTERM at step") == 2
    assert local_rig.events.kinds("elastic-mnist") == ["running", "resized", "resized", "finished"]
