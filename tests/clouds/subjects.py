"""Backends under test, each behind one ``Subject`` so the contract suite
(test_contract.py) runs the same tests on every backend, and the helpers
the backend tests share.

Adding a backend to the suite means: one more ``Subject`` subclass and one
more entry in ``SUBJECTS``. ``aws`` runs on moto's server over HTTP (the
``aws`` fixture, which the ``subject`` fixture requests for subjects with
``needs_moto``); ``kubernetes`` on kmock's emulator over HTTP (the
``kube_api`` fixture, for subjects with ``needs_kube``), and on a real
cluster when ``KUBECONFIG`` names one (``kubernetes-cluster``; skipped
otherwise).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from backend.clouds.backends.base import GONE, AccountConfig, CloudState, Compute, Handle, LaunchSpec
from backend.clouds.backends.errors import NotYetTerminated
from backend.clouds.backends.fake.script import write_script
from backend.clouds.backends.fake.state import read_calls
from backend.clouds.backends.registry import compute_for

GIB = 2**30
INSTALLATION = "ty-test"
TERMINATE_DEADLINE = 30.0

# The same three machines for every backend's catalog tests.
SHAPES: list[dict[str, Any]] = [
    {"name": "cpu-small", "cpus": 2, "memory_bytes": 4 * GIB, "disk_bytes": 20 * GIB, "gpus": []},
    {"name": "cpu-big", "cpus": 32, "memory_bytes": 128 * GIB, "disk_bytes": 500 * GIB, "gpus": []},
    {
        "name": "gpu-a100",
        "cpus": 16,
        "memory_bytes": 64 * GIB,
        "disk_bytes": 200 * GIB,
        "gpus": [{"name": "NVIDIA A100-SXM4-40GB", "memory_bytes": 40 * GIB}] * 2,
    },
]


def unused_loopback_url() -> str:
    """An http URL where nothing listens: a runner pointed at it keeps retrying."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def runner_pids(root: Path, key: str = "") -> list[int]:
    """Live processes whose TRAINYARD_RUNNER_DIR is under ``root`` (exactly
    ``root/key`` when a key is given), found in /proc, not from the backend's
    own files. A zombie has no environ, so it does not count."""
    prefix = f"TRAINYARD_RUNNER_DIR={root}".encode()
    exact = f"TRAINYARD_RUNNER_DIR={root / key}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(var == exact if key else var.startswith(prefix) for var in environ):
            found.append(int(entry.name))
    return found


def runner_roots(root: Path, key: str = "") -> list[int]:
    """``runner_pids`` whose parent is not one of them: one per running
    runner, whatever short-lived children it has at the moment (they
    inherit its environment). A pid that ended after the scan (its parent
    unreadable: one of those short-lived children) is no runner."""
    pids = runner_pids(root, key)
    parents = {pid: _parent_of(pid) for pid in pids}
    return [pid for pid, parent in parents.items() if parent is not None and parent not in pids]


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state, past the command's parentheses


def signals_of(pid: int, field: str) -> set[signal.Signals]:
    """The signals a process ignores ("SigIgn") or catches ("SigCgt"), from /proc."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return set()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith(f"{field}:")), 16)
    return {sig for sig in signal.Signals if mask & (1 << (sig - 1))}


def _exec_done(pid: int) -> bool:
    """The slow-to-stop runner's ``exec -a trainyard-runner sleep`` has happened."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"trainyard-runner\0")
    except OSError:
        return False


def terminate_fully(compute: Compute, handle: Handle, *, on_not_yet: Callable[[], None] | None = None) -> int:
    """Call terminate until it returns; the number of NotYetTerminated seen."""
    deadline = time.monotonic() + TERMINATE_DEADLINE
    not_yet = 0
    while True:
        try:
            compute.terminate(handle)
            return not_yet
        except NotYetTerminated:
            not_yet += 1
            if on_not_yet is not None:
                on_not_yet()
            assert time.monotonic() < deadline, f"{handle.key} still not terminated after {TERMINATE_DEADLINE}s"
            time.sleep(0.1)


