"""``artifacts: - to: s3://bucket/prefix/``: where an artifact's files are
copied once uploaded, its variables, and the destinations refused."""

from __future__ import annotations

import textwrap

import pytest
from trainyard_spec import WorkflowFileError, load_workflows_file, resolve_run_plan
from trainyard_spec.schema import export_destination

PATH = ".trainyard/workflows.yaml"


def jobs(text: str, workflow: str = "train"):
    file = load_workflows_file(textwrap.dedent(text), path=PATH)
    return {j.name: j for j in resolve_run_plan(file, workflow, env_overrides={}).jobs}  # type: ignore[call-arg]


def errors(to: str) -> list[str]:
    text = f"""\
    workflows:
      - name: train
        provider: bash
        commands: [echo]
        artifacts:
          - path: ./model
            to: {to}
    """
    with pytest.raises(WorkflowFileError) as info:
        load_workflows_file(textwrap.dedent(text), path=PATH)
    return [str(e) for e in info.value.errors]


def test_every_job_of_the_workflow_carries_its_exports_as_written():
    plan = jobs(
        """\
        workflows:
          - name: train
            provider: bash
            commands: [echo]
            artifacts:
              - path: ./model
                to: s3://acme-models/${{ run.name }}/${{job.name}}/
              - ./logs
        """
    )
    assert plan["train"].exports == {"./model": "s3://acme-models/${{ run.name }}/${{job.name}}/"}
    assert plan["train"].artifacts == ["./model", "./logs"]


def test_a_workflow_without_to_has_no_exports():
    plan = jobs("workflows: [{name: train, provider: bash, commands: [echo], artifacts: [./model]}]")
    assert plan["train"].exports == {}


def test_the_variables_are_filled_in_and_the_destination_is_a_prefix():
    to = "s3://acme-models/models/${{ run.name }}/${{workflow.name}}-${{ job.name }}"
    filled = export_destination(to, run_name="brave-otter-3", job_name="train-worker", workflow_name="train")
    assert filled == "s3://acme-models/models/brave-otter-3/train-train-worker/"
    assert export_destination("s3://b-1/x/", run_name="r", job_name="j", workflow_name="w") == "s3://b-1/x/"


def test_an_unknown_variable_is_refused_at_its_line_naming_the_known_ones():
    assert errors("s3://acme-models/${{ secrets.KEY }}/") == [
        f"{PATH}:7: workflows[0] (train).artifacts[0].to: unknown expression '${{{{ secrets.KEY }}}}' in to:;"
        " known: ${{ run.name }}, ${{ job.name }}, ${{ workflow.name }}"
    ]


@pytest.mark.parametrize(
    ("to", "message"),
    [
        ("gs://acme/x/", "an artifact is copied to an S3 prefix: write to: s3://bucket/prefix/, got 'gs://acme/x/'"),
        ("/mnt/models", "an artifact is copied to an S3 prefix: write to: s3://bucket/prefix/, got '/mnt/models'"),
        (
            "s3://${{ run.name }}/x/",
            "'${{ run.name }}' is not an S3 bucket name (3-63 lowercase letters, digits, '.' and '-'; no variables)",
        ),
        ("s3://Acme/x/", "'Acme' is not an S3 bucket name (3-63 lowercase letters, digits, '.' and '-'; no variables)"),
        ("s3://acme/${{ run.name/", "an unclosed '${{' in to: 's3://acme/${{ run.name/'"),
        ("s3://acme/a/../b/", "to: must be a printable S3 prefix without '..' of at most 1024 characters"),
    ],
)
def test_a_destination_that_is_not_an_s3_prefix_is_refused(to: str, message: str):
    assert errors(to) == [f"{PATH}:7: workflows[0] (train).artifacts[0].to: {message}"]
