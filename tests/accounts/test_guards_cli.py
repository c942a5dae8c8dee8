"""`trainyard guards` and `trainyard guards set` against the real web
server (uvicorn on the test database): an admin sets the workspace's
default guards, everyone reads them, a member is refused, a bad value is
refused naming its key, and the next run's plan (`run --dry-run`) and
`trainyard show` name the guard it got (docs/WORKFLOWS.md, "Guards")."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from trainyard.cli import cli

from backend.accounts.models import Workspace
from tests.support.fixtures import Person
from tests.support.web import WebServers

pytestmark = pytest.mark.django_db(transaction=True)

WORKFLOWS = """workflows:
  - name: train
    provider: bash
    commands: [python train.py]
  - name: quiet
    provider: bash
    commands: [python train.py]
    stall: off
"""
STALL = "stall: {timeout: 20m, action: restart}: restarted from its last checkpoint after 20m without output"
IDLE = "utilization_policy: {min_gpu_utilization: 10, time_window: 30m}: stopped when every GPU stays below 10% for 30m"


@pytest.fixture
def server(web_server: WebServers) -> Any:
    return web_server.start()


def _as(person: Person, server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_URL", server.url)
    monkeypatch.setenv("TRAINYARD_TOKEN", person.token)
    monkeypatch.setenv("TRAINYARD_WORKSPACE", "acme")


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _repo(path: Path) -> Path:
    (path / ".trainyard").mkdir(parents=True)
    (path / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    (path / "train.py").write_text("print('training')\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=T", *args], cwd=path, check=True)
    return path


def test_an_admin_sets_the_defaults_and_everyone_reads_them(
    team: Workspace, owner: Person, viewer: Person, server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _as(owner, server, monkeypatch)
    shown = _invoke("guards")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines() == ["stall: none", "utilization_policy: none"]
    assert "Runs of acme get these where their workflow sets no key of its own" in shown.stderr

    set_both = _invoke("guards", "set", "--stall", "20m:restart", "--utilization", "10%:30m")
    assert set_both.exit_code == 0, set_both.output
    assert set_both.stdout.splitlines() == [STALL, IDLE]
    assert "Default guards of acme set: runs submitted from now on get them" in set_both.stderr

    stall_only = _invoke("guards", "set", "--no-utilization")  # the stall default is kept
    assert stall_only.stdout.splitlines() == [STALL, "utilization_policy: none"]
    back = _invoke("guards", "set", "--utilization", "10:30m", "--stall", "1h")
    assert back.stdout.splitlines() == [
        "stall: {timeout: 1h, action: stop}: stopped after 1h without output",
        IDLE,
    ]

    _as(viewer, server, monkeypatch)
    assert json.loads(_invoke("guards", "--json").stdout) == {
        "stall": {"timeout": "1h", "action": "stop"},
        "utilization_policy": {"min_gpu_utilization": 10, "time_window": "30m"},
    }
    refused = _invoke("guards", "set", "--no-stall")
    assert refused.exit_code == 1
    assert refused.stderr == "error: Your role in acme is viewer: it cannot make changes.\n"
    team.refresh_from_db()
    assert team.guard_defaults["stall"] == {"timeout": "1h", "action": "stop"}


def test_a_bad_value_is_refused_naming_its_key_and_a_bad_shape_never_reaches_the_server(
    team: Workspace, owner: Person, member: Person, server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _as(owner, server, monkeypatch)
    bad = _invoke("guards", "set", "--stall", "soon")
    assert bad.exit_code == 1
    assert bad.stderr == (
        "error: Guard defaults not changed: stall.timeout: expected a duration such as 30m, 2h or 1d (or off), "
        "got 'soon'\n"
    )
    over = _invoke("guards", "set", "--utilization", "150%:30m")
    assert "utilization_policy.min_gpu_utilization: must be at most 100, got the number 150" in over.stderr
    for args, says in [
        (["--stall", "20m:kill"], "the action is stop or restart, got 'kill'"),
        (["--utilization", "ten:30m"], "expected PERCENT%:WINDOW such as 10%:30m, got 'ten:30m'"),
        (["--stall", "20m", "--no-stall"], "give --stall or --no-stall, not both"),
        ([], "name a guard to change"),
    ]:
        result = _invoke("guards", "set", *args)
        assert (result.exit_code, says in result.stderr) == (2, True), result.stderr
    team.refresh_from_db()
    assert team.guard_defaults == {}

    _as(member, server, monkeypatch)
    refused = _invoke("guards", "set", "--stall", "20m")
    assert refused.stderr == "error: Your role in acme is member: only admins can make this change.\n"


def test_a_run_submitted_after_the_change_gets_the_default_and_the_plan_and_show_name_it(
    team: Workspace, owner: Person, server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _as(owner, server, monkeypatch)
    monkeypatch.chdir(_repo(tmp_path / "repo"))
    plain = _invoke("run", "train", "--dry-run")
    assert plain.exit_code == 0, plain.output
    assert "guard:" not in plain.stdout

    assert _invoke("guards", "set", "--stall", "20m:restart").exit_code == 0

    plan = _invoke("run", "train", "--dry-run")
    assert plan.exit_code == 0, plan.output
    assert "   guard: stall: restarted from its last checkpoint after 20m without output" in plan.stdout
    off = _invoke("run", "quiet", "--dry-run")  # the workflow's `stall: off` wins
    assert off.exit_code == 0 and "guard:" not in off.stdout

    submitted = _invoke("run", "train", "-d")
    assert submitted.exit_code == 0, submitted.output
    name = submitted.stdout.strip()
    shown = _invoke("show", name)
    assert shown.exit_code == 0, shown.output
    assert "  train: stall: restarted from its last checkpoint after 20m without output" in shown.stdout
    run = json.loads(_invoke("show", name, "--json").stdout)
    assert run["jobs"][0]["placement"]["stall"] == {"timeout": 1200, "action": "restart"}
