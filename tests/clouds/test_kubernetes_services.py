"""A Kubernetes backend as the services use it, on kmock's emulator over
HTTP (tests/support/kubeapi.py), the pods' status set as a cluster would set
it: connecting one (the checks, the nodes, the kubeconfig encrypted and
never shown), and what the reconciler does with the cluster's reasons: a pod
no node can take says so on its job, then its cluster is skipped for a while
and the next offer is tried; an image that cannot be pulled fails the job
with the cloud's words; an evicted, deleted or node-less pod is a lost
machine, a preempted one an interruption."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from backend.accounts.models import Workspace
from backend.clouds.backends.base import CloudState, Handle, MachineView, Timings, Trouble
from backend.clouds.backends.fake.compute import FakeCompute
from backend.clouds.backends.kubernetes.pods import pod_name
from backend.clouds.models import AccountStatus, CloudAccount, Instance, InstanceEvent, OfferBlock
from backend.clouds.services import reconcile as clouds
from backend.clouds.services import troubles
from backend.clouds.services.accounts import compute_of
from backend.clouds.services.facts import accounts_refresh_facts
from backend.clouds.services.instances import (
    TERMINATE_RECHECK_SECONDS,
    Facts,
    instance_connected,
    instance_mark_interrupted,
)
from backend.clouds.services.provisioning import instance_launch_run, instance_terminate_run
from backend.core.clock import db_now
from backend.runs.models import Attempt, Job
from backend.runs.scheduler.passes import jobs_schedule
from backend.vault.crypto import encrypt
from tests.support.accounttasks import reconcile_with_account_tasks
from tests.support.attempts import accept
from tests.support.cli_wsgi import cli_as, cli_invoke, in_the_tests_transaction
from tests.support.fixtures import Person, submit
from tests.support.kubeapi import NAMESPACE, TOKEN, KubeApi
from tests.support.kubelet import Kubelet

GIB = 2**30
WS = "/api/v1/workspaces/acme"
SCHEDULER_SAYS = (
    "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint {nvidia.com/gpu: present}."
)
WORKFLOWS = """workflows:
  - name: train
    provider: bash
    commands: [python train.py]
    resources: {cpu: 2}
    retry:
      limit: 3
      on_events: [error, interruption, instance_lost, no_capacity]
"""
FAKE_OFFER = {"instance_type": "fake-a", "region": "r1", "price_per_hour": 0.5, "cpus": 4, "memory_bytes": 8 * GIB}


def node(name: str, instance_type: str = "m5.xlarge", *, cpu: str = "4", memory: str = "16Gi") -> dict[str, Any]:
    """A Ready node as the API server lists it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"node.kubernetes.io/instance-type": instance_type}},
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "ephemeral-storage": "100Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def ago(seconds: float) -> str:
    at = datetime.datetime.now(tz=datetime.UTC) - timedelta(seconds=seconds)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def kube(kube_api: KubeApi, settings: Any) -> KubeApi:
    """The emulator with one node; the server lets backends reach it on loopback."""
    settings.TRAINYARD = {
        **settings.TRAINYARD,
        "LOCAL_BACKEND_ENABLED": False,
        "HEARTBEAT_TIMEOUT_SECONDS": 5.0,
        "KUBERNETES_PRIVATE_NETWORKS": ["127.0.0.0/8"],
    }
    settings.ALLOWED_HOSTS = ["*"]
    kube_api.post("/api/v1/nodes", node("node-1"))
    return kube_api


def kube_account(team: Workspace, kube: KubeApi, **config: Any) -> CloudAccount:
    """A Kubernetes account of ``team`` on ``kube``, its nodes refreshed as the periodic task does."""
    account = CloudAccount.objects.create(
        workspace=team,
        kind="kubernetes",
        name="k8s",
        config={"namespace": NAMESPACE, "prices": {"m5.xlarge": 0.2}, "termination_grace_seconds": 5, **config},
        credentials_ciphertext=encrypt(json.dumps({"kubeconfig": kube.kubeconfig()})),
    )
    assert accounts_refresh_facts(account_id=str(account.pk)) == 1
    return account


@pytest.fixture
def no_pod_left(kube: KubeApi) -> Iterator[None]:
    """Afterwards every machine of the test is terminated, and no pod is left."""
    yield
    for instance in Instance.objects.all():
        while instance_terminate_run(instance_id=str(instance.pk)) is not None:
            pass
    assert kube.pods() == [], "every pod of the test was deleted"
    for account in CloudAccount.objects.exclude(kind="kubernetes"):
        assert list(compute_of(account).list_managed()) == []


