"""What the reconciler does when a cloud says why a machine is not doing
what it was launched for (``MachineView.reason``, a ``Trouble``: a
Kubernetes pod's status and events).

- Unschedulable (still pending): the instance's reason becomes ``waiting for
  a node: <the scheduler's words>``, which the job waiting on it shows. Once
  it has been so for the backend's schedule timeout, it is given up as
  ``no_capacity``, its account skipped for ``UNSCHEDULABLE_BLOCK_SECONDS``
  (the cluster, not one node type: nothing in it could take the pod), and
  the scheduler tries the next offer.
- Image pull: when the cloud's words say the image does not exist or may
  not be pulled (``image_missing``), the machine would never start:
  terminated with ``image_pull`` and the cloud's words; its job fails (the
  next attempt would pull the same image). Any other pull failure (a
  registry's rate limit, a network error) is retried by the node itself: the
  instance's reason shows it, and only after ``IMAGE_PULL_PATIENCE_SECONDS``
  of failing is it given up the same way.
- Pending with the cloud's words but no trouble (an autoscaler adding a
  node for it): the reason says so, and no timeout runs.
- Gone, with a reason: lost, with the cloud's words; preempted is an
  interruption (its job resumes from its checkpoint).

A reason says nothing more about a machine whose runner already said hello:
only a machine still ``provisioning`` is given up for one.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from backend.clouds.backends.base import CloudState, Compute, MachineView, Trouble
from backend.clouds.backends.errors import NoCapacity, Scope
from backend.clouds.models import Instance, InstanceReason, InstanceStatus
from backend.clouds.services.blocks import offer_block_record
from backend.clouds.services.instances import STARTING, instance_mark_lost, instance_request_termination
from backend.clouds.services.provisioning import launch_offer
from backend.core.enqueue import enqueue

logger = logging.getLogger(__name__)

# How an unschedulable machine's reason begins (the job waiting on it shows it).
WAITING_FOR_NODE = "waiting for a node"
# How the reason of a machine whose image pull failed for a while begins.
PULLING_IMAGE = "pulling the image"
# Reasons the job waiting on the machine shows beside "starting".
SHOWN_TO_THE_JOB = (WAITING_FOR_NODE, PULLING_IMAGE)
# An account whose pod could not be scheduled within its timeout is skipped this long.
UNSCHEDULABLE_BLOCK_SECONDS = 120.0
# A pull failing for a reason that may pass (a rate limit, the network) is given up after this long.
IMAGE_PULL_PATIENCE_SECONDS = 300.0
# What a container runtime says when the image does not exist or may not be pulled: no retry helps.
_IMAGE_MISSING_WORDS = (
    "not found",
    "manifest unknown",
    "does not exist",
    "pull access denied",
    "unauthorized",
    "denied",
    "invalid reference format",
    "invalidimagename",
    "errimageneverpull",
)
# The cloud's own words, as kept in a reason (the scheduler's message lists every node kind).
CLOUD_WORDS_MAX = 300

_GONE_WORDS: dict[Trouble | None, str] = {
    Trouble.EVICTED: "was evicted",
    Trouble.DELETED: "was deleted",
    Trouble.NODE_LOST: "lost its node",
    Trouble.PREEMPTED: "was preempted",
}


def machine_gone(instance: Instance, view: MachineView) -> bool:
    """The cloud says the machine is gone: lost, or interrupted when it was
    reclaimed (a spot node, a preemption), with the cloud's words."""
    interrupted = view.state == CloudState.INTERRUPTED or view.reason == Trouble.PREEMPTED
    reason = InstanceReason.INTERRUPTED if interrupted else InstanceReason.MACHINE_GONE
    words = _GONE_WORDS.get(view.reason, "was interrupted by the cloud" if interrupted else "is gone")
    message = f"machine {instance.name} {words} (the backend says {view.state})"
    if view.message:
        message += f": {cloud_words(view.message)}"
    return instance_mark_lost(instance_id=str(instance.pk), reason=reason, message=message)


