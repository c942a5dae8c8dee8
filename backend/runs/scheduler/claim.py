"""A pending job's turn, up to the machine it gets: the steps a pass, a
submission and a hand-over all decide a job by (``place``).

1. Its dependencies (``lifecycle.dag``): it may fail here, or wait.
2. The cache (``lifecycle.cache``): it may succeed here, reusing an earlier
   identical job's result.
3. A budget or a GPU quota that applies (``scheduler.holds``): it waits.
4. The wind-down of its last attempt: an interrupted attempt may still sync
   its checkpoint, and the next one waits for it.
5. An idle, connected machine of its workspace that fits
   (``claim_instance``), claimed ``SKIP LOCKED``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db.models import Case, Exists, IntegerField, OuterRef, Q, Value, When
from django.utils import timezone

from backend.clouds.backends.base import Gpu, gpu_shortfall
from backend.clouds.models import Instance, InstanceStatus
from backend.runs.lifecycle.cache import cache_decide
from backend.runs.lifecycle.cachewhy import (
    Subject,
    code_facts,
)
from backend.runs.lifecycle.dag import job_inputs, readiness
from backend.runs.lifecycle.placement import requirements_of
from backend.runs.lifecycle.transitions import (
    job_fail_pending,
    job_reuse,
    job_set_waiting_reason,
)
from backend.runs.models import Attempt, Job, JobStatus
from backend.runs.scheduler.holds import Holds
from backend.runs.scheduler.offers import idle_instances_allowed
from backend.runs.scheduler.volumes import instances_there, volumes_claim, volumes_where

# A machine started for a job that came up during a pass is left to the next
# pass this long before another is launched (it may not fit after all).
READY_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class Placed:
    """What the steps every path shares decided about a pending job (``place``)."""

    runnable: bool  # ready, not failed for its dependencies, not served from the cache
    held: str = ""  # why its next attempt must wait for the last one's wind-down
    instance: Instance | None = None  # the idle instance claimed for it
    # Why it waits with nothing launched for it: a volume it names is another job's.
    waits: str = ""


def place(job: Job, *, only: Any = None, holds: Holds | None = None) -> Placed:
    """The steps a pass, a submission and a hand-over all decide a pending
    job by, in this order: its dependencies (``_ready``: it may fail here),
    the cache (``_reused``: it may succeed here), the budgets and the GPU
    quota that apply (``holds``, read once by the caller for all the jobs it
    decides; None: read for this job), the wind-down of its last attempt,
    its volumes (``volumes_claim``: held by another job, it waits), then an
    idle instance that fits (``claim_instance``; ``only``: that one). A
    submitted job has no attempt yet, so no wind-down holds it."""
    if not _ready(job) or _reused(job):
        return Placed(runnable=False)
    held_by_budget = (holds if holds is not None else Holds.read([job.pk])).hold(job)
    if held_by_budget:
        return Placed(runnable=True, waits=held_by_budget)
    waits = volumes_claim(job)
    if waits:
        return Placed(runnable=True, waits=waits)
    held = _wind_down_hold(job)
    if held:
        return Placed(runnable=True, held=held)
    return Placed(runnable=True, instance=claim_instance(job, only=only))


def _ready(job: Job) -> bool:
    state = readiness(job)
    if state.doomed:
        job_fail_pending(job_id=str(job.pk), reason=state.reason)
        return False
    if not state.ready:
        job_set_waiting_reason(job, state.reason)
    return state.ready


def _reused(job: Job) -> bool:
    """Record the job's cache key; reuse an earlier identical job's result
    (``lifecycle.cache``). Either way record why, once: a retried job keeps
    its decision, and a job pending for capacity, passed over again and
    again, is compared with its previous job only the first time."""
    if job.attempt > 0:
        return False

    def subject() -> Subject:
        return Subject(
            workspace_id=job.workspace_id,
            workflow=job.workflow,
            name=job.name,
            repo_url=job.run.repo_url,
            spec=job.spec,
            code=code_facts(job.run),
            inputs=job_inputs(job),
            before=job.run.created_at,
        )

    answer = cache_decide(
        spec=job.spec,
        subject_of=subject,
        after_running=job.after_running.exists(),
        no_cache=job.run.no_cache,
        exclude=job.pk,
        explain_miss=not job.cache_decision,
    )
    if answer.key:
        Job.objects.filter(pk=job.pk).update(cache_key=answer.key)
    if answer.hit is not None:
        return job_reuse(job_id=str(job.pk), source=answer.hit)
    if answer.decision is not None and not job.cache_decision:
        Job.objects.filter(pk=job.pk).update(cache_decision=answer.decision)
    return False


def claim_instance(job: Job, *, only: Any = None) -> Instance | None:
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
        .filter(_where_volumes_are(job))
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
        if gpu_shortfall(req, [Gpu.from_data(g) for g in instance.gpus]) is None:
            taken = query.select_for_update(skip_locked=True).filter(pk=instance.pk).first()
            if taken is not None:
                return taken
    return None


def _where_volumes_are(job: Job) -> Q:
    """The machines where the job's volumes are (any machine for a job without volumes)."""
    where = volumes_where(job)
    return instances_there(where) if where is not None else Q()


def _reserved_for_another(job: Job) -> Q:
    """Instances idle for less than ``READY_GRACE_SECONDS`` that were started
    for another job still pending. After the grace the machine is anyone's:
    a job that stays pending (held, stopped just now) keeps no machine idle."""
    waiting = Job.objects.filter(pk=OuterRef("requested_for_id"), status=JobStatus.PENDING).exclude(pk=job.pk)
    cutoff = timezone.now() - timedelta(seconds=READY_GRACE_SECONDS)
    return Q(idle_since__gt=cutoff) & Q(Exists(waiting))


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


def just_up(instance: Instance) -> bool:
    """Idle for less than ``READY_GRACE_SECONDS``: not yet passed over by a
    scheduling pass that could claim it (one that fits is claimed at once)."""
    since = instance.idle_since
    return since is not None and (timezone.now() - since).total_seconds() < READY_GRACE_SECONDS
