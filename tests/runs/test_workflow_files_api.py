"""Runs of dstack 0.x-style repos through the API: several workflows files,
bare env names whose values the CLI sends, ``-- args`` and variables; the
server plans from what it is sent and never from its own environment."""

from __future__ import annotations

from typing import Any

import pytest

from backend.runs.lifecycle.privateenv import private_inputs_of
from backend.runs.models import Run
from backend.runs.services.runs import run_rerun
from tests.support.fixtures import Person

BASE = "/api/v1/workspaces/acme"
DATA = {
    "path": ".dstack/workflows/data.yaml",
    "text": "workflows:\n  - name: prepare\n    provider: bash\n    commands: [python prepare.py]\n"
    "    artifacts: [./data]\n",
}
TRAIN = {
    "path": ".dstack/workflows/train.yaml",
    "text": "workflows:\n"
    "  - name: train\n"
    "    help: Trains the model\n"
    "    provider: bash\n"
    "    deps: [{workflow: prepare}]\n"
    "    env: [HF_TOKEN, EPOCHS=3]\n"
    "    commands: ['python train.py ${{ run.args }} --lr ${{ variables.lr }}']\n"
    "  - name: broken\n"
    "    provider: bash\n"
    "    comands: [echo]\n",
}
CODE = {"kind": "git", "repo_url": "https://example.com/acme/models.git", "commit": "c" * 40}


def body(**fields: Any) -> dict[str, Any]:
    return {
        "workflow": "train",
        "workflows_files": [DATA, TRAIN],
        "code": CODE,
        "inherited_env": {"HF_TOKEN": "hf_abc"},
        "run_args": ["--epochs", "it's 3"],
        "variables": {"train": {"lr": "0.1"}},
        **fields,
    }


def test_a_run_is_planned_from_every_file_it_is_sent_and_keeps_them(owner: Person):
    answer = owner.client().post(f"{BASE}/runs/", body(), format="json")
    assert answer.status_code == 201, answer.json()
    run = Run.objects.get(name=answer.json()["name"])
    jobs = {job.name: job for job in run.jobs.all()}
    assert sorted(jobs) == ["prepare", "train"]
    # The shell's value is private: encrypted on the run, a digest in the spec (tests/runs/test_private_env.py).
    assert jobs["train"].spec["env"] == {"EPOCHS": "3"} and set(jobs["train"].spec["private_env"]) == {"HF_TOKEN"}
    assert private_inputs_of(run).jobs["train"] == {"HF_TOKEN": "hf_abc"}
    assert jobs["train"].spec["commands"] == ["python train.py --epochs 'it'\"'\"'s 3' --lr 0.1"]
    assert [job.name for job in jobs["train"].needs.all()] == ["prepare"]
    assert (run.workflows_files, private_inputs_of(run).inherited_env, run.run_args, run.variables) == (
        [DATA, TRAIN],
        {"HF_TOKEN": "hf_abc"},
        ["--epochs", "it's 3"],
        {"train": {"lr": "0.1"}},
    )
    assert (run.workflows_file_path, run.workflows_file_text) == (DATA["path"], DATA["text"])


def test_a_rerun_plans_from_the_same_files_and_values(owner: Person):
    answer = owner.client().post(f"{BASE}/runs/", body(), format="json")
    again = run_rerun(run=Run.objects.get(name=answer.json()["name"]), user=owner.user)
    assert again.jobs.get(name="train").spec["commands"] == ["python train.py --epochs 'it'\"'\"'s 3' --lr 0.1"]


