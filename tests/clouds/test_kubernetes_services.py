"""What the reconciler does with a cloud's reasons (``Trouble``), as a
Kubernetes cluster gives them: a pod no node can take says so on its job,
then its cluster is skipped for a while and the next offer is tried; an image
that cannot be pulled fails the job with the cloud's words; an evicted,
deleted or node-less pod is a lost machine, a preempted one an interruption.

The cloud here is the fake backend with a view the test sets
(``TroubledCompute``): the reasons' handling is the services', whichever
backend gives them."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from backend.accounts.models import Workspace
from backend.clouds.backends.base import CloudState, Handle, MachineView, Timings, Trouble
from backend.clouds.backends.fake.compute import FakeCompute
from backend.clouds.models import CloudAccount, Instance, InstanceEvent, OfferBlock
from backend.clouds.services import reconcile as clouds
from backend.clouds.services.instances import Facts, instance_connected
from backend.clouds.services.provisioning import instance_launch_run, instance_terminate_run
from backend.core.clock import db_now
from backend.runs.models import Attempt, Job
from backend.runs.scheduler.passes import jobs_schedule
from tests.support.accounttasks import reconcile_with_account_tasks
from tests.support.attempts import accept
from tests.support.fixtures import Person, submit

GIB = 2**30
KIND = "troubled"
SCHEDULER_SAYS = (
    "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint {nvidia.com/gpu: present}."
)
WORKFLOWS = """workflows:
  - name: train
    provider: bash
    commands: [python train.py]
    retry:
      limit: 3
      on_events: [error, interruption, instance_lost, no_capacity]
"""
CLUSTER_OFFER = {
    "instance_type": "k8s-node",
    "region": "cluster-a",
    "price_per_hour": 0.1,
    "cpus": 4,
    "memory_bytes": 8 * GIB,
}
FAKE_OFFER = {"instance_type": "fake-a", "region": "r1", "price_per_hour": 0.5, "cpus": 4, "memory_bytes": 8 * GIB}

# What the cloud says of each machine beyond its state, by idempotency key.
VIEWS: dict[str, MachineView] = {}


class TroubledCompute(FakeCompute):
    """The fake cloud, whose ``view`` says what ``VIEWS`` says of a machine."""

    kind = KIND
    reusable_instances = False
    timings = Timings(provision_timeout=60.0, schedule_timeout=300.0)

    def view(self, handles: Sequence[Handle]) -> Mapping[str, MachineView]:
        seen = super().view(handles)
        return {key: VIEWS.get(key, found) for key, found in seen.items()}


@pytest.fixture
def accounts(team: Workspace, tmp_path: Path, script: Path, settings: Any) -> Iterator[CloudAccount]:
    """A troubled cluster (the cheaper offer) and a fake cloud beside it."""
    kinds = {**settings.TRAINYARD["BACKEND_KINDS"], KIND: f"{__name__}:TroubledCompute"}
    settings.TRAINYARD = {
        **settings.TRAINYARD,
        "BACKEND_KINDS": kinds,
        "LOCAL_BACKEND_ENABLED": False,
        "HEARTBEAT_TIMEOUT_SECONDS": 5.0,
    }
    made = []
    for kind, offer in ((KIND, CLUSTER_OFFER), ("fake", FAKE_OFFER)):
        config = {"state_dir": str(tmp_path / kind), "script_file": str(script), "offers": [offer]}
        made.append(CloudAccount.objects.create(workspace=team, kind=kind, name=kind, config=config))
    VIEWS.clear()
    yield made[0]
    VIEWS.clear()
    from backend.clouds.services.accounts import compute_of

    for account in made:
        for instance in Instance.objects.filter(account=account):
            instance_terminate_run(instance_id=str(instance.pk))
        assert list(compute_of(account).list_managed()) == []


def _launched(team: Workspace, owner: Person) -> tuple[Job, Instance]:
    run = submit(team, owner.user, workflow="train", text=WORKFLOWS)
    jobs_schedule()
    instance = Instance.objects.get()
    assert instance.backend == KIND
    instance_launch_run(instance_id=str(instance.pk))
    instance.refresh_from_db()
    return run.jobs.get(), instance


def _running(team: Workspace, owner: Person) -> tuple[Job, Instance]:
    job, instance = _launched(team, owner)
    facts = Facts("pod", "10.0.0.9", "test", 4, 8 * GIB, 50 * GIB, [])
    instance_connected(instance_id=str(instance.pk), channel_name="c", facts=facts, busy=False)
    jobs_schedule()
    assert accept(job, instance.pk)
    return job, instance


def _pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reconcile pass with its account tasks, the cloud view due, then a scheduling pass."""
    monkeypatch.delattr(clouds._accounts_to_ask, "view", raising=False)
    Instance.objects.update(cloud_checked_at=None)
    reconcile_with_account_tasks()
    jobs_schedule()


