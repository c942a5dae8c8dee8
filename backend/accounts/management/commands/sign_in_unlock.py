"""`manage.py sign_in_unlock NAME`: end now the sign-in lockouts of a username or an address.

For when the locked-out account is the one that would lift it in the Django
admin (the local ``admin``, say): run it on the server's host.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from backend.accounts.services.lockout import lockouts_lift


class Command(BaseCommand):
    help = "End now the password sign-in lockouts of a username or a client address."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="a username or a client address")

    def handle(self, *args: Any, **options: Any) -> None:
        lifted = lockouts_lift(identity=options["name"])
        self.stdout.write(f"Lifted {lifted} lockout(s) of {options['name']!r}." if lifted else "No active lockout.")
