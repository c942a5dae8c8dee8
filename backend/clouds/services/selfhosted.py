"""Self-hosted machines: registration tokens, registering a machine, revoking it.

A workspace admin makes a single-use registration token (shown once, stored
hashed). ``trainyard-runner register`` on the machine exchanges it over HTTP
for the machine's own runner token (``runner_register``): one Instance row of
backend ``self-hosted`` under the workspace's self-hosted account (made on
demand), which is the runner's identity from then on, across restarts.
Revoking (``runner_revoke``) ends that identity; the machine itself is never
touched (docs/RUNNER.md, "Self-hosted machines").

A self-hosted machine costs what the workspace says it costs: a price per
hour given with its registration token (priced from its first hello) or set
on the machine later (``runner_price_set``, the price of its whole billed
time from then on: billing keeps one price per machine, docs/COST.md,
"Per backend").
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from backend.accounts.models import User, Workspace
from backend.clouds.models import BackendKind, CloudAccount, Instance, InstanceReason, RunnerRegistrationToken
from backend.clouds.services.instances import instance_register, instance_revoke
from backend.core.errors import ApplicationError
from backend.core.tokens import REGISTRATION_TOKEN_PREFIX, RUNNER_TOKEN_PREFIX, hash_token

SELF_HOSTED_ACCOUNT_NAME = "self-hosted"
# A registration token not used within this long is refused.
REGISTRATION_TOKEN_TTL = timedelta(days=7)
REGISTRATION_PREFIX = REGISTRATION_TOKEN_PREFIX
RUNNER_PREFIX = RUNNER_TOKEN_PREFIX
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# The most a workspace may say one machine costs an hour (USD): a typo's
# ceiling (a p5.48xlarge is about $100/h), not a market price.
MAX_PRICE_PER_HOUR = Decimal(10_000)
PRICE_PLACES = 6  # Instance.price_per_hour's decimal places


@dataclass(frozen=True)
class PriceChange:
    instance: Instance
    before: Decimal


@dataclass(frozen=True)
class IssuedRegistration:
    row: RunnerRegistrationToken
    token: str  # shown once


@dataclass(frozen=True)
class Registered:
    instance: Instance
    runner_token: str  # shown once, to the runner


def registration_token_create(
    *, workspace: Workspace, user: User, note: str = "", price_per_hour: Any = None
) -> IssuedRegistration:
    """A single-use token; ``price_per_hour`` (USD, default 0) becomes the
    price of the machine it registers."""
    price = price_clean(price_per_hour) if price_per_hour is not None else Decimal(0)
    token = REGISTRATION_PREFIX + secrets.token_urlsafe(32)
    row = RunnerRegistrationToken.objects.create(
        workspace=workspace,
        token_hash=hash_token(token),
        prefix=token[: len(REGISTRATION_PREFIX) + 4],
        note=note[:100],
        created_by=user,
        expires_at=timezone.now() + REGISTRATION_TOKEN_TTL,
        price_per_hour=price,
    )
    return IssuedRegistration(row, token)


def registration_token_list(*, workspace: Workspace) -> list[RunnerRegistrationToken]:
    return list(RunnerRegistrationToken.objects.for_workspace(workspace).order_by("-created_at"))


def registration_token_revoke(*, workspace: Workspace, token_id: UUID) -> bool:
    """False when the workspace has no such token; revoking twice is fine."""
    rows = RunnerRegistrationToken.objects.for_workspace(workspace).filter(pk=token_id)
    if not rows.exists():
        return False
    rows.filter(revoked_at=None).update(revoked_at=timezone.now())
    return True


def registration_token_state(row: RunnerRegistrationToken) -> str:
    if row.revoked_at is not None:
        return "revoked"
    if row.used_at is not None:
        return "used"
    return "expired" if row.expires_at <= timezone.now() else "unused"


def runner_register(*, token: str, name: str = "", hostname: str = "") -> Registered:
    """Exchange a registration token for a new machine's identity.

    1. The token row is locked: two machines racing with one token get one
       identity. 2. Used, revoked, expired or unknown: refused (401), the
       same words for each but the state. 3. The workspace's self-hosted
       account (made on demand) gets a new Instance row holding the hash of a
       fresh runner token, returned once."""
    name = name.strip() or _name_from(hostname)
    if not NAME_RE.match(name):
        raise ApplicationError(
            f"{name!r} is not a valid runner name: use letters, digits, '.', '_' and '-' (at most 63).",
            extra={"field": "name"},
        )
    with transaction.atomic():
        row = RunnerRegistrationToken.objects.select_for_update().filter(token_hash=hash_token(token)).first()
        if row is None or registration_token_state(row) != "unused":
            state = "unknown" if row is None else registration_token_state(row)
            raise ApplicationError(
                f"This registration token is {state}: make a new one (dashboard → Self-hosted runners → Add a"
                " machine, or POST …/runners/registration-tokens/).",
                status_code=401,
            )
        account = _account(row.workspace_id)
        runner_token = RUNNER_PREFIX + secrets.token_urlsafe(32)
        instance = instance_register(
            account=account,
            name=_unique_name(row.workspace_id, name),
            token_hash=hash_token(runner_token),
            message=f"registered from {hostname or 'an unnamed host'} with registration token {row.prefix}…",
            price_per_hour=row.price_per_hour,
        )
        RunnerRegistrationToken.objects.filter(pk=row.pk).update(used_at=timezone.now(), instance=instance)
    return Registered(instance, runner_token)


def runners_list(*, workspace: Workspace) -> list[Instance]:
    """The workspace's self-hosted machines, revoked ones last."""
    rows = Instance.objects.for_workspace(workspace).filter(backend=BackendKind.SELF_HOSTED)
    return sorted(rows.order_by("name"), key=lambda i: i.termination_reason == InstanceReason.REVOKED)


