"""A job no idle machine fits: why it waits, or which machine is started for it.

The scheduler names no backend kind: offers come ranked from
``clouds.services.offers``, machines are requested through
``clouds.services.instances`` (the launch itself is a Celery task, after
commit), and no cloud call happens here. After every offer failed, the
attempt ends ``no_capacity`` and ``lifecycle.retry`` decides.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from backend.clouds.models import BackendKind, Instance, InstanceReason, InstanceStatus
from backend.clouds.services.accounts import accounts_broken
from backend.clouds.services.blocks import offer_blocks_active
from backend.clouds.services.instances import instance_end_words, instance_request, instance_request_termination
from backend.clouds.services.offers import Candidate, OfferChoice, offers_rank, pool_room
from backend.clouds.services.troubles import SHOWN_TO_THE_JOB
from backend.runs.lifecycle.placement import Placement, requirements_of, waiting_since
from backend.runs.lifecycle.transitions import job_fail_no_capacity, job_fail_unstarted
from backend.runs.models import Attempt, Job
from backend.runs.reasons import TerminationReason
from backend.runs.scheduler.claim import just_up
from backend.runs.scheduler.offers import Choice, back_in_zone, choose, label, switch_note
from backend.runs.scheduler.volumes import offers_there, volumes_where

# One pass launches at most this many offers for one job before it says "no capacity".
MAX_OFFERS_PER_ATTEMPT = 25


# How a wait for capacity begins when every offer is blocked (``_all_blocked``).
ALL_BLOCKED = "waiting for capacity: all"

# After every offer failed: wait before the next attempt (doubling, capped).
NO_CAPACITY_BACKOFF = (15, 30, 60, 120, 300, 600)


# The offers ranked for each (workspace, requirements, backends) during one
# pass: the jobs of a queue mostly ask the same, and a workspace's accounts
# and their catalogs do not change in the seconds a pass takes (a pass over
# 40 jobs ranked them 40 times). Made by ``jobs_schedule``, handed down to
# ``_ranked``; an account added mid-pass is seen by the next pass.
OffersMemo = dict[tuple[Any, ...], OfferChoice]


def capacity(job: Job, offers: OffersMemo | None = None, *, holding: bool = False) -> tuple[str, Instance | None]:
    """(why the job waits, the instance requested for it, if any).

    0. ``holding`` (``_wind_down_hold``) and a machine started for it is up:
       it waits for the job, nothing more is launched. A machine started for
       it whose image cannot be pulled: the job fails (``image_pull``).
    1. A machine started for it is still coming up: wait for it (saying so
       when its cloud has no node for it yet).
    2. After every offer failed, wait out the back-off.
    3. Rank the offers of its backends; none fits: say the shortfall.
    4. ``placement.choose``: drop the offers tried for this attempt, the
       blocked ones (another launch failed there lately, in any process) and
       its interrupted zones; ``auto`` picks the market.
    5. Launch the cheapest left. None left: if this attempt tried offers (or
       tried ``MAX_OFFERS_PER_ATTEMPT``), it ends ``no_capacity`` and
       ``retry`` (with ``max_wait``) decides; if every offer was blocked
       before it tried any, it waits pending, saying until when.
    """
    last = Attempt.objects.filter(job_id=job.pk).order_by("-number").first() if job.attempt else None
    requested = _requested(job, last)  # read once: the steps below look at it in turn
    ready = next((i for i in requested if i.status == InstanceStatus.IDLE), None)
    if ready is not None and (holding or just_up(ready)):
        # Its runner said hello after this pass looked for an idle machine:
        # the pass its hello queued assigns it (a third machine was launched here).
        return f"{ready.name} is ready for it", None
    unpulled = next((i for i in requested if i.termination_reason == InstanceReason.IMAGE_PULL), None)
    if unpulled is not None:
        message = instance_end_words(unpulled)
        record = _offers_tried(requested)
        job_fail_unstarted(job=job, reason=TerminationReason.IMAGE_PULL, offers_tried=record, message=message)
        return "", None
    starting = next((i for i in requested if i.status == InstanceStatus.PROVISIONING), None)
    if starting is not None:
        why = f"waiting for a runner: starting {starting.name} ({_offer_label(starting)})"
        if starting.status_reason.startswith(SHOWN_TO_THE_JOB):
            why += f", {starting.status_reason}"
        note = back_in_zone(job, account_id=str(starting.account_id), region=starting.region, zone=starting.zone)
        return (f"{why}; {note}" if note else why), None
    backoff = _no_capacity_backoff(job, last)
    if backoff:
        return backoff, None
    placement = Placement.of(job)
    ranked = _ranked(job, placement, offers)
    if ranked.accounts == 0:
        return _no_account(job, placement), None
    if not ranked.candidates:
        why = ranked.shortfall or f"no offer matches its placement ({placement.words()})"
        return f"no backend can run this job: {why}", None
    where = volumes_where(job)
    if where is not None:
        ranked = dataclasses.replace(ranked, candidates=offers_there(where, ranked.candidates))
        if not ranked.candidates:
            return f"waiting for a machine where its volumes are ({where.words()}): no offer fits there", None
    tried = _tried_offer_ids(requested)
    blocks = offer_blocks_active(account_ids={str(c.account.pk) for c in ranked.candidates})
    choice = choose(job=job, candidates=ranked.candidates, tried=tried, blocks=blocks)
    spent = _spent(job, requested, tried)
    if choice.open and spent < MAX_OFFERS_PER_ATTEMPT:
        return _launch(job, choice.open[0], note=choice.note)
    if tried or spent >= MAX_OFFERS_PER_ATTEMPT or _waited_too_long(job, placement):
        since = last.finished_at if last is not None else None
        _no_capacity(job, switch_note(job, since) + _offers_tried(requested), choice)
        return "", None
    return _all_blocked(choice), None


def _ranked(job: Job, placement: Placement, offers: OffersMemo | None) -> OfferChoice:
    """``offers_rank`` for the job, once per pass (``offers``) for the same question."""
    req = requirements_of(job)
    key = (job.workspace_id, req, placement.backends)
    if offers is None:
        return offers_rank(workspace_id=job.workspace_id, req=req, backends=placement.backends)
    if key not in offers:
        offers[key] = offers_rank(workspace_id=job.workspace_id, req=req, backends=placement.backends)
    return offers[key]


def _no_account(job: Job, placement: Placement) -> str:
    broken = accounts_broken(workspace_id=job.workspace_id, kinds=placement.backends)
    if broken:
        named = "; ".join(f"{a.kind} account {a.name!r} is broken: {a.status_reason}" for a in broken[:3])
        return f"waiting for a runner: {named} (fix it and reconnect the account)"
    if placement.backends:
        kinds = " or ".join(placement.backends)
        return f"waiting for a runner: no {kinds} account is connected to this workspace (the workflow's backends)"
    return "waiting for a runner: no backend is configured for this workspace"


def _all_blocked(choice: Choice) -> str:
    """Every offer is blocked before this attempt tried one: the job waits."""
    free = f"; the first is free again in {choice.free_in:.0f}s" if choice.free_in is not None else ""
    return f"{ALL_BLOCKED} {choice.considered} offers are blocked ({'; '.join(choice.blocked[:3])}){free}"


def _waited_too_long(job: Job, placement: Placement) -> bool:
    """``max_wait`` ran out while every offer was blocked: the attempt ends
    ``no_capacity`` (and ``retry_decide`` says max_wait was reached)."""
    if not placement.max_wait or placement.spot_policy == "auto":
        return False
    return (timezone.now() - waiting_since(job)).total_seconds() >= placement.max_wait


def _launch(job: Job, candidate: Candidate, *, note: str = "") -> tuple[str, Instance | None]:
    room = pool_room(kind=candidate.account.kind)
    if room is not None and room <= 0:
        return _pool_full(job), None
    instance = instance_request(
        account=candidate.account, offer=candidate.offer, job_id=str(job.pk), reason_text=f"starting for job {job.name}"
    )
    why = f"waiting for a runner: starting {instance.name} ({label(candidate.offer)})"
    return (f"{why}; {note}" if note else why), instance


def _pool_full(job: Job) -> str:
    """The local pool is shared by all workspaces: an idle runner of another
    workspace gives its place up (the next pass starts one for this job)."""
    limit = settings.TRAINYARD["LOCAL_RUNNERS_MAX"]
    idle_elsewhere = (
        Instance.objects.select_for_update(skip_locked=True)
        .filter(backend=BackendKind.LOCAL, status=InstanceStatus.IDLE)
        .exclude(workspace_id=job.workspace_id)
        .order_by("idle_since")
        .first()
    )
    if idle_elsewhere is not None:
        instance_request_termination(
            instance_id=str(idle_elsewhere.pk),
            reason=InstanceReason.MAKE_ROOM,
            message="retired to make room for another workspace's job",
            only_if_idle=True,
        )
        return "waiting for a runner: freeing a place in the local pool"
    return f"waiting for a runner: all {limit} local runners are busy (TRAINYARD_LOCAL_RUNNERS_MAX)"


def _no_capacity(job: Job, tried: list[dict[str, Any]], choice: Choice) -> None:
    """``no capacity: tried 3 of 9 offers (fake/r1/r1a/fake-a/on-demand
    no_capacity FakeNoCapacity, …); blocked: …``."""
    launched = [t for t in tried if t["offer"]]
    listed = ", ".join(" ".join(filter(None, (t["offer"], t["outcome"], t.get("code", "")))) for t in launched[:4])
    more = ", …" if len(launched) > 4 else ""
    message = f"no capacity: tried {_tried_words(launched, choice.considered)} ({listed}{more})"
    if choice.blocked:
        message += f"; blocked: {'; '.join(choice.blocked[:3])}"
    switched = [t["message"] for t in tried if t["outcome"] == "switched_to_on_demand"]
    if switched:
        message += f"; {switched[0]}"
    job_fail_no_capacity(job=job, offers_tried=tried, message=message)


def _tried_words(launched: list[dict[str, Any]], considered: int) -> str:
    """``4 of 4 offers``. After ``auto`` switched to on-demand, ``considered``
    counts the on-demand offers only: the spot ones tried before the switch
    are said apart (``2 spot offers, then 1 of 1 on-demand offers``).
    An offer's id ends with its market (``Offer.offer_id``)."""
    spot = sum(1 for t in launched if t["offer"].endswith("/spot"))
    on_demand = len(launched) - spot
    if not spot or not on_demand:
        return f"{len(launched)} of {considered} offers"
    return f"{spot} spot offers, then {on_demand} of {considered} on-demand offers"


