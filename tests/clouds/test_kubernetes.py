"""The kubernetes backend on its own, against kmock's emulator over HTTP
(tests/support/kubeapi.py) and, for the API server's failures, a stand-in
HTTP server that answers what the test says (or never answers). The
contract suite (test_contract.py) runs on it too."""

from __future__ import annotations

import base64
import contextlib
import datetime
import http.server
import ipaddress
import json
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from backend.clouds.backends.base import (
    GONE,
    AccountConfig,
    CloudState,
    Handle,
    LaunchSpec,
    MachineView,
    Offer,
    Requirements,
    Trouble,
    shortfall,
)
from backend.clouds.backends.errors import (
    AuthFailed,
    ComputeError,
    InvalidConfig,
    NoCapacity,
    NotYetTerminated,
    QuotaExceeded,
    Scope,
    Transient,
)
from backend.clouds.backends.kubernetes import pods
from backend.clouds.backends.kubernetes.checks import check_cluster
from backend.clouds.backends.kubernetes.client import KubeClient
from backend.clouds.backends.kubernetes.compute import KubernetesCompute
from backend.clouds.backends.kubernetes.config import parse_kubeconfig
from backend.clouds.backends.registry import compute_for
from tests.clouds.subjects import GIB, INSTALLATION, kubeconfig_text, node_facts, terminate_fully, wait_for
from tests.support.kubeapi import NAMESPACE, KubeApi
from tests.support.kubelet import Kubelet

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
EVENTS = f"/api/v1/namespaces/{NAMESPACE}/events"
A100 = "NVIDIA-A100-SXM4-40GB"
SECRET = "sa-secret-token-7f3a"


def account(
    kube: KubeApi | None = None,
    *,
    kubeconfig: str | None = None,
    installation: str = INSTALLATION,
    account_id: str = "acct-1",
    **config: Any,
) -> AccountConfig:
    text = kubeconfig if kubeconfig is not None else (kube.kubeconfig() if kube is not None else "")
    base: dict[str, Any] = {"namespace": NAMESPACE, "allowed_networks": ["127.0.0.0/8"]}
    return AccountConfig(
        account_id=account_id,
        workspace_id="ws-1",
        kind="kubernetes",
        installation=installation,
        config={**base, **config},
        credentials={"kubeconfig": text} if text else {},
    )


def backend(kube: KubeApi, **config: Any) -> KubernetesCompute:
    config.setdefault("facts", node_facts([{"name": "k8s-node", "cpus": 8, "memory_bytes": 32 * GIB}]))
    compute = compute_for(account(kube, **config))
    assert isinstance(compute, KubernetesCompute)
    return compute


def spec(key: str, *, user_data: str = "exec trainyard-runner") -> LaunchSpec:
    return LaunchSpec(
        idempotency_key=key,
        instance_name=f"name-{key}",
        runner_token="token",
        server_url="https://trainyard.example.com",
        tags={"trainyard:installation": INSTALLATION, "trainyard:instance": f"inst-{key}", "Name": f"name-{key}"},
        user_data=user_data,
    )


