"""Writes for accounts, split by concern:

- ``users``: users, and GitHub sign-in (keyed by GitHub's numeric id);
- ``workspaces``: personal and team workspaces, members, invitations;
- ``tokens``: personal API tokens (stored hashed, shown once).

The names below were importable from ``backend.accounts.services`` before the
split. Only ``tokens`` is imported eagerly: DRF loads the token
authentication class (which needs ``hash_token``) while ``rest_framework.views``
is half-imported, and ``users``/``workspaces`` reach it through ``core.errors``.
"""

from __future__ import annotations

from typing import Any

from backend.accounts.services.tokens import TOKEN_PREFIX, api_token_create, hash_token

_LAZY = {"user_get_or_create": "users", "workspace_create_personal": "workspaces"}

__all__ = ["TOKEN_PREFIX", "api_token_create", "hash_token", "user_get_or_create", "workspace_create_personal"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
