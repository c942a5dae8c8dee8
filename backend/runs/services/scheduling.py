"""Matching pending jobs to instances, and asking ``clouds`` for more.

Passes run in Celery tasks (``runs.tasks.schedule``), never in a request;
a submission assigns its own jobs to idle runners in its transaction
(``run_assign_on_submit``), a runner that finished a job takes the next one
it fits (``instance_assign_next``), and the rest is left to the next pass.
Passes are safe to run concurrently in several workers: one pass at a time
holds the scheduler's lock (a try-lock: a pass that cannot take it returns
at once, ``ScheduleResult.busy``, and ``runs.services.coalesce`` runs
another pass after the holder's), each job is decided in a transaction of
its own, and pending jobs, their runs and idle instances are claimed with
``SELECT … FOR UPDATE SKIP LOCKED``: a pass never waits on a row another
transaction holds (docs/RUNS.md, "Locks"). It names no backend
kind: offers come ranked from ``clouds.services.offers``, machines are
requested through ``clouds.services.instances`` (the launch itself is a
Celery task, after commit), and no cloud call happens here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Case, Exists, IntegerField, OuterRef, Q, Value, When
from django.utils import timezone
from trainyard_runner import protocol

from backend.artifacts.caches import cache_file_url, cache_specs
from backend.artifacts.checkpoints import checkpoint_file_url, checkpoint_spec
from backend.artifacts.locations import storage_of
from backend.artifacts.models import Artifact, ArtifactFile, Blob
from backend.artifacts.services import artifact_file_key
from backend.clouds.backends.base import Requirements
from backend.clouds.models import BackendKind, Instance, InstanceReason, InstanceStatus
from backend.clouds.services.accounts import accounts_broken
from backend.clouds.services.blocks import offer_blocks_active
from backend.clouds.services.instances import instance_request, instance_request_termination
from backend.clouds.services.offers import Candidate, OfferChoice, offers_rank, pool_room
from backend.core.db import retry_on_conflict
from backend.core.deliveries import note_subject
from backend.core.errors import NotFound
from backend.runs.events import send_to_channel
from backend.runs.models import Attempt, Job, JobStatus, Run
from backend.runs.reasons import TerminationReason
from backend.runs.services.cachewhy import (
    NO_CACHE,
    Subject,
    code_facts,
    decision_missed,
    decision_runs,
    not_cacheable_reason,
)
from backend.runs.services.dag import InputArtifact, cache_key, cacheable, code_identity, job_inputs, readiness
from backend.runs.services.dag import cached_source as find_cached_source
from backend.runs.services.placement import (
    Choice,
    Placement,
    choose,
    idle_instances_allowed,
    label,
    switch_note,
    waiting_since,
)
from backend.runs.services.placement import requirements_of as placement_requirements
from backend.runs.services.transitions import (
    job_assign,
    job_fail_no_capacity,
    job_fail_pending,
    job_reuse,
    run_refresh,
)
from backend.vault.services import repo_credential_exists, secret_exists

logger = logging.getLogger(__name__)

# Signed URLs for a job's inputs and code: long enough for big downloads.
DOWNLOAD_URL_SECONDS = 6 * 3600
# Key of the Postgres advisory lock that serialises scheduling passes.
SCHEDULER_LOCK = 0x7472_6169_6E79  # "trainy"
# One pass launches at most this many offers for one job before it says "no capacity".
MAX_OFFERS_PER_ATTEMPT = 25
# After every offer failed: wait before the next attempt (doubling, capped).
NO_CAPACITY_BACKOFF = (15, 30, 60, 120, 300, 600)
# A machine started for a job that came up during a pass is left to the next
# pass this long before another is launched (it may not fit after all).
READY_GRACE_SECONDS = 30.0
# A runner that finished a job looks at most this many of the oldest pending
# jobs of its workspace for one it fits (``instance_assign_next``).
HAND_OVER_LOOK_AHEAD = 20


# The offers ranked for each (workspace, requirements, backends) during one
# pass: the jobs of a queue mostly ask the same, and a workspace's accounts
# and their catalogs do not change in the seconds a pass takes (a pass over
# 40 jobs ranked them 40 times). Made by ``jobs_schedule``, handed down to
# ``_ranked``; an account added mid-pass is seen by the next pass.
OffersMemo = dict[tuple[Any, ...], OfferChoice]


@dataclass(frozen=True)
class _Placed:
    """What the steps every path shares decided about a pending job (``_place``)."""

    runnable: bool  # ready, not failed for its dependencies, not served from the cache
    held: str = ""  # why its next attempt must wait for the last one's wind-down
    instance: Instance | None = None  # the idle instance claimed for it


@dataclass(frozen=True)
class ScheduleResult:
    assigned: list[str]
    provisioned: list[str]
    waiting: list[str]
    busy: bool = False  # another pass held the scheduler's lock: nothing was done


def jobs_schedule(*, limit: int = 100, on_lock: Callable[[], object] | None = None) -> ScheduleResult:
    """1. Claim pending jobs, oldest first. 2. Fail those whose dependencies
    failed; skip those whose dependencies are not done. 3. Reuse a cached
    result where one exists. 4. Give the rest an idle instance of their
    workspace that fits (the one started for it first). 5. For the others,
    ask ``clouds`` for a machine from the cheapest offer not tried yet, or say
    why they wait. Each job is decided in a transaction of its own, and its
    assignment is sent (its launch enqueued by ``instance_request``) when
    that commits: a job does not wait for the pass to go through all the
    others, and a pass holds one job's lock at a time, so a runner handed
    its next job (``instance_assign_next``) or a submission is not kept off
    the pending jobs for the length of a pass.

    Returns at once with ``busy`` when another pass holds the lock;
    ``on_lock`` is called once this pass holds it, before it reads a job."""
    result = ScheduleResult([], [], [])
    with _scheduler_lock() as held:
        if not held:
            return ScheduleResult([], [], [], busy=True)
        if on_lock is not None:
            on_lock()
        pending = list(
            Job.objects.filter(status=JobStatus.PENDING).order_by("created_at").values_list("pk", flat=True)[:limit]
        )
        offers: OffersMemo = {}
        for job_id in pending:
            assigned, requested, waits = _schedule_job(job_id, offers)
            if assigned is not None:
                _send_isolated(assigned)  # its transaction has committed
                result.assigned.append(str(job_id))
            if requested is not None:
                result.provisioned.append(str(requested.pk))
            if waits:
                result.waiting.append(str(job_id))
    return result


@contextmanager
def _scheduler_lock() -> Iterator[bool]:
    """One pass at a time across all workers: pool-size checks and new
    Instance rows must not race (two passes once started 7 of 4). A
    try-lock (yields False when another pass holds it): a pass never queues
    behind another, the caller runs one more after it instead. Held by the
    session, across the pass's per-job transactions; a connection that dies
    takes it along, and one that cannot release it is closed, so that it
    never stays held by a pooled connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [SCHEDULER_LOCK])
        held = bool(cursor.fetchone()[0])
    try:
        yield held
    finally:
        if held:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [SCHEDULER_LOCK])
            except DatabaseError:
                connection.close()


