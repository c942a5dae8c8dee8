"""A workspace's own Kubernetes cluster as its backend, end to end.

kmock's emulator over real HTTP plays the API server
(tests/support/kubeapi.py) and tests/support/kubelet.py plays its nodes: it
schedules the pods Trainyard creates as the scheduler does (node selectors,
taints, free CPU, memory and GPUs), runs each pod's command, unmodified (the
boot script: it installs the runner from the server's wheels and runs it in
the foreground), in a scratch folder, and preempts, evicts and fails image
pulls as a cluster does. The stack is the whole one: web, worker and beat.

Each test connects its own workspace to its own cluster (the CLI; the API
where the CLI has no flag: node pools), runs jobs through the stack and ends
by asserting that no pod of the test is left, neither in the API server nor
as a process the kubelet runs. Its user's fixture stops what a failed test
left (runs, machines, the backend)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import User, commit_all
from tests.support.kubeapi import NAMESPACE, KubeApi
from tests.support.kubelet import Kubelet
from tests.support.stack import Stack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

BACKEND = "kubernetes"
CPU_TYPE = "k8s-cpu"
GPU_TYPE = "g5.xlarge"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
IDLE_SECONDS = 5
FINISHED = ("succeeded", "failed", "stopped")
ENDED = ("terminated", "lost")
CENT = Decimal("0.01")


# ----------------------------------------------------------------- fixtures


@pytest.fixture
def cluster(kubelet: Kubelet) -> Kubelet:
    """The cluster's nodes: the kubelet helper on the test's API server (a
    GPU pod finds a stand-in ``nvidia-smi`` listing its GPUs); at the end
    whatever it still runs is stopped, and the test fails if it met an
    error of the API server."""
    return kubelet


def _person(user: User, kube_api: KubeApi) -> Iterator[User]:
    """``user`` for the test; its Kubernetes backends removed after it (the
    names are literal at each fixture, where the suite's uniqueness check reads them)."""
    yield user
    _disconnect(user, kube_api)


@pytest.fixture
def kasimir(stack: Stack, kube_api: KubeApi, cluster: Kubelet) -> Iterator[User]:
    yield from _person(User("kasimir", stack.issue_token("kasimir"), stack), kube_api)


@pytest.fixture
def kelda(stack: Stack, kube_api: KubeApi, cluster: Kubelet) -> Iterator[User]:
    yield from _person(User("kelda", stack.issue_token("kelda"), stack), kube_api)


@pytest.fixture
def kuno(stack: Stack, kube_api: KubeApi, cluster: Kubelet) -> Iterator[User]:
    yield from _person(User("kuno", stack.issue_token("kuno"), stack), kube_api)


@pytest.fixture
def kiri(stack: Stack, kube_api: KubeApi, cluster: Kubelet) -> Iterator[User]:
    yield from _person(User("kiri", stack.issue_token("kiri"), stack), kube_api)


@pytest.fixture
def kolya(stack: Stack, kube_api: KubeApi, cluster: Kubelet) -> Iterator[User]:
    yield from _person(User("kolya", stack.issue_token("kolya"), stack), kube_api)


@pytest.fixture
def ketil(stack: Stack, kube_api: KubeApi, cluster: Kubelet) -> Iterator[User]:
    yield from _person(User("ketil", stack.issue_token("ketil"), stack), kube_api)


@pytest.fixture
def kimo(stack: Stack, kube_api: KubeApi, cluster: Kubelet) -> Iterator[User]:
    yield from _person(User("kimo", stack.issue_token("kimo"), stack), kube_api)


@pytest.fixture
def kaja(stack: Stack, kube_api: KubeApi, cluster: Kubelet) -> Iterator[User]:
    yield from _person(User("kaja", stack.issue_token("kaja"), stack), kube_api)


# ------------------------------------------------------------------ helpers


def connect(user: User, repo: Path, kube_api: KubeApi, *flags: str) -> None:
    """``trainyard backend add kubernetes`` with the cluster's kubeconfig (a token user)."""
    result = _add(user, repo, kube_api, *flags)
    assert result.returncode == 0, result.stderr + result.stdout


def _add(user: User, repo: Path, kube_api: KubeApi, *flags: str) -> Any:
    kubeconfig = repo.parent / "kubeconfig.yaml"
    kubeconfig.write_text(kube_api.kubeconfig())
    return user.cli(
        repo, "backend", "add", "kubernetes", "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE, *flags
    )


def place(repo: Path, workflow: str) -> None:
    """Append ``workflow`` (YAML, indented as a list item) to tiny-train's workflows and commit."""
    workflows = repo / ".trainyard" / "workflows.yaml"
    workflows.write_text(workflows.read_text().rstrip("\n") + "\n" + workflow)
    commit_all(repo, "a job on the cluster")


def submit(user: User, repo: Path, *args: str) -> str:
    submitted = user.cli(repo, "run", *args, "-d")
    assert submitted.returncode == 0, submitted.stderr + submitted.stdout
    return submitted.stdout.strip().splitlines()[-1]


def finished(user: User, name: str, timeout: float = 240) -> dict[str, Any]:
    return user.wait(name, lambda r: r["status"] in FINISHED, timeout=timeout)


def machines(user: User) -> list[dict[str, Any]]:
    answer = user.api("GET", f"/api/v1/workspaces/{user.workspace}/instances/?all=1")
    assert answer.status_code == 200, answer.text
    return [i for i in answer.json() if i["backend"] == BACKEND]


def machine(user: User, name: str) -> dict[str, Any]:
    [found] = [m for m in machines(user) if m["name"] == name]
    return found


def pod_of(kube_api: KubeApi, row: dict[str, Any]) -> dict[str, Any] | None:
    """The pod of an instance row: its backend id names it (or is its uid), its labels carry the row's id."""
    for pod in kube_api.pods():
        meta = pod["metadata"]
        if row["backend_id"] in (meta["name"], meta.get("uid")) or meta.get("labels", {}).get(
            "trainyard.dev/instance"
        ) == str(row["id"]):
            return pod
    return None


def job_of(user: User, run: str, workflow: str | None = None) -> dict[str, Any]:
    jobs = user.run(run)["jobs"]
    found: dict[str, Any] = next(j for j in jobs if workflow is None or j["workflow"] == workflow)
    return found


def log_lines(user: User, repo: Path, run: str) -> list[str]:
    shown = user.cli(repo, "logs", run)
    assert shown.returncode == 0, shown.stderr
    return [line.split("] ", 1)[1] if line.startswith("[") else line for line in shown.stdout.splitlines()]


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


def explain(user: User, kube_api: KubeApi, cluster: Kubelet) -> Any:
    """What stood in the way of a wait: the machines' rows, the pods, what the kubelet runs."""
    pods = [(p["metadata"]["name"], p.get("status", {}).get("phase")) for p in kube_api.pods()]
    rows = [
        {k: m.get(k) for k in ("name", "status", "status_reason", "backend_id", "cloud_state")} for m in machines(user)
    ]
    return {"machines": rows, "pods": pods, "running": cluster.running()}


def all_ended(user: User, kube_api: KubeApi, cluster: Kubelet) -> None:
    """Every machine of the user ended (retired after its idle time, or terminated)."""
    wait_for(
        "every machine of the cluster to end",
        lambda: all(m["status"] in ENDED for m in machines(user)),
        IDLE_SECONDS + 90,
        explain=lambda: explain(user, kube_api, cluster),
    )


def nothing_left(user: User, kube_api: KubeApi, cluster: Kubelet) -> None:
    """Every machine of the user ended, the backend removed, no pod in the
    namespace and no pod's process on the nodes."""
    all_ended(user, kube_api, cluster)
    removed = user.api("DELETE", f"/api/v1/workspaces/{user.workspace}/backends/{BACKEND}/")
    assert removed.status_code == 204, removed.text
    wait_for("no pod left in the namespace", lambda: kube_api.pods() == [], 30, explain=kube_api.pods)
    wait_for("no pod's process left on the nodes", lambda: cluster.running() == [], 30, explain=cluster.running)


def _disconnect(user: User, kube_api: KubeApi) -> None:
    """What a failed test left: its runs stopped, its machines terminated,
    the backend removed (so the stack's reconciler stops calling an API
    server that is gone)."""
    listed = user.api("GET", f"/api/v1/workspaces/{user.workspace}/backends/")
    assert listed.status_code == 200, listed.text
    if not any(b["name"] == BACKEND for b in listed.json()):
        return
    for run in user.runs():
        if run["status"] not in FINISHED:
            user.api("POST", f"/api/v1/workspaces/{user.workspace}/runs/{run['name']}/stop/")
    for row in machines(user):
        if row["status"] not in (*ENDED, "terminating"):
            user.api("POST", f"/api/v1/workspaces/{user.workspace}/instances/{row['name']}/terminate/")
    wait_for("the machines to end", lambda: all(m["status"] in ENDED for m in machines(user)), 120)
    wait_for(
        "the backend to be removed",
        lambda: user.api("DELETE", f"/api/v1/workspaces/{user.workspace}/backends/{BACKEND}/").status_code == 204,
        60,
    )


# -------------------------------------------------------------------- tests

GPU_JOB = f"""
  - name: kube-gpu
    provider: bash
    backends: [kubernetes]
    idle_duration: {IDLE_SECONDS}s
    resources:
      gpu: 1
    commands:
      - 'echo "gpus here: $(nvidia-smi --query-gpu=name --format=csv,noheader,nounits)"'
      - 'mkdir -p out && echo "weights of $TRAINYARD_RUN_NAME" > out/weights.txt'
      - 'echo "saved out/weights.txt"'
    artifacts:
      - ./out
"""


def test_a_gpu_job_gets_a_pod_with_the_gpu_limit_and_toleration_and_its_logs_and_artifacts_arrive(
    stack: Stack, kube_api: KubeApi, cluster: Kubelet, kasimir: User, repo: Path, tmp_path: Path
) -> None:
    """A GPU node (an A10G, tainted nvidia.com/gpu as GPU node pools are)
    beside a CPU node: the job asking one GPU gets a pod on the GPU node that
    requests ``nvidia.com/gpu: 1`` in its limits and tolerates the taint, has
    no service account token and the installation's labels; its logs stream
    back and its artifact downloads byte for byte."""
    cluster.add_node("cpu-1", cpu="8", memory="32Gi", instance_type=CPU_TYPE)
    cluster.add_node(
        "gpu-1",
        cpu="4",
        memory="16Gi",
        gpus=1,
        gpu_product="NVIDIA-A10G",
        gpu_memory_mib=23028,
        instance_type=GPU_TYPE,
        taints=(GPU_TAINT,),
    )
    connect(kasimir, repo, kube_api, "--price", f"{GPU_TYPE}=1.006", "--price", f"{CPU_TYPE}=0.17")
    offers = kasimir.cli(repo, "offers", "--gpu", "A10G")
    assert offers.returncode == 0 and GPU_TYPE in offers.stdout, offers.stderr + offers.stdout
    place(repo, GPU_JOB)

    name = submit(kasimir, repo, "kube-gpu")
    done = finished(kasimir, name)

    assert done["status"] == "succeeded", (done, explain(kasimir, kube_api, cluster))
    [attempt] = done["jobs"][0]["attempts"]
    row = machine(kasimir, attempt["instance"])
    assert row["instance_type"] == GPU_TYPE, row
    pod = pod_of(kube_api, row)
    assert pod is not None, explain(kasimir, kube_api, cluster)
    spec = pod["spec"]
    [container] = spec["containers"]
    assert str(container["resources"]["limits"][GPU_RESOURCE]) == "1", container["resources"]
    assert {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["nodeName"] == "gpu-1"
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert spec["nodeSelector"].get("node.kubernetes.io/instance-type") == GPU_TYPE
    labels = pod["metadata"]["labels"]
    assert {"trainyard.dev/installation", "trainyard.dev/workspace", "trainyard.dev/instance"} <= set(labels)
    assert "ports" not in container, "the runner dials out: nothing listens in the pod"

    logs = log_lines(kasimir, repo, name)
    assert "gpus here: NVIDIA A10G" in logs and "saved out/weights.txt" in logs, logs
    out = tmp_path / "downloaded"
    downloaded = kasimir.cli(repo, "artifacts", "download", name, "-o", str(out))
    assert downloaded.returncode == 0, downloaded.stderr
    [weights] = [p for p in out.rglob("weights.txt")]
    assert weights.read_text() == f"weights of {name}\n"

    nothing_left(kasimir, kube_api, cluster)


POOL_JOB = f"""
  - name: kube-pool
    provider: bash
    backends: [kubernetes]
    idle_duration: {IDLE_SECONDS}s
    resources:
      gpu: 1
    commands:
      - 'echo "ran on $(hostname) once a node was there"'
"""
POOL_LABEL = {"cloud.example.com/pool": "a10g"}


def test_an_unschedulable_job_waits_with_the_schedulers_reason_and_runs_when_a_node_appears(
    stack: Stack, kube_api: KubeApi, cluster: Kubelet, kelda: User, repo: Path
) -> None:
    """A node pool of A10G machines that an autoscaler grows from zero (an
    offer, no node yet; connected through the API) and one CPU node: the GPU
    job's pod, which selects the pool's nodes, stays Pending, the job says
    why in the scheduler's words (the run's job, ``trainyard show``), and it
    runs as soon as a node of the pool joins."""
    cluster.add_node("cpu-1", cpu="8", memory="32Gi", instance_type=CPU_TYPE)
    pool = {
        "name": "a10g",
        "instance_type": GPU_TYPE,
        "cpus": 4,
        "memory_gib": 16,
        "gpus": 1,
        "gpu_name": "A10G",
        "gpu_memory_gib": 24,
        "spot": False,
        "price": 1.006,
        "node_selector": POOL_LABEL,
        "tolerations": [],
    }
    added = kelda.api(
        "POST",
        f"/api/v1/workspaces/{kelda.workspace}/backends/",
        json={
            "kind": "kubernetes",
            "name": BACKEND,
            "kubeconfig": kube_api.kubeconfig(),
            "namespace": NAMESPACE,
            "node_pools": [pool],
        },
    )
    assert added.status_code == 201, added.text
    assert "kubeconfig" not in added.json() and kube_api.token not in added.text
    place(repo, POOL_JOB)

    name = submit(kelda, repo, "kube-pool")
    waiting = wait_for(
        "the job to say why its pod is not scheduled",
        lambda: "waiting for a node" in ((j := job_of(kelda, name))["status_reason"] or "") and j,
        120,
        explain=lambda: (job_of(kelda, name), explain(kelda, kube_api, cluster)),
    )
    words = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    assert f"waiting for a node: {words}" in waiting["status_reason"], waiting
    shown = kelda.cli(repo, "show", name)
    assert f"waiting for a node: {words}" in shown.stdout, shown.stdout
    [pending] = kube_api.pods()
    assert pending["status"]["phase"] == "Pending" and not pending["spec"].get("nodeName")
    time.sleep(3)  # still waiting: nothing gave up on it
    assert job_of(kelda, name)["status"] not in FINISHED

    cluster.add_node(
        "a10g-pool-1",
        cpu="4",
        memory="16Gi",
        gpus=1,
        gpu_product="NVIDIA-A10G",
        gpu_memory_mib=23028,
        instance_type=GPU_TYPE,
        taints=(GPU_TAINT,),
        labels=POOL_LABEL,
    )
    done = finished(kelda, name)

    assert done["status"] == "succeeded", (done, explain(kelda, kube_api, cluster))
    [attempt] = done["jobs"][0]["attempts"]
    assert attempt["reason"] == "done"
    assert any(line.startswith("ran on ") for line in log_lines(kelda, repo, name))
    nothing_left(kelda, kube_api, cluster)


@pytest.mark.timeout(600)  # two pods boot one after the other
def test_a_preempted_pods_job_resumes_from_its_checkpoint_on_a_new_pod(
    stack: Stack, kube_api: KubeApi, cluster: Kubelet, kuno: User, repo: Path, tmp_path: Path
) -> None:
    """tiny-train's finetune-model (60 steps of 0.3 s) on the cluster; at
    step 10 the scheduler preempts its pod (a DisruptionTarget condition, the
    pod deleted with its grace period, SIGTERM): the runner takes the SIGTERM
    as its notice, syncs the checkpoint and reports ``interrupted``; attempt 2
    runs on a new pod and resumes from that checkpoint. One log over both
    attempts, all 60 steps in final.json."""
    cluster.add_node("cpu-1", cpu="8", memory="32Gi", instance_type=CPU_TYPE)
    cluster.add_node("cpu-2", cpu="8", memory="32Gi", instance_type=CPU_TYPE)
    connect(kuno, repo, kube_api)
    workflows = repo / ".trainyard" / "workflows.yaml"
    text = workflows.read_text()
    for head in ("  - name: download-base-model\n", "  - name: finetune-model\n"):
        text = text.replace(
            head + "    provider: bash\n",
            head + f"    provider: bash\n    backends: [kubernetes]\n    idle_duration: {IDLE_SECONDS}s\n",
        )
    workflows.write_text(text)
    commit_all(repo, "tiny-train on the cluster")

    name = submit(kuno, repo, "finetune-model", "-e", "STEPS=60", "-e", "STEP_SECONDS=0.3")
    wait_for(
        "step 10 of finetune-model",
        lambda: any(line.startswith("step 10/60 ") for line in log_lines(kuno, repo, name)),
        240,
        explain=lambda: explain(kuno, kube_api, cluster),
    )
    first = machine(kuno, job_of(kuno, name, "finetune-model")["instance"])
    pod = pod_of(kube_api, first)
    assert pod is not None, explain(kuno, kube_api, cluster)
    cluster.preempt(pod["metadata"]["name"])

    done = finished(kuno, name, timeout=300)

    assert done["status"] == "succeeded", (done, explain(kuno, kube_api, cluster))
    job = next(j for j in done["jobs"] if j["workflow"] == "finetune-model")
    attempts = job["attempts"]
    assert [a["reason"] for a in attempts] == ["interrupted", "done"], attempts
    assert attempts[0]["instance"] == first["name"] and attempts[1]["instance"] != first["name"]
    second = machine(kuno, attempts[1]["instance"])
    assert second["backend_id"] != first["backend_id"], "a new pod, not the preempted one again"
    waited = (at(second["created_at"]) - at(attempts[0]["finished_at"])).total_seconds()
    assert waited < 30, "the new pod is asked for at once: a cluster has no zone to stay away from"
    restored = attempts[1]["restored_checkpoint"]
    assert restored is not None, job["checkpoint"]

    logs = log_lines(kuno, repo, name)
    resuming = [line for line in logs if line.startswith("resuming from step ")]
    assert len(resuming) == 1, logs
    k = int(resuming[0].split()[-1])
    assert k >= 10, "the sync made at the SIGTERM is restored, not nothing"
    assert logs[logs.index(resuming[0]) + 1].startswith(f"step {k + 1}/60 "), logs
    assert any(line.startswith("--- attempt 2") for line in logs), logs
    out = tmp_path / "out"
    downloaded = kuno.cli(repo, "artifacts", "download", name, "-o", str(out))
    assert downloaded.returncode == 0, downloaded.stderr
    final = json.loads(next(out.rglob("final.json")).read_text())
    assert final["steps"] == 60 and final["resumed"] >= 1

    nothing_left(kuno, kube_api, cluster)


LOST_JOB = f"""
  - name: kube-lost
    provider: bash
    backends: [kubernetes]
    idle_duration: {IDLE_SECONDS}s
    commands:
      - 'echo "attempt $TRAINYARD_ATTEMPT on $(hostname)"'
      - 'if [ "$TRAINYARD_ATTEMPT" = 1 ]; then while true; do sleep 0.2; done; fi'
      - 'echo "finished on attempt $TRAINYARD_ATTEMPT"'
"""


def test_a_pod_whose_node_vanishes_is_lost_and_its_job_runs_again_on_a_new_pod(
    stack: Stack, kube_api: KubeApi, cluster: Kubelet, kimo: User, repo: Path
) -> None:
    """The node under a running job's pod vanishes without a word (its
    processes killed, the Node object deleted; the pod garbage collector
    deletes the pod a few seconds later): the runner falls silent, the
    cluster says the pod is gone, the attempt ends ``instance_lost`` and the
    job runs again, to its end, on a new pod on the node that is left."""
    cluster.add_node("cpu-1", cpu="8", memory="32Gi", instance_type=CPU_TYPE)
    cluster.add_node("cpu-2", cpu="8", memory="32Gi", instance_type=CPU_TYPE)
    connect(kimo, repo, kube_api)
    place(repo, LOST_JOB)
    name = submit(kimo, repo, "kube-lost")
    running = wait_for(
        "attempt 1's commands to run",
        lambda: (j := job_of(kimo, name))["status_reason"] == "the commands are running" and j,
        240,
        explain=lambda: explain(kimo, kube_api, cluster),
    )
    first = machine(kimo, running["instance"])
    pod = pod_of(kube_api, first)
    assert pod is not None, explain(kimo, kube_api, cluster)
    node = pod["spec"]["nodeName"]

    cluster.remove_node(node)

    done = finished(kimo, name)
    assert done["status"] == "succeeded", (done, explain(kimo, kube_api, cluster))
    attempts = done["jobs"][0]["attempts"]
    assert [a["reason"] for a in attempts] == ["instance_lost", "done"], attempts
    assert attempts[0]["instance"] == first["name"] and attempts[1]["instance"] != first["name"]
    assert machine(kimo, first["name"])["status"] == "lost"
    second = pod_of(kube_api, machine(kimo, attempts[1]["instance"]))
    assert second is None or second["spec"]["nodeName"] != node
    logs = log_lines(kimo, repo, name)
    assert "finished on attempt 2" in logs, logs
    nothing_left(kimo, kube_api, cluster)


MISSING_IMAGE = "registry.example.com/team/trainer:missing"
HELLO = f"""
  - name: kube-hello
    provider: bash
    backends: [kubernetes]
    idle_duration: {IDLE_SECONDS}s
    commands:
      - 'echo "hello from the cluster"'
"""


def test_an_image_that_cannot_be_pulled_ends_the_attempt_with_that_reason(
    stack: Stack, kube_api: KubeApi, cluster: Kubelet, kiri: User, repo: Path
) -> None:
    """The backend's image does not exist: the pod waits in ErrImagePull /
    ImagePullBackOff; the attempt ends ``image_pull`` naming the image, the
    job fails without a retry (another pod would pull the same image), and
    the pod is deleted."""
    cluster.add_node("cpu-1", cpu="8", memory="32Gi", instance_type=CPU_TYPE)
    cluster.missing_image(MISSING_IMAGE)
    connect(kiri, repo, kube_api, "--image", MISSING_IMAGE)
    place(repo, HELLO)

    name = submit(kiri, repo, "kube-hello")
    done = finished(kiri, name)

    assert done["status"] == "failed", done
    [attempt] = done["jobs"][0]["attempts"]
    assert attempt["reason"] == "image_pull", attempt
    assert MISSING_IMAGE in attempt["message"], attempt
    shown = kiri.cli(repo, "show", name)
    assert MISSING_IMAGE in shown.stdout, shown.stdout
    assert attempt["instance"] is None, "its commands never had a machine"
    all_ended(kiri, kube_api, cluster)
    [row] = machines(kiri)
    assert row["status"] == "terminated", row
    nothing_left(kiri, kube_api, cluster)


def test_the_leak_sweep_deletes_a_pod_no_instance_owns(
    stack: Stack, kube_api: KubeApi, cluster: Kubelet, kolya: User, repo: Path
) -> None:
    """A pod with the installation's labels and a key no row has (a crash
    between the launch and its commit) is deleted by the leak sweep, and its
    process stopped; the idle machine's own pod beside it is left alone."""
    cluster.add_node("cpu-1", cpu="8", memory="32Gi", instance_type=CPU_TYPE)
    connect(kolya, repo, kube_api)
    place(repo, HELLO.replace(f"idle_duration: {IDLE_SECONDS}s", "idle_duration: 10m"))
    name = submit(kolya, repo, "kube-hello")
    assert finished(kolya, name)["status"] == "succeeded"
    [idle] = machines(kolya)
    ours = pod_of(kube_api, idle)
    assert ours is not None and idle["status"] == "idle", explain(kolya, kube_api, cluster)

    leaked_key = "leaked-" + time.strftime("%H%M%S")
    no_row = "00000000-0000-0000-0000-000000000000"
    meta = ours["metadata"]
    tags = {**json.loads(meta["annotations"]["trainyard.dev/tags"]), "trainyard:key": leaked_key}
    tags["trainyard:instance"] = no_row
    annotations = {**meta["annotations"], "trainyard.dev/tags": json.dumps(tags, sort_keys=True)}
    labels = {**meta["labels"], "trainyard.dev/key": leaked_key, "trainyard.dev/instance": no_row}
    leaked = f"ty-{leaked_key}"
    kube_api.post(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": leaked, "namespace": NAMESPACE, "labels": labels, "annotations": annotations},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 5,
                "containers": [
                    {"name": "runner", "image": "python:3.12-slim", "command": ["/bin/sh", "-c", "sleep 600"]}
                ],
            },
        },
    )
    wait_for("the leaked pod to run", lambda: leaked in cluster.running(), 30, explain=cluster.running)

    sweep = {"TRAINYARD_LEAK_SWEEP_SECONDS": "1", "TRAINYARD_LEAK_MIN_AGE_SECONDS": "0"}
    with stack.env_changed(sweep, restart=["worker"]):
        wait_for(
            "the leak sweep to delete the pod",
            lambda: leaked not in [p["metadata"]["name"] for p in kube_api.pods()],
            60,
            explain=lambda: explain(kolya, kube_api, cluster),
        )
    wait_for("the leaked pod's process to stop", lambda: leaked not in cluster.running(), 30, explain=cluster.running)
    assert pod_of(kube_api, idle) is not None, "the idle machine's pod has a live row: not a leak"
    assert machine(kolya, idle["name"])["status"] == "idle"

    terminated = kolya.api("POST", f"/api/v1/workspaces/{kolya.workspace}/instances/{idle['name']}/terminate/")
    assert terminated.status_code in (200, 202), terminated.text
    nothing_left(kolya, kube_api, cluster)


