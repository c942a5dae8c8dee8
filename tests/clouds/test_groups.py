"""A master and its workers restart together (backend/runs/lifecycle/groups.py),
with the fake backend (state only) and real Postgres: the master is
interrupted → the workers are stopped (``group_restart``, not counted as a
retry) and wait; the master starts again on a new machine first, then the
workers, given the new master's address. A provider that says
``on_interruption = "job"`` keeps its workers running."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from backend.clouds.services.instances import Facts, instance_connected
from backend.clouds.services.provisioning import instance_launch_run
from backend.runs.lifecycle.groups import groups_restart
from backend.runs.lifecycle.transitions import job_accept
from backend.runs.models import Attempt, Job, JobStatus
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.guards import jobs_guard
from tests.clouds.test_placement import offer
from tests.support.attempts import accept, assign_frame, report
from tests.support.fixtures import Person, submit

pytestmark = pytest.mark.django_db(transaction=True)

GIB = 2**30
CLUSTER = """workflows:
  - name: train
    provider: cluster
    workers: 2
    port: 29500
    master: [python master.py]
    worker: [python worker.py]
"""


def _up(address: str) -> list[Instance]:
    """Launch what was requested; each new machine's runner says hello from ``address``-N."""
    up = []
    for n, instance in enumerate(Instance.objects.filter(status=InstanceStatus.PROVISIONING, launched_at=None)):
        instance_launch_run(instance_id=str(instance.pk))
        facts = Facts(f"box-{address}-{n}", f"{address}.{n}", "test", 2, 4 * GIB, 50 * GIB, [])
        assert instance_connected(instance_id=str(instance.pk), channel_name="c", facts=facts, busy=False)
        up.append(instance)
    return up


def _run_until_running(jobs: list[Job], address: str) -> None:
    """Scheduling passes until every job of ``jobs`` runs (each on a new machine)."""
    for _ in range(6):
        jobs_schedule()
        _up(address)
        jobs_schedule()
        for job in jobs:
            job.refresh_from_db()
            if job.status == JobStatus.ASSIGNED:
                assert accept(job, job.instance_id)
        if all(j.status == JobStatus.RUNNING for j in _fresh(jobs)):
            return
    raise AssertionError([(j.name, j.status, j.status_reason) for j in _fresh(jobs)])


def _fresh(jobs: list[Job]) -> list[Job]:
    for job in jobs:
        job.refresh_from_db()
    return jobs


def _cluster(team: Workspace, owner: Person) -> tuple[Job, list[Job]]:
    jobs = {j.name: j for j in submit(team, owner.user, workflow="train", text=CLUSTER).jobs.all()}
    return jobs["train-master"], [jobs["train-worker-1"], jobs["train-worker-2"]]


