"""What a job's ``status_reason`` may hold.

Reasons come from git, the runner and the backends, and can quote a secret
(a clone error echoing a token from a URL, a command's stderr) or a signed
storage URL (a failed download). The run's reason is derived from its jobs'
(``run_refresh``), so it is clean too.

A reason is read only up to ``REASON_READ_MAX`` characters, the most a runner
may send (``protocol.MAX_REASON_CHARS``), before anything else is done with
it, and every pass over it is linear in its length
(docs/decisions/0081-linear-redaction.md).
"""

from __future__ import annotations

import logging
from uuid import UUID

from trainyard_runner.protocol import MAX_REASON_CHARS

from backend.artifacts.storage import redact_signed_urls
from backend.core.urlcreds import redact_url_credentials
from backend.runs.lifecycle.privateenv import job_masks
from backend.runs.models import Job
from backend.vault.masking import mask

logger = logging.getLogger(__name__)

REASON_MAX = Job._meta.get_field("status_reason").max_length or 1000
# Read before credentials and signed URLs are shortened, so a reason that
# quotes a long signed URL still keeps what follows it.
REASON_READ_MAX = MAX_REASON_CHARS


def job_reason_clean(*, job_id: UUID | str, reason: str) -> str:
    """``reason`` without its job's workspace secrets, signed URLs' tokens or
    credentials in URLs (git quotes the URL it cloned), at most the column's
    length. Only its first REASON_READ_MAX characters are read. A reason of
    REASON_MAX characters or more may have been cut short (by the caller, the
    runner or here), so a secret's start at its end is masked, and so is a
    URL's authority it ends in (``…https://user:tok``)."""
    if not reason:
        return reason
    read = reason[:REASON_READ_MAX]
    cut = len(reason) >= REASON_MAX
    text = redact_url_credentials(redact_signed_urls(read), cut=cut)
    job = Job.objects.filter(pk=job_id).only("workspace_id", "run_id", "spec", "app_token").first()
    if job is None:
        return text[:REASON_MAX]
    # An unreadable secret is left out of the masks (masks_for): one that no
    # key opens cannot have reached a job started after its key went.
    masks = job_masks(job=job, private_env=bool(job.spec.get("private_env")), app_token=job.app_token is not None)
    return mask(text, masks, cut=cut)[:REASON_MAX]
