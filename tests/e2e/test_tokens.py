"""`trainyard token`: make a token that expires, list it, use it, and be told
clearly when it has expired or was revoked — against the real stack."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.e2e.conftest import User


def test_a_token_made_with_expires_in_works_until_it_expires_and_then_says_so(alice: User, tmp_path: Path) -> None:
    made = alice.cli(tmp_path, "token", "create", "--name", "laptop", "--expires-in", "30d")
    token = made.stdout.strip()
    as_laptop = {"TRAINYARD_TOKEN": token}
    listed = json.loads(alice.cli(tmp_path, "token", "ls", "--json", env=as_laptop).stdout)
    laptop = next(t for t in listed if t["name"] == "laptop")

    assert made.returncode == 0, made.stderr
    assert token.startswith("trainyard_") and "it is not shown again" in made.stderr
    expires = datetime.fromisoformat(laptop["expires_at"].replace("Z", "+00:00"))
    assert timedelta(days=29) < expires - datetime.now(UTC) <= timedelta(days=30)

    alice.stack.manage(
        "shell",
        "-c",
        "from django.utils import timezone; from backend.accounts.models import ApiToken;"
        f" ApiToken.objects.filter(pk={laptop['id']!r}).update(expires_at=timezone.now())",
    )
    expired = alice.cli(tmp_path, "ps", env=as_laptop)

    assert expired.returncode != 0
    assert "This API token expired at" in expired.stderr


def test_a_revoked_token_is_refused(alice: User, tmp_path: Path) -> None:
    token = alice.cli(tmp_path, "token", "create", "--name", "short-lived").stdout.strip()
    row = next(t for t in json.loads(alice.cli(tmp_path, "token", "ls", "--json").stdout) if t["name"] == "short-lived")

    removed = alice.cli(tmp_path, "token", "rm", row["id"])
    refused = alice.cli(tmp_path, "ps", env={"TRAINYARD_TOKEN": token})

    assert removed.returncode == 0, removed.stderr
    assert refused.returncode != 0 and "unknown or revoked" in refused.stderr
