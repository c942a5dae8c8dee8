"""The runs app. At start it plugs the API's run snapshot into the events
module, so that services publish runs without importing the API layer, and
listens to billing's ``budget_raised`` (the runs a budget stopped resume)."""

from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "backend.runs"
    label = "runs"

    def ready(self) -> None:
        from backend.runs import events
        from backend.runs.api.listing import run_snapshot
        from backend.runs.scheduler.volumes import volumes_release_after

        events.snapshot_with(run_snapshot)
        events.on_attempt_end(volumes_release_after)
        # A raised or removed budget resumes the runs it stopped (backend.billing imports nothing of runs).
        from backend.billing.signals import budget_raised
        from backend.runs.services.budgets import on_budget_raised

        budget_raised.connect(on_budget_raised, dispatch_uid="runs.budget_raised")
