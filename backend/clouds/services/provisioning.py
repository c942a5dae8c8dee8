"""The work of the launch and terminate tasks: one backend call each, outside
any transaction, then a status change in ``instances``."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings

from backend.clouds.backends.base import Handle, LaunchSpec, Offer
from backend.clouds.backends.errors import (
    ACCOUNT_BROKEN,
    NEXT_OFFER,
    ComputeError,
    NotYetTerminated,
    Scope,
    Transient,
)
from backend.clouds.models import Instance, InstanceReason, InstanceStatus
from backend.clouds.services.accounts import account_mark_broken, compute_of, installation
from backend.clouds.services.blocks import offer_block_record
from backend.clouds.services.bootstrap import user_data
from backend.clouds.services.instances import (
    handle_of,
    instance_launch_failed,
    instance_launched,
    instance_request_termination,
    instance_runner_token,
    instance_terminated,
    offer_of,
    remember_handle,
)
from backend.core.deliveries import Parked, internal_error
from backend.core.enqueue import enqueue

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
        handle = compute.launch(launch_offer(instance), _spec(instance, boots_from_image=compute.boots_from_image))
    except ComputeError as error:
        return _launch_error(instance, error, last_try)
    except Exception as error:  # a backend bug: treated as transient, bounded by the task's retries
        logger.exception("launching %s failed", instance.name)
        return _launch_error(instance, Transient(str(error) or type(error).__name__), last_try)
    if not instance_launched(instance_id=instance_id, handle=handle):
        _launched_too_late(instance, handle)
    return LaunchOutcome("launched")


def instance_launch_parked(parked: Parked) -> str:
    """The launch task killed its worker too often: the row ends as a failed
    launch (its job tries its next offer) and the backend is asked to
    terminate whatever the launch may have started (idempotent, by the
    row's key: docs/BACKENDS.md)."""
    instance_id = str(parked.kwargs.get("instance_id") or (parked.args[0] if parked.args else ""))
    message = internal_error(parked)
    if not instance_id or not instance_request_termination(
        instance_id=instance_id, reason=InstanceReason.LAUNCH_FAILED, message=message
    ):
        return f"instance {instance_id or '?'} had already ended; nothing failed"
    return f"instance {instance_id} terminated: {message}"


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


def _launched_too_late(instance: Instance, handle: Handle) -> None:
    """The row moved on while the backend was launching (its run was
    cancelled, the reconciler gave the launch up): the machine is not
    wanted. Remember how to find it, so the terminate task (and the leak
    sweep, failing that) can, and terminate it now."""
    remember_handle(instance_id=str(instance.pk), handle=handle)
    logger.warning("%s was launched after its row moved on; terminating %s", instance.name, handle.backend_id)
    assert instance.account is not None
    try:
        compute_of(instance.account).terminate(handle)
    except Exception:
        logger.warning("terminating %s failed; the leak sweep will", handle.backend_id, exc_info=True)


def _launch_error(instance: Instance, error: ComputeError, last_try: bool) -> LaunchOutcome:
    """1. Capacity or quota: block the error's scope (``blocks``), the next
    pass tries the next offer. 2. The account's credentials or configuration:
    the account is not used until fixed; an error about less than the account
    (a region) blocks only that. 3. Transient: the task retries. 4. Else the
    launch failed and the next pass tries the next offer."""
    assert instance.account is not None
    message = f"{instance.offer_id}: {error}"
    failed = {"instance_id": str(instance.pk), "message": message, "code": error.code}
    if isinstance(error, NEXT_OFFER):
        offer_block_record(account=instance.account, offer=launch_offer(instance), error=error)
        instance_launch_failed(reason=InstanceReason.NO_CAPACITY, **failed)
        enqueue("backend.runs.tasks.schedule")  # the next offer
        return LaunchOutcome("no_capacity")
    if isinstance(error, ACCOUNT_BROKEN) and error.scope == Scope.ACCOUNT:
        account_mark_broken(account_id=str(instance.account.pk), message=str(error))
    elif isinstance(error, ACCOUNT_BROKEN):
        offer_block_record(account=instance.account, offer=launch_offer(instance), error=error)
    elif isinstance(error, Transient) and not last_try:
        logger.warning("launching %s: %s; retrying in %.0fs", instance.name, error, error.retry_after or 5)
        return LaunchOutcome("retrying", retry_after=error.retry_after or 5.0)
    instance_launch_failed(reason=InstanceReason.LAUNCH_FAILED, **failed)
    enqueue("backend.runs.tasks.schedule")  # the next offer
    return LaunchOutcome("failed")


def launch_offer(instance: Instance) -> Offer:
    """The offer the row was launched (or is to be launched) from."""
    where = {
        "backend": instance.backend,
        "instance_type": instance.instance_type,
        "region": instance.region,
        "zone": instance.zone,
        "spot": instance.spot,
    }
    return Offer.from_data(offer_of(instance), where=where)


def _spec(instance: Instance, *, boots_from_image: bool = False) -> LaunchSpec:
    """For a machine that boots from an image, the user data carries the
    token, and that token is the instance's single-use bootstrap token
    (``instance_request`` stored its hash as such)."""
    token = instance_runner_token(instance)
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
