"""The work of the launch and terminate tasks: one backend call each, outside
any transaction, then a status change in ``instances``."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings

from backend.clouds.backends.base import Gpu as OfferGpu
from backend.clouds.backends.base import LaunchSpec, Offer
from backend.clouds.backends.errors import ACCOUNT_BROKEN, NEXT_OFFER, ComputeError, NotYetTerminated, Transient
from backend.clouds.models import Instance, InstanceReason, InstanceStatus
from backend.clouds.services.accounts import account_mark_broken, compute_of, installation
from backend.clouds.services.bootstrap import user_data
from backend.clouds.services.instances import (
    handle_of,
    instance_launch_failed,
    instance_launched,
    instance_terminated,
    offer_of,
    runner_token,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchOutcome:
    status: str  # launched, no_capacity, failed, skipped
    retry_after: float | None = None


def instance_launch_run(*, instance_id: str, last_try: bool = False) -> LaunchOutcome:
    """1. Re-read the row: only a provisioning instance not yet launched is
    launched. 2. ``launch`` (idempotent on the row's key). 3. Record the
    handle, or why it failed; a capacity failure asks the scheduler to try
    the next offer."""
    instance = Instance.objects.select_related("account").filter(pk=instance_id).first()
    if instance is None or instance.status != InstanceStatus.PROVISIONING or instance.launched_at is not None:
        return LaunchOutcome("skipped")
    if instance.account is None:
        instance_launch_failed(instance_id=instance_id, reason=InstanceReason.LAUNCH_FAILED, message="no account")
        return LaunchOutcome("failed")
    try:
        compute = compute_of(instance.account)
        handle = compute.launch(_offer(instance), _spec(instance, boots_from_image=compute.boots_from_image))
    except ComputeError as error:
        return _launch_error(instance, error, last_try)
    except Exception as error:  # a backend bug: treated as transient, bounded by the task's retries
        logger.exception("launching %s failed", instance.name)
        return _launch_error(instance, Transient(str(error) or type(error).__name__), last_try)
    instance_launched(instance_id=instance_id, handle=handle)
    return LaunchOutcome("launched")


def instance_terminate_run(*, instance_id: str) -> float | None:
    """Terminate the machine; returns seconds after which to check again, or None when done."""
    instance = Instance.objects.select_related("account").filter(pk=instance_id).first()
    if instance is None or instance.account is None:
        return None
    if instance.status == InstanceStatus.TERMINATED:
        return None
    try:
        compute_of(instance.account).terminate(handle_of(instance))
    except NotYetTerminated as error:
        return error.retry_after or 5.0
    except ComputeError as error:
        logger.warning("terminating %s: %s; trying again", instance.name, error)
        return error.retry_after or 10.0
    except Exception:
        logger.exception("terminating %s failed; trying again", instance.name)
        return 10.0
    instance_terminated(instance_id=instance_id)
    return None


def _launch_error(instance: Instance, error: ComputeError, last_try: bool) -> LaunchOutcome:
    message = f"{instance.offer_id}: {error}"
    if isinstance(error, NEXT_OFFER):
        instance_launch_failed(instance_id=str(instance.pk), reason=InstanceReason.NO_CAPACITY, message=message)
        _schedule_soon()
        return LaunchOutcome("no_capacity")
    if isinstance(error, ACCOUNT_BROKEN):
        assert instance.account is not None
        account_mark_broken(account_id=str(instance.account.pk), message=str(error))
    elif isinstance(error, Transient) and not last_try:
        logger.warning("launching %s: %s; retrying in %.0fs", instance.name, error, error.retry_after or 5)
        return LaunchOutcome("retrying", retry_after=error.retry_after or 5.0)
    instance_launch_failed(instance_id=str(instance.pk), reason=InstanceReason.LAUNCH_FAILED, message=message)
    _schedule_soon()
    return LaunchOutcome("failed")


def _offer(instance: Instance) -> Offer:
    data = offer_of(instance)
    return Offer(
        backend=str(data.get("backend", instance.backend)),
        instance_type=str(data.get("instance_type", instance.instance_type)),
        region=str(data.get("region", instance.region)),
        zone=str(data.get("zone", instance.zone)),
        spot=bool(data.get("spot", instance.spot)),
        price_per_hour=float(data.get("price_per_hour", 0.0)),
        cpus=int(data.get("cpus", 0)),
        memory_bytes=int(data.get("memory_bytes", 0)),
        disk_bytes=int(data.get("disk_bytes", 0)),
        gpus=tuple(OfferGpu(str(g["name"]), int(g.get("memory_bytes", 0))) for g in data.get("gpus", [])),
        data={str(k): str(v) for k, v in dict(data.get("data", {})).items()},
    )


def _spec(instance: Instance, *, boots_from_image: bool = False) -> LaunchSpec:
    """For a machine that boots from an image, the user data carries the
    token, and that token is the instance's single-use bootstrap token
    (``instance_request`` stored its hash as such)."""
    token = runner_token(instance.idempotency_key)
    script = ""
    if boots_from_image:
        script = user_data(
            server_url=settings.PUBLIC_URL, instance_name=instance.name, bootstrap_token=token, cloud=instance.backend
        )
    return LaunchSpec(
        idempotency_key=instance.idempotency_key,
        instance_name=instance.name,
        runner_token=token,
        server_url=settings.PUBLIC_URL,
        user_data=script,
        tags={
            "trainyard:installation": installation(),
            "trainyard:workspace": str(instance.workspace_id),
            "trainyard:instance": str(instance.pk),
            "Name": instance.name,
        },
    )


def _schedule_soon() -> None:
    from celery import current_app

    try:
        current_app.send_task("backend.runs.tasks.schedule")
    except Exception:
        logger.warning("could not enqueue a scheduling pass; the reconciler will", exc_info=True)
