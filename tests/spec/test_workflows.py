from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from trainyard_spec import (
    JobPlan,
    ResourceSpec,
    WorkflowError,
    WorkflowFileError,
    find_workflows_file,
    load_workflows_file,
    resolve_run_plan,
)

PATH = ".trainyard/workflows.yaml"


def errors_of(text: str) -> list[str]:
    with pytest.raises(WorkflowFileError) as info:
        load_workflows_file(textwrap.dedent(text), path=PATH)
    return [str(e) for e in info.value.errors]


def load(text: str):
    return load_workflows_file(textwrap.dedent(text), path=PATH)


# ------------------------------------------------------------ errors


def test_yaml_syntax_error_names_the_line_of_the_mark():
    assert errors_of("""\
        workflows:
          - name: hello
            provider: bash
            commands: [echo hi
          - name: other
        """) == [
        f"{PATH}:5: yaml: invalid YAML: expected ',' or ']', but got ':' (while parsing a flow sequence started at line 4)"
    ]


def test_yaml_error_without_context():
    assert errors_of("workflows:\n  - name: a\n    commands: echo a: b\n") == [
        f"{PATH}:3: yaml: invalid YAML: mapping values are not allowed here"
    ]


def test_a_character_yaml_refuses_is_an_error_with_its_line():
    assert errors_of("workflows:\n  - name: a\n    commands: [echo \x19]\n") == [
        f"{PATH}:3: yaml: invalid YAML: character #x0019 is not allowed (special characters are not allowed)"
    ]


def test_top_level_must_be_a_mapping():
    assert errors_of("- name: hello\n") == [
        f"{PATH}:1: (top level): expected a mapping with a 'workflows' list, got a list"
    ]


def test_empty_file_is_an_error():
    assert errors_of("") == [f"{PATH}:1: (top level): expected a mapping with a 'workflows' list, got an empty file"]


def test_missing_workflows_list():
    assert errors_of("flows: []\n") == [
        f"{PATH}:1: flows: unknown key 'flows'; did you mean 'workflows'?",
        f"{PATH}:1: workflows: missing the 'workflows' list: write workflows: followed by - name: … items",
    ]


def test_workflows_that_is_not_a_list():
    assert errors_of("workflows:\n  hello: {}\n") == [
        f"{PATH}:1: workflows: expected a list of workflows (items starting with '- name:'), got a mapping"
    ]


def test_unknown_key_suggests_the_right_one():
    assert errors_of("""\
        workflows:
          - name: hello
            provider: bash
            comands:
              - echo hi
        """) == [f"{PATH}:4: workflows[0] (hello).comands: unknown key 'comands'; did you mean 'commands'?"]


def test_unknown_key_without_a_close_match_lists_the_allowed_keys():
    [error] = errors_of("""\
        workflows:
          - name: hello
            provider: bash
            commands: [echo hi]
            zzz: 1
        """)
    assert error.startswith(
        f"{PATH}:5: workflows[0] (hello).zzz: unknown key 'zzz'; allowed keys: name, provider, commands, script,"
    )


def test_missing_name_points_at_the_item():
    assert errors_of("""\
        workflows:
          - name: ok
            provider: bash
            commands: [echo hi]
          - provider: bash
            commands: [echo hi]
        """) == [f"{PATH}:5: workflows[1].name: missing required key 'name'"]


def test_duplicate_workflow_name():
    assert errors_of("""\
        workflows:
          - name: hello
            provider: bash
            commands: [echo 1]
          - name: hello
            provider: bash
            commands: [echo 2]
        """) == [f"{PATH}:5: workflows[1] (hello).name: duplicate workflow name 'hello' (first at line 2)"]


def test_bash_provider_needs_commands():
    assert errors_of("""\
        workflows:
          - name: hello
            provider: bash
        """) == [
        f"{PATH}:3: workflows[0] (hello).provider: the bash provider needs 'commands' (a list of shell commands)"
    ]


def test_unknown_provider_lists_the_builtins():
    assert errors_of("""\
        workflows:
          - name: hello
            provider: conda
            commands: [echo hi]
        """) == [
        f"{PATH}:3: workflows[0] (hello).provider: unknown provider 'conda'; the built-in providers are bash, python, docker; installed plugin providers: cluster"
    ]


def test_list_item_that_is_not_a_string():
    assert errors_of("""\
        workflows:
          - name: hello
            provider: bash
            commands:
              - echo hi
              - {a: 1}
        """) == [f"{PATH}:6: workflows[0] (hello).commands[1]: expected a string, got a mapping"]


