"""The only code that writes ``Instance.status``.

Every change is a compare-and-set on the old status and is recorded as an
``InstanceEvent`` with its reason. Cloud calls never happen here: a change
that needs one (launch, terminate) enqueues the task for it on commit
(``clouds.tasks``).

Lifecycle (docs/RUNS.md draws it)::

    provisioning ─hello─▶ idle ⇄ busy ─silent─▶ unreachable ─hello─▶ idle/busy
         │                  │                        │
         ├─launch failed────┴──terminate──▶ terminating ─confirmed─▶ terminated
         └───────────── machine gone / fenced ──────────────────────▶ lost

A self-hosted machine (registered, not launched) differs in three ways: its
row starts ``provisioning`` at registration (``instance_register``) and waits
for its runner as long as it takes; ``lost`` fences its attempts but not its
identity (a later hello with its token makes it ``idle`` again, once the
attempts it had are ended: ``runner_connect``); and it ends only when it is
revoked (``instance_revoke``: ``terminated``, reason ``revoked``), never by a
backend call (docs/decisions/0026-self-hosted-runners.md).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import DurationField, ExpressionWrapper, F, Q
from django.db.models.functions import Now
from django.utils import timezone
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.clouds.backends.base import Handle, Offer
from backend.clouds.backends.errors import InvalidConfig
from backend.clouds.backends.registry import compute_class
from backend.clouds.models import (
    ENDED_STATUSES,
    LIVE_STATUSES,
    BackendKind,
    CloudAccount,
    Instance,
    InstanceEvent,
    InstanceReason,
    InstanceStatus,
)
from backend.core.channels import send_to_channel
from backend.core.clock import db_now
from backend.core.counters import provisioning_observe
from backend.core.enqueue import enqueue
from backend.core.errors import ApplicationError, NotFound
from backend.core.tokens import API_TOKEN_PREFIX, RUNNER_TOKEN_PREFIX, hash_token

logger = logging.getLogger(__name__)

# Storage priced per GiB-month is prorated over the 730 hours AWS counts in a month.
HOURS_A_MONTH = 730
GIB = 2**30

# A terminate that was not confirmed for this long is asked again (the reconciler).
TERMINATE_RECHECK_SECONDS = 30.0
# An interrupted machine's own terminate waits for the cloud's deadline, but never longer than this.
MAX_RECLAIM_WAIT = timedelta(minutes=5)
# A launched machine's reason until its runner says hello (or its cloud says why not).
STARTING = "starting: waiting for its runner to connect"
CONNECTABLE = (InstanceStatus.PROVISIONING, InstanceStatus.IDLE, InstanceStatus.BUSY, InstanceStatus.UNREACHABLE)


@dataclass(frozen=True)
class Facts:
    """What a runner's hello says about its machine."""

    hostname: str
    address: str
    runner_version: str
    cpus: int
    memory_bytes: int
    disk_bytes: int
    gpus: list[dict[str, Any]]
    cloud_id: str = ""  # the machine's id in its cloud, from its instance metadata
    relay_version: int = 0  # the sessions its runner serves (0: none)
    ssh_host_key: str = ""  # its runner's SSH host key, one OpenSSH public key line


class LiveElsewhere(Exception):
    """The instance's connection is another one, heard within the liveness
    window (``TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS``): a second connection
    with its token does not take it over."""

    def __init__(self, heard_seconds_ago: float, window: float) -> None:
        super().__init__(f"its last heartbeat {heard_seconds_ago:.0f}s ago")
        self.heard_seconds_ago = heard_seconds_ago
        self.window = window


# ------------------------------------------------------------------ requests


