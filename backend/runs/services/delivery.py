"""What a job's runner fetches over REST instead of receiving it in the
``AssignJob`` frame: the job's secrets and its inputs' file lists.

The frame goes through the channel layer (Redis, appendonly on disk) and
must stay under the runner's frame limit, so it carries neither plaintext
secrets nor manifests. The views call these only for the runner that holds
the job's current attempt (``HoldsCurrentAttempt``, runs/api/runner_auth.py).
"""

from __future__ import annotations

from django.conf import settings
from trainyard_runner import protocol

from backend.core.errors import ApplicationError, NotFound
from backend.runs.lifecycle.dag import job_inputs
from backend.runs.lifecycle.devenvs import app_token_env
from backend.runs.lifecycle.dispatch import input_url
from backend.runs.lifecycle.privateenv import private_inputs_of
from backend.runs.models import Job
from backend.vault.crypto import Unreadable
from backend.vault.services import repo_credential_for, secret_env, secret_unreadable_advice


def job_secrets(*, job: Job) -> protocol.JobSecrets:
    """The secrets the job's workflow names (``spec["secrets"]``: {variable:
    secret name}) and the repository's clone credential; no other secret of
    the workspace.

    A named secret no key opens, or one deleted since the submission, fails
    the job rather than running it without a value it needs
    (docs/decisions/0035-unreadable-secrets.md): 409, whose message the
    runner reports as the job's reason."""
    named: dict[str, str] = job.spec.get("secrets", {})
    found = secret_env(workspace_id=job.workspace_id, names=set(named.values()))
    missing = sorted(set(named.values()) - set(found.env) - set(found.unreadable))
    if missing:
        raise ApplicationError(
            f"secret {missing[0]} named by workflow {job.workflow} is not set in the workspace any more: an admin"
            f" sets it again (`trainyard secrets set {missing[0]}`)",
            status_code=409,
            extra={"missing": missing},
        )
    if found.unreadable:
        first, *more = found.unreadable
        also = f" (also unreadable: {', '.join(more)})" if more else ""
        raise ApplicationError(
            f"{secret_unreadable_advice(first)}{also}", status_code=409, extra={"unreadable": found.unreadable}
        )
    run = job.run
    credential = repo_credential_for(workspace_id=run.workspace_id, repo_id=run.repo_id)
    secrets = {variable: found.env[secret] for variable, secret in named.items()}
    return protocol.JobSecrets(
        # The submitter's values win over secrets, as the spec's env did.
        env={**secrets, **_private_env(job), **_app_token_env(job)},
        credential=(
            protocol.GitCredential(kind=credential.kind, username=credential.username, secret=credential.secret)  # type: ignore[arg-type]
            if credential is not None
            else None
        ),
    )


def _app_token_env(job: Job) -> dict[str, str]:
    """A Jupyter dev environment's token (``devenvs``), as ``JUPYTER_TOKEN``."""
    if job.app_token is None:
        return {}
    found = app_token_env(job)
    if not found:
        raise ApplicationError(
            "this dev environment's token cannot be decrypted with the server's keys (TRAINYARD_SECRET_KEYS):"
            " run the workflow again",
            status_code=409,
        )
    return found


def _private_env(job: Job) -> dict[str, str]:
    """The job's values of ``-e`` and bare env names (``privateenv``)."""
    if not job.spec.get("private_env"):
        return {}
    try:
        private = private_inputs_of(job.run)
    except Unreadable:
        raise ApplicationError(
            "the values this run was submitted with (-e and bare env names) cannot be decrypted with the server's"
            " keys (TRAINYARD_SECRET_KEYS): submit the run again",
            status_code=409,
        ) from None
    return dict(private.jobs.get(job.name, {}))


def job_input_page(*, job: Job, path: str, after: str = "", limit: int | None = None) -> protocol.InputPage:
    """The files of the job's input at ``path`` (``InputArtifact.path``)
    whose path sorts after ``after``, at most ``limit``
    (``TRAINYARD_INPUT_PAGE_FILES``), each with a signed URL."""
    size = limit or settings.TRAINYARD["INPUT_PAGE_FILES"]
    artifact = next((i.artifact for i in job_inputs(job, files=False) if i.artifact.path == path), None)
    if artifact is None:
        raise NotFound(f"{path!r} is not an input of this job.", extra={"path": path})
    if size < 1:
        raise ApplicationError("A page holds at least one file.")
    rows = list(artifact.files.filter(path__gt=after).order_by("path")[: size + 1])
    page = rows[:size]
    return protocol.InputPage(
        path=path,
        files=[protocol.InputFile(path=f.path, size=f.size, sha256=f.sha256, url=input_url(artifact, f)) for f in page],
        next=page[-1].path if len(rows) > size else "",
    )