def test_the_server_never_takes_a_bare_env_name_from_its_own_environment(
    owner: Person, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("HF_TOKEN", "the-servers-own")
    answer = owner.client().post(f"{BASE}/runs/", body(inherited_env={}), format="json")
    assert answer.status_code == 400
    assert answer.json()["extra"]["errors"] == [
        {
            "file": ".dstack/workflows/train.yaml",
            "line": 6,
            "key": "workflows[0] (train).env[0]",
            "message": "'HF_TOKEN' takes its value from the shell that runs trainyard, where it is not set",
        }
    ]
    assert Run.objects.count() == 0


def test_running_the_broken_workflow_is_refused_with_its_errors(owner: Person):
    answer = owner.client().post(f"{BASE}/runs/", body(workflow="broken"), format="json")
    assert answer.status_code == 400
    assert [e["message"] for e in answer.json()["extra"]["errors"]] == [
        "unknown key 'comands'; did you mean 'commands'?"
    ]


def test_the_plan_has_the_workflows_help(owner: Person):
    answer = owner.client().post(f"{BASE}/runs/plan/", body(code={**CODE, "patch_sha256": "0" * 64}), format="json")
    assert answer.status_code == 200, answer.json()
    plan = answer.json()
    assert (plan["help"], [job["name"] for job in plan["jobs"]]) == ("Trains the model", ["prepare", "train"])


def test_the_single_file_form_still_works(owner: Person):
    single = {"workflow": "prepare", "workflows_file": DATA, "code": CODE}
    answer = owner.client().post(f"{BASE}/runs/", single, format="json")
    assert answer.status_code == 201, answer.json()
    assert Run.objects.get().workflows_files == [DATA]


@pytest.mark.parametrize("files", [{}, {"workflows_file": DATA, "workflows_files": [DATA]}])
def test_exactly_one_of_the_file_forms_is_required(owner: Person, files: dict[str, Any]):
    answer = owner.client().post(f"{BASE}/runs/", {"workflow": "prepare", "code": CODE, **files}, format="json")
    assert answer.status_code == 400
    assert Run.objects.count() == 0


def _datasets_run(team: Any, owner: Person, status: str) -> Run:
    """A run of workflow ``prepare`` from the workspace's repo acme/datasets, ended ``status``."""
    from backend.runs.services.runs import CodeInput, run_create

    text = "workflows:\n  - name: prepare\n    provider: bash\n    commands: [x]\n    artifacts: [./data]\n"
    run = run_create(
        workspace=team,
        user=owner.user,
        workflow="prepare",
        workflows_file_path=".dstack/workflows.yaml",
        workflows_file_text=text,
        code=CodeInput(kind="git", repo_url="git@github.com:acme/datasets.git", commit="d" * 40),
        env={},
    )
    Run.objects.filter(pk=run.pk).update(status=status)
    return run


OTHER = {
    "path": ".dstack/workflows.yaml",
    "text": "workflows:\n  - name: train\n    provider: bash\n    deps: [{workflow: acme/datasets/prepare}]\n"
    "    commands: [python train.py]\n",
}


def test_a_dependency_on_another_repos_workflow_takes_its_latest_successful_run(team: Any, owner: Person) -> None:
    """dstack 0.x's ``deps: - workflow: owner/repo/name``: the repo must be
    one the workspace ran from, and its latest successful run of the
    workflow is the input (its artifacts), fixed at submission."""
    client = owner.client()
    post = {"workflow": "train", "workflows_files": [OTHER], "code": CODE}

    missing = client.post(f"{BASE}/runs/", post, format="json")
    assert missing.status_code == 400
    assert missing.json()["message"].startswith(
        "deps: workflow 'acme/datasets/prepare': no repository 'acme/datasets' is connected to this workspace"
    ), missing.json()

    _datasets_run(team, owner, "failed")
    unfinished = client.post(f"{BASE}/runs/", post, format="json")
    assert unfinished.status_code == 400
    assert "acme/datasets has no successful run of 'prepare' in this workspace yet" in unfinished.json()["message"]

    good = _datasets_run(team, owner, "succeeded")
    created = client.post(f"{BASE}/runs/", post, format="json")
    assert created.status_code == 201, created.json()
    job = Run.objects.get(name=created.json()["name"]).jobs.get()
    assert job.input_refs == [
        {"kind": "workflow", "name": "acme/datasets/prepare", "run_id": str(good.pk), "run_name": good.name}
    ]


def _fan_in(count: int, path: str, prefix: str) -> dict[str, str]:
    text = "workflows:\n" + "".join(
        f"  - name: {prefix}{i}\n    provider: bash\n    commands: [echo {i}]\n" for i in range(count)
    )
    return {"path": path, "text": text}


def test_a_run_of_more_jobs_than_the_limit_is_a_400_naming_it_and_writes_nothing(owner: Person):
    """Tens of thousands of jobs would be one transaction and a placement
    query each: past TRAINYARD_MAX_JOBS_PER_RUN (1,000) the plan is refused
    before anything is written, for a submission and a dry-run plan alike."""
    files = [_fan_in(700, f".trainyard/workflows/part{n}.yaml", f"p{n}-") for n in range(2)]
    deps = "".join(f"      - workflow: p{n}-{i}\n" for n in range(2) for i in range(700))
    files.append({"path": ".trainyard/workflows/all.yaml",
                  "text": f"workflows:\n  - name: all\n    provider: bash\n    commands: [echo]\n    deps:\n{deps}"})  # fmt: skip
    sent = {"workflow": "all", "workflows_files": files, "code": CODE}

    answer = owner.client().post(f"{BASE}/runs/", sent, format="json")
    plan = owner.client().post(f"{BASE}/runs/plan/", sent, format="json")

    for refused in (answer, plan):
        assert refused.status_code == 400, refused.json()
        assert (
            "the run would have more than 1000 jobs: at most 1000 per run (TRAINYARD_MAX_JOBS_PER_RUN"
            in (refused.json()["message"])
        )
    assert not Run.objects.exists()


def test_a_workflows_file_over_the_workflows_limit_is_a_400_naming_the_file_and_key(owner: Person):
    big = _fan_in(1001, ".trainyard/workflows/big.yaml", "w")
    answer = owner.client().post(
        f"{BASE}/runs/", {"workflow": "w0", "workflows_files": [big], "code": CODE}, format="json"
    )

    assert answer.status_code == 400
    (error,) = answer.json()["extra"]["errors"]
    assert (error["file"], error["key"]) == (".trainyard/workflows/big.yaml", "workflows")
    assert error["message"].startswith("1001 workflows in one file: at most 1000")
    assert not Run.objects.exists()