def instance_request(*, account: CloudAccount, offer: Offer, job_id: str | None, reason_text: str) -> Instance:
    """A new machine for ``offer``: the row is written first (inside the
    caller's transaction) and the launch task enqueued on commit, so a crash
    at any point leaves a row the reconciler finishes (docs/BACKENDS.md)."""
    pk = uuid.uuid4()
    key = f"ty-{pk}"
    token = hash_token(runner_token(key))
    # A machine that boots from an image gets the derived token in its user
    # data, readable by every process on it: single-use, exchanged at the first
    # hello for a random token of its own (instance_bootstrap_exchange). Until
    # then its own token is one nobody knows.
    bootstrap = token if _boots_from_image(account.kind) else ""
    storage = root_volume_price_per_hour(offer)
    instance = Instance.objects.create(
        id=pk,
        workspace_id=account.workspace_id,
        account=account,
        backend=account.kind,
        name=f"{account.kind}-{pk.hex[:8]}",
        idempotency_key=key,
        token_hash=hash_token(secrets.token_hex(32)) if bootstrap else token,
        bootstrap_token_hash=bootstrap,
        offer_id=offer.offer_id,
        instance_type=offer.instance_type,
        region=offer.region,
        zone=offer.zone,
        spot=offer.spot,
        price_per_hour=Decimal(str(offer.price_per_hour)) + storage,
        storage_price_per_hour=storage,
        price_source=price_source(offer),
        market="" if account.kind == BackendKind.LOCAL else ("spot" if offer.spot else "on-demand"),
        requested_for_id=job_id,
        status_reason=reason_text,
        backend_data={"offer": offer.to_data()},
    )
    _event(instance, "", InstanceStatus.PROVISIONING, InstanceReason.REQUESTED, reason_text)
    enqueue("backend.clouds.tasks.instance_launch", str(pk))
    return instance


def instance_register(
    *, account: CloudAccount, name: str, token_hash: str, message: str, price_per_hour: Decimal = Decimal(0)
) -> Instance:
    """A self-hosted machine's row, written when it is registered: it waits
    in ``provisioning`` for its runner's first hello (inside the caller's
    transaction; nothing is launched). ``price_per_hour``: the workspace's
    price for it (0: free)."""
    pk = uuid.uuid4()
    instance = Instance.objects.create(
        id=pk,
        workspace_id=account.workspace_id,
        account=account,
        backend=BackendKind.SELF_HOSTED,
        name=name,
        idempotency_key=f"ty-{pk}",
        token_hash=token_hash,
        instance_type="self-hosted",
        price_per_hour=price_per_hour,
        price_source=SELF_HOSTED_PRICE_SOURCE,
        status=InstanceStatus.PROVISIONING,
        status_reason="registered: waiting for its runner to connect",
    )
    _event(instance, "", InstanceStatus.PROVISIONING, InstanceReason.REGISTERED, message)
    return instance


SELF_HOSTED_PRICE_SOURCE = "workspace price for self-hosted"


