"""The ``kubernetes`` backend: one bare Pod per machine in the user's cluster.

The contract's mapping (docs/BACKENDS.md, "Kubernetes"):

- ``offers``: one per instance type and market of the Ready, schedulable
  nodes in ``config["facts"]`` (``refresh_facts`` lists the nodes), and one
  per configured node pool; priced from the config; no network call.
- ``launch``: GET the key's pod (``pods.pod_name``): a live one is adopted,
  a finished one deleted first; else POST it (409 AlreadyExists: another
  worker won, its pod is adopted). Returns at once: the pod is Pending.
- ``describe`` / ``view``: one list of the account's pods (label selector,
  checked again here), and the namespace's events only when a pod's status
  does not say why it waits or a pod vanished.
- ``terminate``: DELETE the pod (its grace period: the runner's notice),
  ``NotYetTerminated`` while it is still there; a pod stuck terminating past
  its grace (its node gone) is deleted with grace 0.
- ``list_managed``: the account's pods that are not going down.

Config keys: ``config.py``. Errors: ``errors.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from backend.clouds.backends.base import (
    LAUNCHED_AT,
    AccountConfig,
    CloudState,
    Compute,
    Handle,
    LaunchSpec,
    MachineView,
    Offer,
    Requirements,
    Timings,
    Trouble,
)
from backend.clouds.backends.errors import ComputeError, NoCapacity, NotYetTerminated, Transient
from backend.clouds.backends.kubernetes import pods
from backend.clouds.backends.kubernetes.client import KubeClient, path_of
from backend.clouds.backends.kubernetes.config import KubeOptions
from backend.clouds.backends.kubernetes.offers import facts_of, make_offers

PROVISION_TIMEOUT = 600.0  # scheduled → image pulled → runner installed → hello
SCHEDULE_TIMEOUT = 300.0
STUCK_MARGIN = 60.0  # a pod still terminating this long after its grace is deleted with grace 0


class KubernetesCompute(Compute):
    kind = "kubernetes"
    reusable_instances = False  # a pod runs one job's runner and goes
    supports_spot = True
    boots_from_image = True  # the pod's command is LaunchSpec.user_data
    terminates_with_notice = True  # the runner's notice is the pod's deletion; terminate keeps its grace
    timings = Timings(provision_timeout=PROVISION_TIMEOUT, schedule_timeout=SCHEDULE_TIMEOUT)

    def __init__(self, account: AccountConfig) -> None:
        super().__init__(account)
        self.options = KubeOptions.of(account)
        self.facts = account.config.get("facts")
        self.client = KubeClient(
            self.options.endpoint, allowed_networks=self.options.allowed_networks, namespace=self.options.namespace
        )
        # Pods this object deleted: their absence is no news (``view``).
        self._deleted: set[str] = set()

    @property
    def schedule_timeout_seconds(self) -> float:
        """How long a pod may wait unschedulable before the services give up on it."""
        return self.options.schedule_timeout

    def provision_timeout_for(self, offer: Offer) -> float:
        """Launch → hello: the schedule timeout (a pod may wait that long for
        a node) plus the image pull and the runner's install."""
        return self.options.schedule_timeout + PROVISION_TIMEOUT

    def refresh_facts(self) -> dict[str, object]:
        """The cluster's nodes as ``offers`` reads them (``offers.facts_of``): one list of nodes."""
        nodes = self.client.list("/api/v1/nodes", resource="nodes")
        return facts_of(nodes, gpu_resource=self.options.gpu_resource)

    def offers(self, req: Requirements) -> Iterable[Offer]:
        return make_offers(self.kind, self.options, self.facts, req)

    def launch(self, offer: Offer, spec: LaunchSpec) -> Handle:
        """Adopt the key's live pod, else create it (module docstring)."""
        key = spec.idempotency_key
        if not key:
            raise ComputeError("a launch needs an idempotency key", code="BadKey")
        if not self._known(offer):
            raise NoCapacity(
                f"the cluster {self.options.cluster} has no {offer.instance_type} "
                f"({'spot' if offer.spot else 'on-demand'}) nodes or node pool",
                code="UnknownOffer",
            )
        name = pods.pod_name(key)
        path = path_of(self.options.namespace, "pods", name)
        found = self.client.get(path, resource="pods")
        if found is not None:
            adopted = self._adopt(found, key)
            if adopted is not None:
                return adopted
        status, answer = self.client.create(
            path_of(self.options.namespace, "pods"),
            pods.manifest(self.account, self.options, offer, spec),
            resource="pods",
        )
        if status == 409:  # another worker created it first
            answer = self.client.get(path, resource="pods")
            adopted = self._adopt(answer, key) if answer is not None else None
            if adopted is None:
                raise Transient(
                    f"the pod {name} was just created and is already going", code="Conflict", retry_after=1.0
                )
            return adopted
        self._deleted.discard(name)
        return self._handle(answer)

    def describe(self, handles: Sequence[Handle]) -> Mapping[str, CloudState]:
        return {key: view.state for key, view in self.view(handles).items()}

    def view(self, handles: Sequence[Handle]) -> Mapping[str, MachineView]:
        """One list of the account's pods; the namespace's events only when
        one of them needs them (``pods.needs_events``, or a pod gone that this
        object did not delete)."""
        if not handles:
            return {}
        by_name = {pods.pod_name(h.key): pod for pod in self._pods() if (h := _keyed(pod)) is not None}
        found: dict[str, Mapping[str, Any] | None] = {}
        for handle in handles:
            pod = by_name.get(pods.pod_name(handle.key))
            uid = handle.data.get("uid", "")
            if pod is not None and uid and (pod.get("metadata") or {}).get("uid") != uid:
                pod = None  # a later pod of the same key: the handle's own is gone
            found[handle.key] = pod
        vanished = [
            h for h in handles if found[h.key] is None and h.backend_id and pods.pod_name(h.key) not in self._deleted
        ]
        wanting = bool(vanished) or any(p is not None and pods.needs_events(p) for p in found.values())
        events = pods.events_by_pod(self._events()) if wanting else {}
        views: dict[str, MachineView] = {}
        for handle in handles:
            pod = found[handle.key]
            name = pods.pod_name(handle.key)
            if pod is None:
                if handle in vanished:
                    about = events.get(handle.data.get("uid", ""), []) or events.get("name:" + name, [])
                    views[handle.key] = self._gone(handle, about)
                else:
                    views[handle.key] = MachineView(CloudState.NOT_FOUND)
                continue
            uid = str((pod.get("metadata") or {}).get("uid", ""))
            about = events.get(uid, []) or events.get("name:" + name, [])
            node_gone = pods.may_be_preempted(pod) and self._node_gone(pod)
            views[handle.key] = pods.pod_view(pod, about, node_gone=node_gone)
        return views

    def terminate(self, handle: Handle) -> None:
        """DELETE the pod; done when it is gone. ``NotYetTerminated`` while it
        is going down (its runner has its grace period for the notice)."""
        name = pods.pod_name(handle.key)
        path = path_of(self.options.namespace, "pods", name)
        uid = handle.data.get("uid", "")
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        pod = self.client.get(path, resource="pods")
        if pod is None or (uid and (pod.get("metadata") or {}).get("uid") != uid):
            self._deleted.add(name)
            return
        if not self._owned(pod, handle.key):
            raise ComputeError(f"the pod {name} does not carry this installation's key {handle.key!r}", code="NotOurs")
        if _stuck(pod):
            body["gracePeriodSeconds"] = 0
        answer = self.client.delete(path, resource="pods", body=body)
        self._deleted.add(name)
        going = answer is not None and (answer.get("metadata") or {}).get("deletionTimestamp")
        if not going and self.client.get(path, resource="pods") is None:
            return
        raise NotYetTerminated(f"the pod {name} is going down", retry_after=2.0)

    def list_managed(self) -> Sequence[Handle]:
        """The account's pods that are not going down (finished ones included:
        the leak sweep deletes their objects too)."""
        found = []
        for pod in self._pods():
            handle = _keyed(pod)
            if handle is not None and not (pod.get("metadata") or {}).get("deletionTimestamp"):
                found.append(handle)
        return found

    # ------------------------------------------------------------------ helpers

    def _pods(self) -> list[Mapping[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in pods.owner_labels(self.account).items())
        items = self.client.list(
            path_of(self.options.namespace, "pods"), params={"labelSelector": selector}, resource="pods"
        )
        return [pod for pod in items if pods.ours(pod, self.account)]

    def _events(self) -> list[Mapping[str, Any]]:
        return self.client.list(
            path_of(self.options.namespace, "events"),
            params={"fieldSelector": "involvedObject.kind=Pod"},
            resource="events",
        )

    def _gone(self, handle: Handle, events: Sequence[Mapping[str, Any]]) -> MachineView:
        """A pod that vanished: what its events say (``pods.gone_view``); when
        they name no cause, the node it was assigned to, if that is gone too
        (the pod garbage collector deletes the pods of a vanished node)."""
        view = pods.gone_view(events)
        node = pods.assigned_node(events)
        if view.message != pods.DELETED_SILENTLY or not node or not self._node_missing(node):
            return view
        if handle.data.get("spot") == "true":
            return MachineView(CloudState.INTERRUPTED, Trouble.PREEMPTED, f"its spot node {node} is gone")
        return MachineView(CloudState.NOT_FOUND, Trouble.NODE_LOST, f"its node {node} is gone")

    def _node_missing(self, node: str) -> bool:
        return self.client.get(f"/api/v1/nodes/{quote(node, safe='')}", resource="nodes") is None

    def _node_gone(self, pod: Mapping[str, Any]) -> bool:
        node = (pod.get("status") or {}).get("nodeName") or (pod.get("spec") or {}).get("nodeName")
        return bool(node) and self._node_missing(str(node))

    def _known(self, offer: Offer) -> bool:
        if offer.region != self.options.cluster:
            return False
        return any(o.instance_type == offer.instance_type and o.spot == offer.spot for o in self._every_offer())

    def _every_offer(self) -> list[Offer]:
        return make_offers(self.kind, self.options, self.facts, Requirements(spot_policy="auto"))

    def _owned(self, pod: Mapping[str, Any], key: str) -> bool:
        return pods.ours(pod, self.account) and pods.key_of(pod) == key

    def _adopt(self, pod: Mapping[str, Any], key: str) -> Handle | None:
        """The handle of the key's live pod; None once a finished one is
        deleted (a new one may be made); ``Transient`` while one is going down."""
        name = str((pod.get("metadata") or {}).get("name", ""))
        if not self._owned(pod, key):
            raise ComputeError(
                f"the pod {name} exists in namespace {self.options.namespace} but is not this installation's "
                f"machine for key {key!r}; delete it or use another namespace",
                code="PodNameTaken",
            )
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            raise Transient(f"the previous pod {name} of this key is still going down", code="PodTerminating")
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self.client.delete(path_of(self.options.namespace, "pods", name), resource="pods")
            if self.client.get(path_of(self.options.namespace, "pods", name), resource="pods") is not None:
                raise Transient(f"the previous pod {name} of this key is still going down", code="PodTerminating")
            return None
        return self._handle(pod)

    def _handle(self, pod: Mapping[str, Any]) -> Handle:
        handle = _keyed(pod)
        if handle is None:
            raise ComputeError("the API server answered a pod without its key annotation", code="BadAnswer")
        return handle


def _keyed(pod: Mapping[str, Any]) -> Handle | None:
    """The handle of one of our pods (None without a key): ``backend_id`` =
    the pod's name; ``data``: its uid, launched_at, instance type, spot."""
    key = pods.key_of(pod)
    if not key:
        return None
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    offer = str(annotations.get(pods.OFFER, ""))
    parts = offer.split("/")
    return Handle(
        key=key,
        backend_id=str(meta.get("name", "")),
        region=parts[1] if len(parts) == 5 else "",
        data={
            "uid": str(meta.get("uid", "")),
            "namespace": str(meta.get("namespace", "")),
            LAUNCHED_AT: str(int(pods.created_at(pod))),
            "instance_type": parts[3] if len(parts) == 5 else "",
            "spot": str(annotations.get(pods.SPOT) == "true").lower(),
        },
    )


def _stuck(pod: Mapping[str, Any]) -> bool:
    """Terminating well past its grace period: its node is gone or its kubelet silent."""
    meta = pod.get("metadata") or {}
    since = pods.rfc3339(meta.get("deletionTimestamp"))
    grace = float(
        meta.get("deletionGracePeriodSeconds") or (pod.get("spec") or {}).get("terminationGracePeriodSeconds") or 30
    )
    return bool(since) and time.time() - since > grace + STUCK_MARGIN
