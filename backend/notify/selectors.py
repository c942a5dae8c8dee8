"""Reads of a workspace's subscriptions and their deliveries: admins see
every subscription of the workspace, anyone else only their own."""

from __future__ import annotations

from typing import Any

from backend.accounts.models import Membership, Role, Workspace
from backend.notify.models import Delivery, Subscription

DELIVERY_PAGE = 100


def subscriptions_visible(*, workspace: Workspace, membership: Membership) -> Any:
    """The subscriptions the member may see and manage."""
    subscriptions = Subscription.objects.for_workspace(workspace).order_by("created_at")
    if membership.role == Role.ADMIN:
        return subscriptions
    return subscriptions.filter(created_by_id=membership.user_id)


def deliveries_of(*, subscription: Subscription, limit: int = DELIVERY_PAGE) -> list[Delivery]:
    """The newest deliveries first."""
    return list(subscription.deliveries.order_by("-created_at")[:limit])