@pytest.fixture
def cluster(kube: KubeApi, team: Workspace, tmp_path: Path, script: Path, no_pod_left: None) -> CloudAccount:
    """A connected cluster, and a pricier fake cloud beside it."""
    config = {"state_dir": str(tmp_path / "fake"), "script_file": str(script), "offers": [FAKE_OFFER]}
    CloudAccount.objects.create(workspace=team, kind="fake", name="fake", config=config)
    return kube_account(team, kube)


def _launched(team: Workspace, owner: Person) -> tuple[Job, Instance, str]:
    run = submit(team, owner.user, workflow="train", text=WORKFLOWS)
    jobs_schedule()
    instance = Instance.objects.get()
    assert instance.backend == "kubernetes"
    instance_launch_run(instance_id=str(instance.pk))
    instance.refresh_from_db()
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod_name(instance.idempotency_key)}"
    return run.jobs.get(), instance, path


def _running(team: Workspace, owner: Person, kube: KubeApi) -> tuple[Job, Instance, str]:
    job, instance, path = _launched(team, owner)
    kube.patch(path, {"spec": {"nodeName": "node-1"}, "status": {"phase": "Running"}})
    facts = Facts("pod", "10.0.0.9", "test", 4, 16 * GIB, 100 * GIB, [])
    instance_connected(instance_id=str(instance.pk), channel_name="c", facts=facts, busy=False)
    jobs_schedule()
    assert accept(job, instance.pk)
    return job, instance, path


