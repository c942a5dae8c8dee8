"""A workflow's ``gpu:`` written as ``NAME`` or ``NAME:COUNT``, as
``trainyard offers --gpu`` takes it (issue 33: ``gpu: A100:2`` was refused
in a workflow file while ``offers --gpu A100:2`` accepted it)."""

from __future__ import annotations

import textwrap

import pytest
from trainyard_spec import WorkflowFileError, load_workflows_file, resolve_run_plan

PATH = ".trainyard/workflows.yaml"


def _workflows(gpu: str) -> str:
    """A workflows file whose one workflow asks for ``gpu``."""
    text = f"""\
        workflows:
          - name: train
            provider: bash
            commands: [python train.py]
            resources:
              gpu: {gpu}
        """
    return textwrap.dedent(text)


def gpu_of(gpu: str) -> tuple[str | None, int, int | None]:
    wf_file = load_workflows_file(_workflows(gpu), path=PATH)
    r = resolve_run_plan(wf_file, "train", env_overrides={}).job("train").resources
    return r.gpu_name, r.gpu_count, r.gpu_memory_bytes


def errors_of(gpu: str) -> list[str]:
    with pytest.raises(WorkflowFileError) as info:
        load_workflows_file(_workflows(gpu), path=PATH)
    return [str(e) for e in info.value.errors]


@pytest.mark.parametrize(
    ("gpu", "parsed"),
    [
        ("A100:2", ("A100", 2, None)),
        ("A100", ("A100", 1, None)),
        ("L4:1", ("L4", 1, None)),
        ('"A100-80GB:8"', ("A100-80GB", 8, None)),
        ("{name: 'A100:2', memory: 40GB}", ("A100", 2, 40 * 2**30)),
        ("{name: A100, count: 2}", ("A100", 2, None)),  # the mapping, as before
        ("2", (None, 2, None)),  # a count, as before
    ],
)
def test_a_gpu_is_name_colon_count_in_a_workflow_as_in_offers(gpu: str, parsed: tuple[str | None, int, int | None]):
    assert gpu_of(gpu) == parsed


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        ("A100:two", "write a name and an optional count, e.g. A10G or A10G:2, got 'A100:two'"),
        ("':2'", "write a name and an optional count, e.g. A10G or A10G:2, got ':2'"),
        ("A100:2:3", "write a name and an optional count, e.g. A10G or A10G:2, got 'A100:2:3'"),
        ("A100:0", "a gpu count must be at least 1, got 0 (to run without a GPU, leave out gpu)"),
        ("{name: 'A100:2', count: 2}", "write the count once: name 'A100:2' has one and so does count"),
    ],
)
def test_a_bad_gpu_is_refused_at_the_gpu_line(gpu: str, message: str):
    assert errors_of(gpu) == [f"{PATH}:6: workflows[0] (train).resources.gpu: {message}"]
