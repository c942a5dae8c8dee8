from __future__ import annotations

import importlib.metadata
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel
from trainyard_spec import (
    JobPlan,
    Provider,
    ProviderNotFound,
    ResourceSpec,
    Workflow,
    WorkflowFileError,
    find_workflows_file,
    get_provider,
    job_plan,
    load_workflows_file,
    providers,
    resolve_run_plan,
)

PATH = ".trainyard/workflows.yaml"
NO_RESOURCES = ResourceSpec(
    cpu=None, memory_bytes=None, disk_bytes=None, shm_size_bytes=None, gpu_name=None, gpu_count=0, gpu_memory_bytes=None
)
CHECK_311 = (
    "python3.11 -c '' 2>/dev/null || { echo \"python 3.11 is not installed on this runner's machine\" >&2; exit 127; }"
)


def load(text: str):
    return load_workflows_file(textwrap.dedent(text), path=PATH)


def plan(text: str, workflow: str, **env: str):
    return resolve_run_plan(load(text), workflow, env_overrides=env)


def plan_errors(text: str, workflow: str) -> list[str]:
    with pytest.raises(WorkflowFileError) as info:
        plan(text, workflow)
    return [str(e) for e in info.value.errors]


def load_errors(text: str) -> list[str]:
    with pytest.raises(WorkflowFileError) as info:
        load(text)
    return [str(e) for e in info.value.errors]


# ------------------------------------------------------------ deps


CHAIN = """\
    workflows:
      - name: train
        provider: bash
        commands: [python train.py]
        deps: [{workflow: download}, {tag: best-model}]
        artifacts: [./checkpoint]
      - name: download
        provider: bash
        commands: [python download.py]
        artifacts: [./base_model]
        resources: {cpu: 2}
      - name: report
        provider: bash
        commands: [python report.py]
        deps: [{workflow: train}, {run: brave-otter-3}, {workflow: download}]
    """


def test_a_dependency_chain_runs_dependencies_first_and_each_job_needs_its_dependencies():
    result = plan(CHAIN, "report")
    assert [(j.name, j.needs) for j in result.jobs] == [
        ("download", []),
        ("train", ["download"]),
        ("report", ["train", "download"]),
    ]
    assert result.workflow == "report"
    assert result.job("download") == JobPlan(
        name="download", workflow="download", provider="bash", commands=["python download.py"], env={},
        artifacts=["./base_model"], resources=ResourceSpec(cpu=2, memory_bytes=None, disk_bytes=None, shm_size_bytes=None, gpu_name=None, gpu_count=0, gpu_memory_bytes=None),
        ports=[], needs=[], after_running=[], tags=[], runs=[],
    )  # fmt: skip


def test_tag_and_run_deps_go_to_the_jobs_of_the_workflow_that_has_them():
    result = plan(CHAIN, "report")
    assert [(j.name, j.tags, j.runs) for j in result.jobs] == [
        ("download", [], []),
        ("train", ["best-model"], []),
        ("report", [], ["brave-otter-3"]),
    ]


def test_a_shared_dependency_runs_once():
    result = plan("""\
        workflows:
          - {name: base, provider: bash, commands: [x]}
          - {name: left, provider: bash, commands: [x], deps: [{workflow: base}]}
          - {name: right, provider: bash, commands: [x], deps: [{workflow: base}, {workflow: base}]}
          - {name: top, provider: bash, commands: [x], deps: [{workflow: left}, {workflow: right}]}
        """, "top")  # fmt: skip
    assert [(j.name, j.needs) for j in result.jobs] == [
        ("base", []),
        ("left", ["base"]),
        ("right", ["base"]),
        ("top", ["left", "right"]),
    ]


def test_a_cycle_is_an_error_at_the_deps_of_its_first_workflow():
    assert plan_errors(
        """\
        workflows:
          - name: top
            provider: bash
            commands: [x]
            deps: [{workflow: a}]
          - name: b
            provider: bash
            commands: [x]
            deps: [{workflow: a}]
          - name: a
            provider: bash
            commands: [x]
            deps:
              - workflow: b
        """,
        "top",
    ) == [f"{PATH}:13: workflows[2] (a).deps: a cycle: a → b → a"]


def test_a_workflow_that_depends_on_itself_is_a_cycle():
    assert plan_errors("workflows:\n  - {name: a, provider: bash, commands: [x], deps: [{workflow: a}]}\n", "a") == [
        f"{PATH}:2: workflows[0] (a).deps: a cycle: a → a"
    ]


