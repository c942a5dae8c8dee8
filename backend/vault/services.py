"""Writes and reads of workspace secrets. Plaintext never leaves this module
except as a job's environment and as the masks logs and reasons are masked
with (``masking.py``)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from uuid import UUID

from django.db.models import Count, Max

from backend.accounts.models import User, Workspace
from backend.core.errors import ApplicationError
from backend.vault.crypto import decrypt, encrypt
from backend.vault.masking import MIN_LENGTH, Masks, masks_of
from backend.vault.models import Secret

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_VALUE_BYTES = 64 * 1024


def secret_set(*, workspace: Workspace, user: User, name: str, value: str) -> tuple[Secret, bool]:
    """Create or replace; returns (secret, created)."""
    if not NAME_RE.match(name):
        raise ApplicationError(
            f"{name!r} is not a valid secret name: use letters, digits and _ (an environment variable name)."
        )
    if not value:
        raise ApplicationError("A secret's value cannot be empty.")
    if len(value) < MIN_LENGTH:
        raise ApplicationError(
            f"A secret's value needs at least {MIN_LENGTH} characters: a shorter one cannot be masked in logs"
            " without masking ordinary text too."
        )
    if len(value.encode()) > MAX_VALUE_BYTES:
        raise ApplicationError(f"A secret's value is at most {MAX_VALUE_BYTES // 1024} KiB.")
    secret, created = Secret.objects.update_or_create(
        workspace=workspace, name=name, defaults={"ciphertext": encrypt(value), "created_by": user}
    )
    # This process re-reads at once; others within the cache's half second.
    _mask_cache.pop(str(workspace.pk), None)
    return secret, created


def secret_delete(*, workspace: Workspace, name: str) -> bool:
    deleted, _ = Secret.objects.for_workspace(workspace).filter(name=name).delete()
    _mask_cache.pop(str(workspace.pk), None)
    return bool(deleted)


def secret_list(*, workspace: Workspace) -> list[Secret]:
    return list(Secret.objects.for_workspace(workspace).order_by("name").defer("ciphertext"))


def secret_env(*, workspace_id: UUID) -> dict[str, str]:
    """Every secret of the workspace, decrypted: a job's environment."""
    return {s.name: decrypt(s.ciphertext) for s in Secret.objects.filter(workspace_id=workspace_id)}


@dataclass
class _Cached:
    version: tuple[object, int]
    masks: Masks
    checked: float


_mask_cache: dict[str, _Cached] = {}


def masks_for(*, workspace_id: UUID) -> Masks:
    """What to hide of this workspace's secrets in its logs and reasons.

    Called for every stored log batch, so it is cached per process and
    rebuilt when the workspace's secrets change (count and latest update,
    one cheap query at most every half second).
    """
    key = str(workspace_id)
    cached = _mask_cache.get(key)
    now = time.monotonic()
    if cached is not None and now - cached.checked < 0.5:
        return cached.masks
    stats = Secret.objects.filter(workspace_id=workspace_id).aggregate(latest=Max("updated_at"), n=Count("id"))
    version = (stats["latest"], stats["n"])
    if cached is None or cached.version != version:
        cached = _Cached(version, masks_of(secret_env(workspace_id=workspace_id).values()), now)
        _mask_cache[key] = cached
    cached.checked = now
    return cached.masks
