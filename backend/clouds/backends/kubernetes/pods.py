"""A machine is one bare Pod: its name, labels and manifest, and what its
status and events say (``MachineView``). Plain functions on dicts as the
API server serves them; no network call here.

Names and labels:

- the pod is ``ty-`` + the idempotency key, lower-cased, anything but
  ``[a-z0-9-]`` as ``-``, at most 63 characters (a DNS-1123 label); a key
  that does not survive that unchanged gets 8 hex characters of its hash
  instead of its tail, so two keys never share a pod;
- labels ``trainyard.dev/installation``, ``/account``, ``/workspace``,
  ``/instance``, ``/key`` (label-value-safe forms: a value that is not one
  is cut and given a hash the same way); the full values are annotations
  (``trainyard.dev/tags``: JSON), which is what ``ours`` compares.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backend.clouds.backends.base import AccountConfig, CloudState, LaunchSpec, MachineView, Offer, Trouble
from backend.clouds.backends.kubernetes.config import KubeOptions, label_safe

PREFIX = "trainyard.dev/"
INSTALLATION = PREFIX + "installation"
ACCOUNT = PREFIX + "account"
WORKSPACE = PREFIX + "workspace"
INSTANCE = PREFIX + "instance"
KEY = PREFIX + "key"
TAGS = PREFIX + "tags"
SPOT = PREFIX + "spot"
OFFER = PREFIX + "offer"
CONTAINER = "runner"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
GIB = 2**30
MIB = 2**20
# Spot nodes of GKE and AKS carry these taints; a spot offer's pod tolerates them.
SPOT_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    {"key": "cloud.google.com/gke-preemptible", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
)
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
MAX_MESSAGE = 500
_NOT_NAME = re.compile(r"[^a-z0-9-]")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9._-]")


def pod_name(key: str) -> str:
    """The pod of ``key`` (module docstring): stable, DNS-1123, one per key."""
    name = "ty-" + _NOT_NAME.sub("-", key.lower())
    if name == "ty-" + key and len(name) <= 63 and not name.endswith("-"):
        return name
    return (name[:54].rstrip("-") + "-" + _digest(key))[:63]


def label_value(value: str) -> str:
    """``value`` when Kubernetes takes it as a label value, else a cut form with its hash."""
    if label_safe(value):
        return value
    cut = _NOT_LABEL.sub("-", value)[:54].strip("-_.")
    return f"{cut}-{_digest(value)}" if cut else _digest(value)


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:8]


def machine_tags(account: AccountConfig, spec: LaunchSpec) -> dict[str, str]:
    """The spec's tags with what marks the pod as ours (the account's installation, whatever the spec says)."""
    return {
        **spec.tags,
        "trainyard:installation": account.installation,
        "trainyard:account": account.account_id,
        "trainyard:workspace": account.workspace_id,
        "trainyard:key": spec.idempotency_key,
    }


def owner_labels(account: AccountConfig) -> dict[str, str]:
    """The labels every pod of this installation's account carries (the list's label selector)."""
    return {INSTALLATION: label_value(account.installation), ACCOUNT: label_value(account.account_id)}


def tags_of(pod: Mapping[str, Any]) -> dict[str, str]:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        tags = json.loads(annotations.get(TAGS, "{}"))
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in tags.items()} if isinstance(tags, dict) else {}


def ours(pod: Mapping[str, Any], account: AccountConfig) -> bool:
    """The pod carries this installation's and this account's labels and
    tags: what a list's label selector asks for, checked here too (an API
    server may ignore the selector; a pod may carry copied labels)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in owner_labels(account).items()):
        return False
    tags = tags_of(pod)
    return tags.get("trainyard:installation") == account.installation and tags.get("trainyard:account") == (
        account.account_id
    )


def key_of(pod: Mapping[str, Any]) -> str:
    return tags_of(pod).get("trainyard:key", "")


@dataclass(frozen=True)
class PodAsk:
    """What the pod requests: the job's resources (at least 1 CPU and 1 GiB)."""

    cpus: int = 1
    memory_bytes: int = GIB
    gpus: int = 0
    shm_bytes: int = 0

    def to_data(self) -> dict[str, str]:
        return {
            "ask_cpus": str(self.cpus),
            "ask_memory_bytes": str(self.memory_bytes),
            "ask_gpus": str(self.gpus),
            "ask_shm_bytes": str(self.shm_bytes),
        }

    @classmethod
    def from_data(cls, data: Mapping[str, str]) -> PodAsk:
        def number(key: str, default: int) -> int:
            try:
                return int(data.get(key, default))
            except ValueError:
                return default

        return cls(
            cpus=max(number("ask_cpus", 1), 1),
            memory_bytes=max(number("ask_memory_bytes", GIB), GIB),
            gpus=max(number("ask_gpus", 0), 0),
            shm_bytes=max(number("ask_shm_bytes", 0), 0),
        )