def test_a_missing_dependency_names_the_line_and_the_workflows_of_the_file():
    assert plan_errors(
        """\
        workflows:
          - name: train
            provider: bash
            commands: [x]
            deps:
              - tag: t
              - workflow: downlaod
          - name: download
            provider: bash
            commands: [x]
        """,
        "train",
    ) == [
        f"{PATH}:7: workflows[0] (train).deps[1].workflow: no workflow named 'downlaod'; did you mean 'download'? the file has: train, download"
    ]


def test_keys_not_supported_yet_are_refused_in_dependencies_too_all_at_once(monkeypatch):
    # Every key is built today; the mechanism is kept for the next new key.
    monkeypatch.setattr("trainyard_spec.planning.NOT_SUPPORTED_YET", ("max_wait", "max_price"))
    assert plan_errors(
        """\
        workflows:
          - name: a
            provider: bash
            commands: [x]
            max_wait: 1h
          - name: b
            provider: bash
            commands: [x]
            deps: [{workflow: a}]
            max_price: 1.5
        """,
        "b",
    ) == [
        f"{PATH}:5: workflows[0] (a).max_wait: 'max_wait' is not supported yet; remove it from workflow 'a' to run it",
        f"{PATH}:10: workflows[1] (b).max_price: 'max_price' is not supported yet; remove it from workflow 'b' to run it",
    ]


def test_a_workflow_unused_by_the_run_may_have_unsupported_keys_and_cycles(monkeypatch):
    monkeypatch.setattr("trainyard_spec.planning.NOT_SUPPORTED_YET", ("max_wait",))
    result = plan("""\
        workflows:
          - {name: ok, provider: bash, commands: [x]}
          - {name: a, provider: bash, commands: [x], deps: [{workflow: a}], max_wait: 1h}
        """, "ok")  # fmt: skip
    assert [j.name for j in result.jobs] == ["ok"]


def test_env_overrides_apply_to_every_job_of_the_run():
    result = plan("""\
        workflows:
          - {name: a, provider: bash, commands: [x], env: {STEPS: 10, KEEP: a}}
          - {name: b, provider: bash, commands: [x], env: {STEPS: 20}, deps: [{workflow: a}]}
        """, "b", STEPS="50")  # fmt: skip
    assert [j.env for j in result.jobs] == [{"STEPS": "50", "KEEP": "a"}, {"STEPS": "50"}]


def test_tiny_train_finetune_runs_download_first_once_checkpoint_is_supported(tiny_train: Path):
    text = find_workflows_file(tiny_train).read_text().replace("    checkpoint: ./checkpoint\n", "")
    result = resolve_run_plan(load_workflows_file(text, path=PATH), "finetune-model", env_overrides={})
    assert [(j.name, j.needs, j.artifacts) for j in result.jobs] == [
        ("download-base-model", [], ["./base_model"]),
        ("finetune-model", ["download-base-model"], ["./checkpoint"]),
    ]
    evaluate = resolve_run_plan(load_workflows_file(text, path=PATH), "evaluate", env_overrides={})
    assert [(j.name, j.provider, j.commands, j.tags) for j in evaluate.jobs] == [
        ("evaluate", "python", ["python evaluate.py"], ["best-model"])
    ]


# ------------------------------------------------------------ built-in providers


def python_job(extra: str):
    return plan(f"workflows:\n  - {{name: a, provider: python, script: train model.py, {extra}}}\n", "a").jobs[0]


def test_python_provider_runs_the_script():
    job = python_job("env: {}")
    assert (job.provider, job.commands) == ("python", ["python 'train model.py'"])


def test_python_provider_with_a_version_checks_it_is_installed():
    assert python_job('python: "3.11"').commands == [CHECK_311, "python3.11 'train model.py'"]


def test_python_provider_with_requirements_runs_the_script_in_their_environment():
    job = python_job("requirements: requirements.txt")
    assert job.commands == ["python 'train model.py'"]
    assert job.environment == {"requirements": "requirements.txt"}


def test_python_provider_with_requirements_and_a_version_asks_for_that_python():
    job = python_job('requirements: req.txt, python: "3.11.4"')
    assert job.commands == ["python 'train model.py'"]
    assert job.environment == {"python": "3.11.4", "requirements": "req.txt"}


ENVIRONMENT = """\
    workflows:
      - name: a
        provider: bash
        commands: [python train.py]
        environment:
          python: "3.11"
          requirements: requirements.txt
          pip: [tqdm==4.67.1]
          setup: [python -m compileall -q .]
    """