@retry_on_conflict
def _schedule_job(job_id: Any, offers: OffersMemo) -> tuple[Attempt | None, Instance | None, bool]:
    """One pending job's turn in a pass, in its own transaction: (the attempt
    it was assigned, to be sent once this returns, the instance requested for
    it, whether it waits). A job another transaction holds (a submission, a
    runner handed its next job, a stop), or that is no longer pending, is
    passed over."""
    with transaction.atomic():
        # The job with its run, skipping both when another transaction holds
        # either (a stop of the run locks the run, then its jobs): run before
        # job, and no wait, so the pass never deadlocks with a stop.
        job = (
            Job.objects.select_for_update(skip_locked=True, of=("self", "run"), no_key=True)
            .filter(pk=job_id, status=JobStatus.PENDING)
            .select_related("run", "run__patch_blob", "run__archive_blob")
            .prefetch_related("needs", "after_running")
            .first()
        )
        if job is None:
            return None, None, False
        note_subject(f"job:{job.pk}")  # a worker that dies here is charged to this job (core.deliveries)
        placed = _place(job)
        if not placed.runnable:
            return None, None, False
        if placed.instance is not None:
            return job_assign(job=job, instance=placed.instance, offers_tried=_offers_worth_showing(job)), None, False
        held = placed.held
        reason, requested = _capacity(job, offers, holding=bool(held))
        reason = f"{held}; {reason}" if held and reason else held or reason
        _set_waiting_reason(job, reason)
        return None, requested, True