def _no_capacity_backoff(job: Job, last: Attempt | None) -> str:
    if last is None or last.termination_reason != TerminationReason.NO_CAPACITY or last.finished_at is None:
        return ""
    streak = Attempt.objects.filter(job_id=job.pk, termination_reason=TerminationReason.NO_CAPACITY).count()
    wait = NO_CAPACITY_BACKOFF[min(streak, len(NO_CAPACITY_BACKOFF)) - 1]
    left = (last.finished_at + timedelta(seconds=wait) - timezone.now()).total_seconds()
    placement = Placement.of(job)
    spot_wait = placement.spot_wait() if placement.spot_policy == "auto" and job.on_demand_since is None else None
    if spot_wait is not None:  # auto: on-demand is tried once max_wait is over, not a back-off later
        left = min(left, spot_wait - (timezone.now() - waiting_since(job)).total_seconds())
    return f"{last.termination_message}; retrying (attempt {last.number + 1}) in {left:.0f}s" if left > 0 else ""


def _requested(job: Job, last: Attempt | None) -> list[Instance]:
    """Instances started for this job since its last attempt ended (``last``:
    its latest attempt), oldest first."""
    query = Instance.objects.filter(requested_for=job)
    if last is not None and last.finished_at is not None:
        query = query.filter(created_at__gt=last.finished_at)
    return list(query.order_by("created_at"))