def test_memory_that_is_not_a_size():
    assert errors_of("""\
        workflows:
          - name: train
            provider: bash
            commands: [python train.py]
            resources:
              cpu: 2
              memory: lots
        """) == [f"{PATH}:7: workflows[0] (train).resources.memory: expected a size such as 512MB or 16GB, got 'lots'"]


def test_size_without_a_unit_is_refused():
    [error] = errors_of("""\
        workflows:
          - name: train
            provider: bash
            commands: [python train.py]
            resources: {memory: 16}
        """)
    assert (
        error
        == f"{PATH}:5: workflows[0] (train).resources.memory: expected a size such as 512MB or 16GB (a size needs a unit: write 16GB, not 16)"
    )


@pytest.mark.parametrize("count", [0, -1])
def test_gpu_count_must_be_at_least_one(count: int):
    assert errors_of(f"""\
        workflows:
          - name: train
            provider: bash
            commands: [python train.py]
            resources:
              gpu:
                name: A100
                count: {count}
        """) == [
        f"{PATH}:8: workflows[0] (train).resources.gpu.count: a gpu count must be at least 1, got {count} (to run without a GPU, leave out gpu)"
    ]


def test_gpu_shorthand_count_zero_is_refused_at_the_gpu_line():
    assert errors_of("""\
        workflows:
          - name: train
            provider: bash
            commands: [python train.py]
            resources:
              gpu: 0
        """) == [
        f"{PATH}:6: workflows[0] (train).resources.gpu.count: a gpu count must be at least 1, got 0 (to run without a GPU, leave out gpu)"
    ]


def test_env_value_that_is_not_a_scalar():
    assert errors_of("""\
        workflows:
          - name: train
            provider: bash
            commands: [python train.py]
            env:
              STEPS: 20
              LAYERS: [1, 2]
        """) == [
        f"{PATH}:7: workflows[0] (train).env.LAYERS: an env value must be a string, number or boolean, got a list"
    ]


def test_unknown_key_inside_resources():
    assert errors_of("""\
        workflows:
          - name: train
            provider: bash
            commands: [python train.py]
            resources:
              gpus: 1
        """) == [f"{PATH}:6: workflows[0] (train).resources.gpus: unknown key 'gpus'; did you mean 'gpu'?"]


def test_every_error_of_the_file_is_reported_at_once_in_line_order():
    errors = errors_of("""\
        workflows:
          - name: a
            provider: bash
            comands: [x]
          - name: b
            provider: bash
            commands: [x]
            resources: {memory: lots}
          - name: c
            provider: nope
        """)
    assert [e.split(":")[1] for e in errors] == ["4", "8", "10"]


def test_duplicate_yaml_key_is_an_error():
    assert errors_of("""\
        workflows:
          - name: a
            provider: bash
            commands: [x]
            commands: [y]
        """) == [f"{PATH}:5: workflows[0] (a).commands: duplicate key 'commands' (first at line 4)"]


def test_key_of_another_provider_is_refused():
    assert errors_of("""\
        workflows:
          - name: a
            provider: bash
            commands: [x]
            image: ubuntu
        """) == [f"{PATH}:5: workflows[0] (a).image: 'image' is for the docker provider, not bash"]


def test_artifact_path_must_stay_inside_the_repo():
    assert errors_of("""\
        workflows:
          - name: a
            provider: bash
            commands: [x]
            artifacts: [../out]
        """) == [
        f"{PATH}:5: workflows[0] (a).artifacts[0]: expected a path inside the repository such as ./checkpoint, got '../out'"
    ]


def test_recursive_alias_is_an_error_not_a_hang():
    assert errors_of("a: &x [*x]\n") == [
        f"{PATH}:1: (top level): the file is too large or nests too deep (more than 200000 values or 64 levels)"
    ]


def test_workflow_error_without_a_line():
    assert str(WorkflowError("f.yaml", None, "workflows", "boom")) == "f.yaml: workflows: boom"


# ------------------------------------------------------------ good files


def test_tiny_train_loads_and_hello_resolves(tiny_train: Path):
    path = find_workflows_file(tiny_train)
    wf_file = load_workflows_file(path.read_text(), path=PATH)
    assert list(wf_file.workflows) == ["hello", "download-base-model", "finetune-model", "evaluate", "noisy", "fail"]
    plan = resolve_run_plan(wf_file, "hello", env_overrides={})
    assert plan.jobs == [
        JobPlan(
            name="hello",
            workflow="hello",
            commands=['echo "hello from $(hostname)"', "python --version"],
            env={},
            artifacts=[],
            resources=ResourceSpec(
                cpu=None,
                memory_bytes=None,
                disk_bytes=None,
                shm_size_bytes=None,
                gpu_name=None,
                gpu_count=0,
                gpu_memory_bytes=None,
            ),
            provider="bash",
            ports=[],
            needs=[],
            after_running=[],
            tags=[],
            runs=[],
        )
    ]


