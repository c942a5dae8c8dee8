"""What ``trainyard ssh``, ``forward`` and ``ssh-config`` share: the host
entries of a run's jobs, a registered key on this machine (Trainyard's own,
made and registered on first use when none of the user's is), and the stock
``ssh`` command line that reaches a job."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .api import Client, Job, Run
from .config import saved_login
from .sshconfig import HostEntry, Scope, host_alias, ssh_reads_user_config_include, write_entries
from .sshkeys import local_keys, make_trainyard_key, read_public_key, trainyard_key

NO_SSH = (
    "the `ssh` command is not installed: install the OpenSSH client "
    "(Debian/Ubuntu: apt install openssh-client; Fedora: dnf install openssh-clients; macOS has it)"
)


WAITING = ("pending", "assigned")  # statuses a job leaves on its own for running
WAIT_SECONDS = 1800.0
WAIT_POLL_SECONDS = 1.0


class SshClientError(Exception):
    """The job cannot be reached with ssh from here; the message says what to do."""


@dataclass(frozen=True)
class Target:
    """One job as ssh reaches it: its host name, the config that defines it,
    and the key to offer (Trainyard's own; None: the user's own keys)."""

    alias: str
    config: Path
    identity: Path | None


def scope_of(api: Client) -> Scope:
    return Scope(api.url, api.workspace)


def default_workspace(api: Client) -> str:
    """The workspace a bare host name means: the saved login's, else the server's default for the user."""
    saved = saved_login().get("workspace")
    if saved:
        return saved
    if os.environ.get("TRAINYARD_WORKSPACE"):
        return api.me()["default_workspace"] or ""
    return api.workspace


def entries_of(api: Client, run: Run, *, jobs: list[Job] | None = None, default: str) -> list[HostEntry]:
    """One host entry per job of ``run`` (``jobs``: only these)."""
    scope = scope_of(api)
    one = len(run["jobs"]) == 1
    chosen = run["jobs"] if jobs is None else jobs
    return [
        HostEntry(host_alias(scope, run["name"], "" if one else job["name"], default_workspace=default), scope,
                  run["name"], "" if one else job["name"])
        for job in chosen
    ]  # fmt: skip


def pick_job(run: Run, name: str | None) -> Job:
    """The job ``name`` of ``run``; without a name, its only job, or its only running one."""
    if name:
        for job in run["jobs"]:
            if job["name"] == name:
                return job
        listed = ", ".join(j["name"] for j in run["jobs"])
        raise SshClientError(f"run {run['name']} has no job {name!r}: its jobs are {listed}")
    if len(run["jobs"]) == 1:
        return run["jobs"][0]
    running = [job for job in run["jobs"] if job["status"] == "running"]
    if len(running) == 1:
        return running[0]
    listed = ", ".join(f"{j['name']} ({j['status']})" for j in run["jobs"])
    raise SshClientError(f"run {run['name']} has several jobs: name one with --job ({listed})")


def prepare(
    api: Client, run_name: str, job_name: str | None, *, say: Callable[[str], None], wait: bool = False
) -> Target:
    """A registered key here, and the job's host entry written: what ssh
    needs to reach it. ``wait``: a job not running yet is waited for."""
    run = api.get_run(run_name)
    job = pick_job(run, job_name)
    if wait:
        run, job = _wait_until_running(api, run, job, say=say)
    _check_running(run, job)
    identity = ensure_registered_key(api, say=say)
    entry = entries_of(api, run, jobs=[job], default=default_workspace(api))[0]
    config = write_entries([entry], identity=_trainyard_identity())
    return Target(entry.alias, config, identity)


def ensure_registered_key(api: Client, *, say: Callable[[str], None]) -> Path | None:
    """The private key of a registered key here, for ``-i`` (ssh may look
    for its default keys in another home than ``$HOME``'s); None when only
    the agent holds one. With none here, Trainyard's own key, made and
    registered first (said once)."""
    registered = {key["fingerprint"] for key in api.list_ssh_keys()}
    for key in local_keys():
        if key.fingerprint in registered:
            return Path(key.source.removesuffix(".pub")) if key.source.endswith(".pub") else None
    own = trainyard_key()
    made = not own.is_file()
    line = make_trainyard_key().line if made else read_public_key(own.with_name(own.name + ".pub"))
    added = api.add_ssh_key(line, name=line.split(" ", 2)[2] if line.count(" ") >= 2 else "trainyard")
    what = f"Made an SSH key for Trainyard, {own}," if made else f"Trainyard's SSH key {own} was not registered: it is"
    say(f"{what} registered as {added['name']} ({added['fingerprint']}); `trainyard ssh-key ls` lists your keys.")
    return own


def ssh_argv(target: Target, options: list[str], command: list[str]) -> list[str]:
    """The stock ssh's command line for ``target``: ``-F`` the Trainyard
    config when ssh would not read it through ``~/.ssh/config``."""
    ssh = shutil.which("ssh")
    if ssh is None:
        raise SshClientError(NO_SSH)
    config = [] if ssh_reads_user_config_include(target.config) else ["-F", str(target.config)]
    identity = ["-i", str(target.identity)] if target.identity is not None else []
    return [ssh, *config, *identity, *options, target.alias, *command]


def exec_ssh(argv: list[str]) -> None:
    """Becomes ``argv`` (ssh's exit code is the command's); tests replace this function."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


def _wait_until_running(api: Client, run: Run, job: Job, *, say: Callable[[str], None]) -> tuple[Run, Job]:
    """Polls until ``job`` leaves pending/assigned (or ``WAIT_SECONDS`` pass),
    saying each status it waits in once."""
    deadline = time.monotonic() + WAIT_SECONDS
    said = ""
    while job["status"] in WAITING and time.monotonic() < deadline:
        if job["status"] != said:
            said = job["status"]
            say(f"job {job['name']} of run {run['name']} is {said}: waiting until it runs (Ctrl-C stops waiting)")
        time.sleep(WAIT_POLL_SECONDS)
        run = api.get_run(run["name"])
        job = pick_job(run, job["name"])
    return run, job


def _check_running(run: Run, job: Job) -> None:
    """Said here rather than by ssh after a refused grant (the server decides for scp, rsync and VS Code)."""
    status = job["status"]
    if status == "running":
        return
    if status in WAITING:
        raise SshClientError(f"job {job['name']} of run {run['name']} is {status}: wait until it runs "
                             f"(trainyard ssh {run['name']} --wait waits for it)")  # fmt: skip
    raise SshClientError(f"job {job['name']} of run {run['name']} is {status}: sessions reach running jobs only; "
                         f"re-run it (trainyard rerun {run['name']}) to get a running one")  # fmt: skip


def _trainyard_identity() -> Path | None:
    own = trainyard_key()
    return own if own.is_file() else None