def run_assign_on_submit(*, run: Run) -> list[Attempt]:
    """Inside the submission's transaction: the run's jobs that are ready get
    an idle runner of the workspace that fits, as a pass would give them one
    (the cache and the readiness checks included), and their assignments go
    out when the submission commits. This is the warm path: no Celery hop and
    no scheduler lock, so concurrent submissions do not queue behind each
    other or behind a pass; the instance is claimed ``SKIP LOCKED``, so two
    submissions never get the same runner and neither waits for the other.
    A job nothing idle fits stays pending for the pass, which launches
    machines (docs/RUNS.md, "Warm start"). Returns the attempts made."""
    if not settings.TRAINYARD["ASSIGN_ON_SUBMIT"]:
        return []
    assigned: list[Attempt] = []
    jobs = Job.objects.filter(run=run, status=JobStatus.PENDING).order_by("created_at")
    for job in jobs:
        # The submission's own run, not a copy: it is named at the end of the
        # transaction, and the assignment frames are built from it on commit.
        job.run = run
        instance = _place(job).instance
        if instance is None:
            continue
        if not assigned:
            # Registered before the first assignment's own hooks: on commit the
            # assignments go out first, then the run's events are published.
            transaction.on_commit(partial(_send_all, assigned))
        assigned.append(job_assign(job=job, instance=instance))
    return assigned


def instance_assign_next(*, instance_id: str) -> Attempt | None:
    """A runner that has just finished a job (or said hello) takes the next
    one at once: the job it was started for if still pending, else the
    oldest pending job of its workspace that it fits, decided by the pass's
    own steps (readiness, the cache, a wind-down hold,
    placement and resources), in one short transaction whose assignment is
    sent on commit. The hand-over from one job to the next waits for no
    Celery hop and no pass (a pass over many pending jobs took 0.5–1 s). The
    runner and the jobs are claimed ``SKIP LOCKED``, as by a pass and a
    submission: a runner another transaction holds (a pass giving it a job)
    is left to it. Looks at the ``HAND_OVER_LOOK_AHEAD`` oldest pending
    jobs; None when none of them fits, and the pass asked for next decides
    (docs/RUNS.md, "Warm start")."""
    if not settings.TRAINYARD["ASSIGN_ON_IDLE"]:
        return None
    with transaction.atomic():
        instance = (
            Instance.objects.select_for_update(skip_locked=True)
            .filter(pk=instance_id, status=InstanceStatus.IDLE)
            .exclude(channel_name="")
            .first()
        )
        if instance is None:
            return None
        # The job it was started for first (if still pending), then the oldest.
        started_for = Case(
            When(pk=instance.requested_for_id, then=Value(0)), default=Value(1), output_field=IntegerField()
        )
        jobs = (
            Job.objects.select_for_update(skip_locked=True, of=("self", "run"), no_key=True)
            .filter(workspace_id=instance.workspace_id, status=JobStatus.PENDING)
            .select_related("run", "run__patch_blob", "run__archive_blob")
            .order_by(started_for, "created_at")[:HAND_OVER_LOOK_AHEAD]
        )
        for job in jobs:
            if _place(job, only=instance.pk).instance is None:
                continue
            # Registered before the assignment's own hooks (the run's events):
            # the frame goes out first. It is filled in once the attempt is made.
            attempts: list[Attempt] = []
            transaction.on_commit(partial(_send_all, attempts))
            attempts.append(job_assign(job=job, instance=instance))
            return attempts[0]
    return None


def _send_all(attempts: list[Attempt]) -> None:
    for attempt in attempts:
        _send_isolated(attempt)


