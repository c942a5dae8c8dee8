"""Offers across every account a workspace may use, filtered by the job's
requirements and ranked cheapest first."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from pydantic_core import PydanticCustomError
from trainyard_spec._units import parse_gpu, parse_size  # as workflow files: 16GB is 16 GiB, A10G:2 two A10Gs

from backend.clouds.backends.base import Offer, Requirements, SpotPolicy, shortfall
from backend.clouds.models import LIVE_STATUSES, BackendKind, CloudAccount, Instance
from backend.clouds.services.accounts import accounts_usable, compute_of
from backend.core.errors import ApplicationError

SPOT_POLICIES: tuple[SpotPolicy, ...] = ("spot", "on-demand", "auto")

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


def offer_requirements(
    *, gpu: str = "", memory: str = "", cpu: str = "", spot_policy: str = "auto", regions: str = ""
) -> Requirements:
    """Requirements from the words a person types (``gpu=A10G:2``,
    ``memory=16GB``, ``cpu=8``, ``region=us-east-1,eu-west-1``);
    ``ApplicationError`` naming the bad one."""
    name, count = _gpu(gpu) if gpu.strip() else ("", 0)
    if cpu and not cpu.strip().isdigit():
        raise ApplicationError(f"cpu {cpu!r}: a whole number of CPUs, e.g. 8")
    return Requirements(
        cpu=int(cpu) if cpu else None,
        memory_bytes=_size("memory", memory) if memory else None,
        gpu_name=name,
        gpu_count=count,
        spot_policy=_policy(spot_policy),
        regions=tuple(r.strip() for r in regions.split(",") if r.strip()),
    )


def catalog_date(account: CloudAccount) -> str | None:
    """The date of the catalog the account's backend prices offers from,
    when it has one (``Compute.catalog_date``, an ISO date)."""
    try:
        date = getattr(compute_of(account), "catalog_date", None)
    except Exception:  # a backend that cannot be built has no offers either
        return None
    return str(date) if date else None


def pool_room(*, kind: str) -> int | None:
    """Machines a shared pool may still start; None when it has no limit.
    The local backend's runners share the server's host: TRAINYARD_LOCAL_RUNNERS_MAX."""
    if kind != BackendKind.LOCAL:
        return None
    live = Instance.objects.filter(backend=BackendKind.LOCAL, status__in=LIVE_STATUSES).count()
    return max(0, int(settings.TRAINYARD["LOCAL_RUNNERS_MAX"]) - live)


def _policy(value: str) -> SpotPolicy:
    for policy in SPOT_POLICIES:
        if value == policy:
            return policy
    raise ApplicationError(f"spot_policy {value!r}: one of {', '.join(SPOT_POLICIES)}")


def _gpu(value: str) -> tuple[str, int]:
    try:
        return parse_gpu(value)
    except PydanticCustomError as error:
        raise ApplicationError(f"gpu {value!r}: {error}") from None


def _size(what: str, value: str) -> int:
    try:
        return parse_size(value)
    except PydanticCustomError as error:
        raise ApplicationError(f"{what} {value!r}: {error}") from None


def _offers(account: CloudAccount, req: Requirements) -> list[Offer]:
    try:
        return list(compute_of(account).offers(req))
    except Exception:  # one broken backend must not hide the others' offers
        logger.exception("offers of account %s failed", account.pk)
        return []