def test_an_interrupted_master_restarts_its_workers_after_it_with_its_new_address(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake_account([offer("a", 0.1, zone="r1a"), offer("b", 0.2, zone="r1b")])
    master, workers = _cluster(team, owner)
    _run_until_running([master], "10.0.1")
    _run_until_running(workers, "10.0.2")
    assert {assign_frame(w).env["TRAINYARD_MASTER_HOST"] for w in workers} == {"10.0.1.0"}

    assert report(master, master.instance_id, "interrupted", reason="spot interruption notice")
    assert groups_restart() == 2
    assert groups_restart() == 0, "once"
    for worker in _fresh(workers):
        assert (worker.status, worker.stop_reason) == (JobStatus.STOPPING, "group_restart")
        assert "train-master's attempt 1 ended: the machine was interrupted" in worker.status_reason
        assert report(worker, worker.instance_id, "stopped", exit_code=143)
    for worker in _fresh(workers):
        assert worker.status == JobStatus.PENDING, worker.status_reason
        assert worker.status_reason.startswith("waiting to restart with its group")
        assert Attempt.objects.get(job=worker, number=1).termination_reason == "group_restart"

    # The master first, on a new machine; the workers once it runs, with its new address.
    _run_until_running([master], "10.0.3")
    for worker in _fresh(workers):
        assert worker.status == JobStatus.PENDING
    _run_until_running(workers, "10.0.4")
    for worker in _fresh(workers):
        frame = assign_frame(worker)
        assert frame.attempt == 2 and frame.env["TRAINYARD_MASTER_HOST"] == "10.0.3.0"
        assert frame.env.get("TRAINYARD_RESUMED") == "1"
    assert groups_restart() == 0, "the group runs again: nothing more to restart"


def test_an_interrupted_worker_restarts_the_master_too(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake_account([offer("a", 0.1, zone="r1a")])
    master, workers = _cluster(team, owner)
    _run_until_running([master], "10.0.1")
    _run_until_running(workers, "10.0.2")
    assert report(workers[0], workers[0].instance_id, "interrupted", reason="spot interruption notice")
    assert groups_restart() == 2
    master.refresh_from_db()
    assert (master.status, master.stop_reason) == (JobStatus.STOPPING, "group_restart")


def test_a_provider_that_retries_jobs_alone_keeps_the_workers_running(
    fake_account: Any, script: Path, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainyard_example_cluster import ClusterProvider

    monkeypatch.setattr(ClusterProvider, "on_interruption", "job")
    fake_account([offer("a", 0.1, zone="r1a")])
    master, workers = _cluster(team, owner)
    assert master.spec["on_interruption"] == "job"
    _run_until_running([master], "10.0.1")
    _run_until_running(workers, "10.0.2")
    assert report(master, master.instance_id, "interrupted", reason="spot interruption notice")
    assert groups_restart() == 0
    assert {w.status for w in _fresh(workers)} == {JobStatus.RUNNING}


def test_ports_the_runner_picked_are_the_jobs_and_its_workers_master_port(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    """``ports: N`` (a count): the assignment asks the runner for N ports; the
    ones it names in its acceptance become the job's ``ports``, and a worker
    started after it is given the first as TRAINYARD_MASTER_PORT."""
    fake_account([offer("a", 0.1, zone="r1a")])
    master, workers = _cluster(team, owner)
    Job.objects.filter(pk=master.pk).update(spec={**master.spec, "port_count": 2}, ports=[])
    jobs_schedule()
    _up("10.0.1")
    jobs_schedule()
    master.refresh_from_db()
    assert assign_frame(master).port_count == 2
    attempt = Attempt.objects.get(job=master, number=1)
    assert job_accept(
        job_id=str(master.pk), instance_id=str(master.instance_id), attempt=1, lease=attempt.lease, ports=[40001, 40002]
    )
    master.refresh_from_db()
    assert master.ports == [40001, 40002]
    _run_until_running(workers, "10.0.2")
    assert {assign_frame(w).env["TRAINYARD_MASTER_PORT"] for w in workers} == {"40001"}


def test_a_worker_a_stall_guard_restarts_restarts_its_group(
    fake_account: Any, script: Path, team: Workspace, owner: Person
) -> None:
    fake_account([offer("a", 0.1, zone="r1a")])
    text = CLUSTER + "    stall: {timeout: 1m, action: restart}\n"
    jobs = {j.name: j for j in submit(team, owner.user, workflow="train", text=text).jobs.all()}
    master, workers = jobs["train-master"], [jobs["train-worker-1"], jobs["train-worker-2"]]
    _run_until_running([master], "10.0.1")
    _run_until_running(workers, "10.0.2")
    now = timezone.now()
    Attempt.objects.filter(job__run=master.run).update(last_output_at=now)
    Attempt.objects.filter(job=workers[0]).update(last_output_at=now - timedelta(minutes=2))

    assert jobs_guard() == 1
    assert report(workers[0], workers[0].instance_id, "stopped", exit_code=143)
    workers[0].refresh_from_db()
    assert workers[0].status == JobStatus.PENDING
    assert groups_restart() == 2
    for job in _fresh([master, workers[1]]):
        assert (job.status, job.stop_reason) == (JobStatus.STOPPING, "group_restart")
        assert "train-worker-1's attempt 1 ended: no output for the stall timeout (stall)" in job.status_reason
