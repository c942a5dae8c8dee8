"""Typed errors a backend raises; what the caller does with each is in
``Compute``'s docstring and docs/BACKENDS.md.

Every error carries the cloud's own ``code`` (``InsufficientInstanceCapacity``),
a ``scope`` (what the failure is about, so the caller skips exactly that for
``retry_after`` seconds) and a ``message`` a user can act on.
"""

from __future__ import annotations

import functools
from enum import StrEnum
from typing import Any


class Scope(StrEnum):
    OFFER = "offer"  # this exact offer (type, market, zone)
    ZONE = "zone"
    INSTANCE_TYPE = "instance_type"  # the type in the region
    QUOTA = "quota"  # a quota family in the region and market
    REGION = "region"
    ACCOUNT = "account"


class ComputeError(Exception):
    default_scope: Scope = Scope.OFFER
    default_retry_after: float | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str = "",
        scope: Scope | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or type(self).__name__
        self.scope = scope or self.default_scope
        self.retry_after = retry_after if retry_after is not None else self.default_retry_after

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.code != type(self).__name__ else self.message

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        # Pickled whole (Celery, multiprocessing): the default keeps only the message.
        rebuild = functools.partial(
            type(self), self.message, code=self.code, scope=self.scope, retry_after=self.retry_after
        )
        return rebuild, ()


class NoCapacity(ComputeError):
    """The cloud has no machine of this kind here now: try the next offer."""

    default_retry_after = 180.0


class QuotaExceeded(ComputeError):
    """The account's quota does not allow it: try the next offer; name the quota."""

    default_scope = Scope.QUOTA
    default_retry_after = 600.0


class Transient(ComputeError):
    """Throttled, a 5xx, a timeout: call again later with the same arguments."""

    default_retry_after = 5.0


class AuthFailed(ComputeError):
    """The credentials are wrong or lack a permission: stop using the account."""

    default_scope = Scope.ACCOUNT


class InvalidConfig(ComputeError):
    """The account's configuration cannot work (a bad region, a missing bucket)."""

    default_scope = Scope.ACCOUNT


class NotYetTerminated(ComputeError):
    """terminate() was accepted but the machine is still going down: call again."""

    default_retry_after = 5.0


# Errors after which the caller moves to the next offer.
NEXT_OFFER = (NoCapacity, QuotaExceeded)
# Errors after which the account is not used until someone fixes it.
ACCOUNT_BROKEN = (AuthFailed, InvalidConfig)
