"""The cheapest offer each job would start from: the plan table of
``trainyard run`` and of the dry run (``--dry-run``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from backend.billing.selectors import shown
from backend.clouds.backends.base import Gpu
from backend.clouds.services.instances import root_volume_price_per_hour
from backend.clouds.services.offers import offers_rank
from backend.runs.lifecycle.placement import Placement, requirements_from
from backend.runs.models import Job


def run_offer_plan(*, run: Any) -> list[dict[str, Any]]:
    """Each job of ``run`` with the cheapest offer it would start from and
    the most it may cost (``max_cost``, estimated at submission; null:
    unbounded or unpriced): the run-creation answer's ``plan``."""
    return [
        {
            "job": job.name,
            "offer": offer_plan(
                workspace_id=run.workspace_id, resources=job.spec.get("resources") or {}, placement=job.placement
            ),
            "max_cost": shown(job.estimate_max_cost),
        }
        for job in Job.objects.filter(run=run).order_by("created_at")
    ]


def run_estimate(*, run: Any) -> str | None:
    """The most ``run`` may cost (its jobs' estimates at submission), a
    decimal string; None when any job's is unbounded or unpriced."""
    costs = list(Job.objects.filter(run=run).values_list("estimate_max_cost", flat=True))
    known = [c for c in costs if c is not None]
    return shown(sum(known, Decimal(0))) if costs and len(known) == len(costs) else None


def offer_plan(*, workspace_id: Any, resources: Mapping[str, Any], placement: Mapping[str, Any]) -> dict[str, Any]:
    """The cheapest offer a job would start from (``trainyard run``'s plan
    table): ``{"offers": n, "backend", "instance_type", "region", "spot",
    "price_per_hour", "storage_price_per_hour", "gpus"}``, or ``{"offers": 0,
    "reason": …}``. ``price_per_hour`` is the offer's (compute);
    ``storage_price_per_hour`` what its root volume adds, as the machine is billed.
    ``gpus``: the exact models the machine has, ``[{"model", "count",
    "memory_bytes"}]`` (``A100-40GB``, not the ``A100`` the job asked for)."""
    where = Placement.from_spec(placement)
    req = requirements_from(resources=resources, placement=placement)
    ranked = offers_rank(workspace_id=workspace_id, req=req, backends=where.backends)
    if not ranked.candidates:
        why = ranked.shortfall or f"no offer matches its placement ({where.words()})"
        return {"offers": 0, "reason": why if ranked.accounts else "no backend is configured for this workspace"}
    spot_first = [c for c in ranked.candidates if c.offer.spot] if where.spot_policy == "auto" else []
    offer = (spot_first or ranked.candidates)[0].offer
    return {
        "offers": len(ranked.candidates),
        "backend": offer.backend,
        "instance_type": offer.instance_type,
        "region": offer.region,
        "spot": offer.spot,
        "price_per_hour": offer.price_per_hour,
        "storage_price_per_hour": float(root_volume_price_per_hour(offer)),
        "gpus": gpu_models(offer.gpus),
    }


def gpu_models(gpus: Sequence[Gpu]) -> list[dict[str, Any]]:
    """``[{"model": "A100-40GB", "count": 8, "memory_bytes": …}]``: each model of
    ``gpus`` once, in the order the machine lists them."""
    out: dict[str, dict[str, Any]] = {}
    for gpu in gpus:
        entry = out.setdefault(gpu.model, {"model": gpu.model, "count": 0, "memory_bytes": gpu.memory_bytes})
        entry["count"] += 1
    return list(out.values())
