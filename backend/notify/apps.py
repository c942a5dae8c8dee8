"""The notify app: a workspace's subscriptions to its runs' events (signed
webhooks, Slack incoming webhooks, email) and the log of each delivery.
``backend.runs`` calls ``services.notify_event``; this app imports nothing
of ``backend.runs`` but its models (docs/NOTIFICATIONS section of docs/COST.md)."""

from __future__ import annotations

from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "backend.notify"
    label = "notify"