def node(
    name: str,
    *,
    instance_type: str | None = "m6i.2xlarge",
    cpu: str = "7910m",
    memory: str = "31Gi",
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    ready: bool = True,
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    all_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    if instance_type:
        all_labels["node.kubernetes.io/instance-type"] = instance_type
    allocatable = {"cpu": cpu, "memory": memory, "ephemeral-storage": "95Gi", "pods": "110"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod_of(kube: KubeApi, key: str) -> dict[str, Any]:
    found = kube.get(f"{PODS}/{pods.pod_name(key)}")
    assert found is not None, f"no pod for {key}"
    return dict(found)


def rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cleanup(compute: KubernetesCompute) -> None:
    for handle in compute.list_managed():
        terminate_fully(compute, handle)


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("where", "key", "value", "words"),
    [
        ("user", "exec", {"command": "aws", "args": ["eks", "get-token"]}, "runs a program"),
        ("user", "auth-provider", {"name": "gcp"}, "runs a program"),
        ("cluster", "certificate-authority", "/etc/kubernetes/pki/ca.crt", "certificate-authority-data"),
        ("user", "client-certificate", "/home/me/.kube/me.crt", "client-certificate-data"),
        ("user", "client-key", "/home/me/.kube/me.key", "client-key-data"),
        ("user", "tokenFile", "/var/run/secrets/token", "a service account token"),
    ],
)
def test_a_kubeconfig_that_runs_a_program_or_reads_a_file_is_refused(
    where: str, key: str, value: Any, words: str
) -> None:
    user: dict[str, Any] = {"token": "t"}
    cluster: dict[str, Any] = {}
    (user if where == "user" else cluster)[key] = value
    text = kubeconfig_text("https://k8s.example.com", "t", user=user, **cluster)

    with pytest.raises(InvalidConfig) as raised:
        parse_kubeconfig(text)

    assert f"uses {key!r}" in raised.value.message
    assert words in raised.value.message
    assert raised.value.scope is Scope.ACCOUNT


@pytest.mark.parametrize(
    ("config", "credentials", "words"),
    [
        ({}, {"kubeconfig": "clusters: [\n"}, "the kubeconfig is not valid YAML (line 2)"),
        ({}, {}, "needs a kubeconfig"),
        ({"namespace": None}, None, "needs config key 'namespace'"),
        ({"namespace": "Not_A_Namespace"}, None, "'namespace' must be a namespace name"),
        ({"context": "elsewhere"}, None, "the kubeconfig has no context named 'elsewhere'"),
        ({"in_cluster": True}, {}, "does not allow in-cluster Kubernetes backends"),
        ({"tolerations": [{"key": "gpu", "effect": "Sometimes"}]}, None, "'tolerations[].effect'"),
        ({"node_selector": {"pool": 3}}, None, "'node_selector.pool' must be a label value"),
        ({"prices": {"m6i.large": -1}}, None, "'prices.m6i.large' must be a price"),
        ({"gpu_resource": "gpu"}, None, "'gpu_resource' must be an extended resource name"),
        ({"node_pools": [{"name": "a100", "cpus": 0, "memory_gib": 1}]}, None, "cpus ≥ 1"),
    ],
)
def test_a_bad_config_names_what_to_fix(config: dict[str, Any], credentials: dict[str, str] | None, words: str) -> None:
    base = account(kubeconfig=kubeconfig_text("https://k8s.example.com", "t"))
    merged = {k: v for k, v in {**base.config, **config}.items() if v is not None}
    made = AccountConfig(
        "a", "w", "kubernetes", INSTALLATION, merged, base.credentials if credentials is None else credentials
    )

    with pytest.raises(InvalidConfig) as raised:
        compute_for(made)

    assert words in raised.value.message


def test_a_kubeconfig_with_inline_credentials_gives_the_endpoint() -> None:
    ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

    text = kubeconfig_text(
        "https://k8s.example.com:6443/",
        "sa-token",
        **{"certificate-authority-data": base64.b64encode(ca.encode()).decode()},
    )

    endpoint = parse_kubeconfig(text)

    assert (endpoint.server, endpoint.host, endpoint.port, endpoint.ca_pem, endpoint.token, endpoint.cluster) == (
        "https://k8s.example.com:6443",
        "k8s.example.com",
        6443,
        ca,
        "sa-token",
        "test",
    )
    assert "sa-token" not in repr(endpoint)


def test_an_api_server_on_a_private_address_is_refused_unless_the_operator_allows_its_network(
    kube_api: KubeApi,
) -> None:
    refused = compute_for(account(kube_api, allowed_networks=[]))
    allowed = compute_for(account(kube_api, allowed_networks=["127.0.0.0/8"]))

    with pytest.raises(InvalidConfig) as raised:
        refused.list_managed()

    assert raised.value.code == "PrivateApiServer"
    assert "127.0.0.1, a private address" in raised.value.message
    assert "TRAINYARD_KUBERNETES_PRIVATE_NETWORKS" in raised.value.message
    assert allowed.list_managed() == []


# ---------------------------------------------------------------- offers


def test_offers_come_from_the_ready_schedulable_nodes_with_their_gpus_markets_and_prices(kube_api: KubeApi) -> None:
    spot = {"karpenter.sh/capacity-type": "spot"}
    gpu = {"nvidia.com/gpu.product": A100, "nvidia.com/gpu.memory": "40960", "karpenter.sh/capacity-type": "on-demand"}
    gpu_taint = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    for made in (
        node("cpu-1", labels={"karpenter.sh/capacity-type": "on-demand"}),
        node("cpu-2", labels=spot),
        node("gpu-1", instance_type="p4d.24xlarge", cpu="95", memory="1100Gi", gpus=8, labels=gpu, taints=gpu_taint),
        node("cordoned", instance_type="c6i.large", unschedulable=True),
        node("not-ready", instance_type="c6i.xlarge", ready=False),
        node(
            "dedicated", instance_type="r6i.large", taints=[{"key": "team", "value": "infra", "effect": "NoSchedule"}]
        ),
        node("bare", instance_type=None, cpu="4", memory="8Gi"),
    ):
        kube_api.post("/api/v1/nodes", made)
    facts = backend(kube_api).refresh_facts()
    compute = backend(
        kube_api,
        facts=facts,
        prices={"m6i.2xlarge": 0.384, "p4d.24xlarge": 32.77},
        spot_prices={"m6i.2xlarge": 0.12},
        default_price=0.05,
    )

    offers = {(o.instance_type, o.spot): o for o in compute.offers(Requirements(spot_policy="auto"))}

    assert set(offers) == {("m6i.2xlarge", False), ("m6i.2xlarge", True), ("p4d.24xlarge", False), ("node", False)}
    assert facts["gpu_resources"] == ["nvidia.com/gpu"]
    a100 = offers[("p4d.24xlarge", False)]
    assert (a100.cpus, a100.memory_bytes, len(a100.gpus), a100.price_per_hour) == (95, 1100 * GIB, 8, 32.77)
    assert a100.gpus[0].name == "NVIDIA A100-SXM4-40GB" and a100.gpus[0].memory_bytes == 40 * GIB
    assert shortfall(Requirements(gpu_count=8, gpu_name="A100", gpu_memory_bytes=40 * GIB), a100) is None
    assert (offers[("m6i.2xlarge", False)].cpus, offers[("m6i.2xlarge", False)].price_per_hour) == (7, 0.384)
    assert offers[("m6i.2xlarge", True)].price_per_hour == 0.12
    assert offers[("node", False)].price_per_hour == 0.05  # no instance type label, no price: the default
    assert {o.region for o in offers.values()} == {"test"}  # the kubeconfig's cluster name
    assert [o.instance_type for o in compute.offers(Requirements())] == ["m6i.2xlarge", "node", "p4d.24xlarge"]


@pytest.mark.parametrize(
    ("labels", "spot", "selector"),
    [
        ({"eks.amazonaws.com/capacityType": "SPOT"}, True, {"eks.amazonaws.com/capacityType": "SPOT"}),
        ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, False, {"eks.amazonaws.com/capacityType": "ON_DEMAND"}),
        ({"cloud.google.com/gke-spot": "true"}, True, {"cloud.google.com/gke-spot": "true"}),
        ({"cloud.google.com/gke-preemptible": "true"}, True, {"cloud.google.com/gke-preemptible": "true"}),
        ({"kubernetes.azure.com/scalesetpriority": "spot"}, True, {"kubernetes.azure.com/scalesetpriority": "spot"}),
        ({}, False, {}),
    ],
)
def test_a_nodes_capacity_type_label_makes_its_market_and_selects_it(
    kube_api: KubeApi, labels: dict[str, str], spot: bool, selector: dict[str, str]
) -> None:
    kube_api.post("/api/v1/nodes", node("n", instance_type="e2-standard-8", labels=labels))
    compute = backend(kube_api, facts=backend(kube_api).refresh_facts())

    [offer] = compute.offers(Requirements(spot_policy="auto"))
    handle = compute.launch(offer, spec("ty-market"))

    assert offer.spot is spot
    manifest = pod_of(kube_api, "ty-market")["spec"]
    assert manifest["nodeSelector"] == {"node.kubernetes.io/instance-type": "e2-standard-8", **selector}
    spot_keys = {t["key"] for t in manifest["tolerations"]} & {t["key"] for t in pods.SPOT_TOLERATIONS}
    assert bool(spot_keys) is spot
    terminate_fully(compute, handle)


