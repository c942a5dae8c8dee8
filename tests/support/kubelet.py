"""Plays a Kubernetes cluster's node side against the API emulator
(tests/support/kubeapi.py), only over its HTTP: the scheduler, the nodes'
kubelets, and the controllers that disrupt pods.

- **Nodes** (``add_node``, ``cordon``, ``remove_node``): Node objects with the
  labels clouds and GPU feature discovery put on them (instance type,
  capacity type, ``nvidia.com/gpu.product`` / ``.memory`` / ``.count``),
  allocatable cpu, memory, ephemeral storage and GPUs, a Ready condition. A
  node with GPUs has the taint GPU node pools get
  (``nvidia.com/gpu=present:NoSchedule``) unless ``gpu_taint=False``.
- **The scheduler**: a Pending pod without ``spec.nodeName`` goes to a
  node it fits (not cordoned, every NoSchedule/NoExecute taint tolerated,
  ``nodeSelector`` and required node affinity matched, the requests of the
  node's live pods plus its own within allocatable), the one with the most
  room: ``spec.nodeName``, condition ``PodScheduled=True``, event
  ``Scheduled``. Else ``PodScheduled=False`` reason ``Unschedulable`` with
  the scheduler's message ("0/2 nodes are available: 1 Insufficient
  nvidia.com/gpu, 1 node(s) had untolerated taint {nvidia.com/gpu:
  present}.") and a Warning event ``FailedScheduling`` whose count grows at
  each retry (every second, and at once when a node comes or changes).
- **The kubelet**: pulls the image (``missing_image(name)`` makes that fail:
  ``ErrImagePull``, then ``ImagePullBackOff``, with events ``Failed`` and
  ``BackOff``; the pod stays Pending), then runs the container's
  ``command + args`` in ``root/<pod>/`` as a process group of its own, with
  the pod's env, ``TRAINYARD_BOOT_ROOT`` (``root/<pod>/opt``) and the test's
  ``env``; output in ``root/<pod>/container.log``. A pod given GPUs (a
  limit of the node's GPU resource) finds a stand-in ``nvidia-smi``
  (tests/support/gpus.py) first on its PATH listing that many of the node's
  GPUs (product and memory labels), as the NVIDIA container toolkit gives a
  container its GPUs. Phase ``Running`` with a running container status; the
  exit gives ``Succeeded`` (0) or ``Failed`` with a terminated container
  status (128+N for a signal).
- **Stopping a pod** as a container runtime does: SIGTERM to the
  container's main process only (as to a container's PID 1: a shell that
  does not pass it on leaves its children running), SIGKILL to everything
  of the pod when the grace period (``deletionGracePeriodSeconds``, else
  ``terminationGracePeriodSeconds``, else 30 s) is over, and when the main
  process ends everything else of the pod is killed (the container ends
  with its PID 1).
- **Graceful deletion**: the emulator deletes an object at once unless it
  has finalizers, while the API server keeps a deleted pod that runs on a
  node (``deletionTimestamp`` set, "Terminating") until its kubelet has
  stopped it. So a bound pod carries the finalizer ``FINALIZER`` while it
  is not terminal: a DELETE marks it, the kubelet stops it, writes its
  final status and removes the finalizer, and the pod is gone. A pod that
  was never bound, or that has ended, is deleted at once, as by the API
  server.
- **Disruptions** as Kubernetes makes them: ``preempt`` (condition
  ``DisruptionTarget`` reason ``PreemptionByScheduler``, event
  ``Preempted``, graceful delete), ``evict`` (the Eviction API:
  ``EvictionByEvictionAPI``, graceful delete; or with ``pressure=`` the
  kubelet's node-pressure eviction: ``TerminationByKubelet``, the pod ends
  ``Failed`` with ``status.reason: Evicted`` and stays),
  ``terminate_node`` (graceful node shutdown: the node turns NotReady, each
  of its pods gets ``TerminationByKubelet`` and SIGTERM, ends ``Failed`` with
  ``status.reason: Terminated``, then the Node object is deleted), and
  ``remove_node`` (the machine vanishes: its processes are SIGKILLed, the
  Node object deleted, and after ``pod_gc_seconds`` the pod garbage
  collector deletes its pods, a running one with ``DeletionByPodGC``).

Not played: init containers, more than one container, restarts, volumes,
probes, real images (every image but a missing one "pulls"; the command
runs on this machine), cgroup limits, services and networking (pod IP
127.0.0.1). ``Kubelet(api, root, env=...)``; ``start()`` / ``stop()``; the
``kubelet`` fixture (registered in tests/conftest.py) wraps it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import pytest

from tests.support.gpus import gpu, stand_in_nvidia_smi
from tests.support.kubeapi import KubeApi

FINALIZER = "trainyard.dev/test-kubelet"
PLAIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
SCHEDULER = "default-scheduler"
DEFAULT_GRACE = 30.0
RETRY_SCHEDULING = 1.0  # seconds between the scheduler's tries of an unschedulable pod
PULL_BACKOFF_FIRST, PULL_BACKOFF_MAX = 10.0, 300.0
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
_PLAIN_RESOURCES = {"cpu", "memory", "ephemeral-storage", "pods"}
_QUANTITY_SUFFIX = {
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}


def quantity(value: object) -> Decimal:
    """A Kubernetes quantity ("500m", "32Gi", "1e9", 2) as a number."""
    text = str(value).strip()
    with contextlib.suppress(InvalidOperation):
        return Decimal(text)
    for suffix in sorted(_QUANTITY_SUFFIX, key=len, reverse=True):
        if text.endswith(suffix):
            with contextlib.suppress(InvalidOperation):
                return Decimal(text[: -len(suffix)]) * _QUANTITY_SUFFIX[suffix]
    raise ValueError(f"not a Kubernetes quantity: {value!r}")


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Pod:
    """What the kubelet knows of one pod (by uid) beyond what the API holds."""

    uid: str
    name: str
    namespace: str
    folder: Path
    node: str = ""
    grace: float = DEFAULT_GRACE  # spec.terminationGracePeriodSeconds
    process: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    exit_code: int | None = None
    ended: bool = False  # the main process ended and the final status is written (or the pod is gone)
    gone: bool = False  # no longer in the API
    term_sent: bool = False
    kill_at: float | None = None  # monotonic: SIGKILL everything of the pod then
    killed: bool = False
    group_killed: bool = False  # its process group got the SIGKILL
    next_schedule: float = 0.0
    next_pull: float = 0.0
    pull_failures: int = 0
    backing_off: bool = False
    orphaned_at: float | None = None  # monotonic: when its node was found gone
    ending: tuple[str, str] | None = None  # the final status's (reason, message): node shutdown, eviction
    events: dict[tuple[str, str], tuple[str, int, str]] = field(default_factory=dict)  # (reason, message) → event

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Kubelet:
    """See the module docstring. ``root``: one folder per pod. ``env``: added
    to every container's environment (last, so it wins). ``tick``: seconds
    between looks at the API. ``pod_gc_seconds``: how long pods of a node
    that is gone stay before the pod garbage collector deletes them."""

    def __init__(
        self,
        api: KubeApi,
        root: Path,
        *,
        env: Mapping[str, str] | None = None,
        tick: float = 0.1,
        pod_gc_seconds: float = 5.0,
    ) -> None:
        self.api = api
        self.root = root
        self.extra_env = dict(env or {})
        self.tick = tick
        self.pod_gc_seconds = pod_gc_seconds
        self.errors: list[str] = []
        self.missing_images: set[str] = set()
        self._pods: dict[str, _Pod] = {}  # by uid
        self._shutting_down: set[str] = set()  # nodes in graceful shutdown
        self._listed: list[dict[str, Any]] = []  # the pods of the current pass
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> Kubelet:
        self.root.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops looking; kills every process of every pod; takes the
        finalizer off the pods still carrying it (nothing is left waiting)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(15)
        with self._lock:
            for pod in self._pods.values():
                if pod.process is not None:
                    self._kill_all(pod)
            with contextlib.suppress(Exception):  # the emulator may be gone already
                for obj in self._list_pods():
                    if FINALIZER in (obj["metadata"].get("finalizers") or []):
                        self._release(obj)

    # ------------------------------------------------------------ the test's calls

    def add_node(
        self,
        name: str,
        *,
        cpu: str = "8",
        memory: str = "32Gi",
        gpus: int = 0,
        gpu_product: str = "",
        gpu_memory_mib: int = 0,
        instance_type: str = "k8s-node",
        spot: bool = False,
        taints: Iterable[Mapping[str, str] | str] = (),
        labels: Mapping[str, str] | None = None,
        gpu_resource: str = GPU_RESOURCE,
        gpu_taint: bool = True,
        ephemeral_storage: str = "100Gi",
        pods: int = 110,
    ) -> None:
        """A Ready node. ``taints``: dicts (key, value, effect) or
        ``"key[=value]:Effect"``. ``labels`` are added last (they win)."""
        node_labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": instance_type,
            "karpenter.sh/capacity-type": "spot" if spot else "on-demand",
        }
        resources = {"cpu": cpu, "memory": memory, "ephemeral-storage": ephemeral_storage, "pods": str(pods)}
        node_taints = [_taint(t) for t in taints]
        if gpus:
            resources[gpu_resource] = str(gpus)
            node_labels["nvidia.com/gpu.present"] = "true"
            node_labels["nvidia.com/gpu.count"] = str(gpus)
            if gpu_product:
                node_labels["nvidia.com/gpu.product"] = gpu_product
            if gpu_memory_mib:
                node_labels["nvidia.com/gpu.memory"] = str(gpu_memory_mib)
            if gpu_taint and not any(t["key"] == gpu_resource for t in node_taints):
                node_taints.append({**GPU_TAINT, "key": gpu_resource})
        node_labels.update(labels or {})
        now = _now()
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": node_labels},
            "spec": {"providerID": f"kubelet-test:///{name}", **({"taints": node_taints} if node_taints else {})},
            "status": {
                "capacity": dict(resources),
                "allocatable": dict(resources),
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
                "nodeInfo": {
                    "kubeletVersion": "v1.30.0",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "containerRuntimeVersion": "containerd://1.7.0",
                },
            },
        }
        self.api.post("/api/v1/nodes", body)
        self._wake_scheduler()

    def cordon(self, name: str) -> None:
        """``kubectl cordon``: ``spec.unschedulable`` and its taint; no new pod goes there."""
        node = self._node(name)
        taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != UNSCHEDULABLE_TAINT]
        taints.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule", "timeAdded": _now()})
        self.api.patch(f"/api/v1/nodes/{name}", {"spec": {"unschedulable": True, "taints": taints}})

    def remove_node(self, name: str) -> None:
        """The machine vanishes without a word: everything running on it is
        SIGKILLed at once and the Node object deleted; its pods stay as they
        were until the pod garbage collector deletes them (``pod_gc_seconds``)."""
        with self._lock:
            for pod in self._pods.values():
                if pod.node == name and pod.process is not None:
                    pod.ended = True  # nobody is left on the node to write its status
                    self._kill_all(pod)
            self.api.delete(f"/api/v1/nodes/{name}")
        self._wake.set()

    def terminate_node(self, name: str) -> None:
        """Graceful node shutdown (a spot node reclaimed, a node scaled
        down): the node turns NotReady; each of its pods gets the
        DisruptionTarget condition (``TerminationByKubelet``) and SIGTERM
        with its grace, and ends ``Failed`` (reason ``Terminated``); when none
        runs any more the Node object is deleted. Returns at once."""
        with self._lock:
            node = self._node(name)
            taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != NOT_READY_TAINT]
            taints.append({"key": NOT_READY_TAINT, "effect": "NoSchedule", "timeAdded": _now()})
            ready = {
                "type": "Ready",
                "status": "False",
                "reason": "KubeletNotReady",
                "message": "node is shutting down",
                "lastHeartbeatTime": _now(),
                "lastTransitionTime": _now(),
            }
            self.api.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": taints}, "status": {"conditions": [ready]}})
            self._shutting_down.add(name)
            for obj in self._list_pods():
                if obj["spec"].get("nodeName") != name or obj["status"].get("phase") in ("Succeeded", "Failed"):
                    continue
                pod = self._track(obj)
                pod.ending = ("Terminated", SHUTDOWN_MESSAGE)
                self._set_status(obj, conditions=[_disruption("TerminationByKubelet", SHUTDOWN_MESSAGE)])
                self._event(obj, pod, "Normal", "Shutdown", SHUTDOWN_MESSAGE, "kubelet")
                self._terminate(obj, pod)
        self._wake.set()

    def preempt(self, pod_name: str, *, namespace: str | None = None) -> None:
        """The scheduler preempts the pod for one of higher priority:
        DisruptionTarget ``PreemptionByScheduler``, event ``Preempted``, then
        a graceful delete (SIGTERM, its grace, gone)."""
        with self._lock:
            obj = self._pod_named(pod_name, namespace)
            pod = self._track(obj)
            message = f"{SCHEDULER}: preempting to accommodate a higher priority pod"
            self._set_status(obj, conditions=[_disruption("PreemptionByScheduler", message)])
            node = obj["spec"].get("nodeName", "")
            self._event(obj, pod, "Normal", "Preempted", f"Preempted by pod {uuid.uuid4()} on node {node}", SCHEDULER)
            self.api.delete(_path(obj))
        self._wake.set()

    def evict(
        self, pod_name: str, *, namespace: str | None = None, pressure: str = "", grace: float | None = None
    ) -> None:
        """The Eviction API (``kubectl drain``): DisruptionTarget
        ``EvictionByEvictionAPI``, then a graceful delete. With ``pressure``
        ("memory", "ephemeral-storage"): the kubelet's node-pressure eviction
        instead: ``TerminationByKubelet``, event ``Evicted``, SIGTERM with
        ``grace`` (default the pod's), and the pod ends ``Failed`` with
        ``status.reason: Evicted``; it is not deleted."""
        with self._lock:
            obj = self._pod_named(pod_name, namespace)
            pod = self._track(obj)
            if not pressure:
                self._set_status(obj, conditions=[_disruption("EvictionByEvictionAPI", "Eviction API: evicting")])
                self.api.delete(_path(obj))
            else:
                message = f"The node was low on resource: {pressure}. "
                pod.ending = ("Evicted", message)
                self._set_status(obj, conditions=[_disruption("TerminationByKubelet", message)])
                self._event(obj, pod, "Warning", "Evicted", message, "kubelet")
                self._terminate(obj, pod, grace=grace)
        self._wake.set()

    def missing_image(self, image: str) -> None:
        """From now on pulls of ``image`` fail (not found in the registry)."""
        self.missing_images.add(image)

    def pod_log(self, pod_name: str) -> str:
        path = self.root / pod_name / "container.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def folder(self, pod_name: str) -> Path:
        """The pod's folder (its container's working directory)."""
        return self.root / pod_name

    def running(self) -> list[str]:
        """The pods with a live process, by name."""
        with self._lock:
            return sorted(p.name for p in self._pods.values() if p.alive)

    def wait_running(self, count: int = 1, timeout: float = 30.0) -> list[str]:
        """Until at least ``count`` pods have a live process; their names."""
        deadline = time.monotonic() + timeout
        while len(found := self.running()) < count:
            assert time.monotonic() < deadline, (
                f"{len(found)} of {count} pods run after {timeout:.0f}s: {found}; errors: {self.errors[-5:]}"
            )
            time.sleep(0.05)
        return found

    def wait_gone(self, pod_name: str, timeout: float = 60.0) -> None:
        """Until the pod is no longer in the API and nothing of it runs."""
        deadline = time.monotonic() + timeout
        while pod_name in self.running() or any(p["metadata"]["name"] == pod_name for p in self._list_pods()):
            assert time.monotonic() < deadline, f"{pod_name} still there after {timeout:.0f}s: {self.errors[-5:]}"
            time.sleep(0.05)

    # ------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    self._pass()
            except Exception as e:  # the emulator stopping under us, a test's own writes: look again
                self.errors.append(f"{type(e).__name__}: {e}")
            self._wake.wait(self.tick)
            self._wake.clear()

    def _pass(self) -> None:
        nodes = {n["metadata"]["name"]: n for n in (self.api.get("/api/v1/nodes") or {}).get("items", [])}
        seen: set[str] = set()
        self._listed = self._list_pods()
        for obj in self._listed:
            uid = obj["metadata"].get("uid", "")
            seen.add(uid)
            self._follow(obj, nodes)
        for pod in self._pods.values():
            if pod.uid not in seen and not pod.gone:
                pod.gone = True
                if pod.alive and not pod.term_sent:  # deleted at once (no finalizer): stop what runs
                    self._terminate(None, pod)
        for pod in list(self._pods.values()):
            self._watch_process(pod)
            if pod.gone and not pod.alive:
                del self._pods[pod.uid]
        for name in list(self._shutting_down):
            if not any(p.node == name and p.alive for p in self._pods.values()):
                self._shutting_down.discard(name)
                if name in nodes:
                    self.api.delete(f"/api/v1/nodes/{name}")

    def _follow(self, obj: dict[str, Any], nodes: Mapping[str, dict[str, Any]]) -> None:
        """One pod's next step, from what the API says of it."""
        meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
        pod = self._track(obj)
        phase = status.get("phase", "Pending")
        node = spec.get("nodeName", "")
        if meta.get("deletionTimestamp"):
            if pod.alive:
                if not pod.term_sent:
                    self._terminate(obj, pod)
            elif FINALIZER in (meta.get("finalizers") or []) and (pod.ended or pod.process is None):
                self._release(obj)
            return
        if node and node not in nodes:
            self._orphaned(obj, pod)
            return
        if phase in ("Succeeded", "Failed") or pod.process is not None:
            return
        if not node:
            if time.monotonic() >= pod.next_schedule:
                self._schedule(obj, pod, nodes)
            return
        pod.node = node
        if FINALIZER not in (meta.get("finalizers") or []):  # bound by its creator (spec.nodeName)
            self.api.patch(_path(obj), {"metadata": {"finalizers": [*(meta.get("finalizers") or []), FINALIZER]}})
        if node in self._shutting_down:
            return
        if time.monotonic() >= pod.next_pull:
            self._pull_and_start(obj, pod, nodes[node])

    def _track(self, obj: dict[str, Any]) -> _Pod:
        meta = obj["metadata"]
        uid = meta.get("uid", "")
        pod = self._pods.get(uid)
        if pod is None:
            name = meta["name"]
            folder = self.root / name
            if folder.exists() and not any(p.folder == folder for p in self._pods.values()):
                # A pod of the same name before this one: its files moved aside.
                with contextlib.suppress(OSError):
                    folder.rename(self.root / f"{name}.{uuid.uuid4().hex[:8]}")
            pod = _Pod(uid=uid, name=name, namespace=meta.get("namespace", ""), folder=folder)
            pod.node = (obj.get("spec") or {}).get("nodeName", "")
            pod.grace = float((obj.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE))
            self._pods[uid] = pod
        return pod

    # ------------------------------------------------------------ scheduling

    def _wake_scheduler(self) -> None:
        """Nodes changed: every unschedulable pod is tried again now."""
        with self._lock:
            for pod in self._pods.values():
                pod.next_schedule = 0.0
        self._wake.set()

    def _schedule(self, obj: dict[str, Any], pod: _Pod, nodes: Mapping[str, dict[str, Any]]) -> None:
        wants = _requests(obj)
        reasons: dict[str, int] = {}
        fits: list[tuple[Decimal, str]] = []
        used = self._used()
        for name, node in sorted(nodes.items()):
            why = _unfit(obj, node, wants, used.get(name, {}))
            for reason in why:
                reasons[reason] = reasons.get(reason, 0) + 1
            if not why:
                fits.append((_room(node, wants, used.get(name, {})), name))
        if fits:
            chosen = max(fits)[1]
            meta = obj["metadata"]
            finalizers = [*(meta.get("finalizers") or []), FINALIZER]
            bound = self.api.patch(_path(obj), {"metadata": {"finalizers": finalizers}, "spec": {"nodeName": chosen}})
            if bound is None:
                return
            pod.node = chosen
            obj.setdefault("spec", {})["nodeName"] = chosen  # counted in the pass's later placements
            scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}
            self._set_status(obj, conditions=[scheduled])
            self._event(
                obj,
                pod,
                "Normal",
                "Scheduled",
                f"Successfully assigned {pod.namespace}/{pod.name} to {chosen}",
                SCHEDULER,
            )
            self._wake.set()  # the kubelet starts it in the next pass
            return
        if not nodes:
            message = "no nodes available to schedule pods"
        else:
            parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
            message = f"0/{len(nodes)} nodes are available: {', '.join(parts)}."
        unschedulable = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": _now(),
        }
        self._set_status(obj, conditions=[unschedulable], keep_transition=True)
        self._event(obj, pod, "Warning", "FailedScheduling", message, SCHEDULER)
        pod.next_schedule = time.monotonic() + RETRY_SCHEDULING

    def _used(self) -> dict[str, dict[str, Decimal]]:
        """The requests of the live pods bound to each node."""
        used: dict[str, dict[str, Decimal]] = {}
        for obj in self._listed:
            node = (obj.get("spec") or {}).get("nodeName", "")
            if not node or (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            total = used.setdefault(node, {"pods": Decimal(0)})
            total["pods"] += 1
            for resource, amount in _requests(obj).items():
                total[resource] = total.get(resource, Decimal(0)) + amount
        return used

    # ------------------------------------------------------------ running

    def _pull_and_start(self, obj: dict[str, Any], pod: _Pod, node: Mapping[str, Any]) -> None:
        container = _container(obj)
        image = str(container.get("image", ""))
        if image in self.missing_images:
            self._fail_pull(obj, pod, image)
            return
        self._event(obj, pod, "Normal", "Pulling", f'Pulling image "{image}"', "kubelet")
        self._event(obj, pod, "Normal", "Pulled", f'Successfully pulled image "{image}"', "kubelet")
        pod.folder.mkdir(parents=True, exist_ok=True)
        command = [str(c) for c in [*(container.get("command") or []), *(container.get("args") or [])]]
        if not command:
            self._waiting(obj, "CreateContainerError", "the kubelet helper runs only containers with a command")
            pod.next_pull = time.monotonic() + PULL_BACKOFF_MAX
            return
        env = {
            "PATH": PLAIN_PATH,
            "HOME": str(pod.folder),
            "LANG": "C.UTF-8",
            "HOSTNAME": pod.name,
            **_env(obj, container),
            "TRAINYARD_BOOT_ROOT": str(pod.folder / "opt"),
            **self.extra_env,
        }
        gpus = _gpus_of(obj, node)
        if gpus:  # as the GPU device plugin and container toolkit give a container its GPUs
            stand_in_nvidia_smi(pod.folder / "gpu-bin", gpus)
            env["PATH"] = f"{pod.folder / 'gpu-bin'}:{env['PATH']}"
        with open(pod.folder / "container.log", "ab") as log:
            try:
                pod.process = subprocess.Popen(
                    command,
                    cwd=pod.folder,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as e:
                message = f"failed to create containerd task: exec: {command[0]!r}: {e.strerror}"
                self._waiting(obj, "StartError", message)
                pod.next_pull = time.monotonic() + PULL_BACKOFF_MAX
                return
        pod.started_at = _now()
        self._event(obj, pod, "Normal", "Created", f"Created container {container.get('name', '')}", "kubelet")
        self._event(obj, pod, "Normal", "Started", f"Started container {container.get('name', '')}", "kubelet")
        running = _container_status(obj, container, {"running": {"startedAt": pod.started_at}}, ready=True)
        self._set_status(
            obj,
            phase="Running",
            extra={"startTime": pod.started_at, "podIP": "127.0.0.1", "hostIP": "127.0.0.1"},
            container=running,
            conditions=_ready_conditions(True),
        )

    def _fail_pull(self, obj: dict[str, Any], pod: _Pod, image: str) -> None:
        """Pull, fail (ErrImagePull), back off (ImagePullBackOff), pull again
        after 10 s, 20 s, … as the kubelet does."""
        now = time.monotonic()
        if not pod.backing_off and pod.pull_failures:
            pod.backing_off = True
            message = f'Back-off pulling image "{image}"'
            self._waiting(obj, "ImagePullBackOff", message)
            self._event(obj, pod, "Normal", "BackOff", message, "kubelet")
            self._event(obj, pod, "Warning", "Failed", "Error: ImagePullBackOff", "kubelet")
            backoff = min(PULL_BACKOFF_FIRST * 2 ** (pod.pull_failures - 1), PULL_BACKOFF_MAX)
            pod.next_pull = now + backoff
            return
        pod.backing_off = False
        pod.pull_failures += 1
        reference = image if "/" in image else f"docker.io/library/{image}"
        message = (
            f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and unpack image'
            f' "{reference}": failed to resolve reference "{reference}": {reference}: not found'
        )
        self._event(obj, pod, "Normal", "Pulling", f'Pulling image "{image}"', "kubelet")
        self._event(obj, pod, "Warning", "Failed", message, "kubelet")
        self._event(obj, pod, "Warning", "Failed", "Error: ErrImagePull", "kubelet")
        self._waiting(obj, "ErrImagePull", message)
        pod.next_pull = now + 1.0  # then ImagePullBackOff

    def _waiting(self, obj: dict[str, Any], reason: str, message: str) -> None:
        container = _container(obj)
        waiting = _container_status(obj, container, {"waiting": {"reason": reason, "message": message}}, ready=False)
        self._set_status(obj, container=waiting, conditions=_ready_conditions(False))

    def _watch_process(self, pod: _Pod) -> None:
        if pod.process is None:
            return
        if pod.alive:
            if pod.kill_at is not None and time.monotonic() >= pod.kill_at and not pod.killed:
                self._kill_all(pod)
            return
        if pod.ended:
            return
        pod.ended = True
        code = pod.process.returncode
        pod.exit_code = 128 - code if code < 0 else code
        _kill_group_and_leftovers(pod)  # the container ends with its main process
        if pod.gone:
            return
        obj = self.api.get(f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}")
        if obj is None or obj["metadata"].get("uid") != pod.uid:
            return
        container = _container(obj)
        terminated = {
            "exitCode": pod.exit_code,
            "reason": "Completed" if pod.exit_code == 0 else "Error",
            "startedAt": pod.started_at,
            "finishedAt": _now(),
            "containerID": f"containerd://{pod.uid}",
        }
        phase = "Succeeded" if pod.exit_code == 0 else "Failed"
        extra: dict[str, Any] = {}
        if pod.ending is not None:
            phase = "Failed"
            extra = {"reason": pod.ending[0], "message": pod.ending[1]}
        self._set_status(
            obj,
            phase=phase,
            extra=extra,
            container=_container_status(obj, container, {"terminated": terminated}, ready=False),
            conditions=_ready_conditions(False, reason="PodCompleted"),
            release=True,
        )

    def _terminate(self, obj: dict[str, Any] | None, pod: _Pod, *, grace: float | None = None) -> None:
        """SIGTERM to the container's main process; SIGKILL to everything of
        the pod when the grace is over."""
        if grace is None:
            grace = pod.grace
            if obj is not None:
                grace = float(obj["metadata"].get("deletionGracePeriodSeconds", grace))
        pod.term_sent = True
        pod.kill_at = time.monotonic() + max(grace, 0.0)
        if obj is not None:
            name = _container(obj).get("name", "")
            self._event(obj, pod, "Normal", "Killing", f"Stopping container {name}", "kubelet")
        if pod.process is not None and pod.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pod.process.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)

    def _kill_all(self, pod: _Pod) -> None:
        pod.killed = True
        _kill_group_and_leftovers(pod)

    def _orphaned(self, obj: dict[str, Any], pod: _Pod) -> None:
        """Bound to a node that is gone: the pod garbage collector deletes it
        after ``pod_gc_seconds`` (a pod not yet ended first gets
        DisruptionTarget ``DeletionByPodGC`` and ``Failed``)."""
        if pod.orphaned_at is None:
            pod.orphaned_at = time.monotonic()
        if time.monotonic() - pod.orphaned_at < self.pod_gc_seconds:
            return
        if (obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            message = f"{SCHEDULER}: deleting pod bound to a node that does not exist"
            self._set_status(obj, phase="Failed", conditions=[_disruption("DeletionByPodGC", message)])
        pod.ended = True
        self._release(obj)
        self.api.delete(_path(obj))

    # ------------------------------------------------------------ API writes

    def _release(self, obj: dict[str, Any]) -> None:
        """The finalizer off: a pod marked deleted goes now."""
        finalizers = [f for f in obj["metadata"].get("finalizers") or [] if f != FINALIZER]
        self.api.patch(_path(obj), {"metadata": {"finalizers": finalizers}})

    def _set_status(
        self,
        obj: dict[str, Any],
        *,
        phase: str = "",
        extra: Mapping[str, Any] | None = None,
        container: dict[str, Any] | None = None,
        conditions: Iterable[dict[str, Any]] = (),
        keep_transition: bool = False,
        release: bool = False,
    ) -> None:
        """Merge into the pod's current status (read again: lists are
        replaced whole by a merge patch); conditions by type. ``release``:
        the finalizer comes off in the same write (a deleted pod goes)."""
        current = self.api.get(_path(obj))
        if current is None or current["metadata"].get("uid") != obj["metadata"].get("uid"):
            return
        status = current.get("status") or {}
        merged = {c["type"]: c for c in status.get("conditions") or []}
        for condition in conditions:
            before = merged.get(condition["type"])
            if keep_transition and before is not None and before.get("status") == condition["status"]:
                condition = {**condition, "lastTransitionTime": before.get("lastTransitionTime")}
            merged[condition["type"]] = condition
        changes: dict[str, Any] = {"conditions": list(merged.values()), **(extra or {})}
        if phase:
            changes["phase"] = phase
        if container is not None:
            changes["containerStatuses"] = [container]
        patch: dict[str, Any] = {"status": changes}
        if release:
            patch["metadata"] = {
                "finalizers": [f for f in current["metadata"].get("finalizers") or [] if f != FINALIZER]
            }
        self.api.patch(_path(obj), patch)

    def _event(self, obj: dict[str, Any], pod: _Pod, kind: str, reason: str, message: str, component: str) -> None:
        """An event about the pod; the same reason and message again counts up the first one."""
        now = _now()
        namespace = pod.namespace
        known = pod.events.get((reason, message))
        if known is not None:
            name, count, first = known
            pod.events[(reason, message)] = (name, count + 1, first)
            self.api.patch(f"/api/v1/namespaces/{namespace}/events/{name}", {"count": count + 1, "lastTimestamp": now})
            return
        name = f"{pod.name}.{uuid.uuid4().hex[:16]}"
        container = _container(obj).get("name", "")
        involved = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.name,
            "namespace": namespace,
            "uid": pod.uid,
            **({"fieldPath": f"spec.containers{{{container}}}"} if component == "kubelet" and container else {}),
        }
        self.api.post(
            f"/api/v1/namespaces/{namespace}/events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": involved,
                "type": kind,
                "reason": reason,
                "message": message,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "source": {"component": component, **({"host": pod.node} if component == "kubelet" else {})},
                "reportingComponent": component,
            },
        )
        pod.events[(reason, message)] = (name, 1, now)

    # ------------------------------------------------------------ API reads

    def _list_pods(self) -> list[dict[str, Any]]:
        return list((self.api.get("/api/v1/pods") or {}).get("items", []))

    def _node(self, name: str) -> dict[str, Any]:
        node = self.api.get(f"/api/v1/nodes/{name}")
        assert node is not None, f"no node {name}"
        node.setdefault("spec", {})
        return dict(node)

    def _pod_named(self, name: str, namespace: str | None) -> dict[str, Any]:
        found = [
            p
            for p in self._list_pods()
            if p["metadata"]["name"] == name and namespace in (None, p["metadata"].get("namespace"))
        ]
        assert len(found) == 1, f"{len(found)} pods named {name} (namespace {namespace})"
        return found[0]