def machine_troubled(instance: Instance, view: MachineView, compute: Compute, now: datetime) -> bool:
    """A launched machine still waiting for its runner, as its cloud sees it
    (not gone): given up, or its reason kept up to date. Returns whether its
    status changed."""
    if instance.status != InstanceStatus.PROVISIONING:
        return False
    if view.reason == Trouble.IMAGE_PULL:
        return _image_pull(instance, view, now)
    if view.reason == Trouble.UNSCHEDULABLE:
        return _unschedulable(instance, view, compute, now)
    if view.state == CloudState.PENDING and view.message:  # waiting, with the cloud's word why but no trouble
        reason = f"{WAITING_FOR_NODE}: {cloud_words(view.message)}"[:500]  # (an autoscaler adding a node)
        Instance.objects.filter(pk=instance.pk, status=InstanceStatus.PROVISIONING).exclude(
            status_reason=reason
        ).update(status_reason=reason)
        return False
    if instance.status_reason.startswith(SHOWN_TO_THE_JOB):  # it got past that: starting, as any other
        Instance.objects.filter(pk=instance.pk, status=InstanceStatus.PROVISIONING).update(status_reason=STARTING)
    return False


def schedule_timeout(compute: Compute) -> float:
    """How long a machine may stay unschedulable before it is given up (0:
    never): the account's own setting where its backend has one
    (``schedule_timeout_seconds``), else the backend's ``Timings``."""
    configured = getattr(compute, "schedule_timeout_seconds", None)
    if isinstance(configured, int | float) and not isinstance(configured, bool):
        return float(configured)
    return float(compute.timings.schedule_timeout)


def cloud_words(message: str) -> str:
    """The cloud's message on one line, bounded."""
    flat = " ".join(message.split())
    return flat if len(flat) <= CLOUD_WORDS_MAX else flat[: CLOUD_WORDS_MAX - 1] + "…"


def image_missing(message: str) -> bool:
    """The runtime's words say no retry can pull this image (it does not
    exist, its name is malformed, or the credentials may not pull it)."""
    lowered = message.lower()
    return any(words in lowered for words in _IMAGE_MISSING_WORDS)


def _image_pull(instance: Instance, view: MachineView, now: datetime) -> bool:
    words = cloud_words(view.message) or "the image could not be pulled"
    since = datetime.fromtimestamp(view.since, UTC) if view.since else instance.launched_at
    failing = (now - since).total_seconds() if since is not None else 0.0
    if not image_missing(view.message) and failing < IMAGE_PULL_PATIENCE_SECONDS:
        reason = f"{PULLING_IMAGE}, which failed (the node tries again): {words}"[:500]
        Instance.objects.filter(pk=instance.pk, status=InstanceStatus.PROVISIONING).exclude(
            status_reason=reason
        ).update(status_reason=reason)
        return False
    message = f"the image of {instance.name} could not be pulled: {words}; check the backend's image"
    changed = instance_request_termination(
        instance_id=str(instance.pk), reason=InstanceReason.IMAGE_PULL, message=message
    )
    if changed:
        enqueue("backend.runs.tasks.schedule")  # its job ends now, not at the next pass
    return changed


def _unschedulable(instance: Instance, view: MachineView, compute: Compute, now: datetime) -> bool:
    words = cloud_words(view.message) or "no node can take it"
    timeout = schedule_timeout(compute)
    since = datetime.fromtimestamp(view.since, UTC) if view.since else instance.launched_at
    if not timeout or since is None or (now - since).total_seconds() < timeout:
        reason = f"{WAITING_FOR_NODE}: {words}"[:500]
        Instance.objects.filter(pk=instance.pk, status=InstanceStatus.PROVISIONING).exclude(
            status_reason=reason
        ).update(status_reason=reason)
        return False
    assert instance.account is not None
    message = f"no node took {instance.name} within {timeout:.0f}s: {words}"
    error = NoCapacity(message, code="Unschedulable", scope=Scope.ACCOUNT, retry_after=UNSCHEDULABLE_BLOCK_SECONDS)
    offer_block_record(account=instance.account, offer=launch_offer(instance), error=error)
    changed = instance_request_termination(
        instance_id=str(instance.pk), reason=InstanceReason.NO_CAPACITY, message=message
    )
    if changed:
        data = instance.backend_data if isinstance(instance.backend_data, dict) else {}
        Instance.objects.filter(pk=instance.pk).update(backend_data={**data, "launch_error": {"code": error.code}})
        logger.info("instance %s given up: %s", instance.name, message)
        enqueue("backend.runs.tasks.schedule")  # the next offer
    return changed
