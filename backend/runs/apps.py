"""The runs app. At start it plugs the API's run snapshot into the events
module, so that services publish runs without importing the API layer."""

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
