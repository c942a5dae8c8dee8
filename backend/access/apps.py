"""The access app. At start it asks the state machine to end a job's
sessions whenever one of its attempts ends (``runs.events.on_attempt_end``),
so that ``backend.runs`` never imports this app."""

from __future__ import annotations

from django.apps import AppConfig


class AccessConfig(AppConfig):
    name = "backend.access"
    label = "access"

    def ready(self) -> None:
        from backend.access.services.sessions import sessions_end_for_attempt
        from backend.runs import events

        events.on_attempt_end(sessions_end_for_attempt)
