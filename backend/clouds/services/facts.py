"""Account facts: what a backend's ``offers`` needs to know about an account
(zones, type offerings per zone, spot prices, quotas), asked for by a
periodic task and stored as ``config["facts"]``, so that scheduling never
waits on a cloud (docs/BACKENDS.md, "Account facts")."""

from __future__ import annotations

import logging

from django.conf import settings
from django.utils import timezone

from backend.clouds.backends.base import Compute
from backend.clouds.backends.errors import ACCOUNT_BROKEN, ComputeError, InvalidConfig
from backend.clouds.backends.registry import compute_class
from backend.clouds.models import AccountStatus, CloudAccount
from backend.clouds.services.accounts import account_mark_broken, compute_of

logger = logging.getLogger(__name__)


def accounts_refresh_facts(*, account_id: str | None = None) -> int:
    """Refresh the facts of every active account whose facts are older than
    ``FACTS_REFRESH_SECONDS`` (or of ``account_id`` now), of every kind whose
    backend keeps facts (``keeps_facts``). One backend call per account,
    outside any transaction; returns how many were stored."""
    active = CloudAccount.objects.filter(status=AccountStatus.ACTIVE)
    kinds = [kind for kind in set(active.values_list("kind", flat=True)) if keeps_facts(kind)]
    accounts = active.filter(kind__in=kinds)
    if account_id is not None:
        accounts = accounts.filter(pk=account_id)
    now = timezone.now().timestamp()
    every = settings.TRAINYARD["FACTS_REFRESH_SECONDS"]
    stored = 0
    for account in accounts:
        facts = (account.config or {}).get("facts") or {}
        if account_id is None and now - float(facts.get("refreshed_at", 0) or 0) < every:
            continue
        stored += _refresh(account)
    return stored


def keeps_facts(kind: str) -> bool:
    """Whether ``kind``'s backend (built-in or ``TRAINYARD_BACKEND_KINDS``)
    answers ``refresh_facts`` with something (it overrides ``Compute``'s)."""
    try:
        cls = compute_class(kind, settings.TRAINYARD["BACKEND_KINDS"])
    except (InvalidConfig, ImportError, TypeError):
        return False
    return cls.refresh_facts is not Compute.refresh_facts


def _refresh(account: CloudAccount) -> int:
    try:
        facts = compute_of(account).refresh_facts()
    except ComputeError as error:
        if isinstance(error, ACCOUNT_BROKEN):
            account_mark_broken(account_id=str(account.pk), message=str(error))
        else:
            logger.warning("refreshing the facts of account %s: %s", account.pk, error)
        return 0
    except Exception:
        logger.exception("refreshing the facts of account %s failed", account.pk)
        return 0
    if facts is None:
        return 0
    # Read-modify-write of one key: a concurrent edit of another key is kept.
    current = CloudAccount.objects.filter(pk=account.pk).values_list("config", flat=True).first()
    if current is None:
        return 0
    # Stamped here when the backend does not (its age decides the next refresh).
    stored = {**facts, "refreshed_at": facts.get("refreshed_at") or timezone.now().timestamp()}
    CloudAccount.objects.filter(pk=account.pk).update(config={**current, "facts": stored}, updated_at=timezone.now())
    return 1