def attempt_send_assignment(*, attempt: Attempt) -> None:
    instance = attempt.instance
    if instance is None or not instance.channel_name:
        return  # the lease runs out and the reconciler re-queues the job
    # The job the assignment was made with (a pass's, a submission's) when it
    # is at hand with its run: what the frame reads of them does not change.
    at_hand = Attempt.job.is_cached(attempt) and Job.run.is_cached(attempt.job)
    job = attempt.job if at_hand else Job.objects.select_related("run").get(pk=attempt.job_id)
    frame = _assign_frame(job, attempt)
    send_to_channel(instance.channel_name, {"type": "runner.frame", "frame": frame.model_dump_json()})


def _send_isolated(attempt: Attempt) -> None:
    """One assignment that cannot be built or sent (a storage error, a bad
    row) must not keep the others of the pass, other tenants' among them,
    from going out: it is logged, and its lease runs out and the reconciler
    re-queues the job."""
    try:
        attempt_send_assignment(attempt=attempt)
    except Exception:
        logger.exception("attempt %s of job %s: the assignment could not be sent", attempt.number, attempt.job_id)


def job_send_cancel(*, job: Job) -> None:
    instance = job.instance
    if instance is not None and instance.channel_name:
        frame = protocol.CancelJob(job=str(job.pk), attempt=job.attempt, reason=job.status_reason)
        send_to_channel(instance.channel_name, {"type": "runner.frame", "frame": frame.model_dump_json()})


def requirements_of(job: Job) -> Requirements:
    """The job's resources and placement, as the backends read them."""
    return placement_requirements(job)


# ------------------------------------------------------------------ helpers


def _place(job: Job, *, only: Any = None) -> _Placed:
    """The steps a pass, a submission and a hand-over all decide a pending
    job by, in this order: its dependencies (``_ready``: it may fail here),
    the cache (``_reused``: it may succeed here), the wind-down of its last
    attempt, then an idle instance that fits (``_claim_instance``; ``only``:
    that one). A submitted job has no attempt yet, so nothing holds it."""
    if not _ready(job) or _reused(job):
        return _Placed(runnable=False)
    held = _wind_down_hold(job)
    if held:
        return _Placed(runnable=True, held=held)
    return _Placed(runnable=True, instance=_claim_instance(job, only=only))


def _ready(job: Job) -> bool:
    state = readiness(job)
    if state.doomed:
        job_fail_pending(job_id=str(job.pk), reason=state.reason)
        return False
    if not state.ready:
        _set_waiting_reason(job, state.reason)
    return state.ready


def _reused(job: Job) -> bool:
    """Record the job's cache key; reuse an earlier identical job's result.
    Either way record why (``cachewhy``), once: a retried job keeps its decision."""
    if job.attempt > 0:
        return False
    after_running = job.after_running.exists()
    if not cacheable(spec=job.spec, after_running=after_running):
        _decided(job, decision_runs([not_cacheable_reason(spec=job.spec, after_running=after_running)]))
        return False
    inputs = job_inputs(job)
    key = cache_key(spec=job.spec, code=code_identity(job.run), inputs=inputs)
    Job.objects.filter(pk=job.pk).update(cache_key=key)
    if job.run.no_cache:
        _decided(job, decision_runs([NO_CACHE]))
        return False
    source = find_cached_source(workspace_id=job.workspace_id, key=key, exclude=job.pk)
    if source is not None:
        return job_reuse(job_id=str(job.pk), source=source)
    if not job.cache_decision:  # a job pending for capacity is passed over again and again: compare once
        _decided(job, decision_missed(_subject(job, inputs)))
    return False


def _decided(job: Job, decision: dict[str, object]) -> None:
    if not job.cache_decision:
        Job.objects.filter(pk=job.pk).update(cache_decision=decision)


def _subject(job: Job, inputs: list[InputArtifact]) -> Subject:
    return Subject(
        workspace_id=job.workspace_id,
        workflow=job.workflow,
        name=job.name,
        repo_url=job.run.repo_url,
        spec=job.spec,
        code=code_facts(job.run),
        inputs=inputs,
        before=job.run.created_at,
    )