def runner_revoke(*, workspace: Workspace, instance_id: UUID) -> bool:
    """False when the workspace has no such self-hosted machine. Its runner
    is refused from now on; a job it was running is retried elsewhere."""
    instance = Instance.objects.for_workspace(workspace).filter(pk=instance_id, backend=BackendKind.SELF_HOSTED).first()
    if instance is None:
        return False
    instance_revoke(
        instance_id=str(instance.pk),
        message=f"runner {instance.name} was revoked; register the machine again (trainyard-runner register)",
    )
    return True


def runner_price_set(*, workspace: Workspace, instance_id: UUID, price_per_hour: Any) -> PriceChange | None:
    """Set a self-hosted machine's price per hour (USD; 0: free); None when
    the workspace has no such machine. Costs read from then on use it, for
    the machine's whole billed time (one price per machine). Its source
    stays "workspace price for self-hosted"."""
    price = price_clean(price_per_hour)
    with transaction.atomic():
        instance = (
            Instance.objects.for_workspace(workspace)
            .select_for_update()
            .filter(pk=instance_id, backend=BackendKind.SELF_HOSTED)
            .first()
        )
        if instance is None:
            return None
        before = Decimal(instance.price_per_hour)
        Instance.objects.filter(pk=instance.pk).update(price_per_hour=price, updated_at=timezone.now())
        instance.price_per_hour = price
    return PriceChange(instance, before)


def price_clean(value: Any) -> Decimal:
    """A price per hour in USD: a number from 0 to ``MAX_PRICE_PER_HOUR``
    with at most 6 decimals, given as a number or a string ("1.20")."""
    field = {"field": "price_per_hour"}
    not_a_number = f"price_per_hour must be a number of USD an hour such as 1.20, not {value!r}"
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise ApplicationError(not_a_number, extra=field)
    try:
        price = Decimal(str(value).strip())
    except InvalidOperation:
        raise ApplicationError(not_a_number, extra=field) from None
    if not price.is_finite():
        raise ApplicationError(not_a_number, extra=field)
    if price < 0:
        raise ApplicationError(f"price_per_hour cannot be negative ({value}): 0 makes the machine free", extra=field)
    if price > MAX_PRICE_PER_HOUR:
        raise ApplicationError(f"price_per_hour {value} is more than ${MAX_PRICE_PER_HOUR:,} an hour", extra=field)
    exact = price.quantize(Decimal(1).scaleb(-PRICE_PLACES))
    if price != exact:
        raise ApplicationError(f"price_per_hour {value} has more than {PRICE_PLACES} decimals", extra=field)
    return exact


# ------------------------------------------------------------------ helpers


def _account(workspace_id: UUID) -> CloudAccount:
    account, _ = CloudAccount.objects.get_or_create(
        workspace_id=workspace_id, name=SELF_HOSTED_ACCOUNT_NAME, defaults={"kind": BackendKind.SELF_HOSTED}
    )
    if account.kind != BackendKind.SELF_HOSTED:
        raise ApplicationError(
            f"This workspace already has a cloud account named {SELF_HOSTED_ACCOUNT_NAME!r} of kind {account.kind}."
        )
    return account


def _name_from(hostname: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", hostname.split(".")[0])[:50].strip("-._")
    return cleaned or "runner"


def _unique_name(workspace_id: UUID, name: str) -> str:
    """``name``, or ``name-2``, ``name-3``… if a live machine of the workspace has it."""
    taken = set(
        Instance.objects.filter(workspace_id=workspace_id, backend=BackendKind.SELF_HOSTED)
        .exclude(termination_reason=InstanceReason.REVOKED)
        .values_list("name", flat=True)
    )
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}-{n}"
    return candidate
