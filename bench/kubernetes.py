"""(kubernetes) The kubernetes backend's reconcile pass over 200 pods: what the
account's reconcile task asks the backend each pass, ``view`` of every
machine (one batched call) and ``list_managed`` (the leak sweep), through
kmock's emulator over HTTP (tests/support/kubeapi.py) in this process.

Seeded with the backend's own pod manifests (``pods.manifest``), posted
with their status: 190 Running, 10 Pending with a FailedScheduling event
each, so the pass reads the namespace's events as it does whenever a pod
waits. Measured: p50 and max of ``--samples`` passes after one warm-up, the
HTTP requests one pass makes, and the backend's own part: the same pass
with the API server's answers of the warm-up handed back from memory (what
Trainyard spends besides waiting for the API server). Target: the whole
pass ≤ 1 s. The emulator dominates the pass: kmock looks every request's
objects up by scanning all of them and ignores label selectors (the backend
filters again client-side either way). Not in it: the reconcile task's
database side.

(kubernetes-launch) A ``hello`` run on a fresh pod, from the submit to the
runner's hello, through the whole stack, with the emulator as the API server
and tests/support/kubelet.py as its node: it schedules the pod and runs its
command (the boot script, unmodified) in a scratch folder. The total runs
from before the POST to the runner's hello (``clouds_instance.connected_at``).
Two spans inside it belong to the stand-ins and are taken out: the kubelet's
start of the pod (the API server got the pod's create request → the pod's
first process started: its poll, scheduling and spawn, standing in for the
cluster's scheduling, image pull and container start) and the runner's
install (that process started → the ``trainyard-runner`` process started:
python found, wheels fetched from the server, venv, pip), as the AWS part
takes the install out. What remains, Trainyard's own part: the submit, the
scheduling pass, the launch task up to the pod's create request, and the
runner's start and hello. Every timestamp is this machine's ``time.time()``
(the emulator runs in this process; the pod's processes, the stack and the
runner here).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from bench.aws import TRAINYARD, AwsBenchError, _follow_first_line, _rel, _rows, started_at, warm_wheels
from bench.lib import Api, log
from tests.support.stack import Stack

TARGET_MS = 1000.0
PODS = 200
WAITING = 10
SCHEDULER = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def bench_kubernetes(samples: int) -> dict[str, Any]:
    """The pass over ``PODS`` pods (module docstring), on a fresh emulator."""
    from tests.support.kubeapi import KubeApi

    api = KubeApi().start()
    try:
        return {"pass": _pass(api, samples)}
    finally:
        api.stop()


def _pass(api: Any, samples: int) -> dict[str, Any]:
    from backend.clouds.backends.base import AccountConfig, CloudState, LaunchSpec, Requirements, Trouble
    from backend.clouds.backends.kubernetes import pods
    from backend.clouds.backends.kubernetes.compute import KubernetesCompute
    from tests.clouds.subjects import GIB, node_facts
    from tests.support.kubeapi import NAMESPACE

    facts = node_facts([{"name": "m6i.2xlarge", "cpus": 8, "memory_bytes": 32 * GIB}])
    account = AccountConfig(
        account_id="bench-account",
        workspace_id="bench-workspace",
        kind="kubernetes",
        installation="bench",
        config={"namespace": NAMESPACE, "allowed_networks": ["127.0.0.0/8"], "facts": facts},
        credentials={"kubeconfig": api.kubeconfig()},
    )
    compute = KubernetesCompute(account)
    [offer] = compute.offers(Requirements())
    started = time.perf_counter()
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for n in range(PODS):
        spec = LaunchSpec(f"ty-bench-{n:04d}", f"bench-{n}", "token", "https://bench.invalid")
        pod = pods.manifest(account, compute.options, offer, spec)
        pod["status"] = {"phase": "Running" if n < PODS - WAITING else "Pending"}
        created = api.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
        if n < PODS - WAITING:
            continue
        api.post(
            f"/api/v1/namespaces/{NAMESPACE}/events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{pod['metadata']['name']}.failed", "namespace": NAMESPACE},
                "involvedObject": {"kind": "Pod", "name": pod["metadata"]["name"], "uid": created["metadata"]["uid"]},
                "reason": "FailedScheduling",
                "message": SCHEDULER,
                "firstTimestamp": now,
                "lastTimestamp": now,
            },
        )
    seed_s = time.perf_counter() - started
    handles = list(compute.list_managed())
    answers: dict[tuple[str, str], Any] = {}
    requests: list[str] = []
    call = compute.client.call

    def recorded(method: str, path: str, **kwargs: Any) -> Any:
        requests.append(f"{method} {path}")
        answers[(method, path)] = answer = call(method, path, **kwargs)
        return answer

    def replayed(method: str, path: str, **kwargs: Any) -> Any:
        return answers[(method, path)]

    def one_pass() -> tuple[dict[str, Any], int]:
        views = compute.view(handles)
        managed = compute.list_managed()
        return dict(views), len(managed)

    compute.client.call = recorded  # type: ignore[method-assign]
    views, managed = one_pass()  # warm-up, and the answer checked
    running = sum(1 for v in views.values() if v.state is CloudState.RUNNING)
    waiting = sum(1 for v in views.values() if v.reason is Trouble.UNSCHEDULABLE)
    assert (running, waiting, managed) == (PODS - WAITING, WAITING, PODS), (running, waiting, managed)
    compute.client.call = call  # type: ignore[method-assign]
    whole = _timed(one_pass, samples)
    compute.client.call = replayed  # type: ignore[method-assign]
    own = _timed(one_pass, samples)
    result = {
        "pods": PODS,
        "waiting": WAITING,
        "seed_seconds": round(seed_s, 1),
        "p50_ms": whole[0],
        "max_ms": whole[1],
        "own_p50_ms": own[0],
        "requests": len(requests),
    }
    log(f"(kubernetes) {PODS} pods seeded in {seed_s:.1f} s; a pass (view + list_managed): {result}")
    return result


def _timed(call: Any, samples: int) -> tuple[float, float]:
    """(p50, max) in ms of ``samples`` calls."""
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 1), round(max(times), 1)


def kubernetes_rows(r: dict[str, Any], row: Any) -> None:
    """The table's rows for the kubernetes part."""
    one = r.get("pass")
    if one:
        row(
            f"kubernetes: view + list_managed of {one['pods']} pods ({one['waiting']} unschedulable), p50",
            f"{one['p50_ms']:.0f} ms (max {one['max_ms']:.0f}), {one['requests']} requests",
            f"≤ {TARGET_MS:.0f} ms",
            one["p50_ms"] <= TARGET_MS,
        )
        row(
            "kubernetes: of which the backend's own part (the API server's answers from memory)",
            f"{one['own_p50_ms']:.1f} ms",
            "(no target of its own)",
            None,
        )


