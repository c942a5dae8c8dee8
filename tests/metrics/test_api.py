"""The metrics API as a member reads it: a run's jobs with their series'
names, last values and counters; one job's series over two attempts
(attempt numbers kept, downsampled to the points asked for, `since`);
runs compared; another workspace's run is 404, a bad query a 400 saying why."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from backend.metrics.services.ingest import record_metrics
from backend.runs.lifecycle.transitions import attempt_end
from backend.runs.models import Attempt, Job, Run
from backend.runs.reasons import TerminationReason
from backend.runs.scheduler.passes import jobs_schedule
from tests.metrics.test_ingest import T0, _sample, _value
from tests.support.attempts import accept, current_attempt
from tests.support.fixtures import Person, submit
from tests.support.runners import runner_instance

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "/api/v1/workspaces/acme"


def _attempt_on(team: Workspace, job: Job, name: str, price: str = "0") -> Instance:
    """The job's next attempt, accepted on a new runner ``name`` (the others busy)."""
    Instance.objects.filter(workspace=team).update(status=InstanceStatus.BUSY)
    instance = runner_instance(team, name, f"{name}-secret", channel_name=f"chan-{name}")
    Instance.objects.filter(pk=instance.pk).update(price_per_hour=Decimal(price))
    jobs_schedule()
    accept(job, instance.pk)
    return instance


def _feed(job: Job, instance: Instance, attempt: int, start: float, steps: range, loss: Any) -> None:
    samples = [_sample(start + 5 * i, cpu=10.0 * attempt, gpus=[50.0]) for i in range(len(steps))]
    values = [_value("loss", loss(s), start + 5 * i, step=s) for i, s in enumerate(steps)]
    message = protocol.Metrics(job=str(job.pk), attempt=attempt, system=samples, training=values, malformed=1)
    assert record_metrics(instance_id=str(instance.pk), message=message)


@pytest.fixture
def resumed(team: Workspace, run: Run) -> Job:
    """Attempt 1 ran steps 0..9 and its machine was lost; attempt 2 resumed at step 8 and ran to 19."""
    job = run.jobs.get()
    first = _attempt_on(team, job, "one", price="3.6")
    _feed(job, first, 1, T0, range(10), lambda s: 10.0 - s)
    attempt_end(attempt_id=str(current_attempt(job).pk), reason=TerminationReason.INSTANCE_LOST, message="gone")
    Attempt.objects.filter(job=job, number=1).update(started_at=protocol_time(T0), finished_at=protocol_time(T0 + 50))
    Instance.objects.filter(pk=first.pk).update(status=InstanceStatus.TERMINATED)
    second = _attempt_on(team, job, "two")
    _feed(job, second, 2, T0 + 100, range(8, 20), lambda s: 10.0 - s)
    return job


def protocol_time(t: float) -> Any:
    from backend.metrics.blocks import at

    return at(t)


def test_a_runs_metrics_name_each_jobs_series_last_values_and_counters(resumed: Job, member: Person) -> None:
    answer = member.client().get(f"{BASE}/runs/{resumed.run.name}/metrics/")
    assert answer.status_code == 200, answer.json()
    (job,) = answer.json()["jobs"]
    assert job["job"] == "hello"
    assert [a["number"] for a in job["attempts"]] == [1, 2]
    assert job["attempts"][0]["termination_reason"] == TerminationReason.INSTANCE_LOST
    assert job["system"][:2] == ["cpu", "memory"] and "gpu0.util" in job["system"]
    assert job["training"] == ["loss"]
    assert job["last"]["loss"]["value"] == 10.0 - 19 and job["last"]["loss"]["step"] == 19
    assert job["last"]["loss"]["attempt"] == 2 and job["last"]["loss"]["t"].endswith("Z")
    assert job["last"]["cpu"]["value"] == 20.0
    assert (job["dropped"], job["malformed"]) == (0, 2)


