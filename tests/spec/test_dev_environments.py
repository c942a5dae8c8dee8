"""``provider: lab | notebook | code``: what a dev environment's job runs,
in which environment, on which port, and its ``inactivity_duration``."""

from __future__ import annotations

import textwrap

import pytest
from trainyard_spec import Source, WorkflowFileError, load_workflows, resolve_run_plan

PATH = ".trainyard/workflows.yaml"


def plan_one(text: str, workflow: str):
    file = load_workflows([Source(PATH, textwrap.dedent(text))])
    assert file.warnings == []
    [job] = resolve_run_plan(file, workflow, env_overrides={}).jobs
    return job


def warnings(text: str) -> list[str]:
    return [str(e) for e in load_workflows([Source(PATH, textwrap.dedent(text))]).warnings]


def test_lab_runs_jupyterlab_in_the_workflows_environment_on_port_0():
    job = plan_one(
        """\
        workflows:
          - name: lab
            provider: lab
            python: "3.11"
            environment: {requirements: requirements.txt, pip: [numpy]}
            setup: [echo ready]
            ports: 1
        """,
        "lab",
    )
    assert job.provider == "bash"
    assert job.environment == {
        "python": "3.11",
        "requirements": "requirements.txt",
        "pip": ["numpy", "jupyterlab==4.6.6"],
    }
    assert job.commands == [
        "echo ready",
        'exec jupyter lab --no-browser --allow-root --ip=127.0.0.1 --port="$PORT_0" --ServerApp.port_retries=0'
        ' --ServerApp.allow_remote_access=True --ServerApp.root_dir="$PWD"',
    ]
    # Jupyter's port is PORT_0; the workflow's own ``ports: 1`` is PORT_1.
    assert (job.port_count, job.dev_environment, job.inactivity_duration) == (2, "lab", None)


def test_notebook_runs_jupyter_notebook_with_its_own_pin_and_culls_idle_kernels():
    job = plan_one("workflows:\n  - {name: nb, provider: notebook, inactivity_duration: 30m}\n", "nb")
    assert job.environment == {"pip": ["notebook==7.6.5"]}
    assert job.commands[-1].startswith(
        'exec jupyter notebook --no-browser --allow-root --ip=127.0.0.1 --port="$PORT_0"'
    )
    assert job.commands[-1].endswith(
        "--MappingKernelManager.cull_idle_timeout=1800 --MappingKernelManager.cull_interval=60"
    )
    assert (job.port_count, job.inactivity_duration) == (1, 1800)


def test_requirements_is_the_environments_shorthand_as_for_python():
    job = plan_one("workflows:\n  - {name: lab, provider: lab, requirements: req.txt}\n", "lab")
    assert job.environment == {"requirements": "req.txt", "pip": ["jupyterlab==4.6.6"]}


def test_code_stays_up_in_its_environment_and_says_how_to_open_it():
    job = plan_one("workflows:\n  - {name: ide, provider: code, python: '3.12', inactivity_duration: off}\n", "ide")
    assert job.environment == {"python": "3.12"}
    assert job.commands == [
        'echo "Ready for VS Code over SSH: trainyard ssh-config $TRAINYARD_RUN_NAME, then:'
        ' code --remote ssh-remote+$TRAINYARD_SSH_HOST $PWD"',
        "exec sleep infinity",
    ]
    assert (job.port_count, job.dev_environment, job.inactivity_duration) == (0, "code", "off")


def test_code_without_an_environment_runs_with_the_machines_python():
    assert plan_one("workflows:\n  - {name: ide, provider: code}\n", "ide").environment is None


@pytest.mark.parametrize(
    ("written", "seconds"), [("30m", 1800), ("2h", 7200), ("45", 45), ("5s", 5), ("off", "off"), ("false", "off")]
)
def test_inactivity_duration_takes_dstacks_forms(written: str, seconds: int | str):
    job = plan_one(f"workflows:\n  - name: lab\n    provider: lab\n    inactivity_duration: {written}\n", "lab")
    assert job.inactivity_duration == seconds


@pytest.mark.parametrize(
    ("written", "error"),
    [
        ("0", "a duration of 0 means no time at all: write e.g. 30m, or off"),
        ("soon", "expected a duration such as 30m, 2h or 1d (or off), got 'soon'"),
    ],
)
def test_a_bad_inactivity_duration_is_an_error_at_its_line(written: str, error: str):
    text = f"workflows:\n  - name: lab\n    provider: lab\n    inactivity_duration: {written}\n"
    assert warnings(text) == [f"{PATH}:4: workflows[0] (lab).inactivity_duration: {error}"]


def test_inactivity_duration_and_version_are_for_dev_environments_only():
    text = "workflows:\n  - {name: t, provider: bash, commands: [x], inactivity_duration: 1h, version: 2}\n"
    assert warnings(text) == [
        f"{PATH}:2: workflows[0] (t).inactivity_duration: 'inactivity_duration' is for the code, lab and notebook"
        " providers, not bash",
        f"{PATH}:2: workflows[0] (t).version: 'version' is for the code, lab and notebook providers, not bash",
    ]


def test_a_dev_environment_takes_no_commands_or_script():
    text = "workflows:\n  - {name: lab, provider: lab, commands: [x]}\n"
    assert warnings(text) == [
        f"{PATH}:2: workflows[0] (lab).commands: 'commands' is for the bash and docker provider, not lab"
    ]


def test_a_refused_version_leaves_the_other_workflows_of_the_file_runnable():
    text = "workflows:\n  - {name: lab, provider: lab, version: 4.0}\n  - {name: nb, provider: notebook}\n"
    file = load_workflows([Source(PATH, text)])
    assert [j.name for j in resolve_run_plan(file, "nb", env_overrides={}).jobs] == ["nb"]
    with pytest.raises(WorkflowFileError) as info:
        resolve_run_plan(file, "lab", env_overrides={})
    assert [str(e) for e in info.value.errors] == [
        f"{PATH}:2: workflows[0] (lab).version: not supported yet: version: 4.0 (lab runs jupyterlab==4.6.6);"
        " remove it to run the workflow"
    ]