def _claim_instance(job: Job, *, only: Any = None) -> Instance | None:
    """An idle, connected instance of the workspace that fits: the one started
    for this job first, then the longest idle. ``only``: that instance, if it fits.

    A machine just up for another job that is still pending is that job's
    for ``READY_GRACE_SECONDS`` (``_reserved_for_another``): an older job
    that also fits does not take it (a CPU job would take the GPU machine
    started for a GPU job, which would then start another).

    Only the instance taken is locked (``SKIP LOCKED``), until the commit:
    locking every candidate read kept the other idle runners from the
    submissions and passes running at the same time."""
    req = requirements_of(job)
    query = (
        Instance.objects.filter(workspace_id=job.workspace_id, status=InstanceStatus.IDLE)
        .filter(Q(pk=only) if only is not None else Q())
        .filter(idle_instances_allowed(job))
        .exclude(channel_name="")
        .exclude(_reserved_for_another(job))
        .filter(Q(cpus__gte=req.cpu or 0) & Q(memory_bytes__gte=req.memory_bytes or 0))
        .filter(Q(disk_bytes__gte=req.disk_bytes or 0))
        .order_by(
            Case(When(requested_for_id=job.pk, then=Value(0)), default=Value(1), output_field=IntegerField()),
            "idle_since",
        )
    )
    if not req.gpu_count:  # every candidate fits
        return query.select_for_update(skip_locked=True).first()
    for instance in query[:20]:  # the GPUs are checked here: read them first, then lock the one that fits
        if _gpus_fit(req, instance.gpus):
            taken = query.select_for_update(skip_locked=True).filter(pk=instance.pk).first()
            if taken is not None:
                return taken
    return None


def _reserved_for_another(job: Job) -> Q:
    """Instances idle for less than ``READY_GRACE_SECONDS`` that were started
    for another job still pending. After the grace the machine is anyone's:
    a job that stays pending (held, stopped just now) keeps no machine idle."""
    waiting = Job.objects.filter(pk=OuterRef("requested_for_id"), status=JobStatus.PENDING).exclude(pk=job.pk)
    cutoff = timezone.now() - timedelta(seconds=READY_GRACE_SECONDS)
    return Q(idle_since__gt=cutoff) & Q(Exists(waiting))


def _gpus_fit(req: Requirements, gpus: list[dict[str, object]]) -> bool:
    if not req.gpu_count:
        return True
    name = req.gpu_name.lower()
    size = req.gpu_memory_bytes or 0
    matching = [
        g for g in gpus if name in str(g.get("name", "")).lower() and int(str(g.get("memory_bytes", 0))) >= size
    ]
    return len(matching) >= req.gpu_count


def _wind_down_hold(job: Job) -> str:
    """Why the job's next attempt is not assigned yet: its interrupted
    attempt still syncs the checkpoint (its machine is not reclaimed yet);
    "" when nothing holds it."""
    if job.attempt == 0:
        return ""  # no attempt yet (an attempt's row is made with the job's count)
    last = Attempt.objects.filter(job_id=job.pk, wind_down_until__gt=timezone.now()).order_by("-number").first()
    if last is None or last.wind_down_until is None:
        return ""
    left = (last.wind_down_until - timezone.now()).total_seconds()
    return f"waiting for attempt {last.number}'s last checkpoint sync (at most {left:.0f}s more)"


