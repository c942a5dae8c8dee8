"""The per-attempt job token: the runner's calls for a job carry it beside
the runner's own token; the runner's token alone (stolen, say) reaches no
job's secrets or artifacts, and the pair stops working when the attempt ends."""

from __future__ import annotations

from rest_framework.test import APIClient

from backend.accounts.models import Workspace
from backend.core.tokens import hash_token
from backend.runs.lifecycle.jobtoken import job_token
from backend.runs.models import Attempt, Run
from backend.runs.scheduler.passes import jobs_schedule
from backend.vault.services import secret_set
from tests.support.attempts import accept, assign_frame, current_attempt, report
from tests.support.fixtures import Person, submit
from tests.support.runners import runner_instance

RUNNER = "runner-token-of-l"
VALUE = "wandb-0123456789abcdef"
NAMES = "workflows:\n  - {name: hello, provider: bash, secrets: [WANDB_API_KEY], commands: [echo hi]}\n"
DENIED = (
    "This attempt's job token is missing or wrong: send Authorization: Bearer <runner token>.<job token>"
    " (AssignJob.job_token)."
)


def _get(credential: str, job_id: object, attempt: int, what: str = "secrets") -> object:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
    return client.get(f"/api/v1/runner/jobs/{job_id}/{what}/", {"attempt": attempt})


def test_the_runners_token_alone_or_with_a_wrong_job_token_is_refused_and_the_pair_dies_with_the_attempt(
    team: Workspace, owner: Person
) -> None:
    secret_set(workspace=team, user=owner.user, name="WANDB_API_KEY", value=VALUE)
    run: Run = submit(team, owner.user, text=NAMES)
    instance = runner_instance(team, "l", RUNNER, channel_name="c-l")
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)
    frame = assign_frame(job)
    attempt = current_attempt(job)

    alone = _get(RUNNER, job.pk, 1)
    wrong = _get(f"{RUNNER}.{'0' * 64}", job.pk, 1)
    paired = _get(f"{RUNNER}.{frame.job_token}", job.pk, 1)
    artifact_alone = APIClient()
    artifact_alone.credentials(HTTP_AUTHORIZATION=f"Bearer {RUNNER}")
    upload = artifact_alone.post(
        f"/api/v1/runner/jobs/{job.pk}/artifacts/?attempt=1", {"path": "./out", "files": []}, format="json"
    )
    report(job, instance.pk, "succeeded", 0)
    after = _get(f"{RUNNER}.{frame.job_token}", job.pk, 1)

    assert frame.job_token == job_token(lease=attempt.lease) and len(frame.job_token) == 64
    assert attempt.job_token_hash == hash_token(frame.job_token)
    assert not Attempt.objects.filter(job_token_hash=frame.job_token).exists(), "only its hash is stored"
    assert (alone.status_code, alone.json()["message"]) == (401, DENIED)
    assert (wrong.status_code, wrong.json()["message"]) == (401, DENIED)
    assert (upload.status_code, upload.json()["message"]) == (401, DENIED)
    assert paired.status_code == 200 and paired.json()["env"] == {"WANDB_API_KEY": VALUE}
    assert after.status_code == 404, "the attempt ended: its token reaches nothing"
    assert VALUE not in alone.content.decode() + wrong.content.decode() + after.content.decode()