def manifest(account: AccountConfig, options: KubeOptions, offer: Offer, spec: LaunchSpec) -> dict[str, Any]:
    """The pod for ``spec`` on ``offer`` (docs/BACKENDS.md, "Kubernetes", the pod)."""
    ask = PodAsk.from_data(offer.data)
    tags = machine_tags(account, spec)
    labels = {
        **owner_labels(account),
        WORKSPACE: label_value(account.workspace_id),
        INSTANCE: label_value(spec.tags.get("trainyard:instance", "")),
        KEY: label_value(spec.idempotency_key),
    }
    annotations = {
        TAGS: json.dumps(tags, sort_keys=True),
        SPOT: "true" if offer.spot else "false",
        OFFER: offer.offer_id,
    }
    memory_mib = -(-ask.memory_bytes // MIB)
    quantities: dict[str, str] = {"cpu": str(ask.cpus), "memory": f"{memory_mib}Mi"}
    limits = dict(quantities)
    if ask.gpus:
        limits[options.gpu_resource] = str(ask.gpus)
    resources = {
        "cpus": ask.cpus,
        "memory_bytes": memory_mib * MIB,
        "disk_bytes": offer.disk_bytes,
        "gpus": [gpu.to_data() for gpu in offer.gpus[: ask.gpus]],
    }
    env = {
        "TRAINYARD_BOOT_FOREGROUND": "1",
        "TRAINYARD_POWER_OFF_COMMAND": "true",
        "TRAINYARD_RUNNER_TERMINATION_GRACE": str(options.termination_grace),
        "TRAINYARD_RUNNER_RESOURCES": json.dumps(resources, separators=(",", ":")),
    }
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": options.image,
        "command": ["/bin/sh", "-c", spec.user_data],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": {"requests": quantities, "limits": limits},
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": options.termination_grace,
        "containers": [container],
        "nodeSelector": node_selector(options, offer),
        "tolerations": tolerations(options, offer, gpus=ask.gpus),
    }
    if options.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in options.image_pull_secrets]
    if ask.shm_bytes:
        pod_spec["volumes"] = [
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{-(-ask.shm_bytes // MIB)}Mi"}}
        ]
        container["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(spec.idempotency_key),
            "namespace": options.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


def node_selector(options: KubeOptions, offer: Offer) -> dict[str, str]:
    """The offer's node pool's own selector, or its instance type label; its
    market's capacity-type label; the account's ``node_selector``."""
    selector: dict[str, str] = {}
    pool = next((p for p in options.node_pools if p.name == offer.data.get("pool")), None)
    if pool is not None and pool.node_selector:
        selector.update(pool.node_selector)
    elif offer.data.get("type_label"):
        selector[offer.data["type_label"]] = offer.instance_type
    capacity = offer.data.get("capacity_label", "")
    if "=" in capacity:
        name, _, value = capacity.partition("=")
        selector.setdefault(name, value)
    selector.update(options.node_selector)
    return selector


def tolerations(options: KubeOptions, offer: Offer, *, gpus: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if gpus:
        found.append({"key": options.gpu_resource, "operator": "Exists", "effect": "NoSchedule"})
    found.extend(dict(t) for t in options.tolerations)
    pool = next((p for p in options.node_pools if p.name == offer.data.get("pool")), None)
    if pool is not None:
        found.extend(dict(t) for t in pool.tolerations)
    if offer.spot:
        found.extend(dict(t) for t in SPOT_TOLERATIONS)
    unique: list[dict[str, Any]] = []
    for toleration in found:
        if toleration not in unique:
            unique.append(toleration)
    return unique


# ---------------------------------------------------------------------- view


def pod_view(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]], *, node_gone: bool = False) -> MachineView:
    """What the pod's status (and its events) say (docs/BACKENDS.md, "Kubernetes", states).
    ``node_gone``: the node it ran on no longer exists."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    spot = (meta.get("annotations") or {}).get(SPOT) == "true"
    disruption = _condition(status, "DisruptionTarget", "True")
    if phase in ("Pending", "Running") and meta.get("deletionTimestamp"):
        if disruption is not None:
            reason = _disruption_trouble(str(disruption.get("reason", "")), spot=spot)
            return _view(CloudState.STOPPING, reason, disruption)
        return MachineView(CloudState.STOPPING)
    if phase == "Pending":
        return _pending(status, events, uid=str(meta.get("uid", "")))
    if phase == "Running":
        return MachineView(CloudState.RUNNING)
    if phase == "Succeeded":
        return MachineView(CloudState.TERMINATED)
    # Failed (or a phase this backend does not know: nothing runs there).
    if status.get("reason") == "Evicted":
        return MachineView(CloudState.TERMINATED, Trouble.EVICTED, _short(str(status.get("message", ""))))
    if disruption is not None:
        reason = _disruption_trouble(str(disruption.get("reason", "")), spot=spot)
        state = CloudState.INTERRUPTED if reason is Trouble.PREEMPTED else CloudState.TERMINATED
        return _view(state, reason, disruption)
    if spot and node_gone:
        node = status.get("nodeName") or (pod.get("spec") or {}).get("nodeName") or ""
        return MachineView(CloudState.INTERRUPTED, Trouble.PREEMPTED, f"its spot node {node} is gone")
    return MachineView(CloudState.TERMINATED)


def gone_view(events: Sequence[Mapping[str, Any]]) -> MachineView:
    """A pod that no longer exists and that this backend did not delete: its
    events may say why, whatever came after (a preempted or evicted pod is
    then killed too): ``Preempted``, else ``Evicted``, else ``Killing``;
    without a word, someone deleted it."""
    latest = sorted(events, key=_event_time, reverse=True)
    for reason, state, trouble in (
        ("Preempted", CloudState.INTERRUPTED, Trouble.PREEMPTED),
        ("Evicted", CloudState.NOT_FOUND, Trouble.EVICTED),
        ("Killing", CloudState.NOT_FOUND, Trouble.DELETED),
    ):
        event = next((e for e in latest if e.get("reason") == reason), None)
        if event is not None:
            message = _short(str(event.get("message", "")))
            if trouble is Trouble.DELETED:
                message = f"the pod was deleted ({message})"
            return MachineView(state, trouble, message, _event_time(event))
    return MachineView(CloudState.NOT_FOUND, Trouble.DELETED, DELETED_SILENTLY)


DELETED_SILENTLY = "the pod was deleted, not by Trainyard"
_ASSIGNED = re.compile(r"^Successfully assigned \S+ to (\S+)$")


def assigned_node(events: Sequence[Mapping[str, Any]]) -> str:
    """The node the scheduler's ``Scheduled`` event names ("" without one)."""
    for event in sorted(events, key=_event_time, reverse=True):
        match = _ASSIGNED.match(str(event.get("message", ""))) if event.get("reason") == "Scheduled" else None
        if match:
            return match.group(1)
    return ""


def may_be_preempted(pod: Mapping[str, Any]) -> bool:
    """A failed spot pod with no word why: its node's absence would say it was reclaimed."""
    status = pod.get("status") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return (
        status.get("phase") == "Failed"
        and status.get("reason") != "Evicted"
        and annotations.get(SPOT) == "true"
        and _condition(status, "DisruptionTarget", "True") is None
        and bool(status.get("nodeName") or (pod.get("spec") or {}).get("nodeName"))
    )


def needs_events(pod: Mapping[str, Any]) -> bool:
    """A pending pod that is not scheduled: its events say why it waits (when
    its status does not), since when, and whether an autoscaler is adding a
    node for it."""
    status = pod.get("status") or {}
    scheduled = _condition(status, "PodScheduled", None)
    return (
        status.get("phase", "Pending") == "Pending"
        and not (pod.get("metadata") or {}).get("deletionTimestamp")
        and (scheduled is None or scheduled.get("status") == "False" or _pull_failing(status) is not None)
    )


def _pull_failing(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container's waiting state when its image cannot be pulled."""
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            return dict(waiting)
    return None


def events_by_pod(events: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Events about pods, by the pod's uid and by its name (either may be all an event names)."""
    found: dict[str, list[Mapping[str, Any]]] = {}
    for event in events:
        target = event.get("involvedObject") or event.get("regarding") or {}
        if target.get("kind") != "Pod":
            continue
        for ref in {str(target.get("uid") or ""), "name:" + str(target.get("name") or "")} - {"", "name:"}:
            found.setdefault(ref, []).append(event)
    return found


def _pending(status: Mapping[str, Any], events: Sequence[Mapping[str, Any]], *, uid: str) -> MachineView:
    waiting = _pull_failing(status)
    if waiting is not None:
        message = f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
        # Backing off, the status says only that; the runtime's error is in the last pull's event.
        pulls = [e for e in events if e.get("reason") == "Failed" and str(e.get("message", "")).startswith(PULL_FAILED)]
        error = str(max(pulls, key=_event_time).get("message", "")) if pulls else ""
        if error and error not in message:
            message = f"{message}; {error}"
        return MachineView(CloudState.PENDING, Trouble.IMAGE_PULL, _short(message), _since(events, IMAGE_PULL_EVENTS))
    scheduled = _condition(status, "PodScheduled", None)
    failed = [e for e in events if e.get("reason") == "FailedScheduling"]
    autoscaler = [e for e in events if e.get("reason") in SCALE_UP or e.get("reason") == NO_SCALE_UP]
    if failed or scheduled is not None:
        latest = max(autoscaler, key=_event_time, default=None)
        if latest is not None and latest.get("reason") in SCALE_UP:
            # Not stuck: a node is on its way (cluster-autoscaler, Karpenter).
            message = _short(f"a node is being added: {latest.get('message', '')}")
            return MachineView(CloudState.PENDING, None, message, _first_time(latest))
    if scheduled is not None and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        since = min(
            filter(None, [rfc3339(scheduled.get("lastTransitionTime")), *(_first_time(e) for e in failed)]), default=0.0
        )
        return MachineView(CloudState.PENDING, Trouble.UNSCHEDULABLE, _short(str(scheduled.get("message", ""))), since)
    if scheduled is None and failed:
        latest = max(failed, key=_event_time)
        since = min((_first_time(e) for e in failed), default=0.0)
        return MachineView(CloudState.PENDING, Trouble.UNSCHEDULABLE, _short(str(latest.get("message", ""))), since)
    return MachineView(CloudState.PENDING)


IMAGE_PULL_EVENTS = frozenset({"Failed", "BackOff"})
PULL_FAILED = "Failed to pull image"
# Autoscalers' events on a pod they add a node for (cluster-autoscaler's
# TriggeredScaleUp, Karpenter's Nominated), and cluster-autoscaler's word that it will not.
SCALE_UP = frozenset({"TriggeredScaleUp", "Nominated"})
NO_SCALE_UP = "NotTriggerScaleUp"


def _since(events: Sequence[Mapping[str, Any]], reasons: frozenset[str]) -> float:
    return min((_first_time(e) for e in events if e.get("reason") in reasons), default=0.0)


def _disruption_trouble(reason: str, *, spot: bool) -> Trouble:
    if reason in ("PreemptionByScheduler", "PreemptionByKubeScheduler"):
        return Trouble.PREEMPTED
    if reason == "EvictionByEvictionAPI":
        return Trouble.EVICTED
    # The node went (tainted away, shut down, or vanished and its pods
    # collected): on a spot node that is the cloud reclaiming it.
    if reason in ("DeletionByTaintManager", "TerminationByKubelet", "DeletionByPodGC"):
        return Trouble.PREEMPTED if spot else Trouble.NODE_LOST
    return Trouble.NODE_LOST


def _view(state: CloudState, reason: Trouble, condition: Mapping[str, Any]) -> MachineView:
    words = str(condition.get("message") or condition.get("reason") or "")
    return MachineView(state, reason, _short(words), rfc3339(condition.get("lastTransitionTime")))


def _condition(status: Mapping[str, Any], kind: str, value: str | None) -> Mapping[str, Any] | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == kind and (value is None or condition.get("status") == value):
            return dict(condition)
    return None


def _first_time(event: Mapping[str, Any]) -> float:
    return (
        rfc3339(event.get("firstTimestamp")) or rfc3339(event.get("eventTime")) or rfc3339(event.get("lastTimestamp"))
    )


def _event_time(event: Mapping[str, Any]) -> float:
    return (
        rfc3339(event.get("lastTimestamp")) or rfc3339(event.get("eventTime")) or rfc3339(event.get("firstTimestamp"))
    )


def rfc3339(text: object) -> float:
    """Unix seconds of an RFC 3339 time; 0.0 when there is none."""
    if not isinstance(text, str) or not text:
        return 0.0
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def created_at(pod: Mapping[str, Any]) -> float:
    return rfc3339((pod.get("metadata") or {}).get("creationTimestamp"))


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"
