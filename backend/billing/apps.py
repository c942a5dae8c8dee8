"""The billing app: what machines cost (computed from the instance and
attempt rows) and the budgets that cap it (docs/COST.md)."""

from __future__ import annotations

from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "backend.billing"
    label = "billing"
