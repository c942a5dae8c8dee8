"""Rate limits on websocket connects (``backend.core.ratelimit``), closing
with ``CLOSE_RATE_LIMITED`` (4429) and the wait in the close reason."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from trainyard_runner.protocol import CLOSE_RATE_LIMITED

from backend.core.origins import scope_ip
from backend.core.ratelimit import Refusal, rate_hit, rate_over

__all__ = ["CLOSE_RATE_LIMITED", "close_reason", "connect_hit", "connect_over", "scope_ip"]


async def connect_hit(*, scope: str, kind: str, identity: str) -> Refusal | None:
    # Off the event loop: the counter is one Redis round trip of the sync client.
    return await sync_to_async(rate_hit, thread_sensitive=False)(scope=scope, kind=kind, identity=identity)


async def connect_over(*, scope: str, kind: str, identity: str) -> Refusal | None:
    return await sync_to_async(rate_over, thread_sensitive=False)(scope=scope, kind=kind, identity=identity)


def close_reason(refusal: Refusal) -> str:
    """At most 123 bytes, as a close reason must be."""
    text = f"rate limited: at most {refusal.limit} connects per {refusal.period_seconds} s"
    return f"{text}; retry in {refusal.retry_after} s"[:123]
