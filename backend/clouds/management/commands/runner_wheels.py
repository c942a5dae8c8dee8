"""Make the wheels this server serves to the machines it boots (once; later calls find them)."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from backend.clouds.services.runner_wheels import WheelhouseError, wheelhouse


class Command(BaseCommand):
    help = "Make the runner's wheelhouse (TRAINYARD_RUNNER_WHEELHOUSE) now instead of at the first request."

    def handle(self, *args: Any, **options: Any) -> None:
        started = time.monotonic()
        try:
            path = wheelhouse()
        except WheelhouseError as e:
            raise CommandError(str(e)) from None
        self.stdout.write(f"{path} ({len(list(path.glob('*.whl')))} wheels, {time.monotonic() - started:.1f}s)")
