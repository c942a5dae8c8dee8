"""Which machines and offers a pending job may take now.

An idle machine or a ranked offer is open to a job when its placement
(``lifecycle.placement``) allows it: of its backends, regions, market and
price; not blocked (``clouds.services.blocks``); not in a zone where its last
attempt was interrupted less than ``INTERRUPTED_ZONE_SECONDS`` ago, unless
its volumes are there (the only zone it can run in: skipping it would only
delay it; a machine with no zone, a Kubernetes pod, names none to skip);
and, for ``spot_policy: auto``, spot until it switches to on-demand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from backend.clouds.backends.base import Offer
from backend.clouds.models import Instance
from backend.clouds.services.blocks import Blocks, block_words
from backend.clouds.services.offers import Candidate
from backend.runs.lifecycle.placement import Placement, waiting_since
from backend.runs.models import Attempt, Job
from backend.runs.reasons import TerminationReason
from backend.runs.scheduler.volumes import Where, volumes_where, wanted

# After an interruption in a zone, the job's next attempts skip it this long.
INTERRUPTED_ZONE_SECONDS = 180


@dataclass
class Choice:
    """The offers a job may launch now, cheapest first, and why the others may not."""

    open: list[Candidate]
    considered: int  # offers of the market(s) in play
    blocked: list[str] = field(default_factory=list)  # words, one per distinct block
    free_in: float | None = None  # seconds until the first blocked offer is free again
    note: str = ""  # why the first open offer is in a zone the job was interrupted in


def idle_instances_allowed(job: Job) -> Q:
    """The idle machines the job may take: of its backends, regions, market
    and price, not in a zone it was interrupted in lately."""
    placement = Placement.of(job)
    allowed = Q()
    if placement.backends:
        allowed &= Q(backend__in=placement.backends)
    if placement.regions:
        allowed &= Q(region__in=placement.regions)
    if placement.spot_policy != "auto":  # auto takes an idle machine of either market
        allowed &= Q(spot=placement.spot_policy == "spot")
    if placement.max_price is not None:
        allowed &= Q(price_per_hour__lte=placement.max_price)
    for account_id, region, zone in zones_skipped(job, timezone.now()):
        if zone:  # an idle machine in the zone the job was interrupted in may go the same way
            allowed &= ~Q(account_id=account_id, region=region, zone=zone)
    return allowed


def choose(
    *, job: Job, candidates: list[Candidate], tried: set[str], blocks: Blocks, now: datetime | None = None
) -> Choice:
    """The offers ``job`` may launch now.

    1. Drop offers tried for this attempt, blocked ones and those in a zone
       where the job was interrupted lately.
    2. ``spot_policy: auto``: spot offers only, until it switches to
       on-demand (``_switch``): at once when no spot offer is left open,
       after ``max_wait`` (default ``AUTO_SPOT_WAIT_SECONDS``) otherwise.
    """
    now = now or timezone.now()
    zones = zones_skipped(job, now)
    reasons: dict[str, str] = {}
    free_at: list[datetime] = []

    def is_open(c: Candidate) -> bool:
        if c.offer.offer_id in tried:
            return False
        block = blocks.of(str(c.account.pk), c.offer)
        if block is not None:
            reasons.setdefault(f"{block.account_id}/{block.scope}/{block.key}", block_words(block, now=now))
            free_at.append(block.until)
            return False
        until = zones.get((str(c.account.pk), c.offer.region, c.offer.zone))
        if until is not None:
            left = int((until - now).total_seconds())
            reasons.setdefault(f"zone/{c.offer.zone}", f"zone {c.offer.zone} skipped {left}s more (interrupted there)")
            free_at.append(until)
            return False
        return True

    market = _market(job, candidates, is_open, now)
    reasons.clear()
    free_at.clear()
    open_ = [c for c in market if is_open(c)]
    free_in = (min(free_at) - now).total_seconds() if free_at else None
    first = open_[0] if open_ else None
    note = (
        back_in_zone(job, account_id=str(first.account.pk), region=first.offer.region, zone=first.offer.zone, now=now)
        if first is not None
        else ""
    )
    return Choice(open_, len(market), list(reasons.values()), free_in, note)


def zones_skipped(job: Job, now: datetime) -> dict[tuple[str, str, str], datetime]:
    """(account, region, zone) → until when the job skips it: the zones it
    was interrupted in lately, but for the one its volumes are in."""
    zones = _interrupted_zones(job, now)
    where = volumes_where(job) if zones else None
    if where is None:
        return zones
    return {key: until for key, until in zones.items() if not _volumes_there(where, key)}


def switch_note(job: Job, since: datetime | None) -> list[dict[str, Any]]:
    """The switch to on-demand as an entry of an attempt's offers tried, when
    it happened while this attempt waited (``since``: the previous attempt's end)."""
    switched = job.on_demand_since
    if switched is None or (since is not None and switched <= since):
        return []
    return [{"offer": "", "instance": "", "outcome": "switched_to_on_demand", "message": job.placement_note}]


def label(offer: Offer) -> str:
    market = ", spot" if offer.spot else ""
    price = f", ${offer.price_per_hour:.4f}/h" if offer.price_per_hour else ""
    return f"{offer.instance_type} in {offer.region}{market}{price}"


def _market(job: Job, candidates: list[Candidate], is_open: Any, now: datetime) -> list[Candidate]:
    placement = Placement.of(job)
    if placement.spot_policy != "auto":
        return candidates
    on_demand = [c for c in candidates if not c.offer.spot]
    if job.on_demand_since is not None:
        return on_demand or candidates
    spot = [c for c in candidates if c.offer.spot]
    wait = placement.spot_wait()
    waited = (now - waiting_since(job)).total_seconds()
    if not spot:
        why = "no spot offer fits this job"
    elif not any(is_open(c) for c in spot):
        why = f"every spot offer ({len(spot)}) was tried or is blocked"
    elif wait is not None and waited >= wait:
        why = f"no spot machine after waiting {waited:.0f}s (max_wait {wait}s)"
    else:
        return spot
    _switch(job, why, now)
    return on_demand or candidates


def _switch(job: Job, why: str, now: datetime) -> None:
    note = f"switched to on-demand: {why}"
    if Job.objects.filter(pk=job.pk, on_demand_since=None).update(on_demand_since=now, placement_note=note):
        job.on_demand_since, job.placement_note = now, note


def back_in_zone(job: Job, *, account_id: str, region: str, zone: str, now: datetime | None = None) -> str:
    """``back in zone Z, where it was interrupted: its volume V is there``
    when a machine in (account, region, zone) takes the job back to a zone
    it was interrupted in lately (only a job pinned there by its volumes
    does); "" otherwise."""
    key = (account_id, region, zone)
    if key not in _interrupted_zones(job, now or timezone.now()):
        return ""
    where = volumes_where(job)
    if where is None or not _volumes_there(where, key):
        return ""
    names = wanted(job)
    volumes = f"volume {names[0]} is" if len(names) == 1 else f"volumes {', '.join(names)} are"
    return f"back in zone {where.zone or zone}, where it was interrupted: its {volumes} there"


def _volumes_there(where: Where, key: tuple[str, str, str]) -> bool:
    account_id, region, zone = key
    return account_id == where.account_id and region == where.region and zone in where.zone_names


def _interrupted_zones(job: Job, now: datetime) -> dict[tuple[str, str, str], datetime]:
    """(account, region, zone) → until when the job skips it."""
    if job.attempt == 0:  # never tried, so never interrupted: no query (a warm start's)
        return {}
    cutoff = now - timedelta(seconds=INTERRUPTED_ZONE_SECONDS)
    ended = Attempt.objects.filter(
        job_id=job.pk, termination_reason=TerminationReason.INTERRUPTED, finished_at__gt=cutoff
    ).exclude(instance=None)
    zones: dict[tuple[str, str, str], datetime] = {}
    for attempt in ended.select_related("instance"):
        instance: Instance | None = attempt.instance
        if instance is None or attempt.finished_at is None or not instance.zone:
            continue  # a machine without a zone (a Kubernetes pod) leaves no zone to skip
        until = attempt.finished_at + timedelta(seconds=INTERRUPTED_ZONE_SECONDS)
        key = (str(instance.account_id), instance.region, instance.zone)
        zones[key] = max(until, zones.get(key, until))
    return zones
