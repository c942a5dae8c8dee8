"""dstack 0.x workflow files run as they are: each key of a 2022–23 file
parses and means what it meant there, or is refused when a run uses it with
"not supported yet: …" (never as a parse error of the whole file)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from trainyard_spec import (
    Source,
    WorkflowFileError,
    find_workflows_files,
    load_variables,
    load_workflows,
    load_workflows_file,
    resolve_run_plan,
)
from trainyard_spec.planning import NOT_BUILT_YET

PATH = ".dstack/workflows.yaml"


def load(text: str, path: str = PATH):
    return load_workflows([Source(path, textwrap.dedent(text))])


def plan(text: str, workflow: str, **kwargs):
    kwargs.setdefault("env_overrides", {})
    return resolve_run_plan(load(text), workflow, **kwargs)


def plan_errors(text: str, workflow: str, **kwargs) -> list[str]:
    with pytest.raises(WorkflowFileError) as info:
        plan(text, workflow, **kwargs)
    return [str(e) for e in info.value.errors]


def load_errors(sources: list[Source]) -> list[str]:
    with pytest.raises(WorkflowFileError) as info:
        load_workflows(sources)
    return [str(e) for e in info.value.errors]


# ------------------------------------------------------------ 1. help


def test_help_is_accepted_and_kept():
    file = load("""\
        workflows:
          - name: prepare
            help: Downloads the dataset
            provider: bash
            commands: [python prepare.py]
        """)
    assert file.workflows["prepare"].help == "Downloads the dataset"


# ------------------------------------------------------------ 2. env as a list


ENV_LIST = """\
    workflows:
      - name: train
        provider: bash
        env:
          - EPOCHS=3
          - EMPTY=
          - HF_TOKEN
        commands: [python train.py]
    """


def test_env_list_items_are_key_value_and_bare_names_come_from_the_submitting_shell():
    job = plan(ENV_LIST, "train", inherited_env={"HF_TOKEN": "hf_abc", "OTHER": "unused"}).jobs[0]
    assert job.env == {"EPOCHS": "3", "EMPTY": "", "HF_TOKEN": "hf_abc"}


def test_an_env_override_stands_in_for_a_bare_name():
    job = plan(ENV_LIST, "train", env_overrides={"HF_TOKEN": "from-e"}).jobs[0]
    assert job.env["HF_TOKEN"] == "from-e"


def test_a_bare_env_name_unset_in_the_shell_is_an_error_at_its_item():
    assert plan_errors(ENV_LIST, "train") == [
        f"{PATH}:7: workflows[0] (train).env[2]: 'HF_TOKEN' takes its value from the shell that runs trainyard, "
        "where it is not set"
    ]


def test_a_bad_env_list_item_is_an_error_of_that_workflow_only():
    file = load("""\
        workflows:
          - name: train
            provider: bash
            env: [EPOCHS=3, "1BAD"]
            commands: [python train.py]
          - name: ok
            provider: bash
            commands: [echo ok]
        """)
    assert list(file.workflows) == ["ok"]
    assert [str(e) for e in file.warnings] == [
        f"{PATH}:4: workflows[0] (train).env: an env list item is KEY=VALUE or a bare KEY, got '1BAD'"
    ]


# ------------------------------------------------------------ 3. python: 3.10


@pytest.mark.parametrize(("written", "version"), [("3.10", "3.10"), ("3.9", "3.9"), ("3", "3"), ('"3.11"', "3.11")])
def test_an_unquoted_python_version_is_read_as_written(written: str, version: str):
    file = load(f"""\
        workflows:
          - name: train
            provider: bash
            python: {written}
            commands: [python train.py]
        """)
    assert file.workflows["train"].python == version


def test_a_python_number_that_is_not_a_version_as_written_keeps_the_hint():
    with pytest.raises(WorkflowFileError) as info:
        load_workflows_file("workflows:\n  - {name: t, provider: bash, commands: [x], python: 3_10}\n", path=PATH)
    assert [str(e) for e in info.value.errors] == [
        f'{PATH}:2: workflows[0] (t).python: write the Python version as a string, e.g. python: "3.11" '
        "(3.10 unquoted is the number 3.1)"
    ]


# ------------------------------------------------------------ 4. deps


def test_a_bare_colon_string_dep_is_a_tag():
    job = plan(
        """\
        workflows:
          - name: train
            provider: bash
            deps: [":base-model", {tag: tokenizer}]
            commands: [python train.py]
        """,
        "train",
    ).jobs[0]
    assert job.tags == ["base-model", "tokenizer"]


def test_a_dep_string_without_the_colon_is_an_error():
    file = load("""\
        workflows:
          - name: train
            provider: bash
            deps:
              - base-model
            commands: [python train.py]
        """)
    assert [str(e) for e in file.warnings] == [
        f"{PATH}:5: workflows[0] (train).deps[0]: a dependency is ':tag-name' or a mapping "
        "{workflow|tag|run: name}, got 'base-model'"
    ]


OTHER_REPO = """\
    workflows:
      - name: train
        provider: bash
        deps:
          - workflow: acme/datasets/prepare
        commands: [python train.py]
      - name: lint
        provider: bash
        commands: [ruff check .]
    """


def test_another_repos_workflow_dep_is_carried_for_the_server_to_resolve():
    assert plan(OTHER_REPO, "lint").jobs[0].name == "lint"
    [train] = plan(OTHER_REPO, "train").jobs
    assert (train.repo_workflows, train.needs) == (["acme/datasets/prepare"], [])


# ------------------------------------------------------------ 5. interruptible, local


def test_interruptible_means_spot_and_local_means_the_local_backends():
    file = load("""\
        workflows:
          - name: train
            provider: bash
            commands: [python train.py]
            resources: {interruptible: true, local: true, gpu: 1}
          - name: steady
            provider: bash
            commands: [python train.py]
            resources: {interruptible: false, local: false}
        """)
    assert file.workflows["train"].placement() == {"backends": ["local", "self-hosted"], "spot_policy": "spot"}
    assert file.workflows["steady"].placement() == {"spot_policy": "on-demand"}


def test_interruptible_that_contradicts_spot_policy_is_an_error():
    file = load("""\
        workflows:
          - name: train
            provider: bash
            commands: [python train.py]
            spot_policy: on-demand
            resources:
              interruptible: true
        """)
    assert [str(e) for e in file.warnings] == [
        f"{PATH}:7: workflows[0] (train).resources.interruptible: interruptible: true means spot_policy: spot, "
        "but spot_policy is on-demand; keep one of them"
    ]


def test_local_that_contradicts_backends_is_an_error_and_agreeing_ones_stay():
    file = load("""\
        workflows:
          - name: train
            provider: bash
            commands: [python train.py]
            backends: [aws, local]
            resources:
              local: true
          - name: here
            provider: bash
            commands: [python train.py]
            backends: [local]
            resources: {local: true, interruptible: true}
            spot_policy: spot
        """)
    assert [str(e) for e in file.warnings] == [
        f"{PATH}:7: workflows[0] (train).resources.local: local: true means backends: [local, self-hosted], "
        "but backends names aws; keep one of them"
    ]
    assert file.workflows["here"].placement() == {"backends": ["local"], "spot_policy": "spot"}


# ------------------------------------------------------------ 6. several files


def test_workflow_files_are_found_in_both_folders_and_sorted_by_path(tmp_path: Path):
    for name in [
        ".dstack/workflows/b.yaml",
        ".dstack/workflows/a.yml",
        ".trainyard/workflows.yaml",
        ".dstack/workflows.yaml",
        ".trainyard/workflows/z.yaml",
        ".dstack/workflows/notes.txt",
    ]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("workflows: []\n")
    assert [p.relative_to(tmp_path).as_posix() for p in find_workflows_files(tmp_path)] == [
        ".dstack/workflows.yaml",
        ".dstack/workflows/a.yml",
        ".dstack/workflows/b.yaml",
        ".trainyard/workflows.yaml",
        ".trainyard/workflows/z.yaml",
    ]


PREPARE = Source(
    ".dstack/workflows/data.yaml",
    "workflows:\n  - name: prepare\n    provider: bash\n    commands: [python prepare.py]\n    artifacts: [./data]\n",
)
TRAIN = Source(
    ".dstack/workflows/train.yaml",
    "workflows:\n"
    "  - name: train\n    provider: bash\n    deps: [{workflow: prepare}]\n    commands: [python train.py]\n"
    "  - name: broken\n    provider: bash\n    commands: [echo]\n    gpu: 1\n",
)


def test_a_workflow_may_depend_on_one_in_another_file():
    file = load_workflows([PREPARE, TRAIN])
    run = resolve_run_plan(file, "train", env_overrides={})
    assert [(j.name, j.needs) for j in run.jobs] == [("prepare", []), ("train", ["prepare"])]
    assert file.file_of("prepare") == ".dstack/workflows/data.yaml"


def test_every_error_names_its_own_file():
    file = load_workflows([PREPARE, TRAIN])
    assert [str(e) for e in file.warnings] == [
        ".dstack/workflows/train.yaml:9: workflows[1] (broken).gpu: unknown key 'gpu'; allowed keys: "
        + ", ".join(type(file.workflows["train"]).model_fields)
    ]


def test_a_duplicate_name_across_files_names_both_files_and_lines():
    copy = Source(
        ".trainyard/workflows.yaml", "workflows:\n\n  - name: prepare\n    provider: bash\n    commands: [x]\n"
    )
    file = load_workflows([PREPARE, copy])
    assert [str(e) for e in file.warnings] == [
        ".trainyard/workflows.yaml:3: workflows[0] (prepare).name: duplicate workflow name 'prepare' "
        "(first at .dstack/workflows/data.yaml:2)"
    ]
    assert "prepare" not in file.workflows


def test_a_top_level_error_of_one_file_fails_the_load_naming_that_file():
    bad = Source(".dstack/workflows/bad.yaml", "- name: x\n")
    assert load_errors([PREPARE, bad]) == [
        ".dstack/workflows/bad.yaml:1: (top level): expected a mapping with a 'workflows' list, got a list"
    ]


# ------------------------------------------------------------ 7. run.args, variables

ARGS = """\
    workflows:
      - name: train
        provider: bash
        commands:
          - python train.py ${{ run.args }}
          - echo lr=${{ variables.lr }} batch=${{variables.batch}}
    """


def test_run_args_are_quoted_for_bash_and_variables_are_filled_in():
    job = plan(
        ARGS,
        "train",
        run_args=["--epochs", "3", "--name", "it's a test"],
        variables={"train": {"lr": "0.1", "batch": "8"}},
    ).jobs[0]
    assert job.commands == ["python train.py --epochs 3 --name 'it'\"'\"'s a test'", "echo lr=0.1 batch=8"]


def test_an_env_override_wins_over_a_variable_and_no_args_is_empty():
    job = plan(ARGS, "train", env_overrides={"lr": "0.5"}, variables={"train": {"lr": "0.1", "batch": "8"}}).jobs[0]
    assert job.commands == ["python train.py ", "echo lr=0.5 batch=8"]


def test_an_undefined_variable_is_an_error_naming_it():
    assert plan_errors(ARGS, "train", variables={"train": {"lr": "0.1"}}) == [
        f"{PATH}:6: workflows[0] (train).commands[1]: undefined variable 'batch': define it in "
        ".trainyard/variables.yaml or pass -e batch=VALUE"
    ]


def test_an_unknown_expression_is_an_error():
    text = "workflows:\n  - {name: t, provider: bash, commands: ['echo ${{ github.sha }}']}\n"
    assert plan_errors(text, "t") == [
        f"{PATH}:2: workflows[0] (t).commands[0]: unknown expression '${{{{ github.sha }}}}'; "
        "known: ${{ run.args }}, ${{ variables.NAME }}, ${{ secrets.NAME }}"
    ]


def test_the_variables_file_has_shared_and_per_workflow_values_as_written():
    variables = load_variables(
        "variables:\n  batch: 32\n  lr: 1.10\n  train:\n    lr: 0.01\n    epochs: 3\n", path=".dstack/variables.yaml"
    )
    assert variables.of("train") == {"batch": "32", "lr": "0.01", "epochs": "3"}
    assert variables.of("other") == {"batch": "32", "lr": "1.10"}


def test_a_bad_variables_file_names_its_line():
    with pytest.raises(WorkflowFileError) as info:
        load_variables("variables:\n  train:\n    lr: [1, 2]\nother: 1\n", path=".dstack/variables.yaml")
    assert [str(e) for e in info.value.errors] == [
        ".dstack/variables.yaml:3: variables.train.lr: expected a value, got a list",
        ".dstack/variables.yaml:4: other: unknown key 'other'; allowed keys: variables",
    ]


# ------------------------------------------------------------ 8. dev environments, ssh

DEV = """\
    workflows:
      - name: ide
        provider: code
        setup:
          - pip install -r requirements.txt
        python: 3.10
      - name: notebook
        provider: lab
      - name: debug
        provider: bash
        ssh: true
        commands: [python train.py]
      - name: train
        provider: bash
        commands: [python train.py]
      - name: pinned
        provider: lab
        version: 3.6.3
      - name: old-ide
        provider: code
        version: 1.67.2
    """


def test_dev_environments_and_ssh_parse_and_another_workflow_runs():
    file = load(DEV)
    assert file.warnings == []
    assert [j.name for j in resolve_run_plan(file, "train", env_overrides={}).jobs] == ["train"]


def test_dstack_dev_environments_run():
    file = load(DEV)
    [ide] = resolve_run_plan(file, "ide", env_overrides={}).jobs
    [lab] = resolve_run_plan(file, "notebook", env_overrides={}).jobs
    assert (ide.dev_environment, ide.environment, ide.commands[0]) == (
        "code",
        {"python": "3.10"},
        "pip install -r requirements.txt",
    )
    assert (lab.dev_environment, lab.environment, lab.port_count) == ("lab", {"pip": ["jupyterlab==4.6.6"]}, 1)


@pytest.mark.parametrize(
    ("workflow", "error"),
    [
        ("debug", f"{PATH}:11: workflows[2] (debug).ssh: not supported yet: ssh: true (an SSH server in the job)"),
        ("pinned", f"{PATH}:18: workflows[4] (pinned).version: not supported yet: version: 3.6.3 (lab runs "
         "jupyterlab==4.6.6); remove it to run the workflow"),
        ("old-ide", f"{PATH}:21: workflows[5] (old-ide).version: not supported yet: version: 1.67.2 (VS Code is the "
         "one on your machine, over Remote-SSH); remove it to run the workflow"),
    ],
)  # fmt: skip
def test_a_key_a_dev_environment_cannot_apply_or_ssh_is_refused_alone(workflow: str, error: str):
    assert plan_errors(DEV, workflow) == [error]


def test_setup_is_for_dev_environments_only():
    file = load("workflows:\n  - {name: t, provider: bash, commands: [x], setup: [y]}\n")
    assert [str(e) for e in file.warnings] == [
        f"{PATH}:2: workflows[0] (t).setup: 'setup' is for the code, lab and notebook providers, not bash"
    ]


# ------------------------------------------------------------ 9. one broken workflow


BROKEN = """\
    workflows:
      - name: train
        provider: bash
        commands: [python train.py]
      - name: evaluate
        provider: bash
        comands: [python eval.py]
        deps: [{workflow: train}]
      - name: report
        provider: bash
        deps: [{workflow: evaluate}]
        commands: [python report.py]
    """


def test_a_broken_workflow_leaves_the_others_usable_and_is_a_warning():
    file = load(BROKEN)
    assert list(file.workflows) == ["train", "report"]
    assert [str(e) for e in file.warnings] == [
        f"{PATH}:7: workflows[1] (evaluate).comands: unknown key 'comands'; did you mean 'commands'?"
    ]
    assert [j.name for j in resolve_run_plan(file, "train", env_overrides={}).jobs] == ["train"]


def test_running_the_broken_workflow_fails_with_its_errors():
    assert plan_errors(BROKEN, "evaluate") == [
        f"{PATH}:7: workflows[1] (evaluate).comands: unknown key 'comands'; did you mean 'commands'?"
    ]


def test_depending_on_a_broken_workflow_fails_with_its_errors():
    assert plan_errors(BROKEN, "report") == [
        f"{PATH}:11: workflows[2] (report).deps[0].workflow: workflow 'evaluate' has errors, so this one cannot run",
        f"{PATH}:7: workflows[1] (evaluate).comands: unknown key 'comands'; did you mean 'commands'?",
    ]


def test_the_strict_loader_still_refuses_the_whole_file():
    with pytest.raises(WorkflowFileError) as info:
        load_workflows_file(textwrap.dedent(BROKEN), path=PATH)
    assert [str(e) for e in info.value.errors] == [
        f"{PATH}:7: workflows[1] (evaluate).comands: unknown key 'comands'; did you mean 'commands'?"
    ]


def test_a_missing_workflows_list_still_fails_the_file():
    assert load_errors([Source(PATH, "name: train\n")]) == [
        f"{PATH}:1: name: unknown key 'name'; allowed keys: workflows",
        f"{PATH}:1: workflows: missing the 'workflows' list: write workflows: followed by - name: … items",
    ]


# ------------------------------------------------------------ 10. parsed, not built yet

LATE = """\
    workflows:
      - name: serve
        provider: bash
        ports: 2
        commands: [python serve.py]
      - name: train
        provider: bash
        artifacts:
          - ./checkpoints
          - path: ./logs
          - path: ./data
            mount: true
        cache:
          - ~/.cache/pip
          - path: ./models
        commands: [python train.py]
      - name: plain
        provider: bash
        ports: [8080]
        artifacts: [{path: ./out, mount: false}]
        commands: [python serve.py]
    """


def test_port_counts_mounts_and_cache_are_carried_on_the_job_plan():
    file = load(LATE)
    serve, train = file.workflows["serve"], file.workflows["train"]
    assert (serve.ports.count, serve.ports.numbers) == (2, [])
    assert train.artifact_paths == ["./checkpoints", "./logs", "./data"]
    assert [c.path for c in train.cache] == ["~/.cache/pip", "./models"]
    job = resolve_run_plan(file, "plain", env_overrides={}).jobs[0]
    assert (job.ports, job.port_count, job.artifacts, job.mounts, job.cache) == ([8080], 0, ["./out"], [], [])


def test_port_counts_mounts_and_cache_are_planned_on_the_jobs():
    file = load(LATE)
    [serve] = resolve_run_plan(file, "serve", env_overrides={}).jobs
    [train] = resolve_run_plan(file, "train", env_overrides={}).jobs
    assert (serve.ports, serve.port_count) == ([], 2)
    assert (train.artifacts, train.mounts) == (["./checkpoints", "./logs", "./data"], ["./data"])
    assert train.cache == ["~/.cache/pip", "./models"]


def test_the_late_refusals_are_one_table():
    assert list(NOT_BUILT_YET) == ["version", "ssh"]


def test_a_bad_port_count_and_a_bad_port_are_errors_at_their_lines():
    file = load("""\
        workflows:
          - {name: a, provider: bash, commands: [x], ports: 0}
          - name: b
            provider: bash
            commands: [x]
            ports:
              - 80
              - 70000
        """)
    assert [str(e) for e in file.warnings] == [
        f"{PATH}:2: workflows[0] (a).ports: a count of free ports is from 1 to 100, got 0",
        f"{PATH}:8: workflows[1] (b).ports[1]: expected a port number from 1 to 65535, got the number 70000",
    ]


def test_an_unknown_name_also_shows_the_broken_workflows_errors():
    file = load("workflows:\n  - provider: bash\n    commands: [echo]\n")
    with pytest.raises(WorkflowFileError) as info:
        resolve_run_plan(file, "a", env_overrides={})
    assert [str(e) for e in info.value.errors] == [
        f"{PATH}:2: workflows[0].name: missing required key 'name'",
        f"{PATH}: workflows: no workflow named 'a'; the file has: none",
    ]


def test_a_null_in_the_env_mapping_is_still_an_error_not_a_value_from_the_shell():
    file = load("workflows:\n  - name: t\n    provider: bash\n    commands: [x]\n    env:\n      HF_TOKEN:\n")
    assert [str(e) for e in file.warnings] == [
        f"{PATH}:6: workflows[0] (t).env.HF_TOKEN: an env value must be a string, number or boolean, got nothing (null)"
    ]


def test_a_broken_workflow_with_the_name_of_a_valid_one_makes_the_name_unusable():
    file = load("""\
        workflows:
          - {name: train, provider: bash, commands: [x]}
          - {name: train, provider: bash, comands: [x]}
        """)
    assert list(file.workflows) == []
    assert [str(e) for e in file.warnings] == [
        f"{PATH}:3: workflows[1] (train).comands: unknown key 'comands'; did you mean 'commands'?",
        f"{PATH}:3: workflows[1] (train).name: duplicate workflow name 'train' (first at line 2)",
    ]


def test_an_artifact_may_be_an_absolute_path_of_the_machine_but_a_checkpoint_may_not():
    file = load("""\
        workflows:
          - name: env
            provider: bash
            commands: [conda create -p /opt/envs/train]
            artifacts: [/opt/envs/train]
        """)
    assert file.workflows["env"].artifact_paths == ["/opt/envs/train"]
    for bad in ("/", "/opt/../etc"):
        errors = plan_errors(f"workflows:\n  - {{name: a, provider: bash, commands: [x], artifacts: ['{bad}']}}\n", "a")
        assert any("expected a path inside the repository" in e for e in errors), errors
    errors = plan_errors("workflows:\n  - {name: a, provider: bash, commands: [x], checkpoint: /opt/ckpt}\n", "a")
    assert any("expected a path inside the repository" in e for e in errors), errors


# ------------------------------------------------------------ 11. keys a provider ignored

IGNORED = """\
    workflows:
      - name: train
        provider: bash
        python: 3.10
        requirements: requirements.txt
        commands:
          - pip install -r requirements.txt
          - python train.py
      - name: serve
        provider: docker
        image: python:3.11-slim
        requirements: requirements.txt
        commands: [python serve.py]
    """


def test_requirements_on_bash_and_docker_is_a_warning_at_its_line_not_an_error():
    file = load(IGNORED)

    assert list(file.workflows) == ["train", "serve"]
    assert file.warnings == []
    assert [str(e) for e in file.ignored] == [
        f"{PATH}:5: workflows[0] (train).requirements: ignored: the bash provider does not use 'requirements' "
        "(dstack 0.x ignored it too); to install them, write environment: {requirements: FILE} "
        "(or pip install -r FILE in commands)",
        f"{PATH}:12: workflows[1] (serve).requirements: ignored: the docker provider does not use 'requirements' "
        "(dstack 0.x ignored it too); install them in the image or in commands",
    ]


def test_an_ignored_key_builds_nothing_the_commands_run_as_written():
    [job] = plan(IGNORED, "train").jobs

    assert job.commands[-2:] == ["pip install -r requirements.txt", "python train.py"]
    assert job.environment is None
    assert load_workflows_file(textwrap.dedent(IGNORED), path=PATH).ignored  # the strict loader accepts it too


def test_requirements_is_still_the_python_providers_and_other_keys_are_still_refused_on_bash():
    file = load("""\
        workflows:
          - {name: a, provider: python, script: a.py, requirements: req.txt}
          - {name: b, provider: bash, commands: [x], script: b.py}
        """)

    assert (file.ignored, list(file.workflows)) == ([], ["a"])
    assert [str(e) for e in file.warnings] == [
        f"{PATH}:3: workflows[1] (b).script: 'script' is for the python provider, not bash"
    ]
