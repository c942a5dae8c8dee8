"""What a job's ``status_reason`` may hold.

Reasons come from git, the runner and the backends, and can quote a secret
(a clone error echoing a token from a URL, a command's stderr) or a signed
storage URL (a failed download). The run's reason is derived from its jobs'
(``run_refresh``), so it is clean too.
"""

from __future__ import annotations

import logging
from uuid import UUID

from backend.artifacts.storage import redact_signed_urls
from backend.core.urlcreds import redact_url_credentials
from backend.runs.models import Job
from backend.vault.masking import mask
from backend.vault.services import masks_for

logger = logging.getLogger(__name__)

REASON_MAX = Job._meta.get_field("status_reason").max_length or 1000


def job_reason_clean(*, job_id: UUID | str, reason: str) -> str:
    """``reason`` without its job's workspace secrets, signed URLs' tokens or
    credentials in URLs (git quotes the URL it cloned),
    at most the column's length. A reason of that length or more may have
    been cut short by the caller, so a secret's start at its end is masked."""
    if not reason:
        return reason
    text = redact_url_credentials(redact_signed_urls(reason))
    workspace_id = Job.objects.filter(pk=job_id).values_list("workspace_id", flat=True).first()
    if workspace_id is None:
        return text[:REASON_MAX]
    # An unreadable secret is left out of the masks (masks_for): one that no
    # key opens cannot have reached a job started after its key went.
    masks = masks_for(workspace_id=workspace_id)
    return mask(text, masks, cut=len(reason) >= REASON_MAX)[:REASON_MAX]
