"""The attempts migrations on data written before them: expand, backfill
one attempt per job that reached a runner, contract (the lease moves)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("runs", "0003_logline_without_db_fk"), ("clouds", "0002_instance_address")]
AFTER = [("runs", "0006_job_lease_moves_to_attempt"), ("clouds", "0003_compute_seam")]


def _migrate(targets: list[tuple[str, str]]) -> Any:
    """Migrate runs and clouds to ``targets`` (undoing what depends on their
    later migrations, e.g. artifacts' storage location); the models as the
    database then has them."""
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(sorted(executor.loader.applied_migrations)).apps


@pytest.fixture(autouse=True)
def _back_to_latest() -> Iterator[None]:
    """Later tests find every app at its latest migration again."""
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_every_job_that_reached_a_runner_gets_one_attempt_with_its_lease_and_outcome() -> None:
    old = _migrate(BEFORE)
    user = old.get_model("accounts", "User").objects.create(username=f"u{uuid.uuid4().hex[:6]}")
    ws = old.get_model("accounts", "Workspace").objects.create(slug=f"w{uuid.uuid4().hex[:6]}", name="w")
    instance = old.get_model("clouds", "Instance").objects.create(
        workspace=ws, backend="local", name="local-1", token_hash=uuid.uuid4().hex, status="busy"
    )
    run = old.get_model("runs", "Run").objects.create(
        workspace=ws, name=f"r-{uuid.uuid4().hex[:6]}", workflow="w", submitted_by=user, code_kind="git",
        workflows_file_path=".trainyard/workflows.yaml", workflows_file_text="",
    )  # fmt: skip
    Job = old.get_model("runs", "Job")
    now = timezone.now()
    common = {"workspace": ws, "run": run, "workflow": "w", "spec": {}}
    Job.objects.create(name="pending", **common)
    Job.objects.create(
        name="running", status="running", instance=instance, lease="L1", started_at=now, last_seq=7, **common
    )
    Job.objects.create(
        name="failed", status="failed", instance=instance, started_at=now, finished_at=now, exit_code=3,
        status_reason="exited with code 3", last_seq=2, **common,
    )  # fmt: skip

    new = _migrate(AFTER)

    attempts = {
        a.job.name: a for a in new.get_model("runs", "Attempt").objects.select_related("job").filter(job__run_id=run.pk)
    }
    jobs = {j.name: j.attempt for j in new.get_model("runs", "Job").objects.filter(run_id=run.pk)}
    assert jobs == {"pending": 0, "running": 1, "failed": 1}
    assert sorted(attempts) == ["failed", "running"]
    running, failed = attempts["running"], attempts["failed"]
    assert (running.status, running.lease, running.instance_id, running.last_seq) == (
        "running",
        "L1",
        instance.pk,
        None,
    )
    assert (failed.status, failed.termination_reason, failed.exit_code, failed.last_seq) == ("ended", "error", 3, 2)
    assert failed.termination_message == "exited with code 3"