def test_an_environment_goes_to_the_job_as_the_runner_builds_it():
    job = plan(ENVIRONMENT, "a").jobs[0]
    assert job.commands == ["python train.py"]  # no interpreter check: the runner's build says it
    assert job.environment == {
        "python": "3.11",
        "requirements": "requirements.txt",
        "pip": ["tqdm==4.67.1"],
        "setup": ["python -m compileall -q ."],
    }


def test_the_workflows_python_is_the_environments_when_it_names_none():
    text = ENVIRONMENT.replace('          python: "3.11"\n', "").replace(
        "provider: bash", 'provider: bash\n        python: "3.12"'
    )
    assert plan(text, "a").jobs[0].environment["python"] == "3.12"


def test_two_different_pythons_for_one_environment_are_an_error_at_the_provider():
    text = ENVIRONMENT.replace("provider: bash", 'provider: bash\n        python: "3.12"')
    with pytest.raises(WorkflowFileError) as e:
        plan(text, "a")
    assert "python: '3.12' and environment: python: '3.11' differ; keep one of them" in str(e.value)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("conda: environment.yml", "conda environments are not built yet; use requirements or pip"),
        ("apt: [libsndfile1]", "apt packages are not installed by environments yet; install them in the commands"),
        ("image: python:3.11", "an image is not built from an environment yet; use provider: docker with image"),
        ("requirements: /etc/requirements.txt", "requirements"),
        ("pipp: [x]", "unknown key 'pipp'; did you mean 'pip'?"),
    ],
)
def test_environment_keys_not_built_yet_or_wrong_are_refused_at_their_line(line: str, message: str):
    text = ENVIRONMENT.replace("          pip: [tqdm==4.67.1]", f"          {line}")
    errors = load_errors(text)
    assert len(errors) == 1 and errors[0].startswith(f"{PATH}:8: workflows[0] (a).environment."), errors
    assert message in errors[0]


def test_the_docker_provider_does_not_read_an_environment():
    text = "workflows:\n  - {name: a, provider: docker, image: x, commands: [y], environment: {pip: [z]}}\n"
    assert load_errors(text) == [
        f"{PATH}:2: workflows[0] (a).environment: 'environment' is for the bash, python, code, lab and notebook providers,"
        " not docker"
    ]


def test_bash_provider_with_a_python_version_puts_it_first_on_path():
    job = plan(
        'workflows:\n  - {name: a, provider: bash, commands: [python t.py], python: "3.11", ports: [8080]}\n', "a"
    ).jobs[0]
    assert job.commands[0] == CHECK_311
    assert job.commands[-2:] == ['export PATH="$PWD/.trainyard-bin:$PATH"', "python t.py"]
    assert job.ports == [8080]


def test_docker_provider_runs_the_commands_in_the_image():
    job = plan("workflows:\n  - {name: a, provider: docker, image: 'ubuntu:24.04', commands: [nproc]}\n", "a").jobs[0]
    assert (job.provider, job.image, job.commands) == ("docker", "ubuntu:24.04", ["nproc"])


# ------------------------------------------------------------ plugins


CLUSTER = """\
    workflows:
      - name: prep
        provider: bash
        commands: [python prep.py]
        artifacts: [./data]
      - name: dist
        provider: cluster
        workers: 2
        port: 29500
        master: [python master.py]
        worker: [python worker.py]
        env: {STEPS: 5}
        artifacts: [./model]
        resources: {cpu: 2}
        deps: [{workflow: prep}]
    """


def test_the_example_cluster_plugin_is_found_through_its_entry_point():
    provider = get_provider("cluster")
    assert type(provider).__module__ == "trainyard_example_cluster"
    assert provider.name == "cluster" and isinstance(provider, Provider)


def test_the_cluster_plugin_plans_a_master_and_two_workers_after_the_dependency():
    result = plan(CLUSTER, "dist", STEPS="7")
    cpu2 = ResourceSpec(
        cpu=2,
        memory_bytes=None,
        disk_bytes=None,
        shm_size_bytes=None,
        gpu_name=None,
        gpu_count=0,
        gpu_memory_bytes=None,
    )
    assert [j.name for j in result.jobs] == ["prep", "dist-master", "dist-worker-1", "dist-worker-2"]
    assert result.job("dist-master") == JobPlan(
        name="dist-master", workflow="dist", provider="bash", commands=["python master.py"], env={"STEPS": "7", "MASTER_PORT": "29500"},
        artifacts=["./model"], resources=cpu2, ports=[29500], needs=["prep"], after_running=[], tags=[], runs=[],
    )  # fmt: skip
    assert result.job("dist-worker-2") == JobPlan(
        name="dist-worker-2", workflow="dist", provider="bash", commands=["python worker.py"], env={"STEPS": "7", "WORKER_INDEX": "2"},
        artifacts=[], resources=cpu2, ports=[], needs=["prep"], after_running=["dist-master"], tags=[], runs=[],
    )  # fmt: skip