LAUNCH_FAILURES = (InstanceReason.NO_CAPACITY, InstanceReason.LAUNCH_FAILED, InstanceReason.PROVISION_TIMEOUT)


def _tried_offer_ids(requested: list[Instance]) -> set[str]:
    """Offers whose machine failed to start; one that went away before its
    runner ever connected failed to start too."""
    return {
        i.offer_id
        for i in requested
        if i.termination_reason in LAUNCH_FAILURES or (i.status == InstanceStatus.LOST and i.connected_at is None)
    }


def _spent(job: Job, requested: list[Instance], tried: set[str]) -> int:
    """How much of ``MAX_OFFERS_PER_ATTEMPT`` the attempt has used. Once
    ``spot_policy: auto`` switched to on-demand, only the on-demand offers
    count: a switch when max_wait ran out after 25 spot offers failed
    launches on-demand, rather than ending the attempt (and, as on-demand
    no_capacity follows ``retry:``, failing the job)."""
    if job.on_demand_since is None:
        return len(tried)
    return len({i.offer_id for i in requested if i.offer_id in tried and not i.spot})


def _offers_tried(requested: list[Instance]) -> list[dict[str, Any]]:
    """What was launched for this attempt, in order, with each outcome."""
    return [
        {
            "offer": i.offer_id,
            "instance": i.name,
            "outcome": i.termination_reason or "launched",
            "code": str((i.backend_data or {}).get("launch_error", {}).get("code", "")),
            "message": i.status_reason if i.termination_reason else "",
        }
        for i in requested
    ]


def offers_worth_showing(job: Job) -> list[dict[str, Any]]:
    """The offers tried for this attempt, when any of them failed: a plain
    launch that worked needs no explaining."""
    last = Attempt.objects.filter(job_id=job.pk).order_by("-number").first()
    since = last.finished_at if last is not None else None
    tried = switch_note(job, since) + _offers_tried(_requested(job, last))
    return tried if any(t["outcome"] != "launched" for t in tried) else []


def _offer_label(instance: Instance) -> str:
    price = f", ${instance.price_per_hour:.4f}/h" if instance.price_per_hour else ""
    return f"{instance.instance_type or instance.backend} in {instance.region or '-'}{price}"