def _pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reconcile pass with its account tasks (the cloud view due), then a scheduling pass."""
    monkeypatch.delattr(clouds._accounts_to_ask, "view", raising=False)
    Instance.objects.update(cloud_checked_at=None)
    reconcile_with_account_tasks()
    jobs_schedule()


def _unschedulable(kube: KubeApi, path: str, *, since: float) -> None:
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": SCHEDULER_SAYS,
        "lastTransitionTime": ago(since),
    }
    kube.patch(path, {"status": {"phase": "Pending", "conditions": [condition]}})


# ------------------------------------------------------------------ the cluster's reasons


def test_an_unschedulable_pod_says_why_its_job_waits_then_its_cluster_is_skipped_for_the_next_offer(
    cluster: CloudAccount, kube: KubeApi, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, instance, path = _launched(team, owner)
    _unschedulable(kube, path, since=10)

    _pass(monkeypatch)

    instance.refresh_from_db()
    said = f"waiting for a node: {SCHEDULER_SAYS}"
    assert (instance.status, instance.status_reason) == ("provisioning", said)
    job.refresh_from_db()
    assert job.status == "pending"
    assert job.status_reason == (
        f"waiting for a runner: starting {instance.name} (m5.xlarge in test, $0.2000/h), {said}"
    )
    shown = owner.client().get(f"{WS}/runs/{job.run.name}/").json()  # the run page, `trainyard ps`
    assert shown["jobs"][0]["status_reason"] == job.status_reason
    _unschedulable(kube, path, since=301)  # the backend's schedule timeout (300 s) is over

    _pass(monkeypatch)

    instance.refresh_from_db()
    assert (instance.status, instance.termination_reason) == ("terminating", "no_capacity")
    assert instance.status_reason == f"no node took {instance.name} within 300s: {SCHEDULER_SAYS}"
    block = OfferBlock.objects.get(account=cluster)
    assert (block.scope, block.key, block.code) == ("account", "", "Unschedulable")
    assert 110 < (block.until - db_now()).total_seconds() <= 120
    job.refresh_from_db()
    second = Instance.objects.exclude(pk=instance.pk).get()
    assert (second.backend, job.status) == ("fake", "pending"), "the next offer, in another account"
    assert job.status_reason.startswith(f"waiting for a runner: starting {second.name} (fake-a in r1")


def test_a_pod_an_autoscaler_adds_a_node_for_says_so_and_is_not_given_up_at_the_schedule_timeout(
    cluster: CloudAccount, kube: KubeApi, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, instance, path = _launched(team, owner)
    _unschedulable(kube, path, since=400)  # past the schedule timeout
    pod = kube.get(path)
    scale_up = "pod triggered scale-up: [{eks-gpu-pool 0->1 (max: 4)}]"
    kube.post(
        f"/api/v1/namespaces/{NAMESPACE}/events",
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{pod['metadata']['name']}.scaleup", "namespace": NAMESPACE},
            "involvedObject": {"kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]},
            "reason": "TriggeredScaleUp",
            "type": "Normal",
            "message": scale_up,
            "firstTimestamp": ago(30),
            "lastTimestamp": ago(30),
        },
    )

    _pass(monkeypatch)

    instance.refresh_from_db()
    assert instance.status == "provisioning", "a node is on its way: not given up"
    assert instance.status_reason == f"waiting for a node: a node is being added: {scale_up}"
    job.refresh_from_db()
    assert job.status_reason.endswith(f", waiting for a node: a node is being added: {scale_up}")


def test_a_pod_a_node_took_is_starting_again(
    cluster: CloudAccount, kube: KubeApi, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, instance, path = _launched(team, owner)
    _unschedulable(kube, path, since=10)
    _pass(monkeypatch)
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": ago(0)}
    kube.patch(path, {"spec": {"nodeName": "node-2"}, "status": {"conditions": [scheduled]}})  # the autoscaler's node

    _pass(monkeypatch)

    instance.refresh_from_db()
    assert (instance.status, instance.status_reason) == ("provisioning", "starting: waiting for its runner to connect")
    job.refresh_from_db()
    assert job.status_reason == f"waiting for a runner: starting {instance.name} (m5.xlarge in test, $0.2000/h)"


def test_an_image_that_is_not_there_fails_the_job_with_the_clouds_words_and_is_not_retried(
    cluster: CloudAccount, kube: KubeApi, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, instance, path = _launched(team, owner)
    pulling = (
        'rpc error: code = NotFound desc = failed to pull and unpack image "ghcr.io/acme/missing:1": '
        'failed to resolve reference "ghcr.io/acme/missing:1": ghcr.io/acme/missing:1: not found'
    )
    waiting = {"name": "runner", "state": {"waiting": {"reason": "ErrImagePull", "message": pulling}}}
    kube.patch(path, {"spec": {"nodeName": "node-1"}, "status": {"containerStatuses": [waiting]}})

    monkeypatch.delattr(clouds._accounts_to_ask, "view", raising=False)
    reconcile_with_account_tasks()
    while instance_terminate_run(instance_id=str(instance.pk)) is not None:  # as the worker does
        pass
    jobs_schedule()

    instance.refresh_from_db()
    assert (instance.status, instance.termination_reason) == ("terminated", "image_pull")
    assert kube.pods() == []
    job.refresh_from_db()
    words = f"the image of {instance.name} could not be pulled: ErrImagePull: {pulling}; check the backend's image"
    assert (job.status, job.status_reason) == ("failed", words)
    attempt = Attempt.objects.get(job=job)
    assert (attempt.termination_reason, attempt.termination_message) == ("image_pull", words)
    assert Instance.objects.count() == 1, "nothing else was launched for it"


def test_a_pull_that_fails_for_a_passing_reason_waits_with_it_then_fails_after_its_patience(
    cluster: CloudAccount, kube: KubeApi, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, instance, path = _launched(team, owner)
    limited = (
        'failed to pull and unpack image "docker.io/library/python:3.12-slim": 429 Too Many Requests - '
        "Server message: toomanyrequests: You have reached your pull rate limit."
    )
    waiting = {"name": "runner", "state": {"waiting": {"reason": "ErrImagePull", "message": limited}}}
    kube.patch(path, {"spec": {"nodeName": "node-1"}, "status": {"containerStatuses": [waiting]}})

    _pass(monkeypatch)

    instance.refresh_from_db()
    assert instance.status == "provisioning", "the node tries the pull again: the machine is not given up"
    assert instance.status_reason.startswith("pulling the image, which failed (the node tries again): ErrImagePull:")
    job.refresh_from_db()
    assert job.status == "pending"
    assert "pulling the image, which failed (the node tries again)" in job.status_reason

    monkeypatch.setattr(troubles, "IMAGE_PULL_PATIENCE_SECONDS", 0.0)
    _pass(monkeypatch)
    while instance_terminate_run(instance_id=str(instance.pk)) is not None:
        pass
    jobs_schedule()

    instance.refresh_from_db()
    assert (instance.status, instance.termination_reason) == ("terminated", "image_pull")
    job.refresh_from_db()
    assert job.status == "failed"
    assert "toomanyrequests" in job.status_reason


PREEMPTED = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "preempted"}
NODE_GONE = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC", "message": "node is gone"}


@pytest.mark.parametrize(
    ("status", "words", "state", "instance_reason", "attempt_reason"),
    [
        ({"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
         "was evicted (the backend says terminated): The node was low on resource: memory.",
         "terminated", "machine_gone", "instance_lost"),
        ({"phase": "Failed", "conditions": [NODE_GONE]}, "lost its node (the backend says terminated): node is gone",
         "terminated", "machine_gone", "instance_lost"),
        ({"phase": "Failed", "conditions": [PREEMPTED]}, "was preempted (the backend says interrupted): preempted",
         "interrupted", "interrupted", "interrupted"),
        (None, "was deleted (the backend says not_found): the pod was deleted, not by Trainyard",
         "not_found", "machine_gone", "instance_lost"),
    ],
    ids=["evicted", "node-lost", "preempted", "deleted"],
)  # fmt: skip
def test_a_gone_pod_ends_its_attempt_with_the_clouds_reason(
    cluster: CloudAccount,
    kube: KubeApi,
    team: Workspace,
    owner: Person,
    monkeypatch: pytest.MonkeyPatch,
    status: dict[str, Any] | None,
    words: str,
    state: str,
    instance_reason: str,
    attempt_reason: str,
) -> None:
    job, instance, path = _running(team, owner, kube)
    if status is None:
        kube.delete(path)  # by someone with kubectl
    else:
        kube.patch(path, {"status": status})

    _pass(monkeypatch)

    instance.refresh_from_db()
    said = f"machine {instance.name} {words}"
    assert (instance.status, instance.cloud_state) == ("lost", state)
    assert (instance.termination_reason, instance.status_reason) == (instance_reason, said)
    attempt = Attempt.objects.get(job=job, number=1)
    assert (attempt.termination_reason, attempt.termination_message) == (attempt_reason, said)
    job.refresh_from_db()
    assert job.status == "pending", "retried (an interruption resumes from its checkpoint)"
    assert InstanceEvent.objects.get(instance=instance, to_status="lost").message == said


def _until(monkeypatch: pytest.MonkeyPatch, done: Any, what: str, timeout: float = 20.0) -> None:
    """Reconcile and scheduling passes, as beat runs them, until ``done()``."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        time.sleep(0.3)
        _pass(monkeypatch)


