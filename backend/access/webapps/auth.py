"""What the proxy adds to every request it forwards to a job's port, for
the user: an app's own credential (a dev environment's Jupyter token), so
the person who opened it is not asked for it. Empty for a plain port.

Called in a worker thread (it may read the database), at most every few
seconds per app pass (``proxy.CHECK_SECONDS``)."""

from __future__ import annotations

from backend.runs.lifecycle.devenvs import app_request_headers_of
from backend.runs.models import Job


def app_request_headers(job: Job, port: int) -> dict[str, str]:
    """Headers for requests to ``port`` of ``job`` (replacing the browser's of the same names):
    ``Authorization: token …`` for a lab or notebook job's Jupyter port (``runs.lifecycle.devenvs``)."""
    return app_request_headers_of(job, port)
