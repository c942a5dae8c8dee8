"""`manage.py issue_token USERNAME`: print a new API token (creates the user)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from backend.accounts.services import api_token_create, user_get_or_create


class Command(BaseCommand):
    help = "Print a new API token for USERNAME, creating the user and a personal workspace if needed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="a label for the token")

    def handle(self, *args: Any, **options: Any) -> None:
        user = user_get_or_create(username=options["username"])
        self.stdout.write(api_token_create(user=user, name=options["name"]))