# ------------------------------------------------------------ kubernetes-launch

NODE_TYPE = "k8s-bench"
IDLE_SECONDS = 600  # the bench ends each sample's pod itself
PLACEMENT = f"    backends: [kubernetes]\n    idle_duration: {IDLE_SECONDS}s\n"
SAMPLE_TIMEOUT = 300.0  # submit → first line on a fresh pod (the install is most of it)
ENDED_TIMEOUT = 60.0
SETTLE = 2.0
TARGET_LAUNCH_S = 2.0  # pod launch → runner hello, Trainyard's own part, each sample


def timed_kube_api() -> Any:
    """A started ``KubeApi``; its ``pod_created`` says when it got each pod's create request."""
    from tests.support.kubeapi import KubeApi

    return KubeApi().start()


def hello_workflows(text: str) -> str:
    head = "  - name: hello\n    provider: bash\n"
    if head not in text:
        raise AwsBenchError("tiny-train's workflows.yaml has no `hello` job in the expected shape")
    return text.replace(head, head + PLACEMENT)


def connect_cluster(stack: Stack, api: Api, kube: Any, cwd: Path) -> None:
    """The cluster connected with the CLI, as tests/e2e/test_kubernetes.py connects it."""
    kubeconfig = cwd.parent / "bench-kubeconfig.yaml"
    kubeconfig.write_text(kube.kubeconfig())
    from tests.support.kubeapi import NAMESPACE

    env = {**os.environ, "TRAINYARD_URL": stack.url, "TRAINYARD_TOKEN": api.token, "HOME": str(cwd.parent)}
    result = subprocess.run(
        [str(TRAINYARD), "backend", "add", "kubernetes",
         "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if result.returncode != 0:
        raise AwsBenchError(f"`trainyard backend add kubernetes` failed ({result.returncode}): {result.stderr}")


def pod_processes(folder: Path) -> dict[str, float | None]:
    """When the pod's first process (the command's ``sh``) and its runner started."""
    command: list[float] = []
    runner: list[float] = []
    for p in psutil.process_iter():
        try:
            cmdline = p.cmdline()
            cwd = p.cwd()
        except psutil.Error:
            continue
        inside = cwd == str(folder) or cwd.startswith(f"{folder}/") or any(str(folder) in part for part in cmdline)
        if not inside:
            continue
        at = started_at(p.pid)
        if at is None:
            continue
        command.append(at)
        if any(part.endswith("/venv/bin/trainyard-runner") for part in cmdline):
            runner.append(at)
    return {"command_started": min(command) if command else None, "runner_started": min(runner) if runner else None}


def launch_sample(api: Api, stack: Stack, kube: Any, kubelet_root: Path, workflows: str) -> dict[str, Any]:
    before = set(kube.pod_created)
    first = _follow_first_line(api, workflows, SAMPLE_TIMEOUT)
    rows = _rows(stack.database_url, first["job"])
    new = [name for name in kube.pod_created if name not in before]
    if len(new) != 1:
        raise AwsBenchError(f"run {first['run']}: {len(new)} pods created for one fresh machine ({new})")
    pod = new[0]
    created = kube.pod_created[pod]
    found = pod_processes(kubelet_root / pod)
    command, runner, hello = found["command_started"], found["runner_started"], rows["connected_at"]
    if command is None or runner is None or hello is None:
        raise AwsBenchError(f"pod {pod}: no command ({command}), runner process ({runner}) or hello ({hello}) seen")
    t0 = first["t0"]
    helper, install = command - created, runner - command
    total = hello - t0
    milestones = {
        "post_returned": first["post_returned"],
        "instance_row_created": rows["instance_created"],
        "pod_create_received": created,
        "launched_recorded": rows["launched_at"],
        "pod_command_started": command,
        "runner_process_started": runner,
        "runner_hello": hello,
        "job_started": rows["job_started"],
        "first_line_ts": first["first_line_ts"],
    }
    return {
        "run": first["run"],
        "status": first["status"],
        "instance": rows["instance"],
        "pod": pod,
        "submit_to_hello_s": round(total, 3),
        "kubelet_start_s": round(helper, 3),
        "install_s": round(install, 3),
        "own_part_s": round(total - helper - install, 3),
        "submit_to_pod_create_s": round(created - t0, 3),
        "runner_start_to_hello_s": round(hello - runner, 3),
        "milestones_s": {k: _rel(v, t0) for k, v in milestones.items()},
    }


def end_machine(api: Api, kube: Any, instance: str, pod: str) -> None:
    """Between samples: terminate the idle machine, wait for its row to end and its pod to go."""
    api._client.post(f"/api/v1/workspaces/{api.workspace}/instances/{instance}/terminate/").raise_for_status()
    deadline = time.monotonic() + ENDED_TIMEOUT
    while time.monotonic() < deadline:
        rows = api.get(f"/api/v1/workspaces/{api.workspace}/instances/", all=1)
        live = [i for i in rows if i["name"] == instance and i["status"] not in ("terminated", "lost")]
        if not live and pod not in [p["metadata"]["name"] for p in kube.pods()]:
            return
        time.sleep(0.3)
    raise AwsBenchError(f"{instance} was terminated but its row or pod {pod} did not end within {ENDED_TIMEOUT:.0f} s")


def bench_kubernetes_launch(api: Api, stack: Stack, tmp: Path, *, samples: int) -> dict[str, Any]:
    from tests.support.kubelet import Kubelet

    log("(kubernetes-launch) a fresh pod per run: the runner's wheelhouse, the API server and a node")
    wheels_s = warm_wheels(stack)
    kube = timed_kube_api()
    kubelet_root = tmp / "kube-nodes"
    kubelet = Kubelet(kube, kubelet_root)
    kubelet.start()
    result: dict[str, Any] = {"wheelhouse_s": round(wheels_s, 1), "samples": []}
    try:
        kubelet.add_node("bench-1", cpu="8", memory="32Gi", instance_type=NODE_TYPE)
        with stack.env_changed({"TRAINYARD_KUBERNETES_PRIVATE_NETWORKS": "127.0.0.0/8"}, restart=["web", "worker"]):
            assert api.repo is not None
            connect_cluster(stack, api, kube, api.repo)
            time.sleep(SETTLE)
            workflows = hello_workflows(api.workflows_text)
            for i in range(samples):
                log(
                    f"(kubernetes-launch) fresh pod {i + 1}/{samples}: submit → runner hello (timeout {SAMPLE_TIMEOUT:.0f} s)"
                )
                one = launch_sample(api, stack, kube, kubelet_root, workflows)
                result["samples"].append(one)
                log(
                    f"    {one['submit_to_hello_s']:.2f} s to hello: kubelet {one['kubelet_start_s']:.2f} s, "
                    f"install {one['install_s']:.2f} s, Trainyard's part {one['own_part_s']:.2f} s ({one['pod']})"
                )
                end_machine(api, kube, one["instance"], one["pod"])
            api._client.delete(f"/api/v1/workspaces/{api.workspace}/backends/kubernetes/")
    finally:
        left_pods = [p["metadata"]["name"] for p in kube.pods()]
        deadline = time.monotonic() + 30
        while kubelet.running() and time.monotonic() < deadline:
            time.sleep(0.3)
        result["cleanup"] = {"left_pods": left_pods, "left_processes": kubelet.running()}
        kubelet.stop()
        kube.stop()
    own = [s["own_part_s"] for s in result["samples"]]
    result["own_part_median_s"] = round(statistics.median(own), 3)
    result["own_part_max_s"] = max(own)
    result["all_succeeded"] = all(s["status"] == "succeeded" for s in result["samples"])
    keys = result["samples"][0]["milestones_s"].keys()
    result["milestones_median_s"] = {
        k: round(statistics.median(v), 3)
        for k in keys
        if (v := [s["milestones_s"][k] for s in result["samples"] if s["milestones_s"][k] is not None])
    }
    return result


def kubernetes_launch_rows(k8s: dict[str, Any], row: Any) -> None:
    if "error" in k8s:
        row("kubernetes: pod launch could not be measured", k8s["error"][:60], "", False)
        return
    samples = k8s["samples"]
    each = " / ".join(f"{s['own_part_s']:.2f}" for s in samples)
    row(
        f"kubernetes: pod launch → runner hello, Trainyard's own part (each of {len(samples)})",
        f"{each} s",
        f"≤ {TARGET_LAUNCH_S:.0f} s each",
        k8s["own_part_max_s"] <= TARGET_LAUNCH_S and k8s["all_succeeded"],
    )
    row(
        "  submit → runner hello, in total",
        " / ".join(f"{s['submit_to_hello_s']:.2f}" for s in samples) + " s",
        "",
        None,
    )
    row("  the kubelet's start / the runner's install", " / ".join(
        f"{s['kubelet_start_s']:.2f}+{s['install_s']:.2f}" for s in samples) + " s", "", None)  # fmt: skip
    left = k8s["cleanup"]["left_pods"] + k8s["cleanup"]["left_processes"]
    row("kubernetes: pods or processes left after clean-up", str(len(left)), "0", not left)
