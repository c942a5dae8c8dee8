"""`manage.py rotate_secret_keys`: re-encrypt every secret with the first key
of TRAINYARD_SECRET_KEYS, so older keys can then be removed."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction

from backend.vault.crypto import rotate
from backend.vault.models import Secret


class Command(BaseCommand):
    help = "Re-encrypt all secrets with the newest key (the first of TRAINYARD_SECRET_KEYS)."

    def handle(self, *args: Any, **options: Any) -> None:
        count = 0
        with transaction.atomic():
            for secret in Secret.objects.select_for_update().all():
                Secret.objects.filter(pk=secret.pk).update(ciphertext=rotate(secret.ciphertext))
                count += 1
        self.stdout.write(f"re-encrypted {count} secret(s)")