def price_source(offer: Offer) -> str:
    """What an offer's price rests on, in words: the catalog of a date, the
    spot price history at launch, or a machine nobody sells (price 0); and
    its root volume's storage where the cloud bills it."""
    source = offer.data.get("price_source", "")
    if source == "spot-history":
        words = "spot price history at launch"
    elif source == "catalog":
        words = f"catalog {offer.data.get('catalog_date', '')}".strip()
    else:
        words = source[:100] or ("none: a machine nobody sells" if not offer.price_per_hour else "the offer's price")
    if root_volume_price_per_hour(offer):
        gib = -(-offer.disk_bytes // GIB)
        words += f" + root volume {gib} GiB at ${offer.data['root_volume_gib_month']}/GiB-month"
    return words[:100]


def root_volume_price_per_hour(offer: Offer) -> Decimal:
    """What the offer's root volume costs an hour, USD: its GiB x the offer's
    storage price per GiB-month / the month's 730 hours, to a millionth (0
    where the offer names no storage price: local, self-hosted)."""
    per_month = offer.data.get("root_volume_gib_month") or ""
    if not per_month or offer.disk_bytes <= 0:
        return Decimal(0)
    gib = -(-offer.disk_bytes // GIB)
    return (Decimal(gib) * Decimal(per_month) / HOURS_A_MONTH).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)


def runner_token(idempotency_key: str) -> str:
    """The runner's token, derived from the row's key with the server's secret:
    a redelivered launch task passes the same token the first one did."""
    return RUNNER_TOKEN_PREFIX + _runner_token_hmac(idempotency_key)


def instance_runner_token(instance: Instance) -> str:
    """The token the launch of ``instance`` passes: ``runner_token``, or the
    bare HMAC for a row requested before runner tokens had their prefix
    (its stored hashes are of that), so an upgrade mid-launch changes nothing."""
    bare = _runner_token_hmac(instance.idempotency_key)
    if hash_token(bare) in (instance.token_hash, instance.bootstrap_token_hash):
        return bare
    return RUNNER_TOKEN_PREFIX + bare


def _runner_token_hmac(idempotency_key: str) -> str:
    return hmac.new(settings.SECRET_KEY.encode(), f"runner:{idempotency_key}".encode(), hashlib.sha256).hexdigest()


def instance_launched(*, instance_id: str, handle: Handle) -> bool:
    """The backend accepted the launch: remember how to find the machine."""
    changed = Instance.objects.filter(pk=instance_id, status=InstanceStatus.PROVISIONING, launched_at=None).update(
        backend_id=handle.backend_id[:200],
        launched_at=Now(),
        status_reason=STARTING,
    )
    if changed:
        instance = Instance.objects.get(pk=instance_id)
        data = {**instance.backend_data, "handle": {"region": handle.region, **dict(handle.data)}}
        Instance.objects.filter(pk=instance_id).update(backend_data=data)
        _event(instance, instance.status, instance.status, InstanceReason.LAUNCHED, f"launched as {handle.backend_id}")
    return bool(changed)


def remember_handle(*, instance_id: str, handle: Handle) -> None:
    """Record how to find a machine whose row is no longer provisioning (a
    launch that finished late), without changing its status."""
    instance = Instance.objects.filter(pk=instance_id).first()
    if instance is None or instance.backend_id:
        return
    data = {**instance.backend_data, "handle": {"region": handle.region, **dict(handle.data)}}
    Instance.objects.filter(pk=instance_id, backend_id="").update(backend_id=handle.backend_id[:200], backend_data=data)


def instance_launch_failed(*, instance_id: str, reason: InstanceReason, message: str, code: str = "") -> bool:
    """Nothing was started (the backend refused): terminated at once. ``code``:
    the backend's error code, kept for the job's list of offers tried."""
    changed = _transition(
        instance_id,
        [InstanceStatus.PROVISIONING],
        InstanceStatus.TERMINATED,
        reason,
        message,
        termination_reason=reason,
        terminated_at=timezone.now(),
    )
    if changed and code:
        instance = Instance.objects.get(pk=instance_id)
        data = {**instance.backend_data, "launch_error": {"code": code}}
        Instance.objects.filter(pk=instance_id).update(backend_data=data)
    return changed


def instance_keep_until(*, instance_id: str, kept_until: float) -> None:
    """Its runner kept a job's files until ``kept_until`` (unix time, bounded
    by ``kept_bound``): recorded before the machine goes idle, so idle
    retirement never sees it without."""
    kept = kept_bound(kept_until)
    Instance.objects.filter(pk=instance_id).filter(Q(kept_until__isnull=True) | Q(kept_until__lt=kept)).update(
        kept_until=kept
    )


def kept_bound(kept_until: float | None) -> datetime | None:
    """A runner's kept-until time as stored: at most ``MAX_KEPT_SECONDS``
    ahead, so no runner holds a machine (or an upload right) for longer."""
    if kept_until is None:
        return None
    latest = timezone.now() + timedelta(seconds=protocol.MAX_KEPT_SECONDS)
    return min(datetime.fromtimestamp(kept_until, UTC), latest)


def instance_set_idle_duration(*, instance_id: str, seconds: int | None) -> None:
    """How long the machine may stay idle after its job (its job's
    ``idle_duration``; None: the backend's default; IDLE_FOREVER: off)."""
    Instance.objects.filter(pk=instance_id).update(idle_duration=seconds)


# ------------------------------------------------------------ the runner side


def instance_for_token(*, token: str) -> Instance | None:
    """The instance a runner token belongs to, unless it has ended (a lost
    self-hosted machine has not: its identity outlives the fencing)."""
    instance = Instance.objects.filter(token_hash=hash_token(token)).first()
    if instance is None or (instance.status in ENDED_STATUSES and not _revivable(instance)):
        return None
    return instance


def instance_refusal(*, token: str) -> str:
    """Why a runner token is refused, in words its runner can show; "" when
    there is nothing more to say than "unknown token"."""
    instance = Instance.objects.filter(token_hash=hash_token(token)).first()
    if instance is None and token.startswith(API_TOKEN_PREFIX):
        return f"this is a personal API token ({API_TOKEN_PREFIX}…): a runner connects with its runner token"
    return "" if instance is None else instance_refusal_for(instance)


def instance_refusal_for(instance: Instance) -> str:
    """The words for a revoked runner; "" when ``instance`` was not revoked."""
    if instance.termination_reason != InstanceReason.REVOKED:
        return ""
    return f"runner {instance.name} was revoked; register the machine again (trainyard-runner register)"


def instance_for_bootstrap_token(*, token: str) -> Instance | None:
    """The instance whose unspent bootstrap token this is, unless it has ended."""
    return (
        Instance.objects.filter(bootstrap_token_hash=hash_token(token), bootstrap_used_at=None)
        .exclude(bootstrap_token_hash="")
        .exclude(status__in=ENDED_STATUSES)
        .first()
    )


def instance_bootstrap_exchange(*, instance_id: str, token: str) -> str | None:
    """Spend the bootstrap token ``token``: the instance gets a new random
    runner token (returned; only its hash is kept). None when the token was
    already spent (a second hello with it) or is not this instance's.

    A compare-and-set: of two hellos racing with the same token, one wins.
    If the Welcome carrying the new token is lost, the machine cannot
    connect again; the provision timeout (or the unreachable grace) then
    replaces it (docs/decisions/0071-single-use-bootstrap-token.md)."""
    new = RUNNER_TOKEN_PREFIX + secrets.token_urlsafe(32)
    spent = Instance.objects.filter(
        pk=instance_id, bootstrap_token_hash=hash_token(token), bootstrap_used_at=None
    ).update(token_hash=hash_token(new), bootstrap_used_at=timezone.now())
    if not spent:
        return None
    logger.info("instance %s exchanged its bootstrap token for its own", instance_id)
    return new


def _boots_from_image(kind: str) -> bool:
    try:
        return compute_class(kind, settings.TRAINYARD["BACKEND_KINDS"]).boots_from_image
    except (InvalidConfig, ImportError, TypeError):  # launches nothing anyway: its launch fails and says why
        return False


def instance_connected(*, instance_id: str, channel_name: str, facts: Facts, busy: bool) -> bool:
    """The runner said hello. A hello never revives an instance that is
    terminating, terminated or lost (False then, and the caller refuses it),
    except a lost self-hosted machine, whose attempts the caller has ended.
    Its liveness stamps take the database's clock (``backend.core.clock``).
    Nor does it displace the instance's live connection: ``LiveElsewhere``
    while another channel was heard within the liveness window (a stolen
    token takes over nothing); past it, the new connection takes over (a
    runner back from a network blip whose old socket the server still has)."""
    now = db_now()
    with transaction.atomic():
        instance = Instance.objects.select_for_update().filter(pk=instance_id).first()
        if instance is None or not (instance.status in CONNECTABLE or _revivable(instance)):
            return False
        if instance.channel_name and instance.channel_name != channel_name:
            _refuse_if_heard(instance_id)
        new = InstanceStatus.BUSY if busy else InstanceStatus.IDLE
        Instance.objects.filter(pk=instance_id).update(
            status=new,
            status_reason="",
            hostname=facts.hostname[:255],
            address=facts.address[:255],
            runner_version=facts.runner_version[:50],
            relay_version=facts.relay_version,
            ssh_host_key=facts.ssh_host_key,
            cpus=facts.cpus,
            memory_bytes=facts.memory_bytes,
            disk_bytes=facts.disk_bytes,
            gpus=facts.gpus,
            # A launch whose answer was lost (a worker killed mid-launch): the machine says who it is.
            backend_id=instance.backend_id or facts.cloud_id[:200],
            channel_name=channel_name,
            last_heartbeat_at=now,
            unreachable_since=None,
            connected_at=instance.connected_at or now,
            running_at=instance.running_at or now,
            idle_since=None if busy else (instance.idle_since or now),
            **({"termination_reason": "", "terminated_at": None} if _revivable(instance) else {}),
        )
        if instance.connected_at is None and instance.backend != BackendKind.SELF_HOSTED:
            waited = (now - instance.created_at).total_seconds()
            transaction.on_commit(functools.partial(provisioning_observe, waited))
        if instance.status != new:
            words = " again after it was lost" if instance.status == InstanceStatus.LOST else ""
            message = f"runner {facts.runner_version} connected{words}"
            _event(instance, instance.status, new, InstanceReason.CONNECTED, message)
    return True


def _refuse_if_heard(instance_id: str) -> None:
    """``LiveElsewhere`` when the instance's last heartbeat is within the
    window, measured by the database's clock (every process compares the
    same clock)."""
    window = float(settings.TRAINYARD["HEARTBEAT_TIMEOUT_SECONDS"])
    age = (
        Instance.objects.filter(pk=instance_id, last_heartbeat_at__isnull=False)
        .annotate(age=ExpressionWrapper(Now() - F("last_heartbeat_at"), output_field=DurationField()))
        .values_list("age", flat=True)
        .first()
    )
    if age is not None and age < timedelta(seconds=window):
        raise LiveElsewhere(max(age.total_seconds(), 0.0), window)


def instance_disconnected(*, instance_id: str, channel_name: str) -> None:
    Instance.objects.filter(pk=instance_id, channel_name=channel_name).update(channel_name="")


def instance_heartbeat(
    *,
    instance_id: str,
    busy: bool | None = None,
    kept_until: float | None = None,
    data_cached: list[str] | None = None,
) -> None:
    """A heartbeat from the instance's current connection. An ``unreachable``
    instance heard again on the connection it kept through its silence (a
    link that froze and came back within the runner's own timeouts, so it
    never said hello again) is reachable again: ``busy`` or idle as its
    runner says. ``kept_until`` (unix time; None: nothing kept) is recorded,
    bounded (``kept_bound``). One UPDATE in the usual case. Stamped with the
    database's clock, as the reconciler judges it (``backend.core.clock``).
    ``data_cached``: the data snapshots its cache holds, when they changed
    (None: as before)."""
    kept = kept_bound(kept_until)
    values: dict[str, Any] = {"last_heartbeat_at": Now(), "kept_until": kept}
    if data_cached is not None:
        values["data_cached"] = list(data_cached)[: protocol.MAX_DATA_CACHED]
    if Instance.objects.filter(pk=instance_id).exclude(status=InstanceStatus.UNREACHABLE).update(**values):
        return
    Instance.objects.filter(pk=instance_id).update(**values)
    if busy is None:
        return
    _transition(
        instance_id,
        [InstanceStatus.UNREACHABLE],
        InstanceStatus.BUSY if busy else InstanceStatus.IDLE,
        InstanceReason.CONNECTED,
        "runner heard again on the connection it kept",
        unreachable_since=None,
        **({} if busy else {"idle_since": Now()}),
    )


def instance_set_busy(*, instance_id: str, message: str) -> bool:
    return _transition(
        instance_id, [InstanceStatus.IDLE], InstanceStatus.BUSY, InstanceReason.ASSIGNED, message, idle_since=None
    )


def instance_set_idle(*, instance_id: str, message: str) -> bool:
    return _transition(
        instance_id,
        [InstanceStatus.BUSY],
        InstanceStatus.IDLE,
        InstanceReason.JOB_DONE,
        message,
        idle_since=Now(),
    )


def instance_mark_unreachable(*, instance_id: str, message: str) -> bool:
    return _transition(
        instance_id,
        [InstanceStatus.IDLE, InstanceStatus.BUSY],
        InstanceStatus.UNREACHABLE,
        InstanceReason.SILENT,
        message,
        unreachable_since=Now(),
    )


def instance_mark_lost(*, instance_id: str, reason: InstanceReason, message: str) -> bool:
    """The machine is gone, or is fenced: its socket is closed and the
    machine terminated to be sure (a fenced runner may still be alive).

    A self-hosted machine is never terminated (it is the user's): its socket
    is dropped so that its runner reconnects, and that hello ends the
    attempts it had (``runner_connect``) before the machine takes new work."""
    instance = Instance.objects.filter(pk=instance_id).first()
    changed = _transition(
        instance_id,
        [*LIVE_STATUSES, InstanceStatus.TERMINATING],
        InstanceStatus.LOST,
        reason,
        message,
        termination_reason=reason,
        terminated_at=timezone.now(),
        channel_name="",
    )
    if changed and instance is not None:
        self_hosted = instance.backend == BackendKind.SELF_HOSTED
        if instance.channel_name:
            channel = instance.channel_name
            event = {"type": "runner.drop"} if self_hosted else {"type": "runner.fenced", "reason": message}
            transaction.on_commit(lambda: send_to_channel(channel, event))
        if not self_hosted:
            enqueue("backend.clouds.tasks.instance_terminate", instance_id)
    return changed


def instance_revoke(*, instance_id: str, message: str) -> bool:
    """A self-hosted runner's identity is withdrawn: ``terminated`` (reason
    ``revoked``), its token refused from now on with ``message``, its open
    socket closed with that reason. Its machine is not touched."""
    instance = Instance.objects.filter(pk=instance_id, backend=BackendKind.SELF_HOSTED).first()
    if instance is None:
        return False
    changed = _transition(
        instance_id,
        [*LIVE_STATUSES, InstanceStatus.TERMINATING, InstanceStatus.LOST],
        InstanceStatus.TERMINATED,
        InstanceReason.REVOKED,
        message,
        termination_reason=InstanceReason.REVOKED,
        terminated_at=timezone.now(),
        channel_name="",
    )
    if changed and instance.channel_name:
        channel = instance.channel_name
        transaction.on_commit(lambda: send_to_channel(channel, {"type": "runner.fenced", "reason": message}))
    return changed


def instance_mark_interrupted(*, instance_id: str, message: str, reclaim_at: datetime | None) -> bool:
    """The runner got the cloud's interruption notice (spot): the machine
    takes no new work (terminating, reason ``interrupted``). Its runner keeps
    winding its job down until the cloud reclaims the machine at
    ``reclaim_at``, so it is not told to shut down, and our own terminate is
    first asked at ``reclaim_at`` (at most ``MAX_RECLAIM_WAIT`` from now),
    then every ``TERMINATE_RECHECK_SECONDS`` like any other until the cloud
    confirms. A machine whose backend ``terminates_with_notice`` (a pod,
    already being deleted) is asked at once: its terminate waits out the
    pod's grace and says when it is gone."""
    now = timezone.now()
    at = min(max(reclaim_at or now, now), now + MAX_RECLAIM_WAIT)
    instance = Instance.objects.filter(pk=instance_id).only("backend").first()
    at_once = instance is not None and _terminates_with_notice(instance.backend)
    if at_once:
        at = now
    changed = _transition(
        instance_id,
        list(LIVE_STATUSES),
        InstanceStatus.TERMINATING,
        InstanceReason.INTERRUPTED,
        message,
        termination_reason=InstanceReason.INTERRUPTED,
        # The reconciler asks again TERMINATE_RECHECK_SECONDS after a request: the first ask lands at ``at``.
        terminate_requested_at=at - timedelta(seconds=TERMINATE_RECHECK_SECONDS),
    )
    if changed and at_once:
        enqueue("backend.clouds.tasks.instance_terminate", instance_id)
    return changed


def _terminates_with_notice(kind: str) -> bool:
    try:
        return compute_class(kind, settings.TRAINYARD["BACKEND_KINDS"]).terminates_with_notice
    except (InvalidConfig, ImportError, TypeError):
        return False


def instance_request_termination(
    *, instance_id: str, reason: InstanceReason, message: str, only_if_idle: bool = False
) -> bool:
    """Retire a machine: its runner is told to shut down and the backend to
    terminate it. ``only_if_idle``: not if it took a job meanwhile."""
    instance = Instance.objects.filter(pk=instance_id).first()
    changed = _transition(
        instance_id,
        [InstanceStatus.IDLE] if only_if_idle else list(LIVE_STATUSES),
        InstanceStatus.TERMINATING,
        reason,
        message,
        termination_reason=reason,
        terminate_requested_at=Now(),
    )
    if changed and instance is not None:
        if instance.channel_name:
            frame = protocol.Shutdown(reason=message).model_dump_json()
            channel = instance.channel_name
            transaction.on_commit(lambda: send_to_channel(channel, {"type": "runner.frame", "frame": frame}))
        enqueue("backend.clouds.tasks.instance_terminate", instance_id)
    return changed


def instance_terminate_named(*, workspace: Workspace, name: str, by: str) -> tuple[Instance, bool]:
    """A person ends the workspace's machine ``name`` (its live one, else its
    latest) through the retire path: its runner is told to shut down and the
    backend to terminate it; a job on it ends as one whose machine went away.
    Asking again while it terminates answers it as it is. Returns the
    instance and whether this call asked for its termination."""
    found = Instance.objects.for_workspace(workspace).filter(name=name).order_by("-created_at")
    instance = found.filter(status__in=[*LIVE_STATUSES, InstanceStatus.TERMINATING]).first() or found.first()
    if instance is None:
        raise NotFound(f"No instance named {name!r} in this workspace (see `trainyard instances --all`).")
    if instance.backend == BackendKind.SELF_HOSTED:
        raise ApplicationError(
            f"{name} is a self-hosted machine: it is not Trainyard's to terminate; "
            f"revoke its runner instead (`trainyard runners revoke {name}`).",
            status_code=409,
        )
    if instance.status in (InstanceStatus.TERMINATED, InstanceStatus.LOST):
        raise ApplicationError(f"{name} is already {instance.status}.", status_code=409)
    asked = instance.status != InstanceStatus.TERMINATING and instance_request_termination(
        instance_id=str(instance.pk), reason=InstanceReason.TERMINATE_REQUESTED, message=f"terminated by {by}"
    )
    instance.refresh_from_db()
    return instance, asked


def instance_terminated(*, instance_id: str, message: str = "the backend confirmed") -> bool:
    """The backend says the machine is gone. A lost instance stays lost."""
    changed = _transition(
        instance_id,
        [InstanceStatus.TERMINATING, *LIVE_STATUSES],
        InstanceStatus.TERMINATED,
        InstanceReason.TERMINATED,
        message,
        terminated_at=timezone.now(),
        channel_name="",
    )
    if not changed:
        Instance.objects.filter(pk=instance_id, status=InstanceStatus.LOST).update(backend_data=_confirmed(instance_id))
    return changed


def instance_end_words(instance: Instance) -> str:
    """What ended ``instance``, in the words of the change that gave it its
    termination reason (its ``status_reason`` is its latest change's, such
    as the backend's confirmation)."""
    said = (
        InstanceEvent.objects.filter(instance_id=instance.pk, reason=instance.termination_reason)
        .order_by("-created_at")
        .values_list("message", flat=True)
        .first()
    )
    return said or instance.status_reason


def handle_of(instance: Instance) -> Handle:
    data = instance.backend_data.get("handle", {}) if isinstance(instance.backend_data, dict) else {}
    extra = {k: str(v) for k, v in data.items() if k != "region"}
    return Handle(
        key=instance.idempotency_key, backend_id=instance.backend_id, region=str(data.get("region", "")), data=extra
    )


def offer_of(instance: Instance) -> dict[str, Any]:
    data = instance.backend_data.get("offer", {}) if isinstance(instance.backend_data, dict) else {}
    return dict(data)


# ------------------------------------------------------------------ helpers


def _revivable(instance: Instance) -> bool:
    """A self-hosted machine that was fenced (lost), not revoked."""
    return instance.backend == BackendKind.SELF_HOSTED and instance.status == InstanceStatus.LOST


def _transition(
    instance_id: str,
    old: list[InstanceStatus] | list[str],
    new: InstanceStatus,
    reason: InstanceReason,
    message: str,
    **fields: Any,
) -> bool:
    instance = Instance.objects.filter(pk=instance_id, status__in=old).only("id", "workspace_id", "status").first()
    if instance is None:
        return False
    changed = Instance.objects.filter(pk=instance_id, status=instance.status).update(
        status=new, status_reason=message[:500], **fields
    )
    if changed:
        _event(instance, instance.status, new, reason, message)
        logger.info("instance %s: %s → %s (%s) %s", instance_id, instance.status, new, reason, message)
    return bool(changed)


def _event(instance: Instance, old: str, new: str, reason: InstanceReason, message: str) -> None:
    InstanceEvent.objects.create(
        workspace_id=instance.workspace_id,
        instance_id=instance.pk,
        from_status=old,
        to_status=new,
        reason=reason,
        message=message[:1000],
    )


def _confirmed(instance_id: str) -> dict[str, Any]:
    instance = Instance.objects.get(pk=instance_id)
    return {**instance.backend_data, "terminate_confirmed": True}
