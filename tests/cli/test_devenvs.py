"""What ``trainyard run`` says about a dev environment: where it will be
said while it is pending, then the link to its Jupyter (opened with
``--open``) or its ssh host and VS Code's line, once, when it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from trainyard.devenvs import DevEnvironmentNotice

from tests.cli.fakes import WS, FakeRest, invoke, make_job, make_run, use


def _run(status: str, kind: str, port: int | None, *, jobs: int = 1, idle: int | None = 3600) -> Any:
    dev = {"kind": kind, "inactivity_seconds": idle, "app_port": port}
    others = [{"name": f"other{i}", "status": "running", "dev_environment": None} for i in range(jobs - 1)]
    return {"name": "brave-otter-3", "jobs": [{"name": "lab", "status": status, "dev_environment": dev}, *others]}


def test_lab_says_it_will_print_the_link_then_prints_it_once_and_opens_it(capsys: pytest.CaptureFixture[str]):
    opened: list[str] = []
    notice = DevEnvironmentNotice("http://127.0.0.1:8000/", "team", open_browser=True, opener=opened.append)

    notice.pending(_run("pending", "lab", None))
    notice(_run("assigned", "lab", None))
    notice(_run("running", "lab", 41234))
    notice(_run("running", "lab", 41234))

    assert capsys.readouterr().err == (
        "lab: the link to its JupyterLab is printed here once it runs. It stops after 1h with no session into it"
        " and no kernel activity (inactivity_duration).\n"
        "lab: JupyterLab is at http://127.0.0.1:8000/open/team/brave-otter-3/lab/41234/\n"
    )
    assert opened == ["http://127.0.0.1:8000/open/team/brave-otter-3/lab/41234/"]


def test_without_open_nothing_is_opened(capsys: pytest.CaptureFixture[str]):
    opened: list[str] = []
    DevEnvironmentNotice("http://s", "team", opener=opened.append)(_run("running", "notebook", 5000, idle=None))
    assert capsys.readouterr().err == "lab: Jupyter Notebook is at http://s/open/team/brave-otter-3/lab/5000/\n"
    assert opened == []


def test_detached_it_says_where_to_open_it(capsys: pytest.CaptureFixture[str]):
    DevEnvironmentNotice("http://s", "team", detached=True).pending(_run("pending", "lab", None, idle=None))
    assert capsys.readouterr().err == (
        "lab: once it runs, open its JupyterLab from the run's page in the dashboard (Open, port PORT_0)."
        " It runs until stopped (inactivity_duration: off).\n"
    )


@pytest.mark.parametrize(("jobs", "host"), [(1, "trainyard-brave-otter-3"), (2, "trainyard-brave-otter-3-lab")])
def test_code_prints_its_ssh_host_and_the_code_remote_line(capsys: pytest.CaptureFixture[str], jobs: int, host: str):
    DevEnvironmentNotice("http://s", "team")(_run("running", "code", None, jobs=jobs, idle=1800))
    assert capsys.readouterr().err == (
        f"lab: ready for VS Code over SSH, host {host}: trainyard ssh-config brave-otter-3, then\n"
        f"  code --remote ssh-remote+{host} <its working directory, in its log>\n"
    )


def test_run_lab_detached_says_where_to_open_it_after_the_announcement(
    tiny_train: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tiny_train)
    (tiny_train / ".trainyard" / "workflows.yaml").write_text("workflows:\n  - {name: lab, provider: lab}\n")
    job = {
        **make_job("pending"),
        "name": "lab",
        "dev_environment": {"kind": "lab", "inactivity_seconds": 3600, "app_port": None},
    }
    rest = FakeRest(
        {
            ("POST", f"{WS}/blobs/"): httpx.Response(201, json={"id": "blob-1", "size": 10, "sha256": "x"}),
            ("POST", f"{WS}/runs/"): httpx.Response(201, json=make_run("pending", jobs=[job])),
        }
    )
    use(monkeypatch, "http://fake", rest)

    code, out, err = invoke("run", "lab", "-d")

    assert (code, out) == (0, "brave-otter-1\n")
    assert err == (
        "Run brave-otter-1 submitted\n"
        "View: http://fake/w/ws1/runs/brave-otter-1\n"
        "lab: once it runs, open its JupyterLab from the run's page in the dashboard (Open, port PORT_0). It stops"
        " after 1h with no session into it and no kernel activity (inactivity_duration).\n"
    )
