"""`manage.py rotate_secret_keys`: re-encrypt every secret (and every kept
GitHub sign-in token) with the first key of TRAINYARD_SECRET_KEYS, so older
keys can then be removed."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction

from backend.accounts.models import User
from backend.vault.crypto import Unreadable, rotate
from backend.vault.models import Secret


class Command(BaseCommand):
    help = "Re-encrypt all secrets with the newest key (the first of TRAINYARD_SECRET_KEYS)."

    def handle(self, *args: Any, **options: Any) -> None:
        count, unreadable = 0, []
        with transaction.atomic():
            for secret in Secret.objects.select_for_update().select_related("workspace"):
                try:
                    ciphertext = rotate(secret.ciphertext)
                except Unreadable:  # left as it is: the list shows it, its workspace's admins set it again
                    unreadable.append(f"{secret.workspace.slug}/{secret.name}")
                    continue
                Secret.objects.filter(pk=secret.pk).update(ciphertext=ciphertext)
                count += 1
        self.stdout.write(f"re-encrypted {count} secret(s)")
        if unreadable:
            self.stderr.write(f"no key opens {len(unreadable)} secret(s), left as they are: {', '.join(unreadable)}")
        self.stdout.write(f"re-encrypted {_github_tokens()} kept GitHub sign-in token(s)")


def _github_tokens() -> int:
    """The GitHub tokens kept for the allowlist's re-check
    (backend/accounts/services/allowlist.py); one no key opens is dropped:
    the next re-check then finds none, and that person signs in again."""
    count = 0
    with transaction.atomic():
        for user in User.objects.select_for_update().filter(github_token__isnull=False).only("pk", "github_token"):
            try:
                token = rotate(user.github_token or b"")
            except Unreadable:
                User.objects.filter(pk=user.pk).update(github_token=None)
                continue
            User.objects.filter(pk=user.pk).update(github_token=token)
            count += 1
    return count
