"""Fencing (``held_by`` in backend/runs/models.py) with no instance: a frame
from a connection whose instance is gone (replaced, fenced) holds no job,
not even one whose instance was cleared (sent back to pending)."""

from __future__ import annotations

from backend.accounts.models import Workspace
from backend.runs.models import Attempt, Job
from tests.support.fixtures import Person, submit


def test_no_instance_holds_no_job_even_one_whose_instance_was_cleared(team: Workspace, owner: Person) -> None:
    job = submit(team, owner.user).jobs.get()
    assert job.instance_id is None and job.attempt == 0

    assert not Job.objects.filter(pk=job.pk).held_by(instance_id=None, attempt=0).exists()
    assert not Attempt.objects.current(job_id=job.pk, number=0, instance_id=None).exists()
