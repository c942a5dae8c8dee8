"""Volumes at plan time and in the scheduler's hold (real Postgres): a
workflow naming a volume that does not exist, one in a region or backend
the workflow does not allow, or volumes in two places is refused at
submission with both sides named; a bad ``volumes:`` item names its file,
line and key; a job with volumes is never served from the cache; a volume
is held by one job at a time and the second says who has it; the dry run
shows each volume, where it is and which job holds it."""

from __future__ import annotations

from typing import Any

import pytest
from trainyard.output import plan_lines

from backend.accounts.models import Workspace
from backend.clouds.models import BackendKind, Volume, VolumeStatus
from backend.core.errors import ApplicationError
from backend.runs.lifecycle.dag import cacheable
from backend.runs.models import Job, JobStatus
from backend.runs.scheduler.volumes import volumes_claim
from tests.support.fixtures import Person, submit


def _volume(team: Workspace, name: str, *, region: str = "us-east-1", zone: str = "us-east-1b") -> Volume:
    return Volume.objects.create(
        workspace=team,
        name=name,
        backend=BackendKind.AWS,
        region=region,
        zone=zone,
        size_bytes=2**30,
        backend_id="vol-0123456789abcdef0",
        status=VolumeStatus.AVAILABLE,
    )


def _workflow(volumes: str, **keys: str) -> str:
    lines = "".join(f"    {k}: {v}\n" for k, v in keys.items())
    return (
        "workflows:\n  - name: train\n    provider: bash\n    commands: [python train.py]\n"
        "    artifacts: [./model]\n"
        f"    volumes: {volumes}\n" + lines
    )


def test_a_volume_in_another_region_is_refused_at_submission_naming_both(team: Workspace, owner: Person) -> None:
    _volume(team, "ckpt", region="eu-west-1", zone="eu-west-1a")
    with pytest.raises(ApplicationError) as refused:
        submit(team, owner.user, "train", _workflow("[ckpt:/data]", regions="[us-east-1]"))
    message = str(refused.value)
    assert "volume 'ckpt' is in region eu-west-1 (eu-west-1a)" in message
    assert "the workflow's regions are us-east-1" in message
    assert not Job.objects.filter(run__workspace=team).exists()


def test_a_volume_on_a_backend_the_workflow_does_not_allow_is_refused(team: Workspace, owner: Person) -> None:
    _volume(team, "ckpt")
    with pytest.raises(ApplicationError, match="volume 'ckpt' is on the aws backend, but the workflow's backends are"):
        submit(team, owner.user, "train", _workflow("[ckpt:/data]", backends="[local]"))


def test_a_volume_that_does_not_exist_is_refused_with_how_to_create_it(team: Workspace, owner: Person) -> None:
    _volume(team, "other")
    with pytest.raises(ApplicationError) as refused:
        submit(team, owner.user, "train", _workflow("[ckpt:/data]"))
    assert "volume 'ckpt' does not exist in this workspace (volumes: other)" in str(refused.value)
    assert "trainyard volume create ckpt" in str(refused.value)


def test_another_workspaces_volume_is_not_found(team: Workspace, owner: Person, outsider: Person) -> None:
    _volume(outsider.user.personal_workspace, "ckpt")
    with pytest.raises(ApplicationError, match="volume 'ckpt' does not exist in this workspace"):
        submit(team, owner.user, "train", _workflow("[ckpt:/data]"))


def test_volumes_in_two_zones_are_refused(team: Workspace, owner: Person) -> None:
    _volume(team, "a", zone="us-east-1a")
    _volume(team, "b", zone="us-east-1b")
    with pytest.raises(ApplicationError, match="its volumes are in different places"):
        submit(team, owner.user, "train", _workflow("[a:/a, b:/b]"))


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("[ckpt]", "expected NAME:/path"),
        ("[Bad_Name:/data]", "lowercase letters, digits and dashes"),
        ("[ckpt:../up]", "an absolute path (/data) or one inside the working directory"),
        ("[ckpt:/a, ckpt:/b]", "volume 'ckpt' is named twice"),
    ],
)
def test_a_bad_volumes_item_names_the_key(team: Workspace, owner: Person, item: str, words: str) -> None:
    with pytest.raises(ApplicationError) as refused:
        submit(team, owner.user, "train", _workflow(item))
    assert words in str(refused.value)
    assert "volumes" in str(refused.value)


def test_a_job_with_volumes_is_stored_with_them_never_cached_and_held_one_at_a_time(
    team: Workspace, owner: Person
) -> None:
    volume = _volume(team, "ckpt")
    first = submit(team, owner.user, "train", _workflow("[ckpt:./ckpt]")).jobs.get()
    second = submit(team, owner.user, "train", _workflow("[{name: ckpt, path: /data, read_only: true}]")).jobs.get()
    assert first.spec["volumes"] == [{"name": "ckpt", "path": "./ckpt", "read_only": False}]
    assert second.spec["volumes"] == [{"name": "ckpt", "path": "/data", "read_only": True}]
    assert not cacheable(spec=first.spec, after_running=False)
    assert first.cache_decision["text"] == "runs: never reused (it mounts a volume: what it makes may be there)"

    assert volumes_claim(first) == ""
    assert volumes_claim(first) == "", "claiming again is a no-op"
    assert volumes_claim(second) == f"waiting for volume ckpt (attached to job train of run {first.run.name})"
    volume.refresh_from_db()
    assert volume.attached_job_id == first.pk

    Job.objects.filter(pk=first.pk).update(status=JobStatus.SUCCEEDED)
    assert volumes_claim(second) == "", "a job that is over holds nothing"
    volume.refresh_from_db()
    assert volume.attached_job_id == second.pk


def _dry_run(team: Workspace, owner: Person, text: str) -> dict[str, Any]:
    body = {
        "workflow": "train",
        "workflows_file": {"path": ".trainyard/workflows.yaml", "text": text},
        "code": {"kind": "git", "repo_url": "https://example.com/r.git", "commit": "b" * 40},
    }
    answer = owner.client().post(f"/api/v1/workspaces/{team.slug}/runs/plan/", body, format="json")
    assert answer.status_code == 200, answer.content
    [job] = answer.json()["jobs"]
    return dict(job)


def test_the_dry_run_shows_each_volume_where_it_is_and_which_job_holds_it(team: Workspace, owner: Person) -> None:
    _volume(team, "ckpt")
    text = _workflow("[ckpt:./ckpt]")

    free = _dry_run(team, owner, text)
    holder = submit(team, owner.user, "train", text).jobs.get()
    assert volumes_claim(holder) == ""
    held = _dry_run(team, owner, text)

    assert free["volumes"] == [
        {
            "name": "ckpt",
            "path": "./ckpt",
            "read_only": False,
            "where": "aws us-east-1 us-east-1b",
            "size_bytes": 2**30,
            "held_by": None,
        }
    ]
    assert held["volumes"][0]["held_by"] == {"job": "train", "run": holder.run.name}
    assert "   volume: ckpt at ./ckpt (aws us-east-1 us-east-1b, 1.0 GiB): free" in plan_lines(
        {"workflow": "train", "jobs": [free]}
    )
    assert (
        f"   volume: ckpt at ./ckpt (aws us-east-1 us-east-1b, 1.0 GiB): held by job train of run "
        f"{holder.run.name}, the job waits for it"
    ) in plan_lines({"workflow": "train", "jobs": [held]})
