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
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.lib import log

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
