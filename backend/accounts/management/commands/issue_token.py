"""`manage.py issue_token USERNAME`: print a new API token (creates the user).

``--keep FILE`` prints the token kept in FILE while it still works, and
makes (and keeps) a new one only when it does not: ``make run`` prints the
same token on every start instead of minting one each time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from backend.accounts.services import api_token_create, user_get_or_create
from backend.accounts.services.tokens import api_token_kept


class Command(BaseCommand):
    help = "Print a new API token for USERNAME, creating the user and a personal workspace if needed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="a label for the token")
        parser.add_argument(
            "--keep", type=Path, default=None, help="reuse the token in this file while it works; else keep a new one"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = user_get_or_create(username=options["username"])
        if options["keep"] is not None:
            self.stdout.write(api_token_kept(user=user, path=options["keep"], name=options["name"]))
            return
        self.stdout.write(api_token_create(user=user, name=options["name"]))