def _capacity(job: Job, offers: OffersMemo | None = None, *, holding: bool = False) -> tuple[str, Instance | None]:
    """(why the job waits, the instance requested for it, if any).

    0. ``holding`` (``_wind_down_hold``) and a machine started for it is up:
       it waits for the job, nothing more is launched.
    1. A machine started for it is still coming up: wait for it.
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
    if ready is not None and (holding or _just_up(ready)):
        # Its runner said hello after this pass looked for an idle machine:
        # the pass its hello queued assigns it (a third machine was launched here).
        return f"{ready.name} is ready for it", None
    starting = next((i for i in requested if i.status == InstanceStatus.PROVISIONING), None)
    if starting is not None:
        return f"waiting for a runner: starting {starting.name} ({_offer_label(starting)})", None
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
    tried = _tried_offer_ids(requested)
    blocks = offer_blocks_active(account_ids={str(c.account.pk) for c in ranked.candidates})
    choice = choose(job=job, candidates=ranked.candidates, tried=tried, blocks=blocks)
    spent = _spent(job, requested, tried)
    if choice.open and spent < MAX_OFFERS_PER_ATTEMPT:
        return _launch(job, choice.open[0])
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


def _just_up(instance: Instance) -> bool:
    """Idle for less than ``READY_GRACE_SECONDS``: not yet passed over by a
    scheduling pass that could claim it (one that fits is claimed at once)."""
    since = instance.idle_since
    return since is not None and (timezone.now() - since).total_seconds() < READY_GRACE_SECONDS


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
    return f"waiting for capacity: all {choice.considered} offers are blocked ({'; '.join(choice.blocked[:3])}){free}"


def _waited_too_long(job: Job, placement: Placement) -> bool:
    """``max_wait`` ran out while every offer was blocked: the attempt ends
    ``no_capacity`` (and ``retry_decide`` says max_wait was reached)."""
    if not placement.max_wait or placement.spot_policy == "auto":
        return False
    return (timezone.now() - waiting_since(job)).total_seconds() >= placement.max_wait


def _launch(job: Job, candidate: Candidate) -> tuple[str, Instance | None]:
    room = pool_room(kind=candidate.account.kind)
    if room is not None and room <= 0:
        return _pool_full(job), None
    instance = instance_request(
        account=candidate.account, offer=candidate.offer, job_id=str(job.pk), reason_text=f"starting for job {job.name}"
    )
    return f"waiting for a runner: starting {instance.name} ({label(candidate.offer)})", instance


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


def _offers_worth_showing(job: Job) -> list[dict[str, Any]]:
    """The offers tried for this attempt, when any of them failed: a plain
    launch that worked needs no explaining."""
    last = Attempt.objects.filter(job_id=job.pk).order_by("-number").first()
    since = last.finished_at if last is not None else None
    tried = switch_note(job, since) + _offers_tried(_requested(job, last))
    return tried if any(t["outcome"] != "launched" for t in tried) else []


def _offer_label(instance: Instance) -> str:
    price = f", ${instance.price_per_hour:.4f}/h" if instance.price_per_hour else ""
    return f"{instance.instance_type or instance.backend} in {instance.region or '-'}{price}"


def _set_waiting_reason(job: Job, reason: str) -> None:
    if reason and job.status_reason != reason:
        Job.objects.filter(pk=job.pk, status=JobStatus.PENDING).update(status_reason=reason)
        run_refresh(run_id=str(job.run_id))


def _assign_frame(job: Job, attempt: Attempt) -> protocol.AssignJob:
    run: Run = job.run
    spec = job.spec
    ran_before = (
        attempt.number > 1
        and Attempt.objects.filter(job_id=job.pk, number__lt=attempt.number).exclude(started_at=None).exists()
    )
    resumed = {"TRAINYARD_RESUMED": "1"} if ran_before else {}
    # No secret in the frame: it crosses the channel layer (Redis, on disk).
    # The runner fetches them (``delivery.job_secrets``); the job's own env wins over them.
    env = {
        **spec["env"],
        **_master_env(job),
        "TRAINYARD_RUN_NAME": run.name,
        "TRAINYARD_JOB_ID": str(job.pk),
        "TRAINYARD_JOB_NAME": job.name,
        "TRAINYARD_ATTEMPT": str(attempt.number),
        **resumed,
    }
    return protocol.AssignJob(
        job=str(job.pk),
        attempt=attempt.number,
        seq_base=attempt.first_seq - 1,
        lease=attempt.lease,
        lease_seconds=settings.TRAINYARD["LEASE_SECONDS"],
        run_name=run.name,
        workflow=job.workflow,
        commands=spec["commands"],
        env=env,
        code=_code_spec(run),
        artifacts=[protocol.ArtifactSpec(path=p, mount=p in spec.get("mounts", ())) for p in spec["artifacts"]],
        api_url=f"{settings.PUBLIC_URL}/api/v1",
        inputs=_inputs(job),
        provider=spec.get("provider", "bash"),
        image=spec.get("image", ""),
        checkpoint=_checkpoint(job, attempt),
        port_count=int(spec.get("port_count", 0)),
        mount_seconds=settings.TRAINYARD["MOUNT_SYNC_SECONDS"],
        caches=cache_specs(job=job),
        environment=protocol.EnvironmentSpec.model_validate(spec["environment"]) if spec.get("environment") else None,
        secrets=secret_exists(workspace_id=job.workspace_id)
        or repo_credential_exists(workspace_id=run.workspace_id, repo_id=run.repo_id),
    )


def _checkpoint(job: Job, attempt: Attempt) -> protocol.CheckpointSpec | None:
    """The job's checkpoint path and the latest version to restore, if an
    earlier attempt synced one (recorded on the attempt: the API shows it)."""
    found = checkpoint_spec(job=job)
    if found is not None and found.version:
        Attempt.objects.filter(pk=attempt.pk).update(restored_checkpoint=found.version)
    return found


def _master_env(job: Job) -> dict[str, str]:
    master = job.after_running.select_related("instance").first()
    if master is None or master.instance is None:
        return {}
    host = master.instance.address or master.instance.hostname or "127.0.0.1"
    port = str(master.ports[0]) if master.ports else ""
    return {"TRAINYARD_MASTER_HOST": host, "TRAINYARD_MASTER_PORT": port}


def _inputs(job: Job) -> list[protocol.InputArtifact]:
    """The inputs' paths and sizes in files: their manifests are fetched
    page by page (``delivery.job_input_page``), so a 50k-file input does not
    make a frame the runner refuses."""
    return [
        protocol.InputArtifact(path=i.artifact.path, file_count=i.artifact.files.count())
        for i in job_inputs(job, files=False)
    ]


def _code_spec(run: Run) -> protocol.CodeSpec:
    if run.code_kind == "archive":
        assert run.archive_blob is not None
        return protocol.CodeSpec(kind="archive", archive_url=_blob_url(run.archive_blob))
    patch_url = _blob_url(run.patch_blob) if run.patch_blob else ""
    return protocol.CodeSpec(kind="git", repo_url=run.repo_url, commit=run.commit, patch_url=patch_url)


def job_download_url(
    *, job: Job, code: str = "", input_path: str = "", file_path: str = "", checkpoint: int = 0, cache: str = ""
) -> str:
    """A fresh URL for something the job's AssignJob names: its code
    (``code`` "archive" or "patch") or an input file (``input_path`` as in
    ``InputArtifact.path``, ``file_path`` as in ``InputFile.path``). The
    runner asks when a URL has expired (S3 URLs live 15 minutes)."""
    run = job.run
    if checkpoint:
        return checkpoint_file_url(job=job, number=checkpoint, file_path=file_path)
    if cache:
        return cache_file_url(job=job, path=cache, file_path=file_path)
    if code:
        blob = {"archive": run.archive_blob, "patch": run.patch_blob}.get(code)
        if blob is None:
            raise NotFound(f"This job has no {code!r} to download.")
        return _blob_url(blob)
    for i in job_inputs(job, files=False):
        if i.artifact.path == input_path:
            file = i.artifact.files.filter(path=file_path).first()
            if file is not None:
                return input_url(i.artifact, file)
    raise NotFound(f"Input {input_path}/{file_path} is not an input of this job.")


def input_url(artifact: Artifact, file: ArtifactFile) -> str:
    """A signed GET URL of an input file, for the job's runner."""
    return storage_of(artifact).signed_url(
        artifact_file_key(artifact, file), method="GET", seconds=DOWNLOAD_URL_SECONDS
    )


def _blob_url(blob: Blob) -> str:
    return storage_of(blob).signed_url(blob.storage_key, method="GET", seconds=DOWNLOAD_URL_SECONDS)
