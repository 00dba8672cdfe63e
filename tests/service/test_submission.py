"""Submission bodies, the instance limit range (seed 000's) and the hub config helpers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from extension.scheduler import UNLIMITED, Resources
from extension.service.app import DEFAULT_PLANS, WmlaService
from extension.service.records import InstanceBounds
from extension.service.submission import (
    LimitRange,
    SubmissionError,
    parse_submission,
    resolve_command,
)
from extension.userfs.files import UserFiles
from hub_config import (
    ADMIN_SCOPE,
    custom_scopes,
    roles,
    server_token_scopes,
    services,
)

Mi, Gi = 2**20, 2**30

# seed 000_e3bbfd5fbfa67fae: the LimitRange of type Container
SEED_LIMIT_RANGE = {
    "max": {"cpu": "1", "memory": "1Gi"},
    "min": {"cpu": "100m", "memory": "100Mi"},
    "default": {"cpu": "900m", "memory": "800Mi"},
    "defaultRequest": {"cpu": "200m", "memory": "200Mi"},
    "maxLimitRequestRatio": {"cpu": 2, "memory": 1.5},
}


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    (tmp_path / "user1" / "models" / "mnist").mkdir(parents=True)
    (tmp_path / "user1" / "models" / "mnist" / "main.py").write_text("print('hi')\n")
    (tmp_path / "user2").mkdir()
    (tmp_path / "user2" / "secret.py").write_text("print('secret')\n")
    return tmp_path


def parse(storage: Path, limit_range=None, **body):
    base = {
        "plan": "/sample-project/training",
        "command": {"model_dir": "models/mnist", "model_main": "main.py"},
    }
    sub = parse_submission(
        {**base, **body},
        user="user1",
        storage_root=storage,
        limit_range=LimitRange.from_config(limit_range or SEED_LIMIT_RANGE),
        max_workers=64,
    )
    return resolve_command(sub, UserFiles(None), storage, "user1")  # in-process, as the service


@pytest.mark.parametrize(
    ("body", "per_worker", "limits"),
    [
        # defaulted limits capped at request x ratio: cpu 200m x 2, memory 200Mi x 1.5
        ({}, Resources(0, 200, 200 * Mi), Resources(0, 400, 300 * Mi)),
        ({"resources": {"cpu": "500m"}}, Resources(0, 500, 200 * Mi), Resources(0, 900, 300 * Mi)),
        ({"limits": {"cpu": "400m"}}, Resources(0, 200, 200 * Mi), Resources(0, 400, 300 * Mi)),
        (
            {"resources": {"cpu": "1", "memory": "1Gi"}},
            Resources(0, 1000, Gi),
            Resources(0, 1000, Gi),
        ),
    ],
    ids=["defaults", "cpu-request", "cpu-limit", "at-max"],
)
def test_limit_range_fills_defaults(storage, body, per_worker, limits) -> None:
    sub = parse(storage, **body)
    assert (sub.per_worker, sub.limits) == (per_worker, limits)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"resources": {"cpu": "50m"}}, "below the instance's minimum of 0.1 cpu"),
        ({"resources": {"cpu": "2"}}, "above the instance's maximum of 1 cpu"),
        ({"limits": {"memory": "2Gi"}}, "above the instance's maximum of 1Gi memory"),
        ({"resources": {"cpu": "300m"}, "limits": {"cpu": "900m"}}, "more than 2 times"),
        ({"resources": {"memory": "500Mi"}, "limits": {"memory": "400Mi"}}, "below its request"),
    ],
    ids=["under-min", "over-max", "limit-over-max", "ratio", "limit-below-request"],
)
def test_limit_range_refuses_out_of_range(storage, body, words) -> None:
    with pytest.raises(SubmissionError, match=words):
        parse(storage, **body)


@pytest.mark.parametrize(
    ("workers", "expected"),
    [(3, (3, 3)), ("2", (2, 2)), ("1:4", (1, 4)), ({"min": 2, "max": 8}, (2, 8))],
)
def test_worker_forms(storage, workers, expected) -> None:
    sub = parse(storage, workers=workers)
    assert (sub.min_workers, sub.max_workers) == expected


def test_paths_resolve_inside_the_users_folder(storage) -> None:
    sub = parse(storage, command={"model_dir": "models/mnist", "model_main": "main.py"})
    assert sub.model_main == str(storage.resolve() / "user1" / "models" / "mnist" / "main.py")
    for command in (
        {"model_dir": "..", "model_main": "user2/secret.py"},
        {"model_dir": "models", "model_main": "../../user2/secret.py"},
        {"model_dir": str(storage / "user2"), "model_main": "secret.py"},
    ):
        with pytest.raises(SubmissionError, match="outside your folder"):
            parse(storage, command=command)


def test_limit_range_config_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="unknown entry 'maximum'"):
        LimitRange.from_config({"maximum": {"cpu": 1}})
    with pytest.raises(ValueError, match="number >= 1"):
        LimitRange.from_config({"max_limit_request_ratio": {"cpu": 0.5}})


def test_service_traits_quota_and_limit_range(tmp_path: Path, monkeypatch) -> None:
    config = {
        "WmlaService": {
            "state_dir": str(tmp_path / "state"),
            "storage_root": str(tmp_path / "storage"),
            "quota": {"gpu": 4, "cpu": "2", "memory": "2Gi", "jobs": 3},
            "limit_range": SEED_LIMIT_RANGE,
        }
    }
    monkeypatch.setenv("WMLA_SERVICE_CONFIG", json.dumps(config))
    app = WmlaService()
    app.initialize(["--WmlaService.tick=2"])
    assert app.tick == 2  # the command line over $WMLA_SERVICE_CONFIG
    assert app._bounds == InstanceBounds(Resources(4, 2000, 2 * Gi), 3)
    assert app.limit_range_obj.default_request == {"cpu": 200, "memory": 200 * Mi}
    assert (tmp_path / "storage").is_dir()
    WmlaService.clear_instance()


def test_every_service_trait_has_help_with_a_config_line() -> None:
    for name, trait in WmlaService.class_traits(config=True).items():
        if name in ("log_level", "log_datefmt", "log_format", "logging_config", "show_config",
                    "show_config_json"):  # fmt: skip
            continue
        assert f"c.WmlaService.{name} = " in (trait.help or ""), name


def test_hub_config_helpers(tmp_path: Path) -> None:
    (entry,) = services(port=10123, config={"WmlaService": {"device_layout": "4x8"}})
    assert entry["name"] == "wmla" and entry["url"] == "http://127.0.0.1:10123"
    assert entry["command"][1:] == ["-m", "extension.service"]
    assert json.loads(entry["environment"]["WMLA_SERVICE_CONFIG"]) == {
        "WmlaService": {"device_layout": "4x8"}
    }
    assert ADMIN_SCOPE in custom_scopes()
    user, admin, service = roles(admin_users=["alice"])
    assert "access:services!service=wmla" in user["scopes"] and "self" in user["scopes"]
    assert admin["users"] == ["alice"] and ADMIN_SCOPE in admin["scopes"]
    assert service["services"] == ["wmla"] and "read:servers" in service["scopes"]
    assert "access:services!service=wmla" in server_token_scopes()
    assert set(DEFAULT_PLANS) == {
        "/sample-project",
        "/sample-project/training",
        "/sample-project/inference",
        "/sample-project/notebooks",
    }


def test_quota_caps_the_instance() -> None:
    from extension.scheduler import Instance, Node

    inst = Instance((Node("local", Resources(4, 2000, 8 * Gi)),), Resources(2, UNLIMITED, Gi), 3)
    assert inst.capacity == Resources(2, 2000, Gi)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--WmlaService.limit_range=maximum=1"], "limit_range: unknown entry"),
        (["--WmlaService.quota=gpu=lots"], "quota: gpu 'lots' is not a quantity"),
        (["--WmlaService.quota=jobs=0"], "jobs must be a whole number >= 1"),
    ],
)
def test_bad_service_config_exits_with_a_message(tmp_path: Path, argv, words) -> None:
    app = WmlaService()
    base = [f"--WmlaService.state_dir={tmp_path}", f"--WmlaService.storage_root={tmp_path}"]
    with pytest.raises(SystemExit, match=words):
        app.initialize(base + argv)
    WmlaService.clear_instance()


def test_bad_device_layout_exits_with_a_message(tmp_path: Path) -> None:
    app = WmlaService()
    base = [f"--WmlaService.state_dir={tmp_path}", f"--WmlaService.storage_root={tmp_path}"]
    app.initialize([*base, "--WmlaService.device_layout=four"])
    with pytest.raises(SystemExit, match="device_layout: .* write it like 1x4"):
        app.make_backend(lambda event: None)
    WmlaService.clear_instance()


@pytest.mark.parametrize(
    ("body", "name"),
    [
        ({}, "mnist-main"),
        ({"name": ""}, "mnist-main"),
        ({"name": "  "}, "mnist-main"),
        ({"name": "my run"}, "my run"),
        ({"command": {"model_dir": ".", "model_main": "train.py"}}, "train"),
        ({"command": {"model_dir": "models", "model_main": "mnist/main.py"}}, "mnist-main"),
        ({"command": {"model_dir": "odd+dir", "model_main": "run v2.py"}}, "odd_dir-run v2"),
        ({"command": {"model_dir": "d" * 120, "model_main": "main.py"}}, "d" * 100),
    ],
    ids=["none", "empty", "blank", "given", "top-level", "nested", "odd-chars", "long"],
)
def test_a_job_without_a_name_is_named_after_its_script(storage, body, name) -> None:
    (storage / "user1" / "train.py").write_text("print('hi')\n")
    (storage / "user1" / "odd+dir").mkdir()
    (storage / "user1" / "odd+dir" / "run v2.py").write_text("print('hi')\n")
    (storage / "user1" / ("d" * 120)).mkdir()
    (storage / "user1" / ("d" * 120) / "main.py").write_text("print('hi')\n")
    sub = parse(storage, **body)
    assert sub.name == name
    assert re.fullmatch(r"[A-Za-z0-9 ._-]{1,100}", sub.name)


def test_a_notebook_without_a_name_is_called_notebook(storage) -> None:
    body = {"kind": "notebook", "command": None, "preemptible": False}
    assert parse(storage, **body).name == "notebook"
    assert parse(storage, **body, name="notebook lab").name == "notebook lab"


def test_a_bad_name_says_what_is_allowed(storage) -> None:
    with pytest.raises(SubmissionError, match=r"got 'a/b'; or leave it out"):
        parse(storage, name="a/b")