def test_finetune_model_with_its_checkpoint_plans_its_dependency_first(tiny_train: Path):
    wf_file = load_workflows_file(find_workflows_file(tiny_train).read_text(), path=PATH)
    plan = resolve_run_plan(wf_file, "finetune-model", env_overrides={})
    assert [(j.name, j.needs) for j in plan.jobs] == [
        ("download-base-model", []),
        ("finetune-model", ["download-base-model"]),
    ]


def test_unknown_workflow_name_lists_the_available_ones(tiny_train: Path):
    wf_file = load_workflows_file(find_workflows_file(tiny_train).read_text(), path=PATH)
    with pytest.raises(WorkflowFileError) as info:
        wf_file.get("hallo")
    assert (
        str(info.value)
        == f"{PATH}: workflows: no workflow named 'hallo'; did you mean 'hello'? the file has: hello, download-base-model, finetune-model, evaluate, noisy, fail"
    )


def test_env_values_are_passed_as_written_and_overrides_win():
    wf_file = load("""\
        workflows:
          - name: a
            provider: bash
            commands: [x]
            env: {VERSION: 1.10, FLAG: true, N: 20, S: "a b", KEEP: k}
        """)
    job = resolve_run_plan(wf_file, "a", env_overrides={"N": "50"}).job("a")
    assert job.env == {"VERSION": "1.10", "FLAG": "true", "N": "50", "S": "a b", "KEEP": "k"}


def test_resources_are_resolved_to_bytes():
    wf_file = load("""\
        workflows:
          - name: a
            provider: bash
            commands: [x]
            resources: {cpu: 4, memory: 512MB, disk: 1.5GiB, shm_size: 1G, gpu: {name: A100, count: 2, memory: 40GB}}
          - name: b
            provider: bash
            commands: [x]
            resources: {gpu: 1}
        """)
    a = resolve_run_plan(wf_file, "a", env_overrides={}).job("a").resources
    assert a == ResourceSpec(
        cpu=4,
        memory_bytes=512 * 2**20,
        disk_bytes=int(1.5 * 2**30),
        shm_size_bytes=2**30,
        gpu_name="A100",
        gpu_count=2,
        gpu_memory_bytes=40 * 2**30,
    )
    b = resolve_run_plan(wf_file, "b", env_overrides={}).job("b").resources
    assert (b.gpu_name, b.gpu_count) == (None, 1)


@pytest.mark.parametrize("version", ["3", "3.11", "3.11.4"])
def test_python_version_must_be_a_python_3_version_string(version: str):
    assert (
        load(f"""\
        workflows:
          - name: a
            provider: python
            script: a.py
            python: "{version}"
        """)
        .get("a")
        .python
        == version
    )
    assert errors_of("""\
        workflows:
          - name: a
            provider: python
            script: a.py
            python: "latest"
        """) == [f"{PATH}:5: workflows[0] (a).python: expected a Python 3 version such as \"3.11\", got 'latest'"]


def test_every_key_of_the_schema_loads():
    wf_file = load("""\
        workflows:
          - name: full
            provider: bash
            commands: [x]
            python: "3.11"
            env: {A: b}
            ports: [8080]
            artifacts: [./out]
            deps: [{workflow: w}, {tag: t}, {run: r}]
            checkpoint: ./ckpt
            resources: {cpu: 1, memory: 1GB, disk: 10GB, shm_size: 1GB, gpu: {name: T4, count: 1, memory: 16GB}}
            backends: [aws]
            regions: [us-east-1]
            spot_policy: auto
            max_price: 1.5
            max_wait: 10m
            idle_duration: 1h
            max_duration: off
            retry: {on_events: [interruption], limit: 3, duration: 1d}
        """)
    assert wf_file.get("full").retry.limit == 3


def test_dstack_path_is_the_fallback(tmp_path: Path):
    with pytest.raises(WorkflowFileError) as info:
        find_workflows_file(tmp_path)
    assert (
        str(info.value) == f"{tmp_path}: workflows: no workflows file: `trainyard init` writes a starter, or create "
        ".trainyard/workflows.yaml (or .dstack/workflows.yaml) with a 'workflows:' list"
    )
    (tmp_path / ".dstack").mkdir()
    (tmp_path / ".dstack" / "workflows.yaml").write_text("workflows: []\n")
    assert find_workflows_file(tmp_path) == tmp_path / ".dstack" / "workflows.yaml"
    (tmp_path / ".trainyard").mkdir()
    (tmp_path / ".trainyard" / "workflows.yaml").write_text("workflows: []\n")
    assert find_workflows_file(tmp_path) == tmp_path / ".trainyard" / "workflows.yaml"


