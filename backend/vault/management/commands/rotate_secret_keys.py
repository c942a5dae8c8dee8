"""`manage.py rotate_secret_keys`: re-encrypt every secret with the first key
of TRAINYARD_SECRET_KEYS, so older keys can then be removed."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction

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
