"""``%wmla_train`` / ``wmla exec-start`` options as tables: what each line becomes, and the
message each bad line gets. Paths: a model folder outside the user's folder is refused, and a
``%%wmla_train`` cell is written as the script inside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from extension.magics.core import CELL_FOLDER, resolve_code
from extension.magics.options import OptionsError, inside_folder, parse_train, submission_body

CODE = "--model-dir models/mnist --model-main main.py"


@pytest.mark.parametrize(
    "line, body",
    [
        pytest.param(
            f"--plan /sample-project/training {CODE}",
            {"plan": "/sample-project/training", "workers": 1},
            id="defaults-one-worker",
        ),
        pytest.param(
            f"--consumer /project1/dev-team --workerDeviceNum 4 {CODE} -- --batch-size 64 "
            "--epochs 4",
            {"plan": "/project1/dev-team", "workers": 4,
             "args": ["--batch-size", "64", "--epochs", "4"]},
            id="dlicmd-spellings-and-script-args",
        ),
        pytest.param(
            f"--plan /p/ --workers 2 --gpus-per-worker 0 --cpus 500m --memory 1Gi {CODE}",
            {"plan": "/p", "workers": 2,
             "resources": {"gpu": 0, "cpu": "500m", "memory": "1Gi"}},
            id="per-worker-resources",
        ),
        pytest.param(
            f"--plan /p --elastic 1:4 --priority -3 --name 'my run' --env A=1 --env B=x=y {CODE}",
            {"plan": "/p", "workers": {"min": 1, "max": 4}, "priority": -3, "name": "my run",
             "env": {"A": "1", "B": "x=y"}},
            id="elastic-priority-name-env",
        ),
        pytest.param(
            f"--plan /p --workerMemory 2Gi --workerCpu 2 {CODE} --wait -- --plan /not/mine",
            {"plan": "/p", "workers": 1, "resources": {"cpu": "2", "memory": "2Gi"},
             "args": ["--plan", "/not/mine"]},
            id="after-double-dash-everything-is-the-scripts",
        ),
    ],
)  # fmt: skip
def test_good_lines_become_the_service_body(line: str, body: dict) -> None:
    opts = parse_train(line)
    got = submission_body(opts, "models/mnist", "main.py")
    expected = {k: v for k, v in body.items() if k != "args"}
    expected["command"] = {
        "model_dir": "models/mnist",
        "model_main": "main.py",
        "args": body.get("args", []),
    }
    assert got == expected
    assert opts.wait == ("--wait" in line.split(" -- ")[0])


@pytest.mark.parametrize(
    "line, message",
    [
        pytest.param("--workers 0", "--workers takes a whole number >= 1, got '0'", id="zero"),
        pytest.param("--workers two", "got 'two'", id="not-a-number"),
        pytest.param("--elastic 4:2", "MAX at least MIN", id="elastic-backwards"),
        pytest.param("--elastic 4", "--elastic takes MIN:MAX such as 1:4", id="elastic-form"),
        pytest.param("--workers 2 --elastic 1:2", "not both", id="workers-and-elastic"),
        pytest.param("--cpus lots", "cpu 'lots' is not a quantity", id="bad-cpu"),
        pytest.param("--memory 2GB", "memory '2GB' is not a quantity", id="bad-memory"),
        pytest.param("--gpus-per-worker 0.5", "whole number of devices", id="half-gpu"),
        pytest.param("--priority high", "--priority takes a whole number", id="priority"),
        pytest.param("--plan dev-team", "not a plan path", id="relative-plan"),
        pytest.param("--epochs 4", "unknown option or stray word '--epochs'", id="script-flag"),
        pytest.param("--epochs 4", "go after `--`", id="hint-double-dash"),
        pytest.param("main.py", "stray word 'main.py'", id="stray-word"),
        pytest.param("--env 1A=2", "--env takes NAME=VALUE", id="bad-env"),
        pytest.param("--name 'a/b'", "--name", id="bad-name"),
        pytest.param("--plan '/p", "unbalanced quotes", id="quotes"),
        pytest.param("--wor 2", "unknown option", id="no-abbreviations"),
    ],
)
def test_bad_lines_say_what_is_wrong(line: str, message: str) -> None:
    with pytest.raises(OptionsError) as err:
        parse_train(line)
    assert message in str(err.value)


def test_a_plan_is_required_and_the_message_says_how_to_find_one() -> None:
    with pytest.raises(OptionsError, match="--plan .*alias --consumer.*wmla_plans"):
        submission_body(parse_train(CODE), "models/mnist", "main.py")


def test_the_cli_takes_the_framework_first() -> None:
    opts = parse_train(["pytorch", "--consumer", "/p", "--json"], framework=True, cli=True)
    assert opts.framework == "PyTorch" and opts.json
    with pytest.raises(OptionsError, match="framework 'TensorFlow' is not supported"):
        parse_train(["TensorFlow", "--consumer", "/p"], framework=True, cli=True)
    with pytest.raises(OptionsError, match="unknown option"):
        parse_train(["--json"])  # only the CLI prints JSON


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "alice"
    (root / "models" / "mnist").mkdir(parents=True)
    (root / "models" / "mnist" / "main.py").write_text("print('hi')\n")
    other = tmp_path / "bob"
    other.mkdir()
    (root / "escape").symlink_to(other)
    return root, other


@pytest.mark.parametrize(
    "path, cwd, expected",
    [
        pytest.param("models/mnist", None, "models/mnist", id="relative"),
        pytest.param("mnist", "models", "models/mnist", id="relative-to-the-notebook-folder"),
        pytest.param("{root}/models/mnist", None, "models/mnist", id="absolute-inside"),
        pytest.param(".", None, ".", id="the-folder-itself"),
        pytest.param("models/../models/mnist", None, "models/mnist", id="dots-that-stay-in"),
    ],
)
def test_paths_inside_the_users_folder(folders, path: str, cwd: str | None, expected: str) -> None:
    root, _ = folders
    where = root / cwd if cwd else None
    assert inside_folder(root, path.format(root=root), cwd=where) == expected


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("..", id="parent"),
        pytest.param("../bob", id="sibling"),
        pytest.param("/etc", id="absolute-elsewhere"),
        pytest.param("escape", id="symlink-out"),
        pytest.param("models/../../bob", id="dots-that-leave"),
        pytest.param("", id="empty"),
    ],
)
def test_paths_that_escape_are_refused(folders, path: str) -> None:
    root, _ = folders
    with pytest.raises(OptionsError) as err:
        inside_folder(root, path)
    assert "your folder" in str(err.value)


def test_a_cell_is_saved_as_the_script_in_the_users_folder(folders) -> None:
    root, other = folders
    opts = parse_train("--plan /p --name run1")
    model_dir, main = resolve_code(opts, root, root, cell="print('cell')\n")
    assert (model_dir, main) == (f"{CELL_FOLDER}/run1", "main.py")
    assert (root / model_dir / main).read_text() == "print('cell')\n"
    opts = parse_train("--plan /p --model-dir models/mnist --model-main train.py")
    assert resolve_code(opts, root, root, cell="x = 1\n") == ("models/mnist", "train.py")
    assert (root / "models" / "mnist" / "train.py").read_text() == "x = 1\n"


@pytest.mark.parametrize(
    "line, message",
    [
        pytest.param("--plan /p --model-dir escape", "outside your folder", id="dir-escapes"),
        pytest.param("--plan /p --model-dir ../bob", "outside your folder", id="dir-dots"),
        pytest.param(
            "--plan /p --model-dir models --model-main ../../bob/x.py", "outside", id="main-dots"
        ),
    ],
)
def test_a_cell_that_would_land_outside_writes_nothing(folders, line: str, message: str) -> None:
    root, other = folders
    before = sorted(os.walk(other))
    with pytest.raises(OptionsError, match=message):
        resolve_code(parse_train(line), root, root, cell="print('x')\n")
    assert sorted(os.walk(other)) == before
    assert not (root / CELL_FOLDER).exists()


@pytest.mark.parametrize(
    "line, expected",
    [
        pytest.param("--model-dir models/mnist --model-main main.py", ("models/mnist", "main.py"),
                     id="dir-and-main"),
        pytest.param("--model-main models/mnist/main.py", ("models/mnist", "main.py"),
                     id="main-with-folder"),
    ],
)  # fmt: skip
def test_script_lines_resolve_without_writing(folders, line: str, expected) -> None:
    root, _ = folders
    assert resolve_code(parse_train(line), root, root) == expected


def test_script_lines_need_code() -> None:
    with pytest.raises(OptionsError, match="say what to run"):
        resolve_code(parse_train("--plan /p"), Path("/tmp"), Path("/tmp"))
    with pytest.raises(OptionsError, match="--model-main is required"):
        resolve_code(parse_train("--plan /p --model-dir m"), Path("/tmp"), Path("/tmp"))