def test_the_connection_check_names_a_missing_permission(
    stack: Stack, kube_api: KubeApi, cluster: Kubelet, ketil: User, repo: Path
) -> None:
    """The kubeconfig's user may not list nodes: ``trainyard backend add
    kubernetes`` fails with the server's words (what is missing, the RBAC
    file that grants it) and saves nothing; granted, the same command
    connects, and the kubeconfig never comes back from the API."""
    cluster.add_node("cpu-1", cpu="8", memory="32Gi", instance_type=CPU_TYPE)
    kube_api.deny("list", "nodes")

    refused = _add(ketil, repo, kube_api)

    assert refused.returncode == 1, refused.stderr + refused.stdout
    assert "list nodes" in refused.stderr and "deploy/kubernetes/backend-rbac.yaml" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    listed = ketil.cli(repo, "backend", "ls", "--json")
    assert listed.returncode == 0 and [b for b in json.loads(listed.stdout) if b["name"] == BACKEND] == []

    kube_api.denied.clear()
    connect(ketil, repo, kube_api)
    listed = ketil.cli(repo, "backend", "ls", "--json")
    [backend] = [b for b in json.loads(listed.stdout) if b["name"] == BACKEND]
    assert backend["kind"] == "kubernetes" and backend["status"] == "active", backend
    assert kube_api.token not in listed.stdout and "kubeconfig" not in backend
    nothing_left(ketil, kube_api, cluster)