def test_plugin_option_errors_carry_file_line_and_key():
    text = CLUSTER.replace("workers: 2", "workers: 17").replace("port: 29500", "prot: 29500")
    assert load_errors(text) == [
        f"{PATH}:6: workflows[1] (dist).port: missing required key 'port'",
        f"{PATH}:8: workflows[1] (dist).workers: must be at most 16, got the number 17",
        f"{PATH}:9: workflows[1] (dist).prot: unknown key 'prot'; did you mean 'port'?",
    ]


def test_a_plugin_workflow_refuses_the_builtin_keys_it_does_not_read():
    assert load_errors(CLUSTER.replace("workers: 2", "workers: 2\n        commands: [x]")) == [
        f"{PATH}:9: workflows[1] (dist).commands: 'commands' is not used by the cluster provider"
    ]


def test_a_builtin_workflow_with_a_plugins_key_is_still_an_unknown_key():
    assert load_errors("workflows:\n  - {name: a, provider: bash, commands: [x], workers: 2}\n")[0].startswith(
        f"{PATH}:2: workflows[0] (a).workers: unknown key 'workers'; allowed keys: name, provider,"
    )


def test_an_unknown_provider_is_not_found():
    with pytest.raises(ProviderNotFound, match=r"unknown provider 'clustr'; did you mean 'cluster'\?"):
        get_provider("clustr")


def test_a_plugin_that_imports_the_sdk_from_the_cli_says_where_the_sdk_is_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "oldstyle_plugin.py").write_text("from trainyard.providers import Provider\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "trainyard", None)  # as on the server, which has no CLI
    monkeypatch.delitem(sys.modules, "trainyard.providers", raising=False)
    entry = importlib.metadata.EntryPoint("oldstyle", "oldstyle_plugin:OldProvider", providers.ENTRY_POINT_GROUP)
    monkeypatch.setattr(providers, "_entry_points", lambda: (entry,))
    providers._plugin.cache_clear()
    try:
        with pytest.raises(ProviderNotFound) as info:
            get_provider("oldstyle")
    finally:
        providers._plugin.cache_clear()
    message = str(info.value)
    assert message.startswith(
        "provider 'oldstyle' is installed (oldstyle_plugin:OldProvider) but could not be loaded: ModuleNotFoundError: "
    )
    assert message.endswith(" (the provider SDK is now the trainyard-spec package: import from trainyard_spec)")


class _Broken(Provider):
    name = "broken"

    def jobs(self, wf: Workflow, *, env: dict[str, str], options: BaseModel | None) -> list[JobPlan]:
        return [
            job_plan(wf, name="x", commands=[], env=env, after_running=["y"]),
            job_plan(wf, name="y", commands=[], env=env, after_running=["x"]),
        ]


def test_a_plugins_invalid_plan_is_an_error_at_the_workflow(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(providers._BUILTINS, "broken", _Broken())
    assert plan_errors("workflows:\n  - {name: a, provider: broken}\n", "a") == [
        f"{PATH}:2: workflows[0] (a).provider: the broken provider made an invalid plan: its jobs wait for each other in a cycle (x, y)"
    ]


def test_a_plugin_job_named_like_another_workflows_job_is_an_error():
    text = CLUSTER + "  - {name: dist-master, provider: bash, commands: [x], deps: [{workflow: dist}]}\n"
    assert plan_errors(text, "dist-master") == [
        f"{PATH}:16: workflows[2] (dist-master).name: the run would have two jobs named 'dist-master' (one of workflow 'dist'); rename one of the workflows"
    ]


def test_the_provider_decides_what_an_interruption_does_to_the_group(monkeypatch):
    assert {j.on_interruption for j in plan(CLUSTER, "dist").jobs} == {"restart_group"}
    cluster = type(get_provider("cluster"))
    monkeypatch.setattr(cluster, "on_interruption", "job")
    assert {j.on_interruption for j in plan(CLUSTER, "dist").jobs if j.name.startswith("dist-")} == {"job"}
    monkeypatch.setattr(cluster, "on_interruption", "restart-everything")
    [error] = plan_errors(CLUSTER, "dist")
    assert error.endswith(
        "(dist).provider: the cluster provider's on_interruption is 'restart-everything', not one of restart_group, job"
    ), error