def test_a_node_pool_is_offered_before_it_has_a_node_and_its_pod_selects_the_pool(kube_api: KubeApi) -> None:
    pool = {
        "name": "a100-spot",
        "instance_type": "a2-highgpu-1g",
        "cpus": 12,
        "memory_gib": 85,
        "gpus": 1,
        "gpu_name": "NVIDIA A100-SXM4-40GB",
        "gpu_memory_gib": 40,
        "spot": True,
        "price": 1.1,
        "node_selector": {"cloud.google.com/gke-nodepool": "a100-spot"},
        "tolerations": [{"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    }
    compute = backend(kube_api, facts={"nodes": []}, node_pools=[pool])

    [offer] = compute.offers(Requirements(gpu_count=1, spot_policy="spot"))
    handle = compute.launch(offer, spec("ty-pool"))

    assert (offer.instance_type, offer.spot, offer.price_per_hour, offer.cpus, len(offer.gpus)) == (
        "a2-highgpu-1g",
        True,
        1.1,
        12,
        1,
    )
    assert shortfall(Requirements(gpu_count=1, gpu_name="A100"), offer) is None
    manifest = pod_of(kube_api, "ty-pool")["spec"]
    assert manifest["nodeSelector"] == {"cloud.google.com/gke-nodepool": "a100-spot"}
    assert {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in manifest["tolerations"]
    terminate_fully(compute, handle)


def test_an_offer_of_another_cluster_is_no_capacity(kube_api: KubeApi) -> None:
    compute = backend(kube_api)
    offer = next(iter(compute.offers(Requirements())))
    elsewhere = Offer(**{**offer.__dict__, "region": "another-cluster"})

    with pytest.raises(NoCapacity):
        compute.launch(elsewhere, spec("ty-elsewhere"))

    assert kube_api.pods() == []


# ---------------------------------------------------------------- the pod


def test_the_pod_asks_for_the_jobs_resources_and_gpus_and_carries_no_service_account_token(kube_api: KubeApi) -> None:
    facts = node_facts(
        [
            {
                "name": "g5.12xlarge",
                "cpus": 47,
                "memory_bytes": 180 * GIB,
                "gpus": [{"name": "NVIDIA A10G", "memory_bytes": 24 * GIB}] * 4,
            }
        ]
    )
    compute = backend(
        kube_api,
        facts=facts,
        image="ghcr.io/acme/train:1.2",
        image_pull_secrets=["ghcr"],
        node_selector={"acme.com/pool": "training"},
        tolerations=[{"key": "acme.com/training", "operator": "Exists", "effect": "NoSchedule"}],
        termination_grace_seconds=90,
    )
    req = Requirements(cpu=6, memory_bytes=40 * GIB, gpu_count=2, shm_size_bytes=8 * GIB)
    [offer] = compute.offers(req)

    handle = compute.launch(offer, spec("ty-gpu-job", user_data="echo boot"))

    pod = pod_of(kube_api, "ty-gpu-job")
    meta, body = pod["metadata"], pod["spec"]
    [container] = body["containers"]
    assert meta["name"] == "ty-ty-gpu-job" == handle.backend_id
    assert meta["labels"] == {
        "trainyard.dev/installation": INSTALLATION,
        "trainyard.dev/account": "acct-1",
        "trainyard.dev/workspace": "ws-1",
        "trainyard.dev/instance": "inst-ty-gpu-job",
        "trainyard.dev/key": "ty-gpu-job",
    }
    tags = json.loads(meta["annotations"]["trainyard.dev/tags"])
    assert tags["trainyard:key"] == "ty-gpu-job" and tags["Name"] == "name-ty-gpu-job"
    assert (body["restartPolicy"], body["automountServiceAccountToken"], body["enableServiceLinks"]) == (
        "Never",
        False,
        False,
    )
    assert body["terminationGracePeriodSeconds"] == 90
    assert body["imagePullSecrets"] == [{"name": "ghcr"}]
    assert (container["name"], container["image"], container["command"]) == (
        "runner",
        "ghcr.io/acme/train:1.2",
        ["/bin/sh", "-c", "echo boot"],
    )
    assert container["resources"] == {
        "requests": {"cpu": "6", "memory": "40960Mi"},
        "limits": {"cpu": "6", "memory": "40960Mi", "nvidia.com/gpu": "2"},
    }
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TRAINYARD_BOOT_FOREGROUND"] == "1"
    assert env["TRAINYARD_POWER_OFF_COMMAND"] == "true"
    assert env["TRAINYARD_RUNNER_TERMINATION_GRACE"] == "90"
    declared = json.loads(env["TRAINYARD_RUNNER_RESOURCES"])
    assert (declared["cpus"], declared["memory_bytes"], len(declared["gpus"])) == (6, 40 * GIB, 2)
    assert body["nodeSelector"] == {"node.kubernetes.io/instance-type": "g5.12xlarge", "acme.com/pool": "training"}
    assert body["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "acme.com/training", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert body["volumes"] == [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8192Mi"}}]
    assert container["volumeMounts"] == [{"name": "shm", "mountPath": "/dev/shm"}]
    terminate_fully(compute, handle)


def test_a_cpu_job_asks_at_least_one_cpu_and_one_gib_and_no_gpu(kube_api: KubeApi) -> None:
    compute = backend(kube_api)
    [offer] = compute.offers(Requirements())

    handle = compute.launch(offer, spec("ty-small"))

    container = pod_of(kube_api, "ty-small")["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "1024Mi"}
    assert pod_of(kube_api, "ty-small")["spec"]["tolerations"] == []
    terminate_fully(compute, handle)


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("ty-0b4c7a52-1f3e-4d6a-9c1b-2f0e8d7a6b5c", "ty-ty-0b4c7a52-1f3e-4d6a-9c1b-2f0e8d7a6b5c"),
        ("Ty_Upper.Key", "ty-ty-upper-key-" + pods._digest("Ty_Upper.Key")),
        ("ty-upper-key", "ty-ty-upper-key"),
        ("k" * 80, ("ty-" + "k" * 51) + "-" + pods._digest("k" * 80)),
    ],
)
def test_a_pod_name_is_a_dns_label_and_two_keys_never_share_one(key: str, name: str) -> None:
    assert pods.pod_name(key) == name
    assert len(name) <= 63 and name[-1].isalnum()


def test_a_finished_pod_of_the_key_is_replaced_and_one_going_down_is_waited_for(kube_api: KubeApi) -> None:
    compute = backend(kube_api)
    [offer] = compute.offers(Requirements())
    first = compute.launch(offer, spec("ty-again"))
    kube_api.patch(f"{PODS}/{first.backend_id}", {"status": {"phase": "Failed"}})

    second = compute.launch(offer, spec("ty-again"))

    assert second.backend_id == first.backend_id and second.data["uid"] != first.data["uid"]
    assert compute.describe([first, second]) == {"ty-again": CloudState.PENDING}
    assert compute.view([first])["ty-again"].state is CloudState.NOT_FOUND
    kube_api.patch(f"{PODS}/{second.backend_id}", {"metadata": {"finalizers": ["test/hold"]}})
    kube_api.delete(f"{PODS}/{second.backend_id}")
    with pytest.raises(Transient) as raised:
        compute.launch(offer, spec("ty-again"))
    assert raised.value.code == "PodTerminating"
    kube_api.patch(f"{PODS}/{second.backend_id}", {"metadata": {"finalizers": []}})
    assert kube_api.pods() == []


# ---------------------------------------------------------------- view


def _launched(kube: KubeApi, key: str, *, spot: bool = False) -> tuple[KubernetesCompute, Handle]:
    facts = node_facts([{"name": "m6i.large", "cpus": 2, "memory_bytes": 8 * GIB, "spot": spot}])
    compute = backend(kube, facts=facts)
    [offer] = compute.offers(Requirements(spot_policy="auto"))
    return compute, compute.launch(offer, spec(key))


def _event(kube: KubeApi, pod: dict[str, Any], reason: str, message: str, *, first: float, last: float) -> None:
    meta = pod["metadata"]
    kube.post(
        EVENTS,
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{reason.lower()}{int(first)}", "namespace": NAMESPACE},
            "involvedObject": {"kind": "Pod", "name": meta["name"], "namespace": NAMESPACE, "uid": meta["uid"]},
            "reason": reason,
            "message": message,
            "type": "Warning",
            "count": 3,
            "firstTimestamp": rfc3339(first),
            "lastTimestamp": rfc3339(last),
        },
    )


SCHEDULER = "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint {team: infra}."


def test_an_unschedulable_pod_says_why_and_since_when(kube_api: KubeApi) -> None:
    compute, handle = _launched(kube_api, "ty-unsched")
    since = time.time() - 90
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": SCHEDULER}
    kube_api.patch(
        f"{PODS}/{handle.backend_id}", {"status": {"conditions": [{**condition, "lastTransitionTime": rfc3339(since)}]}}
    )

    view = compute.view([handle])[handle.key]

    assert view == MachineView(CloudState.PENDING, Trouble.UNSCHEDULABLE, SCHEDULER, float(int(since)))
    assert compute.describe([handle]) == {handle.key: CloudState.PENDING}
    terminate_fully(compute, handle)