def test_with_the_kubelet_a_pod_no_node_takes_shows_the_schedulers_words_on_its_job(
    kube: KubeApi, kubelet: Kubelet, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch, no_pod_left: None
) -> None:
    """The offer is a node pool an autoscaler grows from zero: until its node
    comes, the scheduler finds none for the pod."""
    pool = {"name": "big", "instance_type": "c5.4xlarge", "cpus": 16, "memory_gib": 32, "price": 0.68}
    kube_account(team, kube, node_pools=[pool])
    text = WORKFLOWS.replace("resources: {cpu: 2}", "resources: {cpu: 8}")
    run = submit(team, owner.user, workflow="train", text=text)
    jobs_schedule()
    instance = Instance.objects.get()
    instance_launch_run(instance_id=str(instance.pk))
    job = run.jobs.get()

    _until(monkeypatch, lambda: "waiting for a node" in Job.objects.get(pk=job.pk).status_reason, "the node's wait")

    pod = kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod_name(instance.idempotency_key)}")
    condition = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert condition["message"].startswith("0/1 nodes are available:")
    job.refresh_from_db()
    assert job.status_reason.endswith(f", waiting for a node: {condition['message']}")
    assert job.status == "pending"


def test_with_the_kubelet_an_image_that_is_not_there_fails_the_job(
    kube: KubeApi, kubelet: Kubelet, team: Workspace, owner: Person, monkeypatch: pytest.MonkeyPatch, no_pod_left: None
) -> None:
    kubelet.missing_image("ghcr.io/acme/missing:1")
    kube_account(team, kube, image="ghcr.io/acme/missing:1")
    run = submit(team, owner.user, workflow="train", text=WORKFLOWS)
    jobs_schedule()
    instance_launch_run(instance_id=str(Instance.objects.get().pk))
    job = run.jobs.get()

    _until(monkeypatch, lambda: Job.objects.get(pk=job.pk).status == "failed", "the job's failure")

    attempt = Attempt.objects.get(job=job)
    assert attempt.termination_reason == "image_pull"
    assert "ghcr.io/acme/missing:1" in attempt.termination_message
    assert attempt.termination_message.endswith("; check the backend's image")


