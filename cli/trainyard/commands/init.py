"""``trainyard init``: a new project's first workflows file, and a training
script for it, written into the repo; nothing already there is replaced."""

from __future__ import annotations

from pathlib import Path

import click
from trainyard_spec import WorkflowFileError, find_workflows_files
from trainyard_spec.workflows import WORKFLOW_FILES

from ..code import find_workspace
from . import common

WORKFLOWS_FILE = WORKFLOW_FILES[0]
SCRIPT = "train.py"

STARTER_WORKFLOWS = r"""# Trainyard workflows: `trainyard run NAME` runs one, `trainyard workflows`
# lists them. Every key is in docs/WORKFLOWS.md of the Trainyard repository.
workflows:
  - name: hello
    help: Prints the machine and Python it ran on
    provider: bash
    commands:
      - echo "hello from $(hostname), python $(python3 -c 'import platform; print(platform.python_version())')"

  - name: train
    help: Runs train.py; its loss is the run's metric, ./model its artifact
    provider: python
    script: train.py
    # requirements: requirements.txt   # built once into an environment, reused by later runs
    env:
      EPOCHS: "20"
    # train.py prints "epoch   3/20  loss 0.12345" after every epoch: the
    # epoch is the step, so a resumed job continues the same loss curve.
    metrics:
      - name: loss
        regex: 'epoch +(?P<step>\d+)/\d+ +loss (?P<value>[0-9.]+)'
    artifacts:
      - ./model                         # uploaded when the job succeeds
    checkpoint: ./model                 # synced while it runs, restored when it resumes
    resources:
      cpu: 1
      memory: 256MB
      # gpu: 1                          # one GPU of any kind; or gpu: T4, gpu: A100:2
"""

STARTER_SCRIPT = '''"""Fits y = a*x + b by gradient descent on points it makes; writes ./model.

Replace the model with yours and keep the shape: read EPOCHS from the
environment, print "epoch N/EPOCHS  loss L" (the workflow's metric), and
write the state under ./model after every epoch, atomically, so a job that
resumes on another machine (TRAINYARD_RESUMED=1) continues from it.
"""

import json
import os
import pathlib
import random

epochs = int(os.environ.get("EPOCHS", "20"))
rng = random.Random(0)
points = [(x, 3.0 * x + 1.0 + rng.gauss(0, 0.1)) for x in (i / 100 for i in range(100))]

model = pathlib.Path("model")
model.mkdir(exist_ok=True)
state_file = model / "state.json"
state = json.loads(state_file.read_text()) if state_file.exists() else {"epoch": 0, "a": 0.0, "b": 0.0}
if state["epoch"]:
    print(f"resuming at epoch {state['epoch']}", flush=True)

while state["epoch"] < epochs:
    ga = sum(2 * (state["a"] * x + state["b"] - y) * x for x, y in points) / len(points)
    gb = sum(2 * (state["a"] * x + state["b"] - y) for x, y in points) / len(points)
    state["a"] -= 0.5 * ga
    state["b"] -= 0.5 * gb
    state["epoch"] += 1
    loss = sum((state["a"] * x + state["b"] - y) ** 2 for x, y in points) / len(points)
    print(f"epoch {state['epoch']:3d}/{epochs}  loss {loss:.5f}", flush=True)
    tmp = state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(state_file)  # atomic: a checkpoint sync never sees half a file

(model / "weights.json").write_text(json.dumps({"a": state["a"], "b": state["b"]}, indent=2))
print(f"done: a={state['a']:.3f} b={state['b']:.3f}")
'''


@click.command()
def init() -> None:
    """Start a project: write .trainyard/workflows.yaml (workflows `hello`
    and `train`) and train.py at the top of the repo.

    Refuses when the repo already has a workflows file; an existing train.py
    is kept as it is. Then: `trainyard run hello`.
    """
    root = find_workspace(Path.cwd()).root
    existing = _workflows_files(root)
    if existing:
        raise common.CliError(
            f"{', '.join(existing)} already exists: trainyard init writes a new project's first workflows file "
            "and never replaces one; add workflows to it, or see them with `trainyard workflows`"
        )
    path = root / WORKFLOWS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    _create(path, STARTER_WORKFLOWS)
    wrote = [WORKFLOWS_FILE]
    script = root / SCRIPT
    if script.exists():
        click.echo(f"Kept your {SCRIPT}: the train workflow runs it.", err=True)
    else:
        _create(script, STARTER_SCRIPT)
        wrote.append(SCRIPT)
    click.echo(f"Wrote {' and '.join(wrote)} in {root} (workflows: hello, train).")
    click.echo("Next:")
    click.echo('  trainyard run hello    # prints "hello from <the machine>"')
    click.echo("  trainyard run train    # runs train.py: its loss per epoch, then ./model as the run's artifact")


def _workflows_files(root: Path) -> list[str]:
    """The workflows files the repo already has, as paths relative to it."""
    try:
        return [p.relative_to(root).as_posix() for p in find_workflows_files(root)]
    except WorkflowFileError:
        return []


def _create(path: Path, text: str) -> None:
    """Write a new file; one that appeared meanwhile is an error, never replaced."""
    try:
        with open(path, "x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        raise common.CliError(f"{path} already exists: trainyard init never replaces a file") from None
