"""What a job's ``status_reason`` may hold.

Reasons come from git, the runner and the backends, and can quote a secret
(a clone error echoing a token from a URL, a command's stderr) or a signed
storage URL (a failed download). The run's reason is derived from its jobs'
(``run_refresh``), so it is clean too.
"""

from __future__ import annotations

import logging
from uuid import UUID

from cryptography.fernet import InvalidToken

from backend.artifacts.storage import redact_signed_urls
from backend.runs.models import Job
from backend.vault.masking import mask
from backend.vault.services import masks_for

logger = logging.getLogger(__name__)

REASON_MAX = Job._meta.get_field("status_reason").max_length or 1000
WITHHELD = "(reason withheld: a secret of this workspace cannot be decrypted, so it could not be masked)"


def job_reason_clean(*, job_id: UUID | str, reason: str) -> str:
    """``reason`` without its job's workspace secrets or signed URLs' tokens,
    at most the column's length. A reason of that length or more may have
    been cut short by the caller, so a secret's start at its end is masked."""
    if not reason:
        return reason
    text = redact_signed_urls(reason)
    workspace_id = Job.objects.filter(pk=job_id).values_list("workspace_id", flat=True).first()
    if workspace_id is None:
        return text[:REASON_MAX]
    try:
        masks = masks_for(workspace_id=workspace_id)
    except InvalidToken:
        # A state change must not fail on a bad secret (a key removed
        # mid-rotation); the reason might hold that secret, so it goes.
        logger.warning("job %s: a secret of workspace %s cannot be decrypted; reason withheld", job_id, workspace_id)
        return WITHHELD
    return mask(text, masks, cut=len(reason) >= REASON_MAX)[:REASON_MAX]
