"""Setting and removing budgets (docs/COST.md, "Budgets and quotas").

Rules:

- A workspace has at most one budget of its own and one per member (the
  member's runs' spending and, with ``gpu_quota``, the GPUs their running
  jobs hold at once). Only admins change them (the API says who may).
- ``monthly_limit``: USD, more than 0, whole cents, at most ``MAX_AMOUNT``;
  None: no monthly cap. ``gpu_quota``: a member's only, 0 to ``MAX_GPUS``;
  None: no quota. ``warn_percent``: 1 to 99. A field left out keeps its
  value; a budget with neither a limit nor a quota is refused (remove it).
- Bad input raises ApplicationError naming the field and what to send,
  before anything is written. The change and its audit entry
  (``budget.set`` / ``budget.removed``) are one transaction.
- A change that gives the budget more room (its limit raised or taken off,
  or the budget removed) sends ``signals.budget_raised`` once committed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import partial
from typing import Any

from django.db import transaction

from backend.accounts.models import AuditKind, User, Workspace
from backend.accounts.services.audit import Actor, audit_record
from backend.billing.models import MAX_AMOUNT, Budget
from backend.billing.selectors import DEFAULT_WARN_PERCENT
from backend.billing.signals import budget_raised
from backend.core.errors import ApplicationError, NotFound

FIELDS = ("monthly_limit", "gpu_quota", "warn_percent")
MAX_GPUS = 10_000
CENT = Decimal("0.01")


@dataclass(frozen=True)
class BudgetValues:
    monthly_limit: Decimal | None
    gpu_quota: int | None
    warn_percent: int


def budget_of(*, workspace: Workspace, member: User | None) -> Budget | None:
    """The workspace's own budget (``member`` None) or the member's; None: there is none."""
    return Budget.objects.filter(workspace=workspace, user=member).first()


def budget_set(*, workspace: Workspace, member: User | None, changes: Mapping[str, Any], actor: Actor) -> Budget:
    """Set the workspace's budget (``member`` None) or a member's from
    ``changes`` (a subset of ``FIELDS``), audited; see the module's rules."""
    unknown = sorted(set(changes) - set(FIELDS))
    if unknown:
        raise ApplicationError(f"unknown field {unknown[0]!r}; a budget has {', '.join(FIELDS)}.")
    parsed = _parsed(changes)
    if member is None and parsed.get("gpu_quota") is not None:
        raise ApplicationError(
            "gpu_quota is a member's (the GPUs their running jobs hold at once): set it on their budget "
            "(PUT …/budgets/<username>/, trainyard budget set … --user NAME --gpus N)."
        )
    with transaction.atomic():
        Workspace.objects.select_for_update().filter(pk=workspace.pk).get()  # one writer of its budgets at a time
        budget = Budget.objects.select_for_update().filter(workspace=workspace, user=member).first()
        before = _values(budget) if budget is not None else None
        current = before or BudgetValues(monthly_limit=None, gpu_quota=None, warn_percent=DEFAULT_WARN_PERCENT)
        after = BudgetValues(
            monthly_limit=parsed.get("monthly_limit", current.monthly_limit),
            gpu_quota=parsed.get("gpu_quota", current.gpu_quota),
            warn_percent=parsed.get("warn_percent", current.warn_percent),
        )
        if after.monthly_limit is None and after.gpu_quota is None:
            raise ApplicationError(
                "a budget needs a monthly_limit"
                + (" or a gpu_quota" if member is not None else "")
                + ": to take the cap off, remove the budget (DELETE, trainyard budget rm)."
            )
        if budget is None:
            budget = Budget(workspace=workspace, user=member)
        budget.monthly_limit = after.monthly_limit
        budget.gpu_quota = after.gpu_quota
        budget.warn_percent = after.warn_percent
        budget.updated_by = actor.user
        budget.save()
        audit_record(
            workspace_id=workspace.pk,
            kind=AuditKind.BUDGET,
            action="budget.set",
            actor=actor,
            target=_target(member),
            detail={"before": _shown(before), "after": _shown(after)},
        )
        if before is not None and _raised(before.monthly_limit, after.monthly_limit):
            _tell_raised(workspace, member)
    return budget


