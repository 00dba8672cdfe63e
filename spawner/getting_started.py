"""What a new user finds in their folder on their first spawn: a getting-started notebook and the
example's code, so that `--model-dir models/pytorch_mnist` names something real.

The spawner writes these once (a marker file remembers it), as the user's own account, and
never over a file that exists: what the user changed or deleted stays so.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

PROJECT = Path(__file__).resolve().parents[1]
EXAMPLE = PROJECT / "examples" / "pytorch_mnist" / "main.py"
NOTEBOOK = "getting-started.ipynb"
MODEL_DIR = "models/pytorch_mnist"
MARKER = ".wmla/getting-started"  # written once the files were offered


def terminal_command(plan: str) -> str:
    """The notebook's training run as a terminal command, exactly as a user copies it (the
    framework first: dlicmd's order, which ``wmla exec-start`` requires)."""
    return (
        f"wmla exec-start PyTorch --plan {plan} --model-dir {MODEL_DIR} --model-main main.py "
        "--wait -- --epochs 3"
    )


def getting_started_notebook(plan: str = "/sample-project/training") -> str:
    """The notebook's JSON: the user's plans, a 2-worker training run of the example with its
    job monitor, the user's jobs and their usage."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    cells = [
        md(
            "# Getting started with wmla\n\n"
            "This folder is yours alone: your notebooks and your training jobs see it, nobody "
            "else's. GPUs come from **resource plans**: each plan has a share of the machine, "
            "and idle GPUs of other plans are lent to yours until their owners need them.\n\n"
            "The `%wmla_*` magics are already loaded. The plans you may use:"
        ),
        code("%wmla_plans"),
        md(
            "## Train on 2 workers\n\n"
            f"`{MODEL_DIR}/main.py` is a small PyTorch DDP example (digits, a few epochs). "
            "`%wmla_train` submits it as one gang: both workers start together or not at all. "
            "The job monitor below shows its state, why it waits if it must, its progress and "
            "a live chart of what the script reports."
        ),
        code(
            f"%wmla_train --plan {plan} --workers 2 --model-dir {MODEL_DIR} "
            "--model-main main.py -- --epochs 3"
        ),
        md("## Your jobs and their logs"),
        code("%wmla_jobs"),
        code("%wmla_logs {wmla_last_job['id']} --tail 5"),
        md(
            "## What you used\n\n"
            "Requested and used GPUs and CPUs of your plans over time (metering)."
        ),
        code("%wmla_usage"),
        md(
            "## From a terminal\n\n"
            "File > New > Terminal, then `wmla exec-get` lists your jobs and "
            f"`{terminal_command(plan)}` runs one; the hub's address and your token are "
            "already known there."
        ),
    ]
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    return nbformat.writes(notebook)


def starter_files() -> dict[str, str]:
    """{path inside the user's folder: text} of everything a first spawn offers."""
    return {
        NOTEBOOK: getting_started_notebook(),
        f"{MODEL_DIR}/main.py": EXAMPLE.read_text(encoding="utf-8"),
    }
