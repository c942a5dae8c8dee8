"""``secrets:`` and ``${{ secrets.NAME }}``: which workspace secrets a
workflow's jobs get (names only: the values are fetched by the runner)."""

from __future__ import annotations

import textwrap

import pytest
from trainyard_spec import WorkflowFileError, load_workflows, load_workflows_file, resolve_run_plan
from trainyard_spec.workflows import Source

PATH = ".trainyard/workflows.yaml"


def plan(text: str, workflow: str, known: set[str] | None = None, **kw: object):
    file = load_workflows_file(textwrap.dedent(text), path=PATH)
    return resolve_run_plan(file, workflow, env_overrides={}, known_secrets=known, **kw)  # type: ignore[arg-type]


def plan_errors(text: str, workflow: str, known: set[str] | None = None) -> list[str]:
    with pytest.raises(WorkflowFileError) as info:
        plan(text, workflow, known)
    return [str(e) for e in info.value.errors]


NAMED = """\
    workflows:
      - name: train
        provider: bash
        secrets: [WANDB_API_KEY]
        env:
          TOKEN: ${{ secrets.HF_TOKEN }}
          STEPS: 3
        commands:
          - python train.py --key "${{ secrets.S3_KEY }}"
        deps: [{workflow: prepare}]
      - name: prepare
        provider: bash
        commands: [echo prepare]
    """


def test_each_job_gets_the_secrets_its_own_workflow_names_and_no_value_is_planned():
    jobs = {job.name: job for job in plan(NAMED, "train").jobs}

    assert jobs["train"].secrets == {"WANDB_API_KEY": "WANDB_API_KEY", "TOKEN": "HF_TOKEN", "S3_KEY": "S3_KEY"}
    assert jobs["train"].env == {"STEPS": "3"}
    assert jobs["train"].commands == ['python train.py --key "${S3_KEY}"']
    assert jobs["prepare"].secrets == {}


def test_a_secret_the_workspace_does_not_have_is_an_error_at_each_place_that_names_it():
    known = {"WANDB_API_KEY", "HF_TOKENS"}
    assert plan_errors(NAMED, "train", known) == [
        f"{PATH}:6: workflows[0] (train).env.TOKEN: secret 'HF_TOKEN' is not set in this workspace;"
        " did you mean 'HF_TOKENS'? a workspace admin sets it with `trainyard secrets set HF_TOKEN`",
        f"{PATH}:9: workflows[0] (train).commands[0]: secret 'S3_KEY' is not set in this workspace;"
        " a workspace admin sets it with `trainyard secrets set S3_KEY`",
    ]


def test_a_secret_is_a_whole_env_value():
    text = """\
        workflows:
          - name: t
            provider: bash
            env: {URL: "https://${{ secrets.TOKEN }}@example.com"}
            commands: [x]
        """
    assert plan_errors(text, "t") == [
        f"{PATH}:4: workflows[0] (t).env.URL: a secret is a whole env value: write URL: ${{{{ secrets.NAME }}}}"
        " (no other text)"
    ]


def test_a_name_that_is_both_an_env_value_and_a_secret_is_an_error():
    text = """\
        workflows:
          - name: t
            provider: bash
            secrets: [HF_TOKEN]
            env: {HF_TOKEN: public}
            commands: [x]
        """
    assert plan_errors(text, "t") == [
        f"{PATH}:5: workflows[0] (t).env.HF_TOKEN: 'HF_TOKEN' is both a value here and a secret the workflow"
        " names: rename one of them"
    ]


def test_a_secret_name_must_be_a_variable_name():
    with pytest.raises(WorkflowFileError) as info:
        load_workflows_file(
            "workflows:\n  - {name: t, provider: bash, commands: [x], secrets: [hf-token]}\n", path=PATH
        )
    assert [str(e) for e in info.value.errors] == [
        f"{PATH}:2: workflows[0] (t).secrets[0]: a secret name is an environment variable name"
        " (letters, digits and _), got 'hf-token'"
    ]


def test_a_dstack_file_gets_no_secret_it_does_not_name():
    """dstack 0.x gave every job every secret; here a .dstack file's
    workflow names the ones it uses like any other (docs/WORKFLOWS.md)."""
    text = "workflows:\n  - {name: t, provider: bash, commands: [echo $HF_TOKEN]}\n"
    file = load_workflows([Source(".dstack/workflows.yaml", text)])
    job = resolve_run_plan(file, "t", env_overrides={}, known_secrets={"HF_TOKEN"}).jobs[0]
    assert job.secrets == {}
