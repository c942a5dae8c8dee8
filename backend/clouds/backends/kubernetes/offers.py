"""Node facts and the offers made from them (docs/BACKENDS.md, "Kubernetes", offers).

``node_fact`` reads what a node says about itself: its instance type and
capacity type labels, GPU feature discovery's product and memory labels,
its allocatable CPU, memory, ephemeral storage and GPUs, whether it is Ready
and schedulable, its NoSchedule taints. ``refresh_facts`` stores them;
``offers`` makes one offer per instance type and market from them (and one
per configured node pool), with no network call.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from backend.clouds.backends.base import Gpu, Offer, Requirements, in_placement
from backend.clouds.backends.kubernetes.config import KubeOptions, NodePool
from backend.clouds.backends.kubernetes.pods import GIB, MIB, SPOT_TOLERATIONS, PodAsk

TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
NO_TYPE = "node"  # the instance type of nodes that carry no instance type label
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB
# Capacity type labels: (label, value on spot nodes, value on on-demand nodes or "").
CAPACITY_LABELS = (
    ("karpenter.sh/capacity-type", "spot", "on-demand"),
    ("eks.amazonaws.com/capacityType", "SPOT", "ON_DEMAND"),
    ("cloud.google.com/gke-spot", "true", ""),
    ("cloud.google.com/gke-preemptible", "true", ""),
    ("kubernetes.azure.com/scalesetpriority", "spot", ""),
)
_QUANTITY = re.compile(r"^([0-9.]+(?:[eE][-+]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIX: dict[str, int | Decimal] = {
    "": 1,
    "m": Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}


def quantity(text: object) -> Decimal:
    """A Kubernetes quantity ("7910m", "32Gi", "1") as a number; 0 when it is none."""
    match = _QUANTITY.match(str(text or "").strip())
    if not match or match.group(2) not in _SUFFIX:
        return Decimal(0)
    try:
        return Decimal(match.group(1)) * Decimal(_SUFFIX[match.group(2)])
    except InvalidOperation:
        return Decimal(0)


def node_fact(node: Mapping[str, Any], *, gpu_resource: str) -> dict[str, Any]:
    """What ``offers`` needs of one node, as JSON."""
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or {}
    type_label = next((label for label in TYPE_LABELS if labels.get(label)), "")
    spot, capacity_label = _market(labels)
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    gpus = int(quantity(allocatable.get(gpu_resource)))
    product = str(labels.get(GPU_PRODUCT, ""))
    return {
        "name": str(meta.get("name", "")),
        "instance_type": labels[type_label] if type_label else NO_TYPE,
        "type_label": type_label,
        "spot": spot,
        "capacity_label": capacity_label,
        "cpus": int(quantity(allocatable.get("cpu"))),
        "memory_bytes": int(quantity(allocatable.get("memory"))),
        "disk_bytes": int(quantity(allocatable.get("ephemeral-storage"))),
        "gpus": gpus,
        # GPU feature discovery writes NVIDIA-A100-SXM4-40GB; nvidia-smi says NVIDIA A100-SXM4-40GB.
        "gpu_name": product.replace("-", " ", 1) if product.startswith("NVIDIA-") else product,
        "gpu_memory_bytes": int(quantity(labels.get(GPU_MEMORY))) * MIB,
        "ready": ready,
        "unschedulable": bool(spec.get("unschedulable")),
        "taints": [
            {k: t[k] for k in ("key", "value", "effect") if t.get(k)}
            for t in spec.get("taints") or []
            if t.get("effect") in ("NoSchedule", "NoExecute")
        ],
    }


def facts_of(nodes: Sequence[Mapping[str, Any]], *, gpu_resource: str) -> dict[str, Any]:
    """``refresh_facts``'s answer: the nodes, the GPU resources they
    advertise, when (``checked_at`` as text, ``refreshed_at`` in Unix seconds)."""
    resources = sorted(
        {
            name
            for node in nodes
            for name, amount in ((node.get("status") or {}).get("allocatable") or {}).items()
            if _is_gpu_resource(name) and quantity(amount) > 0
        }
    )
    now = datetime.datetime.now(tz=datetime.UTC)
    return {
        "nodes": [node_fact(node, gpu_resource=gpu_resource) for node in nodes],
        "gpu_resources": resources,
        "checked_at": now.isoformat(timespec="seconds"),
        "refreshed_at": now.timestamp(),
    }


def make_offers(kind: str, options: KubeOptions, facts: object, req: Requirements) -> list[Offer]:
    """One offer per (instance type, market) among the usable nodes, with the
    largest node's resources, and one per node pool not already offered;
    each priced from the config; filtered by ``in_placement``."""
    ask = PodAsk(
        cpus=max(req.cpu or 1, 1),
        memory_bytes=max(req.memory_bytes or GIB, GIB),
        gpus=req.gpu_count,
        shm_bytes=req.shm_size_bytes or 0,
    ).to_data()
    best: dict[tuple[str, bool], Mapping[str, Any]] = {}
    for node in _nodes(facts):
        if not _usable(node, options):
            continue
        key = (str(node["instance_type"]), bool(node["spot"]))
        if key not in best or _size(node) > _size(best[key]):
            best[key] = node
    found = [_node_offer(kind, options, node, ask) for node in best.values()]
    for pool in options.node_pools:
        if (pool.instance_type, pool.spot) not in best:
            found.append(_pool_offer(kind, options, pool, ask))
    return sorted((o for o in found if in_placement(req, o)), key=lambda o: o.offer_id)


def price_of(options: KubeOptions, instance_type: str, *, spot: bool) -> float:
    prices = options.spot_prices if spot else options.prices
    return prices.get(instance_type, options.default_price)


def _node_offer(kind: str, options: KubeOptions, node: Mapping[str, Any], ask: Mapping[str, str]) -> Offer:
    count = int(node.get("gpus") or 0)
    gpu = Gpu(str(node.get("gpu_name") or "GPU"), int(node.get("gpu_memory_bytes") or 0))
    instance_type = str(node["instance_type"])
    return Offer(
        backend=kind,
        instance_type=instance_type,
        region=options.cluster,
        spot=bool(node["spot"]),
        price_per_hour=price_of(options, instance_type, spot=bool(node["spot"])),
        cpus=int(node.get("cpus") or 0),
        memory_bytes=int(node.get("memory_bytes") or 0),
        disk_bytes=int(node.get("disk_bytes") or 0),
        gpus=(gpu,) * count,
        data={
            **ask,
            "type_label": str(node.get("type_label") or ""),
            "capacity_label": str(node.get("capacity_label") or ""),
        },
    )


def _pool_offer(kind: str, options: KubeOptions, pool: NodePool, ask: Mapping[str, str]) -> Offer:
    gpu = Gpu(pool.gpu_name or "GPU", int(pool.gpu_memory_gib * GIB))
    return Offer(
        backend=kind,
        instance_type=pool.instance_type,
        region=options.cluster,
        spot=pool.spot,
        price_per_hour=pool.price if pool.price is not None else price_of(options, pool.instance_type, spot=pool.spot),
        cpus=pool.cpus,
        memory_bytes=int(pool.memory_gib * GIB),
        # A pool's nodes are not there to ask; their disk is whatever the pool gives.
        disk_bytes=0,
        gpus=(gpu,) * pool.gpus,
        data={**ask, "pool": pool.name, "type_label": "" if pool.node_selector else TYPE_LABELS[0]},
    )


def _usable(node: Mapping[str, Any], options: KubeOptions) -> bool:
    """Ready, not cordoned, and every NoSchedule/NoExecute taint tolerated by
    what a pod of it would carry (the GPU taint, the config's, the spot ones)."""
    if not node.get("ready") or node.get("unschedulable"):
        return False
    carried = [
        {"key": options.gpu_resource, "operator": "Exists"},
        *options.tolerations,
        *(SPOT_TOLERATIONS if node.get("spot") else ()),
    ]
    return all(any(_tolerates(t, taint) for t in carried) for taint in node.get("taints") or [])


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration.get("key") == taint.get("key")
    return toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get("value", "")


def _market(labels: Mapping[str, str]) -> tuple[bool, str]:
    """(spot, the "label=value" that selects this market) from the node's labels."""
    for label, spot_value, on_demand_value in CAPACITY_LABELS:
        value = labels.get(label)
        if value is None:
            continue
        if value == spot_value:
            return True, f"{label}={value}"
        if on_demand_value and value == on_demand_value:
            return False, f"{label}={value}"
    return False, ""


def _nodes(facts: object) -> Iterable[Mapping[str, Any]]:
    nodes = facts.get("nodes") if isinstance(facts, Mapping) else None
    return [n for n in nodes if isinstance(n, Mapping) and n.get("instance_type")] if isinstance(nodes, list) else []


def _size(node: Mapping[str, Any]) -> tuple[int, int, int]:
    return int(node.get("gpus") or 0), int(node.get("cpus") or 0), int(node.get("memory_bytes") or 0)


def _is_gpu_resource(name: str) -> bool:
    return "/" in name and (name.endswith("/gpu") or name.startswith("gpu.intel.com/"))