PLACEMENT_ERRORS = [
    (
        "backends: [asw]",
        "backends[0]: unknown backend 'asw'; did you mean 'aws'? known backends: aws, kubernetes, local, fake, self-hosted",
    ),
    ("backends: []", "backends: an empty list allows nothing: name at least one, or leave the key out"),
    ("backends: aws", "backends: expected a list, got 'aws'"),
    ("regions: [US East]", "regions[0]: expected a region name such as us-east-1, got 'US East'"),
    ("spot_policy: spto", "spot_policy: expected one of 'spot', 'on-demand' or 'auto', got 'spto'"),
    ("max_price: 0", "max_price: must be more than 0, got the number 0"),
    ("max_price: cheap", "max_price: expected a price in USD per hour such as 1.5, got 'cheap'"),
    ("max_wait: soon", "max_wait: expected a duration such as 30m, 2h or 1d (or off), got 'soon'"),
    ("max_wait: 0", "max_wait: a duration of 0 means no time at all: write e.g. 30m, or off"),
    ("idle_duration: forever", "idle_duration: expected a duration such as 30m, 2h or 1d (or off), got 'forever'"),
    ("max_duration: 0", "max_duration: a duration of 0 means no time at all: write e.g. 30m, or off"),
]


@pytest.mark.parametrize(("line", "error"), PLACEMENT_ERRORS)
def test_a_bad_placement_value_is_named_with_its_line_and_key(line: str, error: str):
    text = f"workflows:\n  - name: a\n    provider: bash\n    commands: [x]\n    {line}\n"
    assert errors_of(text) == [f"{PATH}:5: workflows[0] (a).{error}"]


def test_placement_is_what_the_server_stores_with_durations_in_seconds():
    wf = load("""\
        workflows:
          - name: a
            provider: bash
            commands: [x]
            backends: [aws, local, aws]
            regions: [us-east-1]
            spot_policy: auto
            max_price: 2
            max_wait: 30m
            idle_duration: off
            max_duration: 2h
          - {name: b, provider: bash, commands: [x], idle_duration: 0}
        """)
    assert wf.get("a").placement() == {
        "backends": ["aws", "local"],
        "regions": ["us-east-1"],
        "spot_policy": "auto",
        "max_price": 2.0,
        "max_wait": 1800,
        "idle_duration": "off",
        "max_duration": 7200,
    }
    assert wf.get("b").placement() == {"idle_duration": 0}


# ------------------------------------------------------------ limits


def _many(count: int, *, prefix: str = "w") -> str:
    return "workflows:\n" + "".join(
        f"  - name: {prefix}{i}\n    provider: bash\n    commands: [echo {i}]\n" for i in range(count)
    )


def test_a_file_of_more_workflows_than_the_limit_is_refused_naming_the_file_the_key_and_the_limit():
    from trainyard_spec.workflows import MAX_WORKFLOWS_PER_FILE

    assert MAX_WORKFLOWS_PER_FILE == 1000
    assert len(load(_many(MAX_WORKFLOWS_PER_FILE)).workflows) == MAX_WORKFLOWS_PER_FILE
    with pytest.raises(WorkflowFileError) as info:
        load_workflows_file(_many(MAX_WORKFLOWS_PER_FILE + 1), path=PATH)
    (error,) = info.value.errors
    assert (error.file, error.line, error.key) == (PATH, 1, "workflows")
    assert error.message == (
        "1001 workflows in one file: at most 1000; split them into several files of .trainyard/workflows/"
    )


def test_a_run_of_more_jobs_than_max_jobs_is_refused_at_the_workflow_that_passes_it():
    text = (
        _many(5)
        + "  - name: all\n    provider: bash\n    commands: [echo]\n    deps:\n"
        + "".join(f"      - workflow: w{i}\n" for i in range(5))
    )
    file = load(text)

    assert len(resolve_run_plan(file, "all", env_overrides={}, max_jobs=6).jobs) == 6
    with pytest.raises(WorkflowFileError) as info:
        resolve_run_plan(file, "all", env_overrides={}, max_jobs=4)
    (error,) = info.value.errors
    assert error.key == "workflows[4] (w4).name"
    assert error.message == (
        "the run would have more than 4 jobs: at most 4 per run (TRAINYARD_MAX_JOBS_PER_RUN on the server); "
        "split the work into several runs"
    )