COST_JOB = f"""
  - name: kube-cost
    provider: bash
    backends: [kubernetes]
    idle_duration: {IDLE_SECONDS}s
    resources:
      cpu: 1
      memory: 256MB
    commands:
      - 'sleep 3'
      - 'echo "three seconds on the cluster"'
"""


def test_an_attempts_cost_is_the_configured_node_price_times_its_billed_seconds(
    stack: Stack, kube_api: KubeApi, cluster: Kubelet, kaja: User, repo: Path
) -> None:
    """The admin priced the cluster's node type at $0.36/h: the offer, the
    machine, the attempt and the run all use it; the attempt costs that price
    x the seconds it held its pod, the machine that price x its billed seconds
    (at least 60), the run the sum of its attempts."""
    cluster.add_node("cpu-1", cpu="8", memory="32Gi", instance_type=CPU_TYPE)
    connect(kaja, repo, kube_api, "--price", f"{CPU_TYPE}=0.36")
    place(repo, COST_JOB)
    planned = kaja.cli(repo, "run", "kube-cost", "--dry-run")
    assert planned.returncode == 0 and "$0.3600/h" in planned.stdout, planned.stderr + planned.stdout

    name = submit(kaja, repo, "kube-cost")
    done = finished(kaja, name)
    assert done["status"] == "succeeded", (done, explain(kaja, kube_api, cluster))
    all_ended(kaja, kube_api, cluster)

    run = kaja.run(name)
    [job] = run["jobs"]
    [attempt] = job["attempts"]
    row = machine(kaja, attempt["instance"])
    price = Decimal("0.36")
    assert Decimal(str(row["price_per_hour"])) == price and Decimal(attempt["price_per_hour"]) == price, (row, attempt)
    assert (row["instance_type"], row["spot"]) == (CPU_TYPE, False), row
    assert attempt["billed_seconds"] >= 3
    assert cents(Decimal(attempt["cost"])) == cents(price * attempt["billed_seconds"] / 3600)
    assert Decimal(job["cost"]) == Decimal(run["cost"]) == Decimal(attempt["cost"])
    assert row["billed_seconds"] >= 60
    assert cents(Decimal(row["cost"])) == cents(price * row["billed_seconds"] / 3600)
    nothing_left(kaja, kube_api, cluster)
