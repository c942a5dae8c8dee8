"""Parts of an account's offers not to try for a while (``OfferBlock``).

A launch that failed with ``NoCapacity``, ``QuotaExceeded`` (or an account
error about something narrower than the account, such as one region) blocks
exactly the error's scope for its ``retry_after``, so the next scheduling
pass, in any process, goes straight to an offer outside it. Blocks live in
Postgres: every scheduler sees them, and a restart forgets nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from backend.clouds.backends.base import Offer
from backend.clouds.backends.errors import ACCOUNT_BROKEN, ComputeError, Scope
from backend.clouds.models import CloudAccount, OfferBlock

# When an error gives no retry-after: how long each scope is skipped (docs/BACKENDS.md).
DEFAULT_SECONDS = {
    Scope.OFFER: 180.0,
    Scope.ZONE: 180.0,
    Scope.INSTANCE_TYPE: 180.0,
    Scope.QUOTA: 600.0,
    Scope.REGION: 600.0,
    Scope.ACCOUNT: 600.0,
}
# An error "until the user fixes it" about less than the whole account (a
# region not opted in): looked at again after this long.
UNTIL_FIXED_SECONDS = 3600.0
# Old rows are deleted when a block is recorded this long after they ran out.
KEEP_EXPIRED = timedelta(days=1)


@dataclass(frozen=True)
class Blocks:
    """The blocks in force, to look offers up in."""

    by_key: dict[tuple[str, str, str], OfferBlock]

    def of(self, account_id: str, offer: Offer) -> OfferBlock | None:
        """The block ``offer`` of this account falls under, if any (the
        widest scope first: it says more)."""
        for scope in reversed(list(Scope)):
            key = block_key(scope, offer)
            if key is not None:
                block = self.by_key.get((account_id, scope, key))
                if block is not None:
                    return block
        return None


def block_key(scope: Scope | str, offer: Offer) -> str | None:
    """What ``scope`` names of ``offer`` within its account; None for the
    whole account (an account-wide block has the key "")."""
    market = "spot" if offer.spot else "on-demand"
    keys = {
        Scope.OFFER: offer.offer_id,
        Scope.ZONE: f"{offer.region}/{offer.zone or '-'}",
        Scope.INSTANCE_TYPE: f"{offer.region}/{offer.instance_type}",
        Scope.QUOTA: f"{offer.region}/{market}/{quota_family(offer)}",
        Scope.REGION: offer.region,
        Scope.ACCOUNT: "",
    }
    return keys.get(Scope(scope))


def quota_family(offer: Offer) -> str:
    """The quota an offer counts against: what the backend says
    (``Offer.data["quota_family"]``), else the type's family (``g5`` of ``g5.xlarge``)."""
    return offer.data.get("quota_family") or offer.instance_type.split(".")[0]


def offer_block_record(
    *, account: CloudAccount, offer: Offer, error: ComputeError, now: datetime | None = None
) -> OfferBlock:
    """Block ``error.scope`` of ``offer`` for ``error.retry_after`` (or the
    scope's default); a block already there is extended, never shortened."""
    now = now or timezone.now()
    scope = Scope(error.scope)
    seconds = error.retry_after if error.retry_after is not None else _default_seconds(error, scope)
    until = now + timedelta(seconds=seconds)
    key = block_key(scope, offer) or ""
    fields = {"code": error.code[:100], "message": error.message[:1000], "until": until}
    with transaction.atomic():
        block = OfferBlock.objects.select_for_update().filter(account=account, scope=scope, key=key).first()
        if block is None:
            try:
                with transaction.atomic():
                    block = OfferBlock.objects.create(
                        workspace_id=account.workspace_id, account=account, scope=scope, key=key, **fields
                    )
            except IntegrityError:  # another worker recorded it first: extend theirs
                block = OfferBlock.objects.select_for_update().get(account=account, scope=scope, key=key)
        if block.until < until:
            OfferBlock.objects.filter(pk=block.pk).update(**fields)
            block.refresh_from_db()
    OfferBlock.objects.filter(until__lt=now - KEEP_EXPIRED).delete()
    return block


def offer_blocks_active(*, account_ids: Iterable[str], now: datetime | None = None) -> Blocks:
    now = now or timezone.now()
    rows = OfferBlock.objects.filter(account_id__in=list(account_ids), until__gt=now)
    return Blocks({(str(b.account_id), b.scope, b.key): b for b in rows})


def block_words(block: OfferBlock, *, now: datetime | None = None) -> str:
    """``quota us-east-1/spot/g5 blocked 9m 58s more (MaxSpotInstanceCountExceeded)``."""
    now = now or timezone.now()
    left = max(0, int((block.until - now).total_seconds()))
    what = f"{block.scope} {block.key}" if block.key else "the account"
    return f"{what} blocked {_span(left)} more ({block.code})"


def _default_seconds(error: ComputeError, scope: Scope) -> float:
    return UNTIL_FIXED_SECONDS if isinstance(error, ACCOUNT_BROKEN) else DEFAULT_SECONDS[scope]


def _span(seconds: int) -> str:
    minutes, secs = divmod(seconds, 60)
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"