def test_a_failed_scheduling_event_alone_says_why_a_pod_waits(kube_api: KubeApi) -> None:
    compute, handle = _launched(kube_api, "ty-event")
    first = time.time() - 200
    _event(kube_api, pod_of(kube_api, "ty-event"), "FailedScheduling", SCHEDULER, first=first, last=time.time())

    view = compute.view([handle])[handle.key]

    assert (view.state, view.reason, view.message, view.since) == (
        CloudState.PENDING,
        Trouble.UNSCHEDULABLE,
        SCHEDULER,
        float(int(first)),
    )
    terminate_fully(compute, handle)


PULL = 'Back-off pulling image "ghcr.io/acme/nope:1"'


@pytest.mark.parametrize(
    ("spot", "patch", "expected"),
    [
        (
            False,
            {
                "containerStatuses": [
                    {"name": "runner", "state": {"waiting": {"reason": "ImagePullBackOff", "message": PULL}}}
                ]
            },
            (CloudState.PENDING, Trouble.IMAGE_PULL, f"ImagePullBackOff: {PULL}"),
        ),
        (
            False,
            {"containerStatuses": [{"name": "runner", "state": {"waiting": {"reason": "InvalidImageName"}}}]},
            (CloudState.PENDING, Trouble.IMAGE_PULL, "InvalidImageName"),
        ),
        (False, {"phase": "Running"}, (CloudState.RUNNING, None, "")),
        (False, {"phase": "Succeeded"}, (CloudState.TERMINATED, None, "")),
        (False, {"phase": "Failed"}, (CloudState.TERMINATED, None, "")),
        (
            False,
            {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
            (CloudState.TERMINATED, Trouble.EVICTED, "The node was low on resource: memory."),
        ),
        (
            False,
            {
                "phase": "Failed",
                "conditions": [
                    {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "p"}
                ],
            },
            (CloudState.INTERRUPTED, Trouble.PREEMPTED, "p"),
        ),
        (
            True,
            {
                "phase": "Failed",
                "conditions": [
                    {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager", "message": "t"}
                ],
            },
            (CloudState.INTERRUPTED, Trouble.PREEMPTED, "t"),
        ),
        (
            False,
            {
                "phase": "Failed",
                "conditions": [
                    {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC", "message": "gc"}
                ],
            },
            (CloudState.TERMINATED, Trouble.NODE_LOST, "gc"),
        ),
    ],
)
def test_a_pods_status_gives_its_state_and_trouble(
    kube_api: KubeApi, spot: bool, patch: dict[str, Any], expected: tuple[CloudState, Trouble | None, str]
) -> None:
    compute, handle = _launched(kube_api, "ty-status", spot=spot)
    kube_api.patch(f"{PODS}/{handle.backend_id}", {"status": patch})

    view = compute.view([handle])[handle.key]

    assert (view.state, view.reason, view.message) == expected
    terminate_fully(compute, handle)


@pytest.mark.parametrize(
    ("spot", "reason", "trouble"),
    [
        (False, "PreemptionByScheduler", Trouble.PREEMPTED),
        (False, "EvictionByEvictionAPI", Trouble.EVICTED),
        (False, "DeletionByTaintManager", Trouble.NODE_LOST),
        (True, "DeletionByTaintManager", Trouble.PREEMPTED),
        (True, "TerminationByKubelet", Trouble.PREEMPTED),
        (False, "TerminationByKubelet", Trouble.NODE_LOST),
        (False, "DeletionByPodGC", Trouble.NODE_LOST),
        (True, "DeletionByPodGC", Trouble.PREEMPTED),
    ],
)
def test_a_pod_going_down_says_who_disrupted_it(kube_api: KubeApi, spot: bool, reason: str, trouble: Trouble) -> None:
    compute, handle = _launched(kube_api, "ty-disrupted", spot=spot)
    path = f"{PODS}/{handle.backend_id}"
    kube_api.patch(path, {"metadata": {"finalizers": ["test/hold"]}, "status": {"phase": "Running"}})
    condition = {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": f"by {reason}"}
    kube_api.patch(path, {"status": {"conditions": [condition]}})
    kube_api.delete(path)

    view = compute.view([handle])[handle.key]

    assert (view.state, view.reason, view.message) == (CloudState.STOPPING, trouble, f"by {reason}")
    kube_api.patch(path, {"metadata": {"finalizers": []}})


def test_a_failed_spot_pod_whose_node_is_gone_was_reclaimed(kube_api: KubeApi) -> None:
    compute, handle = _launched(kube_api, "ty-reclaimed", spot=True)
    kube_api.post("/api/v1/nodes", node("spot-1"))
    path = f"{PODS}/{handle.backend_id}"
    kube_api.patch(path, {"spec": {"nodeName": "spot-1"}, "status": {"phase": "Failed"}})
    still_there = compute.view([handle])[handle.key]
    kube_api.delete("/api/v1/nodes/spot-1")

    gone = compute.view([handle])[handle.key]

    assert (still_there.state, still_there.reason) == (CloudState.TERMINATED, None)
    assert (gone.state, gone.reason, gone.message) == (
        CloudState.INTERRUPTED,
        Trouble.PREEMPTED,
        "its spot node spot-1 is gone",
    )
    terminate_fully(compute, handle)


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (None, (CloudState.NOT_FOUND, Trouble.DELETED, "the pod was deleted, not by Trainyard")),
        (
            ("Killing", "Stopping container runner"),
            (CloudState.NOT_FOUND, Trouble.DELETED, "the pod was deleted (Stopping container runner)"),
        ),
        (
            ("Evicted", "The node had condition: [DiskPressure]."),
            (CloudState.NOT_FOUND, Trouble.EVICTED, "The node had condition: [DiskPressure]."),
        ),
        (
            ("Preempted", "Preempted by a pod on node gpu-1"),
            (CloudState.INTERRUPTED, Trouble.PREEMPTED, "Preempted by a pod on node gpu-1"),
        ),
    ],
)
def test_a_pod_deleted_by_someone_else_is_gone_with_what_its_events_say(
    kube_api: KubeApi, event: tuple[str, str] | None, expected: tuple[CloudState, Trouble, str]
) -> None:
    compute, handle = _launched(kube_api, "ty-deleted")
    pod = pod_of(kube_api, "ty-deleted")
    if event is not None:
        _event(kube_api, pod, event[0], event[1], first=time.time() - 5, last=time.time() - 5)
        # The kubelet then stops the container: its Killing event comes last, and says less.
        _event(kube_api, pod, "Killing", "Stopping container runner", first=time.time() - 1, last=time.time() - 1)
    kube_api.delete(f"{PODS}/{handle.backend_id}")

    view = compute.view([handle])[handle.key]

    assert (view.state, view.reason, view.message) == expected


@pytest.mark.parametrize(
    ("spot", "expected"),
    [
        (True, MachineView(CloudState.INTERRUPTED, Trouble.PREEMPTED, "its spot node node-7 is gone")),
        (False, MachineView(CloudState.NOT_FOUND, Trouble.NODE_LOST, "its node node-7 is gone")),
    ],
)
def test_a_pod_gone_with_its_node_says_so(kube_api: KubeApi, spot: bool, expected: MachineView) -> None:
    compute, handle = _launched(kube_api, "ty-node-gone", spot=spot)
    kube_api.post("/api/v1/nodes", node("node-7"))
    assigned = f"Successfully assigned {NAMESPACE}/{handle.backend_id} to node-7"
    _event(kube_api, pod_of(kube_api, "ty-node-gone"), "Scheduled", assigned, first=time.time(), last=time.time())
    kube_api.delete(f"{PODS}/{handle.backend_id}")  # the pod garbage collector, after the node vanished
    node_still_there = compute.view([handle])[handle.key]
    kube_api.delete("/api/v1/nodes/node-7")

    gone = compute.view([handle])[handle.key]

    assert (node_still_there.state, node_still_there.reason) == (CloudState.NOT_FOUND, Trouble.DELETED)
    assert gone == expected


def test_a_pod_this_backend_terminated_is_gone_with_no_trouble(kube_api: KubeApi) -> None:
    compute, handle = _launched(kube_api, "ty-ours")
    terminate_fully(compute, handle)

    assert compute.view([handle, Handle(key="ty-never")]) == {
        "ty-ours": MachineView(CloudState.NOT_FOUND),
        "ty-never": MachineView(CloudState.NOT_FOUND),
    }


# ---------------------------------------------------------------- list_managed and the leak sweep


def _foreign_pod(name: str, labels: dict[str, str], tags: dict[str, str] | None = None) -> dict[str, Any]:
    annotations = {"trainyard.dev/tags": json.dumps(tags)} if tags is not None else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels, "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "nginx"}]},
    }


def test_list_managed_sees_only_this_installations_pods_and_never_touches_another(kube_api: KubeApi) -> None:
    compute, ours = _launched(kube_api, "ty-mine")
    theirs_labels = {"trainyard.dev/installation": "ty-other", "trainyard.dev/account": "acct-1"}
    copied = {"trainyard.dev/installation": INSTALLATION, "trainyard.dev/account": "acct-1"}
    kube_api.post(PODS, _foreign_pod("unlabelled", {"app": "web"}))
    kube_api.post(PODS, _foreign_pod("ty-ty-theirs", theirs_labels, {"trainyard:key": "ty-theirs"}))
    # Our labels copied onto a pod whose tags name another installation: not ours either.
    kube_api.post(
        PODS, _foreign_pod("ty-ty-copied", copied, {"trainyard:key": "ty-copied", "trainyard:installation": "x"})
    )
    other_account = compute_for(account(kube_api, account_id="acct-2", facts=compute.facts))

    managed = compute.list_managed()

    assert [(h.key, h.backend_id) for h in managed] == [("ty-mine", "ty-ty-mine")]
    assert other_account.list_managed() == []
    with pytest.raises(ComputeError) as refused:
        compute.terminate(Handle(key="ty-copied"))
    assert refused.value.code == "NotOurs"
    terminate_fully(compute, ours)
    assert sorted(p["metadata"]["name"] for p in kube_api.pods()) == ["ty-ty-copied", "ty-ty-theirs", "unlabelled"]


def test_list_managed_carries_when_each_pod_was_launched(kube_api: KubeApi) -> None:
    compute, handle = _launched(kube_api, "ty-when")

    [listed] = compute.list_managed()

    assert abs(float(listed.data["launched_at"]) - time.time()) < 5
    assert listed.data["uid"] == handle.data["uid"]
    terminate_fully(compute, handle)


# ---------------------------------------------------------------- the API server's failures


class _StandIn:
    """An HTTP server that answers each request with the next of ``answers``
    (status, body, headers); the last one is kept for every later request."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, Any, dict[str, str]]] = [(200, {"kind": "PodList", "items": []}, {})]
        self.requests: list[tuple[str, str]] = []
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                stand_in.requests.append((self.command, self.path))
                status, body, headers = stand_in.answers.pop(0) if len(stand_in.answers) > 1 else stand_in.answers[0]
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = _answer

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def then(self, status: int, reason: str, message: str, headers: dict[str, str] | None = None, **extra: Any) -> None:
        """Answer the next request (after those already queued) with a Status."""
        body = {"kind": "Status", "status": "Failure", "code": status, "reason": reason, "message": message, **extra}
        self.answers.append((status, body, headers or {}))


@pytest.fixture
def stand_in() -> Iterator[_StandIn]:
    made = _StandIn()
    yield made
    made.server.shutdown()
    made.server.server_close()


def _on(stand_in: _StandIn) -> KubernetesCompute:
    facts = node_facts([{"name": "k8s-node", "cpus": 8, "memory_bytes": 32 * GIB}])
    compute = compute_for(account(kubeconfig=kubeconfig_text(stand_in.url, SECRET), facts=facts))
    assert isinstance(compute, KubernetesCompute)
    return compute


@pytest.mark.parametrize(
    ("status", "reason", "message", "error", "code", "words"),
    [
        (401, "Unauthorized", "Unauthorized", AuthFailed, "Unauthorized", "refused the kubeconfig's credentials"),
        (
            403,
            "Forbidden",
            'pods is forbidden: User "system:serviceaccount:ml:trainyard" cannot list resource "pods"',
            AuthFailed,
            "Forbidden",
            "may not list pods in namespace trainyard",
        ),
        (429, "TooManyRequests", "slow down", Transient, "TooManyRequests", "throttling"),
        (500, "InternalError", "etcdserver: request timed out", Transient, "InternalError", "etcdserver"),
        (503, "ServiceUnavailable", "", Transient, "ServiceUnavailable", "failed to list pods"),
    ],
)
def test_the_api_servers_refusals_are_typed_errors(
    stand_in: _StandIn, status: int, reason: str, message: str, error: type[ComputeError], code: str, words: str
) -> None:
    stand_in.answers.clear()
    stand_in.then(status, reason, message, {"Retry-After": "7"} if status == 429 else {})

    with pytest.raises(error) as raised:
        _on(stand_in).list_managed()

    assert raised.value.code == code
    assert words in raised.value.message
    assert SECRET not in str(raised.value)
    if status == 429:
        assert raised.value.retry_after == 7.0
    if isinstance(raised.value, Transient) and status != 429:
        assert raised.value.retry_after == 5.0


@pytest.mark.parametrize(
    ("status", "reason", "message", "details", "error", "code", "words"),
    [
        (
            403,
            "Forbidden",
            'pods "ty-ty-x" is forbidden: exceeded quota: compute, requested: requests.cpu=1, used: 8, limited: 8',
            {},
            QuotaExceeded,
            "ExceededQuota",
            "ResourceQuota does not allow another pod",
        ),
        (
            404,
            "NotFound",
            'namespaces "trainyard" not found',
            {"kind": "namespaces", "name": "trainyard"},
            InvalidConfig,
            "NamespaceNotFound",
            "the namespace trainyard does not exist",
        ),
        (
            422,
            "Invalid",
            'Pod "ty-ty-x" is invalid: spec.containers[0].image: Required value',
            {},
            InvalidConfig,
            "Invalid",
            "check the backend's image",
        ),
        (
            403,
            "Forbidden",
            'pods is forbidden: cannot create resource "pods"',
            {},
            AuthFailed,
            "Forbidden",
            "may not create pods",
        ),
    ],
)
def test_a_refused_pod_creation_is_a_typed_error(
    stand_in: _StandIn,
    status: int,
    reason: str,
    message: str,
    details: dict[str, str],
    error: type[ComputeError],
    code: str,
    words: str,
) -> None:
    compute = _on(stand_in)
    [offer] = compute.offers(Requirements())
    stand_in.answers.clear()
    stand_in.then(404, "NotFound", 'pods "ty-ty-x" not found', details={"kind": "pods"})  # the look-up by name
    stand_in.then(status, reason, message, details=details)  # the create

    with pytest.raises(error) as raised:
        compute.launch(offer, spec("ty-x"))

    assert raised.value.code == code
    assert words in raised.value.message
    assert [m for m, _ in stand_in.requests] == ["GET", "POST"]


def test_a_server_that_never_answers_fails_within_the_timeout() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # accepts connections (the kernel does), never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        endpoint = parse_kubeconfig(kubeconfig_text(url, "t"))
        client = KubeClient(endpoint, allowed_networks=(ipaddress.ip_network("127.0.0.0/8"),), read_timeout=0.5)
        started = time.monotonic()

        with pytest.raises(Transient) as raised:
            client.list(PODS, resource="pods")

    assert time.monotonic() - started < 3
    assert raised.value.code == "Timeout"
    assert raised.value.message == f"the Kubernetes API server at {url} did not answer within 0.5 s"
    built = compute_for(account(kubeconfig=kubeconfig_text(url, "t")))
    assert isinstance(built, KubernetesCompute)
    assert (built.client.timeout.connect_timeout, built.client.timeout.read_timeout) == (5.0, 30.0)


def test_a_server_that_refuses_connections_is_transient() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening: refused
        compute = compute_for(account(kubeconfig=kubeconfig_text(url, "t")))

        with pytest.raises(Transient) as raised:
            compute.list_managed()

    assert raised.value.code == "Unreachable"
    assert raised.value.message.startswith(f"cannot reach the Kubernetes API server at {url}")


# ---------------------------------------------------------------- the connection check


def test_check_cluster_reports_the_server_the_nodes_and_their_gpu_resources(kube_api: KubeApi) -> None:
    kube_api.post("/api/v1/nodes", node("cpu-1"))
    kube_api.post("/api/v1/nodes", node("gpu-1", gpus=4, labels={"nvidia.com/gpu.product": A100}))

    checked = check_cluster(account(kube_api))

    assert (checked.namespace, checked.nodes, checked.gpu_resources) == (NAMESPACE, 2, ("nvidia.com/gpu",))
    assert checked.server_version.startswith("v1.")


def test_check_cluster_names_every_denied_permission_and_the_rbac_file(kube_api: KubeApi) -> None:
    kube_api.deny("list", "nodes")

    with pytest.raises(AuthFailed) as one:
        check_cluster(account(kube_api))
    kube_api.deny("delete", "pods")
    kube_api.deny("get", "pods")  # also pods/log: the review names the resource, not the subresource
    with pytest.raises(AuthFailed) as several:
        check_cluster(account(kube_api))

    assert one.value.message == (
        "the kubeconfig's user may not list nodes (cluster-wide): apply deploy/kubernetes/backend-rbac.yaml "
        "(docs/BACKENDS.md, Kubernetes)"
    )
    assert several.value.message.startswith(
        f"the kubeconfig's user may not get pods, delete pods, get pods/log in namespace {NAMESPACE}; list nodes "
        "(cluster-wide)"
    )


def test_check_cluster_names_a_missing_namespace_a_bad_token_and_an_unreachable_server(kube_api: KubeApi) -> None:
    with pytest.raises(InvalidConfig) as no_namespace:
        check_cluster(account(kube_api, namespace="nowhere"))
    with pytest.raises(AuthFailed) as bad_token:
        check_cluster(account(kube_api, kubeconfig=kube_api.kubeconfig(token="wrong")))
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        with pytest.raises(InvalidConfig) as unreachable:
            check_cluster(account(kubeconfig=kubeconfig_text(url, "t")))

    assert no_namespace.value.message.startswith("the namespace nowhere does not exist in the cluster")
    assert bad_token.value.code == "Unauthorized"
    assert unreachable.value.message.startswith(f"cannot reach the Kubernetes API server at {url}")


# ---------------------------------------------------------------- TLS


def _certificate(
    name: str, key: ec.EllipticCurvePrivateKey, *, issuer: x509.Certificate | None, issuer_key: Any, ca: bool
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject if issuer is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca and name == "localhost":
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(thing: Any) -> str:
    if isinstance(thing, x509.Certificate):
        return thing.public_bytes(serialization.Encoding.PEM).decode()
    return str(
        thing.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
    )


class _TlsApiServer:
    """An HTTPS API server whose certificate a test CA signed, that requires
    a client certificate of the same CA and records who presented one."""

    def __init__(self, folder: Path) -> None:
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ca = _certificate("test-ca", self.ca_key, issuer=None, issuer_key=self.ca_key, ca=True)
        server_key = ec.generate_private_key(ec.SECP256R1())
        server = _certificate("localhost", server_key, issuer=self.ca, issuer_key=self.ca_key, ca=False)
        self.client_key = ec.generate_private_key(ec.SECP256R1())
        self.client = _certificate(
            "trainyard-backend", self.client_key, issuer=self.ca, issuer_key=self.ca_key, ca=False
        )
        (folder / "server.pem").write_text(_pem(server) + _pem(server_key))
        (folder / "ca.pem").write_text(_pem(self.ca))
        self.clients: list[str] = []
        seen = self.clients

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                peer = self.connection.getpeercert() or {}  # type: ignore[attr-defined]
                seen.extend(value for rdn in peer.get("subject", ()) for key, value in rdn if key == "commonName")
                data = json.dumps({"kind": "PodList", "items": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(folder / "server.pem")
        context.load_verify_locations(folder / "ca.pem")
        context.verify_mode = ssl.CERT_REQUIRED
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def kubeconfig(self, host: str = "localhost", *, with_ca: bool = True) -> str:
        def b64(text: str) -> str:
            return base64.b64encode(text.encode()).decode()

        user = {"client-certificate-data": b64(_pem(self.client)), "client-key-data": b64(_pem(self.client_key))}
        cluster = {"certificate-authority-data": b64(_pem(self.ca))} if with_ca else {}
        return kubeconfig_text(f"https://{host}:{self.port}", "", user=user, **cluster)


@pytest.fixture
def tls_api(tmp_path: Path) -> Iterator[_TlsApiServer]:
    made = _TlsApiServer(tmp_path)
    yield made
    made.httpd.shutdown()
    made.httpd.server_close()


def test_tls_verifies_the_api_server_by_the_kubeconfigs_ca_and_presents_its_client_certificate(
    tls_api: _TlsApiServer,
) -> None:
    before = set(Path(tempfile.gettempdir()).glob("ty-kube-*"))
    compute = compute_for(account(kubeconfig=tls_api.kubeconfig()))

    assert compute.list_managed() == []

    assert tls_api.clients == ["trainyard-backend"]
    assert set(Path(tempfile.gettempdir()).glob("ty-kube-*")) == before  # the key's file is gone


@pytest.mark.parametrize(
    ("host", "with_ca", "words"),
    [
        ("localhost", False, "CERTIFICATE_VERIFY_FAILED"),  # the system's CAs do not know the test CA
        ("127.0.0.1", True, "hostname '127.0.0.1' doesn't match 'localhost'"),  # the certificate names localhost only
    ],
)
def test_an_api_server_whose_certificate_does_not_verify_is_refused(
    tls_api: _TlsApiServer, host: str, with_ca: bool, words: str
) -> None:
    compute = compute_for(account(kubeconfig=tls_api.kubeconfig(host, with_ca=with_ca)))

    with pytest.raises(InvalidConfig) as raised:
        compute.list_managed()

    assert raised.value.code == "TlsFailed"
    assert words in raised.value.message
    assert "certificate-authority-data" in raised.value.message
    assert tls_api.clients == []


def test_in_cluster_uses_the_servers_own_service_account_where_the_operator_allows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("backend.clouds.backends.kubernetes.config.SERVICE_ACCOUNT_DIR", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    config = {"namespace": "ml", "in_cluster": True, "in_cluster_allowed": True}
    made = AccountConfig("a", "w", "kubernetes", INSTALLATION, config, {})

    with pytest.raises(InvalidConfig) as no_token:
        compute_for(made)
    (tmp_path / "token").write_text("in-cluster-token\n")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    built = compute_for(made)

    assert no_token.value.code == "NotInCluster"
    assert isinstance(built, KubernetesCompute)
    endpoint = built.options.endpoint
    assert (endpoint.server, endpoint.token, endpoint.in_cluster) == ("https://10.96.0.1:443", "in-cluster-token", True)


# ---------------------------------------------------------------- with the kubelet helper (the cluster's node side)

# A container that says it runs, and on SIGTERM (its grace's notice) says so and exits.
RUNS = "trap 'echo got TERM; exit 0' TERM; echo running; while :; do sleep 0.1; done"
# One that ignores SIGTERM: only the end of its grace period ends it.
DEAF = "trap '' TERM; echo running; while :; do sleep 0.1; done"


def _on_nodes(kube: KubeApi, **config: Any) -> KubernetesCompute:
    """A backend whose facts are the nodes the kubelet made."""
    return backend(kube, facts=backend(kube).refresh_facts(), termination_grace_seconds=3, **config)


def _wait_view(compute: KubernetesCompute, handle: Handle, check: Any, *, what: str) -> MachineView:
    seen: list[MachineView] = []

    def holds() -> bool:
        seen.append(compute.view([handle])[handle.key])
        return bool(check(seen[-1]))

    wait_for(holds, timeout=30, what=f"{what} (last seen: {seen[-1:]})")
    return seen[-1]


def test_with_the_kubelet_a_gpu_pod_runs_on_the_gpu_node_and_goes_within_its_grace(
    kube_api: KubeApi, kubelet: Kubelet
) -> None:
    kubelet.add_node("cpu-1", instance_type="m6i.2xlarge")
    kubelet.add_node("gpu-1", instance_type="p4d.24xlarge", gpus=2, gpu_product=A100, gpu_memory_mib=40960)
    compute = _on_nodes(kube_api, prices={"p4d.24xlarge": 32.77})
    req = Requirements(gpu_count=1, gpu_name="A100")
    [offer] = [o for o in compute.offers(req) if shortfall(req, o) is None]

    handle = compute.launch(offer, spec("ty-gpu-runs", user_data=RUNS))

    _wait_view(compute, handle, lambda v: v.state is CloudState.RUNNING, what="running")
    assert pod_of(kube_api, "ty-gpu-runs")["spec"]["nodeName"] == "gpu-1"
    wait_for(lambda: "running" in kubelet.pod_log(handle.backend_id), what="the container's output")
    with pytest.raises(NotYetTerminated):
        compute.terminate(handle)
    terminate_fully(compute, handle)
    assert "got TERM" in kubelet.pod_log(handle.backend_id)
    assert kubelet.running() == [] and kube_api.pods() == []
    assert compute.view([handle])[handle.key] == MachineView(CloudState.NOT_FOUND)


def test_with_the_kubelet_an_unschedulable_pod_says_why_until_a_node_comes(kube_api: KubeApi, kubelet: Kubelet) -> None:
    kubelet.add_node("cpu-1", instance_type="m6i.2xlarge")
    pool = {"name": "a100", "instance_type": "p4d.24xlarge", "cpus": 95, "memory_gib": 1100, "gpus": 8}
    compute = _on_nodes(kube_api, node_pools=[pool])
    [offer] = [o for o in compute.offers(Requirements(gpu_count=1)) if o.data.get("pool") == "a100"]
    handle = compute.launch(offer, spec("ty-waits", user_data=RUNS))

    waiting = _wait_view(compute, handle, lambda v: v.reason is Trouble.UNSCHEDULABLE, what="unschedulable")
    kubelet.add_node("gpu-1", instance_type="p4d.24xlarge", gpus=8)

    assert waiting.state is CloudState.PENDING
    assert waiting.message.startswith("0/1 nodes are available: ")
    assert "node(s) didn't match Pod's node affinity/selector" in waiting.message
    assert 0 < time.time() - waiting.since < 30
    _wait_view(compute, handle, lambda v: v.state is CloudState.RUNNING, what="running on the new node")
    terminate_fully(compute, handle)
    assert kubelet.running() == []


def test_with_the_kubelet_an_image_that_cannot_be_pulled_is_named(kube_api: KubeApi, kubelet: Kubelet) -> None:
    kubelet.add_node("cpu-1", instance_type="m6i.2xlarge")
    kubelet.missing_image("ghcr.io/acme/gone:1")
    compute = _on_nodes(kube_api, image="ghcr.io/acme/gone:1")
    [offer] = compute.offers(Requirements())
    handle = compute.launch(offer, spec("ty-no-image", user_data=RUNS))

    first = _wait_view(compute, handle, lambda v: v.reason is Trouble.IMAGE_PULL, what="the pull failing")
    backing_off = _wait_view(compute, handle, lambda v: v.message.startswith("ImagePullBackOff"), what="back-off")

    assert first.state is backing_off.state is CloudState.PENDING
    assert "ghcr.io/acme/gone:1" in first.message
    # Backing off, the status says only "Back-off pulling image"; the last pull's error is kept beside it.
    assert backing_off.message.startswith('ImagePullBackOff: Back-off pulling image "ghcr.io/acme/gone:1"; ')
    assert backing_off.message.endswith("ghcr.io/acme/gone:1: not found")
    assert 0 < time.time() - backing_off.since < 30
    terminate_fully(compute, handle)


@pytest.mark.parametrize(
    ("spot", "disrupt", "expected"),
    [
        (False, "preempt", (CloudState.INTERRUPTED, Trouble.PREEMPTED, "Preempted by pod ")),
        (False, "evict-pressure", (CloudState.TERMINATED, Trouble.EVICTED, "The node was low on resource: memory.")),
        (True, "terminate-node", (CloudState.INTERRUPTED, Trouble.PREEMPTED, "")),
        (False, "terminate-node", (CloudState.TERMINATED, Trouble.NODE_LOST, "")),
        (True, "remove-node", (CloudState.INTERRUPTED, Trouble.PREEMPTED, "")),
        # Seen ended by the pod garbage collector, or already deleted by it: either way its node is gone.
        (False, "remove-node", (None, Trouble.NODE_LOST, "")),
    ],
)
def test_with_the_kubelet_a_disrupted_pod_ends_with_its_trouble(
    kube_api: KubeApi, kubelet: Kubelet, spot: bool, disrupt: str, expected: tuple[CloudState, Trouble, str]
) -> None:
    kubelet.pod_gc_seconds = 0.5
    kubelet.add_node("node-1", instance_type="m6i.2xlarge", spot=spot)
    compute = _on_nodes(kube_api)
    [offer] = compute.offers(Requirements(spot_policy="auto"))
    handle = compute.launch(offer, spec("ty-disrupted", user_data=RUNS))
    kubelet.wait_running(1)

    if disrupt == "preempt":
        kubelet.preempt(handle.backend_id)
    elif disrupt == "evict-pressure":
        kubelet.evict(handle.backend_id, pressure="memory")
    elif disrupt == "terminate-node":
        kubelet.terminate_node("node-1")
    else:
        kubelet.remove_node("node-1")
    view = _wait_view(compute, handle, lambda v: v.state in GONE, what="the pod gone")

    assert view.reason is expected[1]
    assert view.state is expected[0] or (expected[0] is None and view.state in GONE)
    assert view.message.startswith(expected[2])
    terminate_fully(compute, handle)
    assert kubelet.running() == [] and kube_api.pods() == []


def test_with_the_kubelet_an_eviction_shows_while_the_pod_goes(kube_api: KubeApi, kubelet: Kubelet) -> None:
    kubelet.add_node("node-1", instance_type="m6i.2xlarge")
    compute = _on_nodes(kube_api)
    [offer] = compute.offers(Requirements())
    handle = compute.launch(offer, spec("ty-evicted", user_data=DEAF))
    kubelet.wait_running(1)

    kubelet.evict(handle.backend_id)  # kubectl drain: the Eviction API, then the pod's grace (3 s)
    going = _wait_view(compute, handle, lambda v: v.state is CloudState.STOPPING, what="stopping")

    assert (going.reason, going.message) == (Trouble.EVICTED, "Eviction API: evicting")
    terminate_fully(compute, handle)
    assert kubelet.running() == []


def test_an_answer_too_large_or_a_redirect_is_refused(stand_in: _StandIn) -> None:
    endpoint = parse_kubeconfig(kubeconfig_text(stand_in.url, SECRET))
    client = KubeClient(endpoint, allowed_networks=(ipaddress.ip_network("127.0.0.0/8"),), max_answer_bytes=2**20)
    stand_in.answers[:] = [(200, {"kind": "PodList", "items": ["x" * 2**21]}, {})]

    with pytest.raises(Transient) as too_large:
        client.list(PODS, resource="pods")
    stand_in.answers[:] = [(302, {}, {"Location": "http://169.254.169.254/latest/meta-data/"})]
    stand_in.requests.clear()
    with pytest.raises(InvalidConfig) as redirected:
        client.list(PODS, resource="pods")

    assert too_large.value.code == "AnswerTooLarge"
    assert too_large.value.message.endswith("answered more than 1 MiB to one request")
    assert redirected.value.code == "Redirect"
    assert "'http://169.254.169.254/latest/meta-data/'; redirects are not followed" in redirected.value.message
    assert stand_in.requests == [("GET", f"{PODS}?limit=500")]  # not followed


def test_an_answer_that_trickles_fails_within_the_whole_answers_time() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"

        def trickle() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                )
                with contextlib.suppress(OSError):
                    for _ in range(100):
                        connection.sendall(b" ")  # one byte at a time
                        time.sleep(0.1)

        threading.Thread(target=trickle, daemon=True).start()
        client = KubeClient(
            parse_kubeconfig(kubeconfig_text(url, SECRET)),
            allowed_networks=(ipaddress.ip_network("127.0.0.0/8"),),
            read_timeout=5,
            total_timeout=1,
        )
        started = time.monotonic()

        with pytest.raises(Transient) as raised:
            client.list(PODS, resource="pods")

    assert time.monotonic() - started < 4
    assert raised.value.code == "Timeout"
    assert raised.value.message == f"the Kubernetes API server at {url} did not finish its answer within 1 s"


def test_check_cluster_names_an_access_review_it_may_not_make(stand_in: _StandIn) -> None:
    stand_in.answers[:] = [(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.2"}, {})]
    stand_in.then(403, "Forbidden", "selfsubjectaccessreviews.authorization.k8s.io is forbidden")

    with pytest.raises(AuthFailed) as raised:
        check_cluster(account(kubeconfig=kubeconfig_text(stand_in.url, SECRET)))

    assert raised.value.message.startswith(
        "the kubeconfig's user may not create selfsubjectaccessreviews (cluster-wide) (403 Forbidden: "
    )
    assert [m for m, _ in stand_in.requests] == ["GET", "POST"]


@pytest.mark.parametrize(
    ("autoscaler", "expected"),
    [
        (
            [("TriggeredScaleUp", "pod triggered scale-up: [{a100-pool 0->1 (max: 4)}]")],
            (None, "a node is being added: pod triggered scale-up: [{a100-pool 0->1 (max: 4)}]"),
        ),
        ([("Nominated", "Pod should schedule on: nodeclaim/gpu-x7k2p")], (None, "a node is being added: Pod ")),
        (
            [
                ("TriggeredScaleUp", "pod triggered scale-up: [{a100-pool 0->1 (max: 1)}]"),
                ("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node group size reached"),
            ],
            (Trouble.UNSCHEDULABLE, SCHEDULER),
        ),
        ([], (Trouble.UNSCHEDULABLE, SCHEDULER)),
    ],
)
def test_an_unschedulable_pod_an_autoscaler_adds_a_node_for_is_not_stuck(
    kube_api: KubeApi, autoscaler: list[tuple[str, str]], expected: tuple[Trouble | None, str]
) -> None:
    compute, handle = _launched(kube_api, "ty-scale-up")
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": SCHEDULER}
    kube_api.patch(f"{PODS}/{handle.backend_id}", {"status": {"conditions": [condition]}})
    pod = pod_of(kube_api, "ty-scale-up")
    for n, (reason, message) in enumerate(autoscaler):
        at = time.time() - 60 + n * 10
        _event(kube_api, pod, reason, message, first=at, last=at)

    view = compute.view([handle])[handle.key]

    assert view.state is CloudState.PENDING
    assert (view.reason, view.message[: len(expected[1])]) == expected
    terminate_fully(compute, handle)
