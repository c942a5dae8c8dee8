"""The metrics app: a job's system samples and training values, stored in
compact blocks per attempt (docs/METRICS.md). ``backend.runs`` calls its
services (ingestion from the runner's socket) and selectors (the guards);
this app imports nothing of ``backend.runs`` but its models."""

from __future__ import annotations

from django.apps import AppConfig


class MetricsConfig(AppConfig):
    name = "backend.metrics"
    label = "metrics"
