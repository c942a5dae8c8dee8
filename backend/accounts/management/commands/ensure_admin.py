"""`manage.py ensure_admin`: the local admin login of the embedded default.

Creates user ``admin`` (staff, superuser, with a personal workspace) with a
password kept in ``$TRAINYARD_DATA_DIR/admin-password`` (0600), so the same
password is printed on every start.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from backend.accounts.services import user_get_or_create


class Command(BaseCommand):
    help = "Create or reset the local admin user and print its login."

    def handle(self, *args: Any, **options: Any) -> None:
        password = _password(Path(settings.DATA_DIR) / "admin-password")
        user = user_get_or_create(username="admin")
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"Admin login: admin / {password}")


def _password(path: Path) -> str:
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(12)
    path.write_text(password)
    path.chmod(0o600)
    return password
