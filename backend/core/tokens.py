"""Tokens are stored hashed: a leaked table gives no usable token.

Each kind starts with its own prefix, so a token found in a log, a paste or
a secret scanner's report says what it opens, and a token given to the
wrong door is told so (docs/decisions/0040-token-prefixes-and-lifetimes.md).
Tokens made before a kind had its prefix keep working: lookups are by hash.
"""

from __future__ import annotations

import hashlib

API_TOKEN_PREFIX = "trainyard_"  # a person's API token (CLI, SDK, scripts)
RUNNER_TOKEN_PREFIX = "tyrun_"  # one machine's runner
REGISTRATION_TOKEN_PREFIX = "tyreg_"  # single use: registers a self-hosted machine
SESSION_TOKEN_PREFIX = "tyses_"  # one session into a job (its client's websocket), short-lived


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_kind(token: str) -> str:
    """ "api", "runner", "registration", or "" for a token without a known prefix."""
    for kind, prefix in (
        ("api", API_TOKEN_PREFIX),
        ("runner", RUNNER_TOKEN_PREFIX),
        ("registration", REGISTRATION_TOKEN_PREFIX),
        ("session", SESSION_TOKEN_PREFIX),
    ):
        if token.startswith(prefix):
            return kind
    return ""