def test_an_unschedulable_pod_says_why_its_job_waits_then_its_cluster_is_skipped_for_the_next_offer(
    accounts: CloudAccount, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, instance = _launched(team, owner)
    VIEWS[instance.idempotency_key] = MachineView(
        CloudState.PENDING, Trouble.UNSCHEDULABLE, f"{SCHEDULER_SAYS}\n preemption: 0/2 nodes", time.time() - 10
    )

    _pass(monkeypatch)

    instance.refresh_from_db()
    said = f"waiting for a node: {SCHEDULER_SAYS} preemption: 0/2 nodes"
    assert (instance.status, instance.status_reason) == ("provisioning", said)
    job.refresh_from_db()
    assert job.status == "pending"
    assert job.status_reason.startswith(f"waiting for a runner: starting {instance.name} (k8s-node in cluster-a")
    assert job.status_reason.endswith(f", {said}")

    VIEWS[instance.idempotency_key] = MachineView(
        CloudState.PENDING, Trouble.UNSCHEDULABLE, SCHEDULER_SAYS, time.time() - 301
    )
    _pass(monkeypatch)

    instance.refresh_from_db()
    assert (instance.status, instance.termination_reason) == ("terminating", "no_capacity")
    assert instance.status_reason == f"no node took {instance.name} within 300s: {SCHEDULER_SAYS}"
    block = OfferBlock.objects.get(account=accounts)
    assert (block.scope, block.key, block.code) == ("account", "", "Unschedulable")
    assert 110 < (block.until - db_now()).total_seconds() <= 120
    job.refresh_from_db()
    second = Instance.objects.exclude(pk=instance.pk).get()
    assert (second.backend, job.status) == ("fake", "pending"), "the next offer, in another account"
    assert job.status_reason.startswith(f"waiting for a runner: starting {second.name} (fake-a in r1")


def test_a_pod_a_node_took_is_starting_again(
    accounts: CloudAccount, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, instance = _launched(team, owner)
    VIEWS[instance.idempotency_key] = MachineView(CloudState.PENDING, Trouble.UNSCHEDULABLE, SCHEDULER_SAYS)
    _pass(monkeypatch)
    VIEWS[instance.idempotency_key] = MachineView(CloudState.PENDING)  # the autoscaler's node came up

    _pass(monkeypatch)

    instance.refresh_from_db()
    assert (instance.status, instance.status_reason) == ("provisioning", "starting: waiting for its runner to connect")
    job.refresh_from_db()
    assert job.status_reason == f"waiting for a runner: starting {instance.name} (k8s-node in cluster-a, $0.1000/h)"


def test_the_provision_timeout_leaves_an_unschedulable_pod_to_the_schedule_timeout(
    accounts: CloudAccount, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend's provision timeout (60 s) is shorter than its schedule
    timeout (300 s): a pod waiting for a node 200 s is still waited for."""
    _job, instance = _launched(team, owner)
    Instance.objects.filter(pk=instance.pk).update(launched_at=db_now() - timedelta(seconds=200))
    VIEWS[instance.idempotency_key] = MachineView(CloudState.PENDING, Trouble.UNSCHEDULABLE, SCHEDULER_SAYS)

    _pass(monkeypatch)

    instance.refresh_from_db()
    assert (instance.status, instance.status_reason) == ("provisioning", f"waiting for a node: {SCHEDULER_SAYS}")
    Instance.objects.filter(pk=instance.pk).update(launched_at=db_now() - timedelta(seconds=301))

    _pass(monkeypatch)

    instance.refresh_from_db()
    assert (instance.status, instance.termination_reason) == ("terminating", "no_capacity")


def test_an_image_that_cannot_be_pulled_fails_the_job_with_the_clouds_words_and_is_not_retried(
    accounts: CloudAccount, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, instance = _launched(team, owner)
    cloud = 'Back-off pulling image "ghcr.io/acme/missing:1": ImagePullBackOff'
    VIEWS[instance.idempotency_key] = MachineView(CloudState.PENDING, Trouble.IMAGE_PULL, cloud)

    monkeypatch.delattr(clouds._accounts_to_ask, "view", raising=False)
    reconcile_with_account_tasks()
    instance_terminate_run(instance_id=str(instance.pk))  # confirmed: its latest words are the backend's
    jobs_schedule()

    instance.refresh_from_db()
    assert (instance.status, instance.termination_reason) == ("terminated", "image_pull")
    job.refresh_from_db()
    words = f"the image of {instance.name} could not be pulled: {cloud}; check the backend's image"
    assert (job.status, job.status_reason) == ("failed", words)
    attempt = Attempt.objects.get(job=job)
    assert (attempt.termination_reason, attempt.termination_message) == ("image_pull", words)
    assert Instance.objects.count() == 1, "nothing else was launched for it"


@pytest.mark.parametrize(
    ("state", "trouble", "cloud", "instance_reason", "attempt_reason", "words"),
    [
        (CloudState.TERMINATED, Trouble.EVICTED, "The node was low on resource: memory.", "machine_gone",
         "instance_lost", "was evicted"),
        (CloudState.NOT_FOUND, Trouble.DELETED, "", "machine_gone", "instance_lost", "was deleted outside Trainyard"),
        (CloudState.NOT_FOUND, Trouble.NODE_LOST, "DeletionByPodGC", "machine_gone", "instance_lost", "lost its node"),
        (CloudState.INTERRUPTED, Trouble.PREEMPTED, "PreemptionByScheduler", "interrupted", "interrupted",
         "was preempted"),
    ],
)  # fmt: skip
def test_a_gone_pod_ends_its_attempt_with_the_clouds_reason(
    accounts: CloudAccount,
    team: Workspace,
    owner: Person,
    monkeypatch: pytest.MonkeyPatch,
    state: CloudState,
    trouble: Trouble,
    cloud: str,
    instance_reason: str,
    attempt_reason: str,
    words: str,
) -> None:
    job, instance = _running(team, owner)
    VIEWS[instance.idempotency_key] = MachineView(state, trouble, cloud)

    _pass(monkeypatch)

    instance.refresh_from_db()
    said = f"machine {instance.name} {words} (the backend says {state})" + (f": {cloud}" if cloud else "")
    assert (instance.status, instance.termination_reason, instance.status_reason) == ("lost", instance_reason, said)
    attempt = Attempt.objects.get(job=job, number=1)
    assert (attempt.termination_reason, attempt.termination_message) == (attempt_reason, said)
    job.refresh_from_db()
    assert job.status == "pending", "retried (an interruption resumes from its checkpoint)"
    ended = InstanceEvent.objects.filter(instance=instance, to_status="lost").get()
    assert ended.message == said
