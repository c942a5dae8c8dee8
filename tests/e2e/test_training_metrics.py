"""Training metrics end to end (docs/METRICS.md): tiny-train's ``train``
under a workflow's ``metrics:`` pattern, the same values appended to
``$TRAINYARD_METRICS_FILE``, and an attempt that fails and is retried from its
checkpoint continuing one ``loss`` curve, each read back through the metrics
API as a real local runner read them and the real server stored them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import User, commit_all, make_repo, run_name_of
from tests.support.stack import Stack

WORKFLOWS = r"""
  - name: train-logged
    provider: bash
    deps: [{workflow: download-base-model}]
    env: {STEPS: "8"}
    commands:
      - python train.py
    metrics: [{name: loss, regex: "loss ([0-9.]+)"}]

  - name: train-filed
    provider: bash
    deps: [{workflow: download-base-model}]
    env: {STEPS: "8"}
    commands:
      - python train.py | python report.py

  - name: train-resumed
    provider: bash
    deps: [{workflow: download-base-model}]
    checkpoint: ./checkpoint
    retry: {on_events: [error], limit: 2}
    commands:
      - STEPS=3 python train.py
      - if [ "$TRAINYARD_ATTEMPT" = 1 ]; then echo "failing after step 3"; exit 1; fi
      - STEPS=6 python train.py
    metrics: [{name: loss, regex: 'step (?P<step>\d+)/\d+ loss (?P<value>[0-9.]+)'}]
"""
# Passes train.py's output on and appends each step's loss to the metrics file.
REPORT = """import json, os, re, sys
with open(os.environ["TRAINYARD_METRICS_FILE"], "a") as f:
    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        found = re.match(r"step (\\d+)/\\d+ loss ([0-9.]+)", line)
        if found:
            f.write(json.dumps({"step": int(found[1]), "loss": float(found[2])}) + "\\n")
            f.flush()
"""
LOSS_LINE = re.compile(r"step (\d+)/\d+ loss ([0-9.]+)")


@pytest.fixture(scope="module")
def tamsin(stack: Stack) -> User:
    return User("tamsin", stack.issue_token("tamsin"), stack)


@pytest.fixture
def trained(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "tiny-train")
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text() + WORKFLOWS)
    (repo / "report.py").write_text(REPORT)
    commit_all(repo, "training metrics")
    return repo


def _run(user: User, repo: Path, workflow: str) -> tuple[str, dict[str, Any]]:
    name = run_name_of(user.cli(repo, "run", workflow, "-d", "--backend", "local"))
    run = user.wait(name, lambda r: r["status"] in {"succeeded", "failed", "stopped"}, timeout=180)
    assert run["status"] == "succeeded", run
    return name, next(j for j in run["jobs"] if j["name"] == workflow)


def _printed_losses(user: User, repo: Path, run: str) -> list[tuple[int, float]]:
    log = user.cli(repo, "logs", run)
    assert log.returncode == 0, log.stderr
    return [(int(step), float(loss)) for step, loss in LOSS_LINE.findall(log.stdout)]


def _loss(user: User, run: str, job: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job's ``loss`` series and the answer it came in."""
    answer = user.api(
        "GET", f"/api/v1/workspaces/{user.workspace}/runs/{run}/metrics/series/", params={"job": job, "names": "loss"}
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    (series,) = body["series"]
    assert (series["name"], series["kind"]) == ("loss", "training")
    return series, body


def test_a_metrics_pattern_reads_one_value_per_step_off_tiny_trains_log(tamsin: User, trained: Path) -> None:
    name, _ = _run(tamsin, trained, "train-logged")
    printed = _printed_losses(tamsin, trained, name)
    assert [step for step, _ in printed] == list(range(1, 9))
    series, _ = _loss(tamsin, name, "train-logged")
    assert series["x"] == "time"  # "loss ([0-9.]+)" has no step group: keyed by when the line came
    assert series["points"]["y"] == pytest.approx([loss for _, loss in printed], rel=1e-6)
    assert series["points"]["attempt"] == [1] * 8


def test_the_same_values_appended_to_the_metrics_file(tamsin: User, trained: Path) -> None:
    name, _ = _run(tamsin, trained, "train-filed")
    printed = _printed_losses(tamsin, trained, name)
    series, _ = _loss(tamsin, name, "train-filed")
    assert series["x"] == "step"
    assert series["points"]["x"] == [step for step, _ in printed] == list(range(1, 9))
    assert series["points"]["y"] == pytest.approx([loss for _, loss in printed], rel=1e-6)
    summary = tamsin.api("GET", f"/api/v1/workspaces/{tamsin.workspace}/runs/{name}/metrics/").json()
    filed = next(j for j in summary["jobs"] if j["job"] == "train-filed")
    assert (filed["training"], filed["malformed"], filed["dropped"]) == (["loss"], 0, 0)


def test_an_attempt_retried_from_its_checkpoint_continues_one_loss_curve(tamsin: User, trained: Path) -> None:
    name, job = _run(tamsin, trained, "train-resumed")
    first, second = job["attempts"]
    assert first["reason"] == "error" and second["restored_checkpoint"] is not None
    printed = _printed_losses(tamsin, trained, name)
    assert [step for step, _ in printed] == [1, 2, 3, 4, 5, 6]  # attempt 2 resumed at step 3
    series, body = _loss(tamsin, name, "train-resumed")
    assert series["x"] == "step"
    assert series["points"]["x"] == [1, 2, 3, 4, 5, 6]
    assert series["points"]["y"] == pytest.approx([loss for _, loss in printed], rel=1e-6)
    assert series["points"]["attempt"] == [1, 1, 1, 2, 2, 2]  # where the curve crosses the boundary
    assert [a["number"] for a in body["attempts"]] == [1, 2]
    assert body["attempts"][0]["finished_at"] <= body["attempts"][1]["started_at"]
