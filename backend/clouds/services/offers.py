"""Offers across every account a workspace may use, filtered by the job's
requirements and ranked cheapest first."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from uuid import UUID

from django.conf import settings

from backend.clouds.backends.base import Offer, Requirements, shortfall
from backend.clouds.models import LIVE_STATUSES, BackendKind, CloudAccount, Instance
from backend.clouds.services.accounts import accounts_usable, compute_of

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    account: CloudAccount
    offer: Offer


@dataclass(frozen=True)
class OfferChoice:
    candidates: list[Candidate]  # every offer that fits, cheapest first
    shortfall: str  # when none fits: why (the closest offer's shortfall)
    accounts: int  # how many accounts were asked


def offers_rank(*, workspace_id: UUID | str, req: Requirements, backends: Iterable[str] = ()) -> OfferChoice:
    """1. The workspace's usable accounts (only ``backends`` when given).
    2. Each backend's offers, from its catalog (no network call).
    3. Keep the ones whose resources cover ``req``; remember the shortfall
       of the others. 4. Cheapest first, then the smallest machine."""
    wanted = set(backends)
    accounts = [a for a in accounts_usable(workspace_id=workspace_id) if not wanted or a.kind in wanted]
    fitting: list[Candidate] = []
    short: list[tuple[Offer, str]] = []
    for account in accounts:
        for offer in _offers(account, req):
            missing = shortfall(req, offer)
            if missing is None:
                fitting.append(Candidate(account, offer))
            else:
                short.append((offer, missing))
    fitting.sort(key=lambda c: (c.offer.price_per_hour, c.offer.cpus, c.offer.memory_bytes, len(c.offer.gpus)))
    # The biggest machines first: their shortfall is the one worth reading.
    short.sort(key=lambda s: (len(s[0].gpus), s[0].memory_bytes, s[0].cpus, s[0].disk_bytes), reverse=True)
    words = "; ".join(f"{o.backend} {o.instance_type}: {m}" for o, m in short[:3])
    return OfferChoice(fitting, words, len(accounts))


def pool_room(*, kind: str) -> int | None:
    """Machines a shared pool may still start; None when it has no limit.
    The local backend's runners share the server's host: TRAINYARD_LOCAL_RUNNERS_MAX."""
    if kind != BackendKind.LOCAL:
        return None
    live = Instance.objects.filter(backend=BackendKind.LOCAL, status__in=LIVE_STATUSES).count()
    return max(0, int(settings.TRAINYARD["LOCAL_RUNNERS_MAX"]) - live)


def _offers(account: CloudAccount, req: Requirements) -> list[Offer]:
    try:
        return list(compute_of(account).offers(req))
    except Exception:  # one broken backend must not hide the others' offers
        logger.exception("offers of account %s failed", account.pk)
        return []
