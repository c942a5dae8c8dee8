"""``inputs:`` in a workflow: the shorthand and the mapping plan onto every
job; every bad item is named with its file, line and key."""

from __future__ import annotations

import textwrap

import pytest
from trainyard_spec import WorkflowFileError, load_workflows_file, resolve_run_plan

PATH = ".trainyard/workflows.yaml"
HEAD = "workflows:\n  - name: a\n    provider: bash\n    commands: [python train.py]\n"


def load(extra: str):
    return load_workflows_file(HEAD + textwrap.indent(textwrap.dedent(extra), "    "), path=PATH)


def errors_of(extra: str) -> list[str]:
    with pytest.raises(WorkflowFileError) as info:
        load(extra)
    return [str(e) for e in info.value.errors]


PIN = "3a7b" * 16


def test_the_shorthand_and_the_mapping_plan_onto_the_job():
    file = load(f"""\
        inputs:
          - s3://acme-data/imagenet/
          - uri: s3://acme-data/imagenet/train/
            path: ./data/train
            read_only: false
            mode: copy
          - uri: https://example.com/vocab.txt
            sha256: {PIN.upper()}
        """)
    (job,) = resolve_run_plan(file, "a", env_overrides={}).jobs
    assert job.data == [
        {"uri": "s3://acme-data/imagenet/", "path": "imagenet", "read_only": True, "sha256": ""},
        {"uri": "s3://acme-data/imagenet/train/", "path": "data/train", "read_only": False, "sha256": ""},
        {"uri": "https://example.com/vocab.txt", "path": "vocab.txt", "read_only": True, "sha256": PIN},
    ]


def test_a_cluster_providers_every_job_gets_the_inputs():
    text = "workflows:\n  - name: a\n    provider: bash\n    commands: [echo]\n    inputs: [s3://acme-data/x/]\n"
    file = load_workflows_file(text, path=PATH)
    assert all(job.data for job in resolve_run_plan(file, "a", env_overrides={}).jobs)


def test_lazy_mode_is_refused_saying_inputs_download_in_full():
    (error,) = errors_of("inputs:\n  - uri: s3://acme-data/x/\n    mode: lazy\n")
    assert error.startswith(f"{PATH}:7: workflows[0] (a).inputs[0].mode: mode: lazy is not built")
    assert "inputs are downloaded in full before the commands start" in error


@pytest.mark.parametrize(
    ("item", "key", "words"),
    [
        ("- gs://bucket/x", "inputs[0]", "an input is s3://bucket/prefix/"),
        ("- https://example.com/", "inputs[0]", "an input is s3://bucket/prefix/"),
        ("- http://example.com/x", "inputs[0]", "an input is s3://bucket/prefix/"),
        ("- uri: s3://b-1/x\n  path: ../outside", "inputs[0].path", "inside the working directory"),
        ("- uri: s3://b-1/x\n  path: /etc", "inputs[0].path", "inside the working directory"),
        ("- uri: s3://b-1/x\n  path: .", "inputs[0].path", "inside the working directory"),
        ("- uri: s3://b-1/x\n  sha256: " + PIN, "inputs[0].sha256", "sha256 pins an https:// file"),
        ("- uri: https://e.com/f\n  sha256: abc", "inputs[0].sha256", "64 hex digits"),
        ("- uri: s3://b-1/x\n  mount: true", "inputs[0].mount", "unknown key"),
    ],
)
def test_bad_items_are_named_at_their_key(item: str, key: str, words: str):
    errors = errors_of("inputs:\n" + textwrap.indent(item, "  ") + "\n")
    assert len(errors) == 1, errors
    assert f"workflows[0] (a).{key}:" in errors[0]
    assert words.lower() in errors[0].lower()


def test_two_inputs_at_one_path_or_one_inside_another_are_refused():
    errors = errors_of("""\
        inputs:
          - s3://acme-data/imagenet/
          - uri: s3://other-data/imagenet/
            path: imagenet
          - uri: s3://acme-data/labels/
            path: imagenet/labels
        """)
    assert errors[0] == (
        f"{PATH}:8: workflows[0] (a).inputs[1].path: path imagenet is also input 0's: give each input a path of its own"
    )
    assert errors[1].startswith(f"{PATH}:10: workflows[0] (a).inputs[2].path: path imagenet/labels and input 0's")
    assert len(errors) == 2


def test_the_spec_keeps_the_protocols_bound_on_inputs():
    from trainyard_runner import protocol
    from trainyard_spec import schema

    assert schema.MAX_INPUTS == protocol.MAX_DATA_INPUTS
