"""`manage.py disconnect_runners [NAME …]`: close runners' websockets.

For operations (e.g. to move runners to other web processes before a
deploy) and for tests of at-least-once delivery: a runner reconnects at once
and resends every unacknowledged line. Jobs keep running.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from backend.clouds.models import Instance
from backend.runs.events import send_to_channel


class Command(BaseCommand):
    help = "Close the websocket of the named runners (all connected runners when none is named)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="*", help="instance names, e.g. local-1a2b3c4d")

    def handle(self, *args: Any, **options: Any) -> None:
        instances = Instance.objects.exclude(channel_name="")
        if options["names"]:
            instances = instances.filter(name__in=options["names"])
        count = 0
        for instance in instances:
            send_to_channel(instance.channel_name, {"type": "runner.drop"})
            count += 1
        self.stdout.write(f"disconnected {count} runner(s)")