def wait_for(condition: Callable[[], bool], *, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@dataclass
class Subject:
    """One backend under test. ``build`` makes a ``Compute`` over the same
    machines (another installation, another config) as the test needs."""

    name: str
    root: Path
    server_url: str = field(default_factory=unused_loopback_url)
    specs: int = 0
    built: list[Compute] = field(default_factory=list)

    kind: ClassVar[str]
    has_processes: ClassVar[bool] = False  # launch starts real runner processes on this host
    needs_moto: ClassVar[bool] = False  # the subject fixture hands it the ``aws`` fixture's server
    moto: Any = None
    needs_kube: ClassVar[bool] = False  # the subject fixture hands it the ``kube_api`` fixture's server
    kube: Any = None

    def skip_reason(self) -> str:
        """Why this subject cannot run here ("" when it can)."""
        return ""

    def start(self) -> None:
        """Called by the fixture once the subject has what it needs."""

    def credentials(self) -> dict[str, str]:
        return {}

    def build(self, *, installation: str = INSTALLATION, account_id: str = "acct-1", **config: Any) -> Compute:
        account = AccountConfig(
            account_id=account_id,
            workspace_id="ws-1",
            kind=self.kind,
            installation=installation,
            config={**self.config(), **config},
            credentials=self.credentials(),
        )
        compute = compute_for(account)
        self.built.append(compute)
        return compute

    def config(self) -> dict[str, Any]:
        raise NotImplementedError

    def catalog_config(self, shapes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Config under which ``offers`` are exactly ``shapes``."""
        raise NotImplementedError

    def slow_to_stop_config(self) -> dict[str, Any]:
        """Config under which terminate says NotYetTerminated for about a second."""
        raise NotImplementedError

    def settle(self, handle: Handle) -> None:
        """Wait until a machine launched under ``slow_to_stop_config`` is slow to stop."""

    def machines_for(self, key: str) -> int:
        """How many machines exist for ``key``, counted independently of the
        backend's own lookup (processes in /proc, the fake's calls log)."""
        raise NotImplementedError

    def spec(self, *, key: str | None = None) -> LaunchSpec:
        self.specs += 1
        key = key or f"ty-{os.getpid()}-{self.specs}"
        return LaunchSpec(
            idempotency_key=key,
            instance_name=f"{self.name}-{self.specs}",
            runner_token=f"token-{self.specs}",
            server_url=self.server_url,
            tags={"trainyard:installation": INSTALLATION, "trainyard:instance": key},
        )

    def leftovers(self) -> list[str]:
        """What is still running, then killed; [] when the test cleaned up after itself."""
        left = [f"{h.key} (list_managed)" for c in self.built for h in c.list_managed()]
        pids = runner_pids(self.root)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for compute in self.built:
            for handle in compute.list_managed():
                terminate_fully(compute, handle)
        return left + [f"pid {pid}" for pid in pids]


class LocalSubject(Subject):
    kind = "local"
    has_processes = True

    def config(self) -> dict[str, Any]:
        return {"runners_dir": str(self.root / "runners")}

    def catalog_config(self, shapes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return {"shapes": list(shapes)}

    def slow_to_stop_config(self) -> dict[str, Any]:
        # A "runner" that ignores SIGTERM, so only kill_after's SIGKILL ends it.
        return {"runner_command": ["bash", "-c", "trap '' TERM; exec -a trainyard-runner sleep 600"], "kill_after": 1}

    def settle(self, handle: Handle) -> None:
        # A SIGTERM before the trap is installed would end it the ordinary way,
        # and while bash execs sleep its cmdline is briefly empty (it reads as gone).
        pid = int(handle.backend_id)
        wait_for(lambda: signal.SIGTERM in signals_of(pid, "SigIgn") and _exec_done(pid), what="SIGTERM ignored")

    def machines_for(self, key: str) -> int:
        return len(runner_roots(self.root / "runners", key))


class FakeSubject(Subject):
    kind = "fake"

    @property
    def state_dir(self) -> Path:
        return self.root / "fake"

    @property
    def script(self) -> Path:
        return self.root / "script.json"

    @property
    def runners_dir(self) -> Path:
        return self.state_dir / "runners"

    def config(self) -> dict[str, Any]:
        return {"state_dir": str(self.state_dir), "script_file": str(self.script)}

    def catalog_config(self, shapes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        offers = [{"instance_type": s["name"], **{k: v for k, v in s.items() if k != "name"}} for s in shapes]
        return {"offers": offers}

    def slow_to_stop_config(self) -> dict[str, Any]:
        write_script(self.script, {"terminate_delay": 1})
        return {}

    def machines_for(self, key: str) -> int:
        live = 0  # launches that created a machine, since its last termination
        for call in read_calls(self.state_dir):
            if call["key"] == key and call["result"] in ("created", "terminated"):
                live = live + 1 if call["result"] == "created" else 0
        return live


class FakeWithRunnerSubject(FakeSubject):
    """The fake backend with real runner processes (``run_runner``)."""

    has_processes = True

    def config(self) -> dict[str, Any]:
        return {**super().config(), "run_runner": True}

    def machines_for(self, key: str) -> int:
        processes = len(runner_roots(self.runners_dir, key))
        assert super().machines_for(key) == processes, "every live fake machine has exactly one runner"
        return processes


MOTO_SDA1_AMI = "ami-03cf127a"  # in moto's built-in images, root device /dev/sda1
CATALOG_COLUMNS = [
    "instance_name",
    "location",
    "price",
    "cpu",
    "memory",
    "gpu_count",
    "gpu_name",
    "gpu_memory",
    "spot",
    "disk_size",
]


class AwsSubject(Subject):
    """EC2 on moto's server (tests/support/moto.py). No runner process: the
    contract suite never needs one (an instance is ``running`` in moto at
    once); machines are counted with DescribeInstances by tag, not through
    the backend."""

    kind = "aws"
    needs_moto = True
    region = "us-east-1"

    def credentials(self) -> dict[str, str]:
        return {"access_key_id": "testing", "secret_access_key": "testing"}

    def config(self) -> dict[str, Any]:
        return {"regions": [self.region], "amis": {self.region: self.image()}}

    def image(self) -> str:
        """An AMI moto ships (root device /dev/sda1); moto has no Ubuntu
        22.04/24.04 to find by name. (Listing moto's images by owner takes
        seconds: name one.)"""
        return MOTO_SDA1_AMI

    def catalog_config(self, shapes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """A catalog file in gpuhunt's layout with exactly ``shapes`` (on-demand)."""
        path = self.root / "aws.csv"
        rows = [
            [
                s["name"],
                self.region,
                0.01 * s["cpus"],
                s["cpus"],
                s["memory_bytes"] / GIB,
                len(s["gpus"]),
                s["gpus"][0]["name"] if s["gpus"] else "",
                s["gpus"][0]["memory_bytes"] / GIB if s["gpus"] else "",
                "False",
                s["disk_bytes"] / GIB,
            ]
            for s in shapes
        ]
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(CATALOG_COLUMNS)
            writer.writerows(rows)
        return {"catalog_file": str(path)}

    def slow_to_stop_config(self) -> dict[str, Any]:
        self.moto.slow_terminate(1.0)
        return {}

    def machines_for(self, key: str) -> int:
        pages = (
            self.ec2()
            .get_paginator("describe_instances")
            .paginate(
                Filters=[
                    {"Name": "tag:trainyard:key", "Values": [key]},
                    {
                        "Name": "instance-state-name",
                        "Values": ["pending", "running", "shutting-down", "stopping", "stopped"],
                    },
                ]
            )
        )
        return sum(len(r["Instances"]) for page in pages for r in page["Reservations"])

    def ec2(self) -> Any:
        import boto3

        return boto3.client("ec2", region_name=self.region, endpoint_url=self.moto.url)


KUBE_NAMESPACE = "trainyard"
SLOW_STOP_FINALIZER = "trainyard.test/slow-stop"


class KubernetesSubject(Subject):
    """Pods on kmock's emulator (tests/support/kubeapi.py) over HTTP. The
    contract needs pods to run and to take a while to go, not processes, so
    the subject plays the cluster's side itself: a node loop turns a Pending
    pod Running; a pod made slow to stop (``settle`` gives it a finalizer,
    as a kubelet holds a pod for its grace period) goes at the first DELETE
    of it ``stop_after`` seconds after its deletion, as moto's slow terminate
    does (so between the test's calls it is STOPPING, never gone behind
    their back). The subject sees the backend's requests by wrapping its
    client's ``call``, which still makes every request unchanged. The kubelet
    helper (tests/support/kubelet.py) runs real containers for the tests
    that need them. Pods are counted with the test's own HTTP calls, not
    through the backend."""

    kind = "kubernetes"
    needs_kube = True
    stop_after = 1.0

    def build(self, *, installation: str = INSTALLATION, account_id: str = "acct-1", **config: Any) -> Compute:
        compute = super().build(installation=installation, account_id=account_id, **config)
        client = getattr(compute, "client", None)
        if client is not None:
            call = client.call

            def observed(method: str, path: str, **kwargs: Any) -> Any:
                if method == "DELETE":
                    self._release_if_due(path)
                return call(method, path, **kwargs)

            client.call = observed
        return compute

    def _release_if_due(self, path: str) -> None:
        pod = self.kube.get(path)
        meta = (pod or {}).get("metadata", {})
        deleting = meta.get("deletionTimestamp")
        if deleting and SLOW_STOP_FINALIZER in (meta.get("finalizers") or []):
            since = datetime.datetime.fromisoformat(deleting.replace("Z", "+00:00")).timestamp()
            if time.time() - since >= self.stop_after:
                self.kube.patch(path, {"metadata": {"finalizers": []}})

    def credentials(self) -> dict[str, str]:
        return {"kubeconfig": self.kube.kubeconfig()}

    def config(self) -> dict[str, Any]:
        return {
            "namespace": KUBE_NAMESPACE,
            "allowed_networks": ["127.0.0.0/8"],
            "termination_grace_seconds": 5,
            "facts": node_facts([{"name": "k8s-node", "cpus": 8, "memory_bytes": 32 * GIB, "disk_bytes": 100 * GIB}]),
        }

    def catalog_config(self, shapes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return {"facts": node_facts(shapes), "prices": {s["name"]: 0.01 * s["cpus"] for s in shapes}}

    def slow_to_stop_config(self) -> dict[str, Any]:
        return {}

    def settle(self, handle: Handle) -> None:
        path = f"/api/v1/namespaces/{KUBE_NAMESPACE}/pods/{handle.backend_id}"
        self.kube.patch(path, {"metadata": {"finalizers": [SLOW_STOP_FINALIZER]}})

    def machines_for(self, key: str) -> int:
        return sum(1 for pod in self.kube.pods(KUBE_NAMESPACE) if _pod_key(pod) == key)

    def start(self) -> None:
        self._stop = threading.Event()
        self._node = threading.Thread(target=self._play_node, name="kube-node", daemon=True)
        self._node.start()

    def leftovers(self) -> list[str]:
        left = super().leftovers()
        self._stop.set()
        self._node.join(5)
        return left

    def _play_node(self) -> None:
        while not self._stop.wait(0.05):
            try:
                for pod in self.kube.pods(KUBE_NAMESPACE):
                    self._step(pod)
            except AssertionError:
                continue  # a pod went between the list and the patch

    def _step(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{KUBE_NAMESPACE}/pods/{meta['name']}"
        if not meta.get("deletionTimestamp") and pod.get("status", {}).get("phase") == "Pending":
            running = {"name": "runner", "ready": True, "state": {"running": {"startedAt": _rfc3339_now()}}}
            self.kube.patch(
                path,
                {
                    "spec": {"nodeName": "k8s-node"},
                    "status": {
                        "phase": "Running",
                        "conditions": [{"type": "PodScheduled", "status": "True"}],
                        "containerStatuses": [running],
                    },
                },
            )


class KubernetesClusterSubject(KubernetesSubject):
    """A real cluster, when ``KUBECONFIG`` names one (its current context;
    namespace ``TRAINYARD_TEST_KUBE_NAMESPACE``, default ``trainyard-test``,
    which must exist): real nodes, real kubelets, real grace periods. The
    pods run a shell loop that exits on SIGTERM; the catalog tests use the
    shapes as facts (their pods are never launched)."""

    needs_kube = False

    def build(self, *, installation: str = INSTALLATION, account_id: str = "acct-1", **config: Any) -> Compute:
        return Subject.build(self, installation=installation, account_id=account_id, **config)

    @property
    def namespace(self) -> str:
        return os.environ.get("TRAINYARD_TEST_KUBE_NAMESPACE", "trainyard-test")

    def skip_reason(self) -> str:
        if not os.environ.get("KUBECONFIG"):
            return "KUBECONFIG is not set: the contract suite runs on a real cluster only when it names one"
        return ""

    def credentials(self) -> dict[str, str]:
        return {"kubeconfig": Path(os.environ["KUBECONFIG"]).read_text()}

    def config(self) -> dict[str, Any]:
        base = {
            "namespace": self.namespace,
            "allowed_networks": ["0.0.0.0/0", "::/0"],
            "termination_grace_seconds": 3,
            "image": os.environ.get("TRAINYARD_TEST_KUBE_IMAGE", "busybox:1.37"),
        }
        if not hasattr(self, "_facts"):
            self._facts = compute_for(self._account(base)).refresh_facts()
        return {**base, "facts": self._facts}

    def _account(self, config: dict[str, Any]) -> AccountConfig:
        return AccountConfig("acct-1", "ws-1", self.kind, INSTALLATION, config, self.credentials())

    def spec(self, *, key: str | None = None) -> LaunchSpec:
        spec = super().spec(key=key)
        return dataclasses.replace(spec, user_data="trap 'exit 0' TERM; while :; do sleep 1; done")

    def settle(self, handle: Handle) -> None:
        compute = self.built[-1]
        wait_for(lambda: states(compute, handle) == [CloudState.RUNNING], timeout=300, what="the pod running")

    def machines_for(self, key: str) -> int:
        compute = compute_for(self._account(self.config()))
        return sum(1 for state in compute.describe([Handle(key=key)]).values() if state not in GONE)

    def start(self) -> None:
        return None

    def leftovers(self) -> list[str]:
        return Subject.leftovers(self)


def kubeconfig_text(server: str, token: str, *, user: Mapping[str, Any] | None = None, **cluster: Any) -> str:
    """A kubeconfig with one context: ``server`` (plus ``cluster`` keys) and
    a user with ``token`` (or exactly ``user``)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "test", "user": dict(user) if user is not None else {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "current-context": "test",
    }
    return str(yaml.safe_dump(config, sort_keys=False))


def node_facts(shapes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``facts`` a refresh would store for Ready nodes of these shapes
    (``name`` is the instance type; ``spot``, ``gpus`` optional)."""
    nodes = []
    for shape in shapes:
        gpus = shape.get("gpus") or []
        nodes.append(
            {
                "name": f"node-{shape['name']}",
                "instance_type": shape["name"],
                "type_label": "node.kubernetes.io/instance-type",
                "spot": bool(shape.get("spot", False)),
                "capacity_label": "",
                "cpus": shape["cpus"],
                "memory_bytes": shape["memory_bytes"],
                "disk_bytes": shape.get("disk_bytes", 0),
                "gpus": len(gpus),
                "gpu_name": gpus[0]["name"] if gpus else "",
                "gpu_memory_bytes": gpus[0]["memory_bytes"] if gpus else 0,
                "ready": True,
                "unschedulable": False,
                "taints": [],
            }
        )
    return {"nodes": nodes, "gpu_resources": ["nvidia.com/gpu"], "checked_at": _rfc3339_now()}


def _pod_key(pod: Mapping[str, Any]) -> str:
    tags = json.loads(pod.get("metadata", {}).get("annotations", {}).get("trainyard.dev/tags", "{}"))
    return str(tags.get("trainyard:key", ""))


def _rfc3339_now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


SUBJECTS: dict[str, type[Subject]] = {
    "local": LocalSubject,
    "fake": FakeSubject,
    "fake-runner": FakeWithRunnerSubject,
    "aws": AwsSubject,
    "kubernetes": KubernetesSubject,
    "kubernetes-cluster": KubernetesClusterSubject,
}


def states(compute: Compute, *handles: Handle) -> list[CloudState]:
    found = compute.describe(list(handles))
    return [found[h.key] for h in handles]