class SlowBootCompute(FakeCompute):
    """A backend whose provision timeout (60 s) is shorter than its schedule
    timeout (300 s), and whose one machine its cloud says no node takes."""

    kind = "slowboot"
    reusable_instances = False
    timings = Timings(provision_timeout=60.0, schedule_timeout=300.0)

    def view(self, handles: Sequence[Handle]) -> Mapping[str, MachineView]:
        return {h.key: MachineView(CloudState.PENDING, Trouble.UNSCHEDULABLE, SCHEDULER_SAYS) for h in handles}


def test_the_provision_timeout_leaves_an_unschedulable_machine_to_the_schedule_timeout(
    team: Workspace, owner: Person, tmp_path: Path, script: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds = {**settings.TRAINYARD["BACKEND_KINDS"], "slowboot": f"{__name__}:SlowBootCompute"}
    settings.TRAINYARD = {**settings.TRAINYARD, "BACKEND_KINDS": kinds, "LOCAL_BACKEND_ENABLED": False}
    offer = {**FAKE_OFFER, "instance_type": "slow"}
    config = {"state_dir": str(tmp_path / "slow"), "script_file": str(script), "offers": [offer]}
    account = CloudAccount.objects.create(workspace=team, kind="slowboot", name="slow", config=config)
    submit(team, owner.user, workflow="train", text=WORKFLOWS)
    jobs_schedule()
    instance = Instance.objects.get()
    instance_launch_run(instance_id=str(instance.pk))
    Instance.objects.filter(pk=instance.pk).update(launched_at=db_now() - timedelta(seconds=200))

    _pass(monkeypatch)

    instance.refresh_from_db()
    assert (instance.status, instance.status_reason) == ("provisioning", f"waiting for a node: {SCHEDULER_SAYS}")
    Instance.objects.filter(pk=instance.pk).update(launched_at=db_now() - timedelta(seconds=301))

    _pass(monkeypatch)

    instance.refresh_from_db()
    assert (instance.status, instance.termination_reason) == ("terminating", "no_capacity")
    instance_terminate_run(instance_id=str(instance.pk))
    assert list(compute_of(account).list_managed()) == []


def test_the_periodic_refresh_lists_a_clusters_nodes_again_once_its_facts_are_old(
    cluster: CloudAccount, kube: KubeApi, team: Workspace, owner: Person
) -> None:
    kube.post("/api/v1/nodes", node("node-2", "g5.xlarge", cpu="8", memory="32Gi"))

    assert accounts_refresh_facts() == 0, "its facts are fresh"
    cluster.refresh_from_db()
    facts = {**cluster.config["facts"], "refreshed_at": 1.0}
    CloudAccount.objects.filter(pk=cluster.pk).update(config={**cluster.config, "facts": facts})

    assert accounts_refresh_facts() == 1
    offers = owner.client().get(f"{WS}/offers/?backend=kubernetes").json()["offers"]
    assert sorted(o["instance_type"] for o in offers) == ["g5.xlarge", "m5.xlarge"]


# ------------------------------------------------------------------ connecting


def _body(kube: KubeApi, **extra: Any) -> dict[str, Any]:
    return {"kind": "kubernetes", "kubeconfig": kube.kubeconfig(), "namespace": NAMESPACE, **extra}


def test_connect_checks_the_cluster_stores_its_nodes_and_never_shows_the_kubeconfig(
    kube: KubeApi, owner: Person
) -> None:
    client = owner.client()
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}

    created = client.post(
        f"{WS}/backends/",
        _body(kube, name="gpus", prices={"m5.xlarge": 0.19}, node_selector={"pool": "ml"}, tolerations=[toleration]),
        format="json",
    )

    assert created.status_code == 201, created.content
    shown = created.json()
    assert {k: shown[k] for k in ("name", "kind", "status", "auth", "regions", "bucket")} == {
        "name": "gpus",
        "kind": "kubernetes",
        "status": "active",
        "auth": "kubeconfig",
        "regions": ["test"],
        "bucket": "",
    }
    kube_part = shown["kubernetes"]
    assert {k: kube_part[k] for k in ("namespace", "cluster", "nodes", "prices", "node_selector", "tolerations")} == {
        "namespace": NAMESPACE,
        "cluster": "test",
        "nodes": 1,
        "prices": {"m5.xlarge": 0.19},
        "node_selector": {"pool": "ml"},
        "tolerations": [toleration],
    }
    account = CloudAccount.objects.get(name="gpus")
    assert TOKEN.encode() not in bytes(account.credentials_ciphertext), "encrypted at rest"
    assert "allowed_networks" not in account.config and "in_cluster_allowed" not in account.config
    offers = client.get(f"{WS}/offers/?backend=kubernetes").json()["offers"]
    assert [(o["instance_type"], o["region"], o["price_per_hour"]) for o in offers] == [("m5.xlarge", "test", 0.19)]
    answers = [
        created,
        client.get(f"{WS}/backends/"),
        client.get(f"{WS}/backends/gpus/"),
        client.post(f"{WS}/backends/gpus/validate/"),
    ]
    for answer in answers:
        assert answer.status_code in (200, 201), answer.content
        assert TOKEN.encode() not in answer.content and b'kubeconfig":' not in answer.content
        assert b"current-context" not in answer.content
    schema = client.get("/api/v1/schema/?format=json").json()["components"]["schemas"]
    assert "kubeconfig" not in schema["BackendOut"]["properties"]


