"""Writes for accounts (being split by concern: users, workspaces, tokens)."""

from backend.accounts.services.users import (
    TOKEN_PREFIX,
    api_token_create,
    hash_token,
    user_get_or_create,
    workspace_create_personal,
)

__all__ = ["TOKEN_PREFIX", "api_token_create", "hash_token", "user_get_or_create", "workspace_create_personal"]
