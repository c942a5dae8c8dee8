"""The per-attempt job token: a credential of one attempt of one job, beside
the runner's own token, for every call the runner makes on the job's behalf
(``api/runner_auth.py``). The runner's token alone is not enough for an
attempt that has one, so whoever holds a stolen runner token but not the
live connection that received the assignment reaches no job's secrets,
inputs or artifacts; and it stops working when the attempt ends (the
fencing refuses an attempt that is not current, whatever it carries).

It is derived from the attempt's lease with the server's key (so the
assignment can be built again, as a hello's hand-over does) and only its
SHA-256 is stored (``Attempt.job_token_hash``).
"""

from __future__ import annotations

from django.utils.crypto import constant_time_compare, salted_hmac

from backend.core.tokens import hash_token

_SALT = "trainyard.job-token"


def job_token(*, lease: str) -> str:
    """The token of the attempt holding ``lease`` ("" for none)."""
    return salted_hmac(_SALT, lease, algorithm="sha256").hexdigest() if lease else ""


def job_token_hash(*, lease: str) -> str:
    token = job_token(lease=lease)
    return hash_token(token) if token else ""


def job_token_matches(*, stored_hash: str, presented: str) -> bool:
    return bool(stored_hash) and constant_time_compare(stored_hash, hash_token(presented))
