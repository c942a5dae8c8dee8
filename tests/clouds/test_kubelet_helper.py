"""The kubelet helper (tests/support/kubelet.py) against the API emulator,
as a client of the cluster sees it: pods scheduled by their requests,
selectors and tolerations or refused with the scheduler's message; their
commands run as processes; deletion, preemption, eviction and node
termination stop them with SIGTERM and their grace as Kubernetes does."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.support.kubeapi import NAMESPACE, KubeApi
from tests.support.kubelet import FINALIZER, Kubelet, quantity
from tests.support.waiting import wait_for

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def make_pod(
    api: KubeApi,
    name: str,
    script: str,
    *,
    cpu: str = "1",
    memory: str = "1Gi",
    gpus: int = 0,
    tolerations: list[dict[str, str]] | None = None,
    node_selector: dict[str, str] | None = None,
    grace: int = 30,
    env: dict[str, str] | None = None,
    image: str = "python:3.12-slim",
) -> dict[str, Any]:
    limits: dict[str, str] = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "test"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": grace,
            "containers": [
                {
                    "name": "runner",
                    "image": image,
                    "command": ["/bin/sh", "-c", script],
                    "env": [{"name": k, "value": v} for k, v in (env or {}).items()]
                    + [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits},
                }
            ],
            **({"tolerations": tolerations} if tolerations else {}),
            **({"nodeSelector": node_selector} if node_selector else {}),
        },
    }
    created = api.post(PODS, body)
    assert created is not None
    return dict(created)


def pod(api: KubeApi, name: str) -> dict[str, Any] | None:
    found = api.get(f"{PODS}/{name}")
    return dict(found) if found is not None else None


def phase(api: KubeApi, name: str) -> str:
    found = pod(api, name)
    return "" if found is None else str(found["status"].get("phase", ""))


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in obj["status"].get("conditions") or [] if c["type"] == kind), {})


def events(api: KubeApi, name: str) -> list[dict[str, Any]]:
    found = api.get(f"/api/v1/namespaces/{NAMESPACE}/events") or {}
    return [e for e in found.get("items", []) if e["involvedObject"]["name"] == name]


def reasons(api: KubeApi, name: str) -> list[str]:
    return [e["reason"] for e in events(api, name)]


def in_phase(api: KubeApi, name: str, wanted: str, timeout: float = 20.0) -> dict[str, Any]:
    return dict(
        wait_for(
            f"{name} {wanted}",
            lambda: (found := pod(api, name)) is not None and found["status"].get("phase") == wanted and found,
            timeout,
            lambda: pod(api, name),
            every=0.05,
        )
    )


def gone(api: KubeApi, kubelet: Kubelet, name: str, timeout: float = 20.0) -> float:
    """Waits until the pod is gone from the API and nothing of it runs; when that was seen."""
    kubelet.wait_gone(name, timeout)
    return time.monotonic()


def test_a_pod_goes_to_the_node_it_fits_and_its_command_runs_with_the_pods_env(
    kube_api: KubeApi, kubelet: Kubelet
) -> None:
    kubelet.add_node("cpu-1", cpu="16", memory="64Gi", instance_type="m6i.4xlarge")
    kubelet.add_node("gpu-1", cpu="8", memory="61Gi", gpus=1, gpu_product="NVIDIA-A100-SXM4-40GB",
                     gpu_memory_mib=40960, instance_type="p4d")  # fmt: skip
    script = (
        'echo "hello from $POD_NAME"; echo "root=$TRAINYARD_BOOT_ROOT"; echo "greeting=$GREETING";'
        " nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits; pwd"
    )
    make_pod(kube_api, "ty-gpu", script, gpus=1, tolerations=[GPU_TOLERATION], env={"GREETING": "hi"})
    make_pod(kube_api, "ty-cpu", "command -v nvidia-smi || echo no GPU here")

    done = in_phase(kube_api, "ty-gpu", "Succeeded")
    assert done["spec"]["nodeName"] == "gpu-1"
    assert condition(done, "PodScheduled")["status"] == "True"
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    assert FINALIZER not in (done["metadata"].get("finalizers") or []), "an ended pod is deleted at once"
    log = kubelet.pod_log("ty-gpu")
    folder = kubelet.folder("ty-gpu")
    assert "hello from ty-gpu" in log
    assert f"root={folder / 'opt'}" in log
    assert "greeting=hi" in log
    assert "NVIDIA A100 SXM4 40GB, 40960" in log, "the pod sees the node's GPU"
    assert in_phase(kube_api, "ty-cpu", "Succeeded")["spec"]["nodeName"] == "cpu-1"
    assert "no GPU here" in kubelet.pod_log("ty-cpu")
    assert str(folder) in log.splitlines()[-1]
    assert reasons(kube_api, "ty-gpu")[:5] == ["Scheduled", "Pulling", "Pulled", "Created", "Started"]
    scheduled = events(kube_api, "ty-gpu")[0]
    assert scheduled["message"] == f"Successfully assigned {NAMESPACE}/ty-gpu to gpu-1"
    assert scheduled["involvedObject"]["uid"] == done["metadata"]["uid"]
    # The node looks like a GPU node of a cloud (what the backend's offers read).
    node = kube_api.get("/api/v1/nodes/gpu-1")
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in node["spec"]["taints"]
    # Deleting an ended pod is immediate.
    kube_api.delete(f"{PODS}/ty-gpu")
    assert pod(kube_api, "ty-gpu") is None


def test_a_failing_command_fails_the_pod_with_its_exit_code(kube_api: KubeApi, kubelet: Kubelet) -> None:
    kubelet.add_node("node-1")
    make_pod(kube_api, "ty-fails", "echo oops >&2; exit 3")
    done = in_phase(kube_api, "ty-fails", "Failed")
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    assert "oops" in kubelet.pod_log("ty-fails")
    assert kubelet.running() == []


def test_an_unschedulable_pod_waits_with_the_schedulers_message_and_runs_when_a_node_comes(
    kube_api: KubeApi, kubelet: Kubelet
) -> None:
    kubelet.add_node("cpu-1")
    kubelet.add_node("gpu-1", gpus=1, gpu_product="NVIDIA-L4")
    make_pod(kube_api, "ty-waits", "echo ran", gpus=1)  # no toleration of the GPU node's taint

    message = (
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu,"
        " 1 node(s) had untolerated taint {nvidia.com/gpu: present}."
    )
    waiting = wait_for(
        "the scheduler's refusal",
        lambda: (
            (found := pod(kube_api, "ty-waits")) and condition(found, "PodScheduled").get("status") == "False" and found
        ),
        10,
        every=0.05,
    )
    refused = condition(waiting, "PodScheduled")
    assert (refused["reason"], refused["message"]) == ("Unschedulable", message)
    assert waiting["status"]["phase"] == "Pending"
    # Retried every second: one FailedScheduling event whose count grows.
    wait_for(
        "a retry",
        lambda: [e["count"] for e in events(kube_api, "ty-waits") if e["reason"] == "FailedScheduling"] >= [3],
        10,
        every=0.1,
    )
    failed = [e for e in events(kube_api, "ty-waits") if e["reason"] == "FailedScheduling"]
    assert len(failed) == 1
    event = failed[0]
    assert (event["type"], event["message"], event["source"]["component"]) == ("Warning", message, "default-scheduler")
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "ty-waits",
        "namespace": NAMESPACE,
        "uid": waiting["metadata"]["uid"],
    }
    assert event["firstTimestamp"] <= event["lastTimestamp"]
    assert kubelet.running() == []

    kubelet.add_node("gpu-2", gpus=1, gpu_product="NVIDIA-L4", gpu_taint=False)
    done = in_phase(kube_api, "ty-waits", "Succeeded", 10)
    assert done["spec"]["nodeName"] == "gpu-2"
    assert condition(done, "PodScheduled")["status"] == "True"


def test_pods_share_a_node_by_their_requests_and_a_cordoned_or_unmatched_node_takes_none(
    kube_api: KubeApi, kubelet: Kubelet, tmp_path: Path
) -> None:
    kubelet.add_node("small", cpu="4", memory="8Gi")
    hold = tmp_path / "hold"
    make_pod(kube_api, "ty-first", f'while [ ! -e "{hold}" ]; do sleep 0.05; done', cpu="3")
    kubelet.wait_running(1)
    make_pod(kube_api, "ty-second", "true", cpu="3")
    make_pod(kube_api, "ty-big", "true", memory="9Gi")
    make_pod(kube_api, "ty-elsewhere", "true", node_selector={"node.kubernetes.io/instance-type": "p5.48xlarge"})

    def refusal(name: str) -> str:
        found = pod(kube_api, name)
        return str(condition(found, "PodScheduled").get("message", "")) if found else ""

    wait_for("three refusals", lambda: all(refusal(n) for n in ("ty-second", "ty-big", "ty-elsewhere")), 10, every=0.05)
    assert refusal("ty-second") == "0/1 nodes are available: 1 Insufficient cpu."
    assert refusal("ty-big") == "0/1 nodes are available: 1 Insufficient memory."
    assert refusal("ty-elsewhere") == "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."

    hold.touch()  # the first pod ends: its cpu is free again
    in_phase(kube_api, "ty-first", "Succeeded")
    assert in_phase(kube_api, "ty-second", "Succeeded", 10)["spec"]["nodeName"] == "small"

    kubelet.cordon("small")
    make_pod(kube_api, "ty-cordoned", "true")
    wait_for("a refusal", lambda: refusal("ty-cordoned"), 10, every=0.05)
    assert refusal("ty-cordoned") == "0/1 nodes are available: 1 node(s) were unschedulable."
    assert kube_api.get("/api/v1/nodes/small")["spec"]["unschedulable"] is True


def test_with_no_node_at_all_the_scheduler_says_so(kube_api: KubeApi, kubelet: Kubelet) -> None:
    make_pod(kube_api, "ty-alone", "true")
    found = wait_for(
        "a refusal", lambda: condition(pod(kube_api, "ty-alone") or {"status": {}}, "PodScheduled"), 10, every=0.05
    )
    assert found["message"] == "no nodes available to schedule pods"


TRAPS_TERM = (
    # The container's main process notes its SIGTERM and goes on; its child
    # (a process of the pod that is not PID 1) must get no SIGTERM.
    "trap 'date +%s.%N > \"$MARK/term\"' TERM; "
    "sh -c 'trap \"touch $MARK/child-term\" TERM; while :; do sleep 0.05; done' & "
    'while :; do touch "$MARK/alive"; sleep 0.05; done'
)


def test_deleting_a_running_pod_sigterms_its_main_process_and_kills_everything_after_the_grace(
    kube_api: KubeApi, kubelet: Kubelet, tmp_path: Path
) -> None:
    mark = tmp_path / "mark"
    mark.mkdir()
    kubelet.add_node("node-1")
    make_pod(kube_api, "ty-stubborn", TRAPS_TERM, grace=2, env={"MARK": str(mark)})
    kubelet.wait_running(1)
    wait_for("the child", lambda: (mark / "alive").exists(), 10, every=0.05)

    kube_api.delete(f"{PODS}/ty-stubborn")
    deleted = time.monotonic()
    terminating = pod(kube_api, "ty-stubborn")
    assert terminating is not None, "a deleted pod that runs stays (Terminating) until its kubelet stopped it"
    assert terminating["metadata"]["deletionTimestamp"]
    wait_for("the SIGTERM", lambda: (mark / "term").exists(), 5, every=0.05)
    assert time.monotonic() - deleted < 1.5
    assert "ty-stubborn" in kubelet.running(), "it ignored the SIGTERM: it runs on within the grace"
    ended = gone(kube_api, kubelet, "ty-stubborn", 10)
    assert 1.8 <= ended - deleted <= 6.0, f"killed {ended - deleted:.1f}s after the delete, grace 2 s"
    assert not (mark / "child-term").exists(), "only the main process gets the SIGTERM"
    last = (mark / "alive").stat().st_mtime_ns
    time.sleep(0.3)
    assert (mark / "alive").stat().st_mtime_ns == last, "nothing of the pod runs on"
    assert "Killing" in reasons(kube_api, "ty-stubborn")


def test_a_pod_that_exits_on_sigterm_is_gone_at_once_and_an_unscheduled_one_on_delete(
    kube_api: KubeApi, kubelet: Kubelet
) -> None:
    kubelet.add_node("node-1", cpu="2")
    make_pod(kube_api, "ty-polite", "trap 'echo bye; exit 0' TERM; while :; do sleep 0.05; done", grace=60)
    make_pod(kube_api, "ty-pending", "true", cpu="4")
    kubelet.wait_running(1)
    kube_api.delete(f"{PODS}/ty-polite")
    deleted = time.monotonic()
    assert gone(kube_api, kubelet, "ty-polite", 10) - deleted < 3.0
    assert "bye" in kubelet.pod_log("ty-polite")
    wait_for("a refusal", lambda: condition(pod(kube_api, "ty-pending") or {"status": {}}, "PodScheduled"), 10)
    kube_api.delete(f"{PODS}/ty-pending")
    assert pod(kube_api, "ty-pending") is None


def test_preemption_marks_the_pod_then_stops_it_with_its_grace(
    kube_api: KubeApi, kubelet: Kubelet, tmp_path: Path
) -> None:
    mark = tmp_path / "mark"
    mark.mkdir()
    kubelet.add_node("spot-1", spot=True)
    make_pod(kube_api, "ty-preempted", 'trap \'touch "$MARK/term"; sleep 0.5; exit 143\' TERM; while :; do sleep 0.05; done',
             grace=20, env={"MARK": str(mark)})  # fmt: skip
    kubelet.wait_running(1)

    kubelet.preempt("ty-preempted")
    marked = pod(kube_api, "ty-preempted")
    assert marked is not None and marked["metadata"]["deletionTimestamp"]
    disruption = condition(marked, "DisruptionTarget")
    assert (disruption["status"], disruption["reason"]) == ("True", "PreemptionByScheduler")
    preempted = next(e for e in events(kube_api, "ty-preempted") if e["reason"] == "Preempted")
    assert preempted["message"].endswith("on node spot-1")
    gone(kube_api, kubelet, "ty-preempted", 10)
    assert (mark / "term").exists()


def test_eviction_through_the_api_and_by_node_pressure(kube_api: KubeApi, kubelet: Kubelet) -> None:
    kubelet.add_node("node-1")
    endless = "trap 'exit 0' TERM; while :; do sleep 0.05; done"
    make_pod(kube_api, "ty-drained", endless)
    make_pod(kube_api, "ty-pressed", endless)
    kubelet.wait_running(2)

    kubelet.evict("ty-drained")
    drained = pod(kube_api, "ty-drained")
    assert drained is not None and drained["metadata"]["deletionTimestamp"]
    assert condition(drained, "DisruptionTarget")["reason"] == "EvictionByEvictionAPI"
    gone(kube_api, kubelet, "ty-drained", 10)

    kubelet.evict("ty-pressed", pressure="memory")
    pressed = in_phase(kube_api, "ty-pressed", "Failed")
    assert pressed["status"]["reason"] == "Evicted"
    assert pressed["status"]["message"].startswith("The node was low on resource: memory.")
    assert condition(pressed, "DisruptionTarget")["reason"] == "TerminationByKubelet"
    assert "deletionTimestamp" not in pressed["metadata"], "a pod evicted by its kubelet stays, Failed"
    assert "Evicted" in reasons(kube_api, "ty-pressed")
    assert kubelet.running() == []


def test_an_image_that_cannot_be_pulled_keeps_the_pod_pending_with_the_kubelets_reasons(
    kube_api: KubeApi, kubelet: Kubelet
) -> None:
    kubelet.add_node("node-1")
    kubelet.missing_image("ghcr.io/acme/nope:1")
    make_pod(kube_api, "ty-nope", "true", image="ghcr.io/acme/nope:1")

    def waiting() -> dict[str, Any]:
        found = pod(kube_api, "ty-nope") or {"status": {}}
        statuses = found["status"].get("containerStatuses") or [{}]
        return dict(statuses[0].get("state", {}).get("waiting") or {})

    first = wait_for("ErrImagePull", lambda: waiting().get("reason") == "ErrImagePull" and waiting(), 10, every=0.05)
    assert 'Failed to pull image "ghcr.io/acme/nope:1"' in first["message"]
    assert "not found" in first["message"]
    wait_for("ImagePullBackOff", lambda: waiting().get("reason") == "ImagePullBackOff", 10, every=0.05)
    assert waiting()["message"] == 'Back-off pulling image "ghcr.io/acme/nope:1"'
    assert phase(kube_api, "ty-nope") == "Pending"
    seen = [(e["type"], e["reason"], e["message"]) for e in events(kube_api, "ty-nope")]
    assert ("Warning", "Failed", "Error: ErrImagePull") in seen
    assert ("Normal", "BackOff", 'Back-off pulling image "ghcr.io/acme/nope:1"') in seen
    assert ("Warning", "Failed", "Error: ImagePullBackOff") in seen
    assert kubelet.running() == []
    kube_api.delete(f"{PODS}/ty-nope")
    gone(kube_api, kubelet, "ty-nope", 5)


def test_terminating_a_node_stops_its_pods_with_their_grace_then_the_node_goes(
    kube_api: KubeApi, quick_gc_kubelet: Kubelet
) -> None:
    kubelet = quick_gc_kubelet
    kubelet.add_node("spot-1", spot=True, cpu="4")
    kubelet.add_node("other", cpu="1")
    endless = "trap 'echo saving; sleep 0.3; exit 0' TERM; while :; do sleep 0.05; done"
    make_pod(kube_api, "ty-a", endless, cpu="2")
    make_pod(kube_api, "ty-b", endless, cpu="2")
    make_pod(kube_api, "ty-c", endless, cpu="1")
    kubelet.wait_running(3)
    assert {pod(kube_api, n)["spec"]["nodeName"] for n in ("ty-a", "ty-b")} == {"spot-1"}

    kubelet.terminate_node("spot-1")
    for name in ("ty-a", "ty-b"):
        ended = in_phase(kube_api, name, "Failed", 10)
        assert ended["status"]["reason"] == "Terminated"
        assert ended["status"]["message"] == "Pod was terminated in response to imminent node shutdown."
        assert condition(ended, "DisruptionTarget")["reason"] == "TerminationByKubelet"
        assert "saving" in kubelet.pod_log(name)
    wait_for("the node's deletion", lambda: kube_api.get("/api/v1/nodes/spot-1") is None, 10, every=0.05)
    # The pod garbage collector deletes the pods of a node that is gone.
    gone(kube_api, kubelet, "ty-a", 10)
    gone(kube_api, kubelet, "ty-b", 10)
    assert kubelet.running() == ["ty-c"], "the other node's pod runs on"


def test_a_node_that_vanishes_takes_its_processes_at_once_and_its_pods_later(
    kube_api: KubeApi, quick_gc_kubelet: Kubelet
) -> None:
    kubelet = quick_gc_kubelet
    kubelet.add_node("node-1")
    make_pod(kube_api, "ty-lost", "trap '' TERM; while :; do sleep 0.05; done", grace=60)
    kubelet.wait_running(1)
    kubelet.remove_node("node-1")
    assert kubelet.running() == []
    assert kube_api.get("/api/v1/nodes/node-1") is None
    assert phase(kube_api, "ty-lost") == "Running", "nobody is left to say otherwise until the pod GC"
    gone(kube_api, kubelet, "ty-lost", 10)


@pytest.fixture
def quick_gc_kubelet(kube_api: KubeApi, tmp_path: Path) -> Any:
    """A kubelet whose pod garbage collector acts after 1 s."""
    helper = Kubelet(kube_api, tmp_path / "gc-pods", pod_gc_seconds=1.0).start()
    try:
        yield helper
    finally:
        helper.stop()
    assert helper.errors == [], helper.errors


def test_quantities_read_as_kubernetes_writes_them() -> None:
    assert quantity("500m") == Decimal("0.5")
    assert quantity("2") == 2
    assert quantity("32Gi") == 32 * 2**30
    assert quantity("1e9") == 10**9
    assert quantity("1G") == 10**9
    assert quantity(3) == 3
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        quantity("lots")