# ---------------------------------------------------------------- pod spec reading


def _path(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return f"/api/v1/namespaces/{meta.get('namespace', 'default')}/pods/{meta['name']}"


def _container(obj: Mapping[str, Any]) -> dict[str, Any]:
    containers = (obj.get("spec") or {}).get("containers") or [{}]
    return dict(containers[0])


def _requests(obj: Mapping[str, Any]) -> dict[str, Decimal]:
    """What the pod's containers request (a limit without a request counts as the request)."""
    total: dict[str, Decimal] = {}
    for container in (obj.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for resource, amount in asked.items():
            total[resource] = total.get(resource, Decimal(0)) + quantity(amount)
    return total


def _gpus_of(obj: Mapping[str, Any], node: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The GPUs the pod's limits take of a GPU node (one labelled by GPU
    feature discovery), as its ``nvidia-smi`` lists them: the product label
    with ``-`` read as spaces, the memory label in MiB."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    product = labels.get("nvidia.com/gpu.product", "")
    if not product:
        return []
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    count = 0
    for container in (obj.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        for resource, amount in limits.items():
            if resource not in _PLAIN_RESOURCES and resource in allocatable:
                count += int(quantity(amount))
    memory = int(labels.get("nvidia.com/gpu.memory", "0") or 0)
    return [gpu(product.replace("-", " "), mem_total_mib=memory) for _ in range(count)]


def _unfit(
    obj: Mapping[str, Any], node: Mapping[str, Any], wants: Mapping[str, Decimal], used: Mapping[str, Decimal]
) -> list[str]:
    """Why the pod cannot go to the node, as the scheduler's filters say it
    (in their order; the first failing filter speaks); [] when it fits."""
    spec = obj.get("spec") or {}
    node_spec = node.get("spec") or {}
    if node_spec.get("unschedulable"):
        return ["node(s) were unschedulable"]
    tolerations = spec.get("tolerations") or []
    for taint in node_spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(_tolerates(t, taint) for t in tolerations):
            return [f"node(s) had untolerated taint {{{taint.get('key', '')}: {taint.get('value', '')}}}"]
    labels = (node.get("metadata") or {}).get("labels") or {}
    selector = spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()) or not _affinity_matches(spec, labels):
        return ["node(s) didn't match Pod's node affinity/selector"]
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    why = []
    if used.get("pods", Decimal(0)) + 1 > quantity(allocatable.get("pods", "110")):
        why.append("Too many pods")
    for resource, amount in sorted(wants.items()):
        if amount > 0 and used.get(resource, Decimal(0)) + amount > quantity(allocatable.get(resource, "0")):
            why.append(f"Insufficient {resource}")
    return why


def _room(node: Mapping[str, Any], wants: Mapping[str, Decimal], used: Mapping[str, Decimal]) -> Decimal:
    """How much of the node's cpu and memory stays free (fractions, summed): the emptiest node wins."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    room = Decimal(0)
    for resource in ("cpu", "memory"):
        total = quantity(allocatable.get(resource, "0"))
        if total > 0:
            room += (total - used.get(resource, Decimal(0)) - wants.get(resource, Decimal(0))) / total
    return room


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    key = toleration.get("key", "")
    if key and key != taint.get("key"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(key) and toleration.get("value", "") == taint.get("value", "")


def _affinity_matches(spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """``requiredDuringSchedulingIgnoredDuringExecution`` node affinity: any term, all its expressions."""
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(all(_expression(e, labels) for e in term.get("matchExpressions") or []) for term in terms)


def _expression(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator, values = expression.get("key", ""), expression.get("operator", ""), expression.get("values") or []
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and key in labels and values:
        with contextlib.suppress(ValueError):
            return (int(labels[key]) > int(values[0])) == (operator == "Gt")
    return False


def _env(obj: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
    """The container's ``env``: values, and the downward API's pod fields."""
    fields = {
        "metadata.name": obj["metadata"]["name"],
        "metadata.namespace": obj["metadata"].get("namespace", ""),
        "metadata.uid": obj["metadata"].get("uid", ""),
        "spec.nodeName": (obj.get("spec") or {}).get("nodeName", ""),
        "spec.serviceAccountName": (obj.get("spec") or {}).get("serviceAccountName", "default"),
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif (path := ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")) in fields:
            env[item["name"]] = fields[path]
    return env


def _taint(value: Mapping[str, str] | str) -> dict[str, str]:
    """``{"key", "value", "effect"}`` or ``"key[=value]:Effect"``."""
    if not isinstance(value, str):
        return {"key": value["key"], "value": value.get("value", ""), "effect": value.get("effect", "NoSchedule")}
    pair, _, effect = value.partition(":")
    key, _, taint_value = pair.partition("=")
    return {"key": key, "value": taint_value, "effect": effect or "NoSchedule"}


def _disruption(reason: str, message: str) -> dict[str, str]:
    return {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": _now(),
    }


def _ready_conditions(ready: bool, *, reason: str = "ContainersNotReady") -> list[dict[str, str]]:
    now = _now()
    conditions = [{"type": "Initialized", "status": "True", "lastTransitionTime": now}]
    for kind in ("ContainersReady", "Ready"):
        condition = {"type": kind, "status": "True" if ready else "False", "lastTransitionTime": now}
        if not ready:
            condition["reason"] = reason
        conditions.append(condition)
    return conditions


def _container_status(
    obj: Mapping[str, Any], container: Mapping[str, Any], state: dict[str, Any], *, ready: bool
) -> dict[str, Any]:
    image = str(container.get("image", ""))
    status: dict[str, Any] = {
        "name": container.get("name", ""),
        "image": image,
        "imageID": "",
        "ready": ready,
        "started": "running" in state,
        "restartCount": 0,
        "state": state,
    }
    if "waiting" not in state:
        status["containerID"] = f"containerd://{obj['metadata'].get('uid', '')}"
        status["imageID"] = f"{image}@sha256:{'0' * 64}"
    return status


# ---------------------------------------------------------------- processes


def _kill_group_and_leftovers(pod: _Pod) -> None:
    """SIGKILL the pod's process group (once: its number may be another's
    later), and what escaped it from the pod's folder (a runner's jobs run in
    sessions of their own)."""
    process = pod.process
    if process is not None and not pod.group_killed:
        pod.group_killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)
    _kill_leftovers(pod.folder)


def _kill_leftovers(folder: Path) -> None:
    import psutil

    here = str(folder)
    inside = here + os.sep
    for proc in psutil.process_iter():
        try:
            cwd = proc.cwd()
            if cwd == here or cwd.startswith(inside) or any(p == here or inside in p for p in proc.cmdline()):
                proc.kill()
        except psutil.Error:
            continue


@pytest.fixture
def kubelet(kube_api: KubeApi, tmp_path: Path) -> Iterator[Kubelet]:
    """The node side of ``kube_api``'s cluster for the test (no node until
    the test adds one); at the end everything its pods started is killed,
    and the test fails if the kubelet met an error of the API on the way."""
    helper = Kubelet(kube_api, tmp_path / "pods").start()
    try:
        yield helper
    finally:
        helper.stop()
    assert helper.errors == [], f"the kubelet helper met errors: {helper.errors[:5]}"


__all__ = ["FINALIZER", "Kubelet", "kubelet", "quantity"]
