"""``trainyard run --gpu/--cpu/--memory/--disk``: keys of ``resources:``
that replace every workflow's for all the jobs of a run, checked as the
file's are."""

from __future__ import annotations

import textwrap

import pytest
from trainyard_spec import ResourceOverrideError, load_workflows_file, resolve_run_plan

FILE = """\
    workflows:
      - name: prepare
        provider: bash
        commands: [echo prepare]
        resources:
          cpu: 2
          memory: 1GB
      - name: train
        provider: bash
        commands: [echo train]
        deps: [{workflow: prepare}]
        resources:
          gpu: T4
          disk: 50GB
    """


def planned(resources: dict[str, object]) -> dict[str, tuple[object, ...]]:
    file = load_workflows_file(textwrap.dedent(FILE), path=".trainyard/workflows.yaml")
    plan = resolve_run_plan(file, "train", env_overrides={}, resources=resources)
    return {
        job.name: (r.cpu, r.memory_bytes, r.disk_bytes, r.gpu_name, r.gpu_count)
        for job in plan.jobs
        if (r := job.resources)
    }


def test_without_overrides_each_job_keeps_its_workflows_resources() -> None:
    assert planned({}) == {
        "prepare": (2, 2**30, None, None, 0),
        "train": (None, None, 50 * 2**30, "T4", 1),
    }


def test_each_override_replaces_that_key_in_every_job_and_leaves_the_others() -> None:
    assert planned({"gpu": "A10G:2", "memory": "16GB"}) == {
        "prepare": (2, 16 * 2**30, None, "A10G", 2),
        "train": (None, 16 * 2**30, 50 * 2**30, "A10G", 2),
    }
    assert planned({"cpu": 8, "disk": "100GB", "gpu": "2"}) == {
        "prepare": (8, 2**30, 100 * 2**30, None, 2),
        "train": (8, None, 100 * 2**30, None, 2),
    }


def test_gpu_none_runs_every_job_without_a_gpu() -> None:
    assert planned({"gpu": "none"})["train"] == (None, None, 50 * 2**30, None, 0)


@pytest.mark.parametrize(
    ("given", "key", "words"),
    [
        ({"memory": "lots"}, "memory", "size"),
        ({"memory": 16}, "memory", "a size needs a unit: write 16GB"),
        ({"gpu": "A10G:x"}, "gpu", "A10G:2"),
        ({"cpu": 0}, "cpu", "greater than or equal to 1"),
        ({"shm_size": "1GB"}, "shm_size", "these are: gpu, cpu, memory, disk"),
    ],
)
def test_a_bad_override_names_its_key_and_what_is_wanted(given: dict[str, object], key: str, words: str) -> None:
    with pytest.raises(ResourceOverrideError) as info:
        planned(given)
    assert info.value.key == key
    assert words in info.value.message
