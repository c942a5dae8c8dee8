"""What ``trainyard run`` says about a run's dev environments
(``provider: code | lab | notebook``): once each runs, the link that opens
its Jupyter (on the dashboard's origin: the server sends the person on to
the app's own origin, docs/ACCESS.md) or its ``ssh-config`` host and VS
Code's ``code --remote`` line; ``--open`` opens the link in a browser."""

from __future__ import annotations

import webbrowser
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

import click

from .api import Job, Run

APPS = {"lab": "JupyterLab", "notebook": "Jupyter Notebook"}


@dataclass
class DevEnvironmentNotice:
    """Called with every update of a followed run; says each dev
    environment's way in once, when it is running."""

    server: str
    workspace: str
    open_browser: bool = False
    detached: bool = False
    opener: Callable[[str], object] = webbrowser.open
    # The ``Host`` ``trainyard ssh-config`` writes for a job (``sshclient``: it
    # names the server and workspace when they are not the login's).
    host_of: Callable[[Run, Job], str] = lambda run, job: ssh_host(run, job)
    said: set[str] = field(default_factory=set)

    def pending(self, run: Run) -> None:
        """What the run will print (or, detached, where to look), said when it is submitted."""
        for job in _dev_jobs(run):
            kind = job["dev_environment"]["kind"]  # type: ignore[index]
            if kind not in APPS:
                alias = self.host_of(run, job)
                where = f"once it runs: trainyard ssh-config {run['name']}, then code --remote ssh-remote+{alias} DIR"
            elif self.detached:
                where = f"once it runs, open its {APPS[kind]} from the run's page in the dashboard (Open, port PORT_0)"
            else:
                where = f"the link to its {APPS[kind]} is printed here once it runs"
            click.echo(f"{job['name']}: {where}. {_idle_words(job)}", err=True)

    def __call__(self, run: Run) -> None:
        for job in _dev_jobs(run):
            if job["name"] in self.said or job["status"] != "running":
                continue
            lines = self._lines(run, job)
            if lines:
                self.said.add(job["name"])
                click.echo("\n".join(lines), err=True)

    def _lines(self, run: Run, job: Job) -> list[str]:
        dev = job["dev_environment"]
        assert dev is not None
        if dev["kind"] not in APPS:
            alias = self.host_of(run, job)
            return [
                f"{job['name']}: ready for VS Code over SSH, host {alias}: trainyard ssh-config {run['name']}, then",
                f"  code --remote ssh-remote+{alias} <its working directory, in its log>",
            ]
        if dev["app_port"] is None:
            return []
        url = app_url(self.server, self.workspace, run["name"], job["name"], dev["app_port"])
        if self.open_browser:
            self.opener(url)
        return [f"{job['name']}: {APPS[dev['kind']]} is at {url}"]


def app_url(server: str, workspace: str, run: str, job: str, port: int) -> str:
    """The dashboard's link that opens a job's port (its app's own origin after a grant)."""
    parts = "/".join(quote(p, safe="") for p in (workspace, run, job))
    return f"{server.rstrip('/')}/open/{parts}/{port}/"


def ssh_host(run: Run, job: Job) -> str:
    """The ``Host`` ``trainyard ssh-config`` writes for the job with the login's server and workspace."""
    return f"trainyard-{run['name']}" if len(run["jobs"]) == 1 else f"trainyard-{run['name']}-{job['name']}"


def _dev_jobs(run: Run) -> list[Job]:
    return [job for job in run["jobs"] if job.get("dev_environment")]


def _idle_words(job: Job) -> str:
    dev = job["dev_environment"]
    assert dev is not None
    seconds = dev["inactivity_seconds"]
    if seconds is None:
        return "It runs until stopped (inactivity_duration: off)."
    kernels = " and no kernel activity" if dev["kind"] in APPS else ""
    return f"It stops after {duration_words(seconds)} with no session into it{kernels} (inactivity_duration)."


def duration_words(seconds: int) -> str:
    """``1h``, ``30m``, ``45s``: as ``inactivity_duration`` is written."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
