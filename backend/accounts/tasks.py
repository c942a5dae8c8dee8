"""Celery tasks of accounts: the periodic re-check of TRAINYARD_GITHUB_ALLOW
(``github-allow-recheck`` in settings.CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from celery import shared_task

from backend.accounts.services.allowlist import github_allow_recheck as github_allow_recheck_pass


@shared_task(acks_late=True, time_limit=300, soft_time_limit=280, expires=600)
def github_allow_recheck() -> str:
    """One pass of backend.accounts.services.allowlist; idempotent (a second
    one right after finds no account due)."""
    return str(github_allow_recheck_pass())