def test_one_curve_continues_across_attempts_with_their_numbers(resumed: Job, viewer: Person) -> None:
    url = f"{BASE}/runs/{resumed.run.name}/metrics/series/"
    body = viewer.client().get(url, {"job": "hello", "names": "loss,cpu,gpu0.util"}).json()
    assert [a["number"] for a in body["attempts"]] == [1, 2]
    loss, cpu, util = body["series"]
    assert (loss["name"], loss["kind"], loss["x"]) == ("loss", "training", "step")
    assert loss["points"]["x"] == list(range(10)) + list(range(8, 20))
    assert loss["points"]["attempt"] == [1] * 10 + [2] * 12
    assert loss["points"]["y"][-1] == -9.0
    assert (cpu["kind"], cpu["x"], cpu["unit"], cpu["resolution"]) == ("system", "time", "%", "raw")
    assert cpu["points"]["x"][:2] == [T0, T0 + 5] and cpu["points"]["y"][0] == 10.0
    assert cpu["points"]["min"] == cpu["points"]["y"] == cpu["points"]["max"]  # raw: each point one sample
    assert set(zip(cpu["points"]["attempt"], cpu["points"]["y"], strict=True)) == {(1, 10.0), (2, 20.0)}
    assert util["unit"] == "%"

    since = viewer.client().get(url, {"job": "hello", "names": "loss,cpu", "since": T0 + 100}).json()
    assert since["series"][0]["points"]["x"] == list(range(8, 20))
    assert since["series"][1]["points"]["attempt"] == [2] * 12

    few = viewer.client().get(url, {"job": "hello", "names": "loss,cpu", "points": 4}).json()
    loss4, cpu4 = few["series"]
    assert len(loss4["points"]["x"]) <= 4 + 1 and set(loss4["points"]["attempt"]) == {1, 2}
    assert len(cpu4["points"]["x"]) <= 4 and cpu4["resolution"] == "1m"  # 155 s in 4 points: minutes
    assert min(cpu4["points"]["min"]) == 10.0 and max(cpu4["points"]["max"]) == 20.0

    every = viewer.client().get(url, {"job": "hello"}).json()
    assert {s["name"] for s in every["series"]} >= {"loss", "cpu", "memory", "gpu0.util", "gpu0.power"}


def test_a_bad_query_is_a_400_that_says_why_and_an_unknown_job_a_404(resumed: Job, member: Person) -> None:
    url = f"{BASE}/runs/{resumed.run.name}/metrics/series/"
    client = member.client()
    assert client.get(url).json()["message"].startswith("job: the job's name is required")
    assert client.get(url, {"job": "hello", "points": "9999"}).status_code == 400
    assert "since" in client.get(url, {"job": "hello", "since": "yesterday"}).json()["message"]
    for bad in ("1e300", "-5", "nan", "inf"):
        far = client.get(url, {"job": "hello", "until": bad})
        assert (far.status_code, far.json()["message"]) == (
            400,
            f"until: {bad!r} is not a Unix time (seconds from 0 to 100000000000).",
        ), bad
    missing = client.get(url, {"job": "nope"})
    assert (missing.status_code, missing.json()["message"]) == (404, f"Run {resumed.run.name!r} has no job 'nope'.")


def test_another_workspaces_run_is_not_found(resumed: Job, outsider: Person) -> None:
    theirs = outsider.user.personal_workspace
    for url in (
        f"/api/v1/workspaces/{theirs.slug}/runs/{resumed.run.name}/metrics/",
        f"/api/v1/workspaces/{theirs.slug}/runs/{resumed.run.pk}/metrics/series/?job=hello",
        f"/api/v1/workspaces/{theirs.slug}/metrics/compare/?runs={resumed.run.name},{resumed.run.name}x",
        f"{BASE}/runs/{resumed.run.name}/metrics/",
    ):
        assert outsider.client().get(url).status_code == 404, url


def test_runs_are_compared_side_by_side(team: Workspace, owner: Person, member: Person, resumed: Job) -> None:
    other = submit(team, owner.user, commit="b" * 40)
    job = other.jobs.get()
    instance = _attempt_on(team, job, "three")
    _feed(job, instance, 1, T0, range(5), lambda s: 5.0 - s)
    third = submit(team, owner.user)
    answer = member.client().get(
        f"{BASE}/metrics/compare/", {"runs": f"{resumed.run.name},{other.name},{third.name}", "names": "loss"}
    )
    assert answer.status_code == 200, answer.json()
    first, second, empty = answer.json()["runs"]
    assert (first["run"], first["workflow"], first["commit"]) == (resumed.run.name, "hello", "a" * 40)
    assert second["commit"] == "b" * 40
    assert first["last"] == {"loss": -9.0} and second["last"] == {"loss": 1.0} and empty["last"] == {}
    assert [(s["name"], s["job"], s["x"]) for s in first["series"]] == [("loss", "hello", "step")]
    assert first["series"][0]["points"]["attempt"][-1] == 2
    # Attempt 1 ran 50 s on a machine at $3.60 an hour: $0.05.
    assert first["cost"] == "0.0500"
    assert empty["cost"] is None and empty["series"] == []
    too_few = member.client().get(f"{BASE}/metrics/compare/", {"runs": resumed.run.name})
    assert too_few.status_code == 400 and "2 to 10" in too_few.json()["message"]


def test_a_runs_metrics_go_with_it(resumed: Job) -> None:
    from backend.metrics.models import AttemptMetrics, SystemBlock, TrainingBlock

    assert SystemBlock.objects.filter(job=resumed).exists() and TrainingBlock.objects.filter(job=resumed).exists()
    resumed.run.delete()
    assert not SystemBlock.objects.exists() and not TrainingBlock.objects.exists()
    assert not AttemptMetrics.objects.exists()