def budget_remove(*, workspace: Workspace, member: User | None, actor: Actor) -> None:
    """Remove the workspace's budget (``member`` None) or a member's,
    audited; NotFound when there is none."""
    with transaction.atomic():
        budget = Budget.objects.select_for_update().filter(workspace=workspace, user=member).first()
        if budget is None:
            raise NotFound(f"{_target(member)} has no budget in {workspace.slug}.")
        before = _values(budget)
        budget.delete()
        audit_record(
            workspace_id=workspace.pk,
            kind=AuditKind.BUDGET,
            action="budget.removed",
            actor=actor,
            target=_target(member),
            detail={"before": _shown(before)},
        )
        if before.monthly_limit is not None:
            _tell_raised(workspace, member)


def _raised(before: Decimal | None, after: Decimal | None) -> bool:
    """More room: a limit taken off, or raised."""
    return before is not None and (after is None or after > before)


def _tell_raised(workspace: Workspace, member: User | None) -> None:
    user_id = member.pk if member is not None else None
    transaction.on_commit(partial(budget_raised.send, sender=Budget, workspace_id=workspace.pk, user_id=user_id))


def _target(member: User | None) -> str:
    return "the workspace" if member is None else member.username


def _values(budget: Budget) -> BudgetValues:
    return BudgetValues(budget.monthly_limit, budget.gpu_quota, budget.warn_percent)


def _shown(values: BudgetValues | None) -> dict[str, Any] | None:
    if values is None:
        return None
    limit = values.monthly_limit
    return {
        "monthly_limit": None if limit is None else str(limit),
        "gpu_quota": values.gpu_quota,
        "warn_percent": values.warn_percent,
    }


def _parsed(changes: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "monthly_limit" in changes:
        out["monthly_limit"] = amount_parse("monthly_limit", changes["monthly_limit"], nullable=True)
    if "gpu_quota" in changes:
        out["gpu_quota"] = _count("gpu_quota", changes["gpu_quota"])
    if "warn_percent" in changes:
        out["warn_percent"] = _percent(changes["warn_percent"])
    return out


def amount_parse(field: str, value: object, *, nullable: bool = False) -> Decimal | None:
    """An amount of USD as sent (a decimal string or a number): more than 0,
    whole cents, at most ``MAX_AMOUNT``; ApplicationError naming ``field`` otherwise."""
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float, Decimal)):
        raise ApplicationError(f"{field}: expected an amount of USD such as 500 or 499.99, got {_got(value)}.")
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise ApplicationError(
            f"{field}: {str(value)[:40]!r} is not an amount of USD (write e.g. 500 or 499.99)."
        ) from None
    if not amount.is_finite():
        raise ApplicationError(f"{field}: {str(value)[:40]!r} is not an amount of USD (write e.g. 500 or 499.99).")
    if amount <= 0:
        raise ApplicationError(f"{field}: must be more than $0, got {value}.")
    if amount > MAX_AMOUNT:
        raise ApplicationError(f"{field}: at most ${MAX_AMOUNT:,}, got {value}.")
    if amount != amount.quantize(CENT):
        raise ApplicationError(f"{field}: whole cents at most (two decimals), got {value}.")
    return amount.quantize(CENT)


def _count(field: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GPUS:
        raise ApplicationError(f"{field}: a whole number of GPUs from 0 to {MAX_GPUS}, or null, got {_got(value)}.")
    return value


def _percent(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 99:
        raise ApplicationError(f"warn_percent: a whole percent from 1 to 99, got {_got(value)}.")
    return value


def _got(value: object) -> str:
    text = repr(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
    return text[:40] if value is not None else "null"