def test_a_denied_permission_is_named_and_nothing_is_saved(kube: KubeApi, owner: Person) -> None:
    kube.deny("list", "nodes")

    answer = owner.client().post(f"{WS}/backends/", _body(kube), format="json")

    assert answer.status_code == 400, answer.content
    message = answer.json()["message"]
    assert "list nodes" in message and "deploy/kubernetes/backend-rbac.yaml" in message
    assert not CloudAccount.objects.filter(kind="kubernetes").exists()


def test_an_api_server_on_a_private_address_needs_its_network_allowed_by_the_operator(
    kube: KubeApi, owner: Person, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "KUBERNETES_PRIVATE_NETWORKS": []}

    answer = owner.client().post(f"{WS}/backends/", _body(kube), format="json")

    assert answer.status_code == 400, answer.content
    assert "TRAINYARD_KUBERNETES_PRIVATE_NETWORKS" in answer.json()["message"]
    assert not CloudAccount.objects.filter(kind="kubernetes").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"namespace": None}, "Invalid input: namespace: This field is required."),
        ({"regions": ["us-east-1"]}, "Invalid input: regions: not a field of kubernetes backends"),
        ({"kind": "aws"}, "Invalid input: kubeconfig: not a field of aws backends"),
        ({"kubeconfig": "x" * (64 * 1024 + 1)}, "Invalid input: kubeconfig: Ensure this field has no more than 65536"),
        ({"kubeconfig": None}, "connect Kubernetes with a kubeconfig whose user is a service account"),
        ({"kubeconfig": None, "in_cluster": True}, "in_cluster: this server does not let backends use its own"),
        ({"tolerations": [{"key": "a", "effect": "Sometimes"}]}, "Invalid input: tolerations: "),
    ],
    ids=[
        "no-namespace",
        "aws-field",
        "kubernetes-fields-for-aws",
        "huge-kubeconfig",
        "no-kubeconfig",
        "in-cluster-off",
        "bad-effect",
    ],
)
def test_bad_input_is_named_before_the_cluster_is_asked(
    kube: KubeApi, owner: Person, change: dict[str, Any], message: str
) -> None:
    body = {k: v for k, v in {**_body(kube), **change}.items() if v is not None}

    answer = owner.client().post(f"{WS}/backends/", body, format="json")

    assert answer.status_code == 400, answer.content
    assert answer.json()["message"].startswith(message)
    assert not CloudAccount.objects.filter(kind="kubernetes").exists()


def test_in_cluster_where_the_operator_allows_it_needs_the_server_in_a_pod(
    kube: KubeApi, owner: Person, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "KUBERNETES_IN_CLUSTER": True}

    answer = owner.client().post(
        f"{WS}/backends/", {"kind": "kubernetes", "in_cluster": True, "namespace": NAMESPACE}, format="json"
    )

    assert answer.status_code == 400, answer.content
    assert answer.json()["message"].startswith("in_cluster: the server does not run in a Kubernetes pod")
    assert not CloudAccount.objects.filter(kind="kubernetes").exists()


