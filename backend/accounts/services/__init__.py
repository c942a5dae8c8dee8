"""Writes for accounts, split by concern:

- ``users``: users, and GitHub sign-in (keyed by GitHub's numeric id);
- ``workspaces``: personal and team workspaces, members, invitations;
- ``tokens``: personal API tokens (stored hashed, shown once).

The names below were importable from ``backend.accounts.services`` before the
split. None of these modules may import DRF: DRF loads the token
authentication class (which needs ``hash_token``) while ``rest_framework.views``
is half-imported (domain errors are in ``backend.core.errors`` for that reason).
"""

from __future__ import annotations

from backend.accounts.services.tokens import TOKEN_PREFIX, api_token_create, hash_token
from backend.accounts.services.users import user_get_or_create
from backend.accounts.services.workspaces import workspace_create_personal

__all__ = ["TOKEN_PREFIX", "api_token_create", "hash_token", "user_get_or_create", "workspace_create_personal"]
