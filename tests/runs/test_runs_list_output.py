"""The runs list builds its results from one SQL query and plain functions
(backend/runs/api/listing.py), not from ``RunOut``: what it shows must be
exactly what ``RunOut`` shows of the same runs (the run page, websockets,
the schema), field by field and in the same key order, for runs with every
kind of content."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from hashlib import sha256
from typing import Any
from zoneinfo import ZoneInfo

from django.utils import timezone

from backend.accounts.models import User, Workspace
from backend.artifacts.models import Artifact, ArtifactFile, ArtifactKind, ArtifactStatus, Blob, CheckpointLatest
from backend.clouds.models import Instance
from backend.data.models import DataSnapshot, pack_entries
from backend.runs.api.listing import run_shown, runs_shown
from backend.runs.api.serializers import RunOut, run_to_dict
from backend.runs.models import Attempt, Job, Run
from backend.runs.selectors import run_list, run_page
from backend.runs.services.runs import run_rerun
from backend.runs.services.tags import tag_set
from tests.support.fixtures import Person, submit

BASE = "/api/v1/workspaces/acme"
AT = datetime(2026, 11, 30, 9, 15, 0, tzinfo=UTC)  # whole seconds: shown without a fraction


def test_the_list_shows_every_run_exactly_as_run_out_does(team: Workspace, owner: Person) -> None:
    runs = _every_kind_of_run(team, owner)

    listed = owner.client().get(f"{BASE}/runs/?page_size=50").json()["results"]

    expected = [run_to_dict(Run.objects.get(pk=run.pk), shape=RunOut) for run in runs]
    assert [r["name"] for r in listed] == [r["name"] for r in expected]
    for got, want in zip(listed, expected, strict=True):
        assert list(got) == list(want)
        for field in want:
            assert got[field] == want[field], (want["name"], field)
        for got_job, want_job in zip(got["jobs"], want["jobs"], strict=True):
            assert list(got_job) == list(want_job)
    _assert_every_kind_is_shown(expected)


def test_one_run_is_shown_exactly_as_run_out_shows_it(team: Workspace, owner: Person) -> None:
    """``run_shown``: the run page, its followers and the published snapshots."""
    runs = _every_kind_of_run(team, owner)

    shown = [run_shown(Run.objects.filter(pk=run.pk)) for run in runs]

    for run, one in zip(runs, shown, strict=True):
        assert one == run_to_dict(Run.objects.get(pk=run.pk)), run.name
    assert run_shown(Run.objects.filter(name="no-such-run")) is None
    jobs = [j for one in shown if one for j in one["jobs"]]
    assert {(d["file_count"], d["versioned"]) for j in jobs for d in j["data_inputs"]} == {(200, True), (None, False)}
    assert [v for j in jobs for v in j["volumes"]] == [{"name": "ckpt", "path": "/data", "read_only": False}]


def test_the_list_shows_dates_in_the_current_time_zone_as_run_out_does(team: Workspace, owner: Person) -> None:
    runs = _every_kind_of_run(team, owner)

    with timezone.override(ZoneInfo("America/Sao_Paulo")):
        rows = run_page(runs=run_list(workspace=team), cursor="", size=50).rows
        listed = json.loads(json.dumps(runs_shown(rows)))
        expected = [run_to_dict(Run.objects.get(pk=run.pk), shape=RunOut) for run in runs]

    assert listed == expected
    assert listed[0]["created_at"].endswith("-03:00")


def _assert_every_kind_is_shown(shown: list[dict[str, Any]]) -> None:
    """The fixture holds what it says (else the comparison proves little)."""
    jobs = [j for r in shown for j in r["jobs"]]
    assert any(r["reproduced"] and r["reproduced"]["state"] == "differs" for r in shown)
    assert any(r["environment_build"] for r in shown) and any(r["tags"] for r in shown)
    assert any(r["submitted_by"] is None for r in shown) and any(r["code"]["has_patch"] for r in shown)
    assert any(r["code"]["repo_url"] == "https://example.com/acme/private.git" for r in shown)
    assert any(r["duration_seconds"] == 61.5 for r in shown)
    assert any(j["needs"] == j["after_running"] == ["a-setup", "hello"] for j in jobs)
    assert any(j["cached_from"] and j["cache_decision"] for j in jobs)
    assert any(j["status"] == "failed" and j["exit_code"] == 3 and j["instance"] == "box-1" for j in jobs)
    assert {a["instance"] for j in jobs for a in j["attempts"]} == {"box-1", None}
    assert {i["from"] for j in jobs for i in j["inputs"]} >= {"job hello", "tag best (run " + shown[-1]["name"] + ")"}
    assert {(c or {}).get("latest") is None for c in (j["checkpoint"] for j in jobs) if c} == {True, False}
    assert any(j["provider"] == "bash" and j["ports"] and j["placement"] and j["on_demand_since"] for j in jobs)


def _every_kind_of_run(team: Workspace, owner: Person) -> list[Run]:
    """Newest first: a re-run whose artifacts differ, a run reading a tag's
    artifacts with a checkpoint, data inputs and a volume, a failed run with attempts and a cached job,
    an environment build by a deleted user, and the tagged original."""
    original = submit(team, owner.user, workflow="train")
    _succeeded(original, b"one")
    original.refresh_from_db()
    tag_set(workspace=team, user=owner.user, name="best", run=original, force=False)
    failed = submit(team, owner.user, workflow="train")
    _failed_with_attempts(team, failed, cached_from=original.jobs.get(name="hello"))
    builder = User.objects.create(username="gone")
    build = submit(team, builder, workflow="big")
    Run.objects.filter(pk=build.pk).update(environment_build=True, patch_blob=_blob(team))
    builder.delete()
    reader = submit(team, owner.user, workflow="evaluate")
    _checkpoints(team, reader.jobs.get())
    _data(team, reader.jobs.get())
    again = run_rerun(run=original, user=owner.user)
    _succeeded(again, b"two")
    Run.objects.filter(pk=original.pk).update(repo_url="https://token:secret@example.com/acme/private.git")
    return [again, reader, build, failed, original]


def _succeeded(run: Run, data: bytes) -> None:
    """The run and its jobs succeeded; each job wrote ./out or ./model, one file holding ``data``."""
    Run.objects.filter(pk=run.pk).update(status="succeeded", started_at=AT, finished_at=AT + timedelta(seconds=61.5))
    for job in run.jobs.all():
        Job.objects.filter(pk=job.pk).update(status="succeeded", started_at=AT, finished_at=AT, exit_code=0)
        artifact = Artifact.objects.create(
            workspace=run.workspace, run=run, job=job, path=job.spec["artifacts"][0], status=ArtifactStatus.COMPLETE,
            storage_prefix=f"p/{job.pk}", completed_at=AT,
        )  # fmt: skip
        ArtifactFile.objects.create(artifact=artifact, path="w.bin", size=len(data), sha256=sha256(data).hexdigest())


def _failed_with_attempts(team: Workspace, run: Run, *, cached_from: Job) -> None:
    """``hello`` reused from ``cached_from``; ``train`` failed on its second
    attempt, on box-1 (the first had no machine), and needs and runs after
    ``hello`` and ``a-setup`` (a job without a provider)."""
    box = Instance.objects.create(
        workspace=team, backend="local", name="box-1", token_hash="a" * 64, status="idle", cpus=8,
        memory_bytes=2**34, channel_name="c", hostname="box", instance_type="m5.large", region="eu-west-1",
        zone="eu-west-1a", spot=True,
    )  # fmt: skip
    hello, train = run.jobs.get(name="hello"), run.jobs.get(name="train")
    decision = {"reused": True, "text": "reused", "run": cached_from.run.name, "reasons": []}
    Job.objects.filter(pk=hello.pk).update(status="succeeded", cached_from=cached_from, cache_decision=decision)
    # Edges stored out of name order: both lists are shown sorted.
    setup = Job.objects.create(workspace=team, run=run, name="a-setup", workflow="hello", spec={}, status="succeeded")
    train.needs.add(setup)
    train.after_running.add(hello, setup)
    Job.objects.filter(pk=train.pk).update(
        status="failed", status_reason="exit 3", exit_code=3, attempt=2, instance=box, ports=[8080],
        placement={"spot_policy": "auto", "max_price": 0.5}, on_demand_since=AT, placement_note="no spot",
        cpu=4, memory_bytes=2**33, started_at=AT, finished_at=AT + timedelta(microseconds=120), log_note="cut",
    )  # fmt: skip
    Attempt.objects.create(
        workspace=team, job=train, number=1, status="ended", termination_reason="no_capacity",
        termination_message="none left", offers_tried=[{"offer": "o1", "outcome": "no_capacity"}],
    )  # fmt: skip
    Attempt.objects.create(
        workspace=team, job=train, number=2, instance=box, status="ended", termination_reason="exit",
        exit_code=3, started_at=AT, finished_at=AT + timedelta(seconds=2, microseconds=5), first_seq=4,
        last_seq=9, restored_checkpoint=1, environment_key="e" * 24,
    )  # fmt: skip
    Run.objects.filter(pk=run.pk).update(status="failed", status_reason="train failed", exit_code=3)


def _checkpoints(team: Workspace, job: Job) -> None:
    """``job`` keeps ./ckpt (version 2, of 2 files, is the latest); the
    original's ``train`` keeps ./state but has no version yet."""
    Job.objects.filter(pk=job.pk).update(spec={**job.spec, "checkpoint": "./ckpt"})
    version = Artifact.stored.create(
        workspace=team, run=job.run, job=job, path="./ckpt", status=ArtifactStatus.COMPLETE,
        kind=ArtifactKind.CHECKPOINT, number=2, attempt=1, total_size=30, storage_prefix="c", completed_at=AT,
    )  # fmt: skip
    for name in ("a", "b"):
        ArtifactFile.objects.create(artifact=version, path=name, size=15, sha256=name * 64)
    CheckpointLatest.objects.create(job=job, version=version)
    train = Job.objects.filter(run__workspace=team, name="train").order_by("created_at").first()
    assert train is not None
    Job.objects.filter(pk=train.pk).update(spec={**train.spec, "checkpoint": "./state"})


def _data(team: Workspace, job: Job) -> None:
    """``job`` reads a listed, versioned prefix and an input whose listing is gone, and mounts ckpt at /data."""
    DataSnapshot.objects.create(
        workspace=team, digest="d" * 64, uri="s3://acme-data/imagenet/", root="s3://acme-data/imagenet/",
        source="anonymous", file_count=200, total_size=2**31, versioned=True, listed_at=AT,
        entries_packed=pack_entries([]),
    )  # fmt: skip
    data = [
        {"uri": "s3://acme-data/imagenet/", "path": "imagenet", "read_only": True, "sha256": "", "snapshot": "d" * 64},
        {"uri": "https://example.com/v.txt", "path": "v.txt", "read_only": True, "sha256": "", "snapshot": "e" * 64},
    ]
    volumes = [{"name": "ckpt", "path": "/data", "read_only": False}]
    Job.objects.filter(pk=job.pk).update(spec={**Job.objects.get(pk=job.pk).spec, "data": data, "volumes": volumes})


def _blob(team: Workspace) -> Blob:
    return Blob.objects.create(workspace=team, size=1, sha256="0" * 64, storage_key="k")