def test_a_kubeconfig_that_would_run_a_program_is_refused(kube: KubeApi, owner: Person) -> None:
    exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}}
    config = kube.kubeconfig().replace(f"token: {TOKEN}", "exec: " + json.dumps(exec_user["exec"]))

    answer = owner.client().post(f"{WS}/backends/", _body(kube, kubeconfig=config), format="json")

    assert answer.status_code == 400, answer.content
    assert "exec" in answer.json()["message"]
    assert not CloudAccount.objects.filter(kind="kubernetes").exists()


def test_validate_marks_a_cluster_that_lost_a_permission_broken_and_refreshes_the_nodes_of_a_good_one(
    kube: KubeApi, owner: Person
) -> None:
    client = owner.client()
    assert client.post(f"{WS}/backends/", _body(kube), format="json").status_code == 201
    kube.post("/api/v1/nodes", node("node-2", "g5.xlarge"))

    validated = client.post(f"{WS}/backends/kubernetes/validate/")

    assert validated.status_code == 200, validated.content
    assert (validated.json()["status"], validated.json()["kubernetes"]["nodes"]) == ("active", 2)
    kube.deny("create", "pods")

    refused = client.post(f"{WS}/backends/kubernetes/validate/")

    assert refused.status_code == 400
    assert "create pods" in refused.json()["message"]
    shown = client.get(f"{WS}/backends/kubernetes/").json()
    assert (shown["status"], shown["status_reason"]) == ("broken", refused.json()["message"])
    assert CloudAccount.objects.get(name="kubernetes").status == AccountStatus.BROKEN


def test_the_cli_connects_a_cluster_and_lists_it(
    kube: KubeApi, team: Workspace, owner: Person, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kube.kubeconfig())
    cli_as(monkeypatch, team, owner)
    args = ["--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE, "--price", "m5.xlarge=0.19"]
    args += ["--node-selector", "pool=ml", "--toleration", "dedicated=ml:NoSchedule", "--toleration", "gpu:NoExecute"]

    with in_the_tests_transaction():
        code, _out, err = cli_invoke("backend", "add", "kubernetes", *args)
        listed = cli_invoke("backend", "ls")

    assert code == 0, err
    assert err.endswith("Connected backend kubernetes (cluster test, 1 node(s)): active\n")
    config = CloudAccount.objects.get(name="kubernetes").config
    assert (config["prices"], config["node_selector"]) == ({"m5.xlarge": 0.19}, {"pool": "ml"})
    assert config["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
        {"key": "gpu", "operator": "Exists", "effect": "NoExecute"},
    ]
    assert listed[0] == 0
    row = next(line for line in listed[1].splitlines() if line.startswith("kubernetes"))
    assert row.split()[:5] == ["kubernetes", "kubernetes", "active", "kubeconfig", f"test/{NAMESPACE}"]
    assert TOKEN not in listed[1]


def test_a_bad_toleration_option_is_named_by_the_cli(
    kube: KubeApi, team: Workspace, owner: Person, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kube.kubeconfig())
    cli_as(monkeypatch, team, owner)

    code, _out, err = cli_invoke(
        "backend", "add", "kubernetes", "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE,
        "--toleration", "dedicated=ml",
    )  # fmt: skip

    assert code == 2
    assert "expected KEY[=VALUE]:EFFECT with EFFECT NoSchedule, PreferNoSchedule or NoExecute" in err
    assert not CloudAccount.objects.filter(kind="kubernetes").exists()


def test_a_pods_interruption_notice_asks_for_its_termination_at_once_so_its_billing_ends_with_the_pod(
    cluster: CloudAccount, kube: KubeApi, team: Workspace, owner: Person
) -> None:
    _job, instance, path = _running(team, owner, kube)
    reclaim_at = timezone.now() + timedelta(seconds=115)  # the runner's deadline: the pod's grace, less a margin

    assert instance_mark_interrupted(instance_id=str(instance.pk), message="the pod is going", reclaim_at=reclaim_at)

    instance.refresh_from_db()
    assert instance.status == "terminating"
    assert instance.terminate_requested_at is not None
    waited = (timezone.now() - instance.terminate_requested_at).total_seconds()
    assert waited >= TERMINATE_RECHECK_SECONDS - 1, "the reconciler's next pass asks, not one at the deadline"
    kube.delete(path)  # the pod, gone at the end of its runner's wind-down
    assert instance_terminate_run(instance_id=str(instance.pk)) is None
    instance.refresh_from_db()
    assert instance.status == "terminated"
    assert instance.terminated_at is not None and instance.terminated_at < reclaim_at - timedelta(seconds=100)
