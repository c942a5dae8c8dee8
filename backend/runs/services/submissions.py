"""A submission sent again makes no second run.

A client names a submission with an ``Idempotency-Key`` header and sends the
same key when it tries again (its answer was lost, it timed out, the server
answered 5xx). The same key from the same person in the same workspace
within ``KEY_WINDOW`` answers with the run the first submission made; the
same key with another body is refused. The key is claimed in the
submission's own transaction under a unique constraint, so two copies sent
at once make one run: the second waits for the first to commit, then
answers with its run (decision 0085; docs/API.md,
"Sending a submission again").
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from http import HTTPStatus

from django.db import connection
from django.db.models.functions import Now

from backend.accounts.models import User, Workspace
from backend.core.errors import ApplicationError
from backend.runs.models import Run, SubmissionKey

KEY_WINDOW = timedelta(hours=24)
# Printable ASCII without spaces: a UUID, a ULID, any client's own scheme.
KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}$")


@dataclass(frozen=True)
class Once:
    """A submission's key and the digest of what it asked for."""

    key: str
    digest: str


@dataclass(frozen=True)
class Submitted:
    run: Run
    replayed: bool  # the run an earlier copy of this submission made


class KeyTaken(Exception):
    """Raised inside the submission's transaction (rolling it back) when a
    concurrent copy of it committed first."""


def once_of(*, header: str | None, body: object) -> Once | None:
    """The submission's key from its ``Idempotency-Key`` header (None: no
    header), with the digest of its body."""
    if header is None:
        return None
    if not KEY_RE.match(header):
        raise ApplicationError(
            "Idempotency-Key must be 1 to 255 printable ASCII characters without spaces (a UUID is a good one)"
        )
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return Once(key=header, digest=hashlib.sha256(canonical.encode()).hexdigest())


def run_submit(*, workspace: Workspace, user: User, once: Once | None, create: Callable[[], Run]) -> Submitted:
    """``create()`` (which claims ``once`` with ``submission_key_claim`` in its
    transaction) unless an earlier copy of this submission made a run."""
    if once is None:
        return Submitted(run=create(), replayed=False)
    earlier = _earlier(workspace, user, once)
    if earlier is not None:
        return Submitted(run=earlier, replayed=True)
    try:
        return Submitted(run=create(), replayed=False)
    except KeyTaken:
        earlier = _earlier(workspace, user, once)
        if earlier is None:  # the other copy's run is gone already (deleted)
            raise ApplicationError("this submission's Idempotency-Key names a run that no longer exists") from None
        return Submitted(run=earlier, replayed=True)


def submission_key_claim(*, workspace: Workspace, user: User, once: Once) -> SubmissionKey:
    """Claim ``once`` in the caller's transaction, or raise ``KeyTaken``.
    An expired claim of the key is dropped first. ``ON CONFLICT DO NOTHING``
    waits for a concurrent claim's transaction: if it commits, this claim
    takes nothing (``KeyTaken``); if it rolls back, this one wins."""
    SubmissionKey.objects.filter(
        workspace=workspace, user=user, key=once.key, created_at__lt=Now() - KEY_WINDOW
    ).delete()
    row = SubmissionKey(workspace=workspace, user=user, key=once.key, digest=once.digest)
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO runs_submissionkey (id, created_at, updated_at, workspace_id, user_id, key, digest)"
            " VALUES (%s, now(), now(), %s, %s, %s, %s)"
            " ON CONFLICT (workspace_id, user_id, key) DO NOTHING RETURNING id",
            [row.pk, workspace.pk, user.pk, once.key, once.digest],
        )
        if cur.fetchone() is None:
            raise KeyTaken
    return row


def submission_key_bind(*, claim: SubmissionKey, run: Run) -> None:
    SubmissionKey.objects.filter(pk=claim.pk).update(run=run)


def submission_keys_expire() -> int:
    """Forget keys older than the window; returns how many."""
    deleted, _ = SubmissionKey.objects.filter(created_at__lt=Now() - KEY_WINDOW).delete()
    return deleted


def _earlier(workspace: Workspace, user: User, once: Once) -> Run | None:
    claim = (
        SubmissionKey.objects.for_workspace(workspace)
        .filter(user=user, key=once.key, created_at__gte=Now() - KEY_WINDOW)
        .select_related("run")
        .first()
    )
    run: Run | None = claim.run if claim is not None else None
    if claim is None or run is None:
        return None
    if claim.digest != once.digest:
        raise ApplicationError(
            f"Idempotency-Key {once.key!r} was sent with another submission (run {run.name}); "
            "send a new key for a new submission",
            extra={"run": run.name},
            status_code=HTTPStatus.UNPROCESSABLE_ENTITY,
        )
    return run
