"""A re-run marked "reproduced" when its artifacts match the original's
(backend/runs/services/reproduced.py; docs/ENVIRONMENTS.md, "Reproduced"):
the verdict, the API's fields and the websocket snapshot (real Postgres)."""

from __future__ import annotations

import hashlib

from backend.accounts.models import Workspace
from backend.artifacts.models import Artifact, ArtifactFile, ArtifactStatus
from backend.runs.api.serializers import run_to_dict
from backend.runs.models import Job, JobStatus, Run
from backend.runs.services.reproduced import ArtifactDifference, ReproducedState, RerunVerdict, rerun_verdict
from backend.runs.services.runs import run_rerun
from tests.support.fixtures import Person, submit

BASE = "/api/v1/workspaces/acme"
# hello writes ./out, train (which needs hello) writes ./model (tests/support/fixtures.py).
SAME = {"hello": {"./out": {"w.bin": b"weights"}}, "train": {"./model": {"m.bin": b"model", "cfg.json": b"{}"}}}
Outputs = dict[str, dict[str, dict[str, bytes]]]


def test_a_rerun_whose_artifacts_match_byte_for_byte_is_reproduced(team: Workspace, owner: Person) -> None:
    first, again = _original_and_rerun(team, owner)
    _ran(first, SAME)
    _ran(again, SAME)

    assert _verdict(again) == RerunVerdict(
        first.name, ReproducedState.REPRODUCED, "every artifact byte-identical (3 files)"
    )
    assert rerun_verdict(run=first) is None  # the original is no re-run


def test_a_rerun_whose_artifact_differs_names_the_job_the_path_and_the_files(team: Workspace, owner: Person) -> None:
    first, again = _original_and_rerun(team, owner)
    _ran(first, SAME)
    _ran(again, {**SAME, "train": {"./model": {"m.bin": b"other model", "cfg.json": b"{}", "extra.txt": b"x"}}})

    verdict = _verdict(again)

    assert verdict.state == ReproducedState.DIFFERS
    assert verdict.differences == (ArtifactDifference("train", "./model", ("extra.txt", "m.bin")),)
    assert verdict.detail == "train ./model (extra.txt, m.bin)"


def test_a_missing_artifact_and_many_differing_files_are_named_in_short(team: Workspace, owner: Person) -> None:
    first, again = _original_and_rerun(team, owner)
    _ran(first, {"train": {"./model": {f"f{i}": b"a" for i in range(6)}}})
    _ran(again, {"hello": {"./out": {"w.bin": b"new"}}, "train": {"./model": {f"f{i}": b"b" for i in range(6)}}})

    verdict = _verdict(again)

    assert verdict.differences == (
        ArtifactDifference("hello", "./out", only_in="the re-run"),
        ArtifactDifference("train", "./model", ("f0", "f1", "f2"), more=3),
    )
    assert verdict.detail == "hello ./out (only in the re-run); train ./model (f0, f1, f2 and 3 more)"


def test_a_job_reused_from_the_cache_is_no_evidence_and_is_named(team: Workspace, owner: Person) -> None:
    first, again = _original_and_rerun(team, owner)
    _ran(first, SAME)
    # The re-run's hello is a cache hit of the original's: it did not run, so its (same) artifacts prove nothing.
    _ran(again, {"train": SAME["train"]}, cached={"hello": first})

    assert _verdict(again) == RerunVerdict(
        first.name,
        ReproducedState.REPRODUCED,
        "every artifact byte-identical (2 files); hello reused from the cache, not compared",
    )


def test_a_rerun_reused_whole_from_the_cache_is_not_comparable(team: Workspace, owner: Person) -> None:
    first, again = _original_and_rerun(team, owner)
    _ran(first, SAME)
    _ran(again, {}, cached={"hello": first, "train": first})

    assert _verdict(again) == RerunVerdict(
        first.name, ReproducedState.NOT_COMPARABLE, "every job was reused from the cache (nothing ran again)"
    )


def test_a_rerun_whose_jobs_wrote_no_artifacts_is_not_comparable(team: Workspace, owner: Person) -> None:
    first, again = _original_and_rerun(team, owner)
    _ran(first, {})
    _ran(again, {})

    assert _verdict(again).detail == "the jobs that ran again wrote no artifacts"
    assert _verdict(again).state == ReproducedState.NOT_COMPARABLE


def test_the_original_is_compared_through_its_cache_source(team: Workspace, owner: Person) -> None:
    earliest = submit(team, owner.user, workflow="train")
    _ran(earliest, SAME)
    first, again = _original_and_rerun(team, owner)
    _ran(first, {}, cached={"hello": earliest, "train": earliest})  # the original repeated nothing itself
    _ran(again, SAME)

    assert _verdict(again).state == ReproducedState.REPRODUCED
    assert _verdict(again).detail == "every artifact byte-identical (3 files)"


def test_a_rerun_is_pending_until_both_runs_finished_and_not_comparable_when_one_failed(
    team: Workspace, owner: Person
) -> None:
    first, again = _original_and_rerun(team, owner)
    assert _verdict(again) == RerunVerdict(first.name, ReproducedState.PENDING, "the re-run has not finished")

    _ran(again, SAME)
    assert _verdict(again) == RerunVerdict(first.name, ReproducedState.PENDING, f"{first.name} has not finished")

    _ran(first, SAME, status="failed")
    assert _verdict(again) == RerunVerdict(first.name, ReproducedState.NOT_COMPARABLE, f"{first.name} failed")

    Run.objects.filter(pk=first.pk).update(status="succeeded")
    Run.objects.filter(pk=again.pk).update(status="stopped")
    assert _verdict(again) == RerunVerdict(first.name, ReproducedState.NOT_COMPARABLE, "the re-run was stopped")


def test_an_original_in_another_workspace_is_never_read(team: Workspace, owner: Person, outsider: Person) -> None:
    theirs = submit(outsider.user.personal_workspace, outsider.user, workflow="train")
    _ran(theirs, SAME)
    mine = submit(team, owner.user, workflow="train")
    _ran(mine, SAME)
    Run.objects.filter(pk=mine.pk).update(rerun_of=theirs)

    assert _verdict(mine) is None
    assert owner.client().get(f"{BASE}/runs/{mine.name}/").json()["rerun_of"] is None


def test_the_api_and_the_websocket_snapshot_show_the_original_and_the_verdict(team: Workspace, owner: Person) -> None:
    first, again = _original_and_rerun(team, owner)
    _ran(first, SAME)
    _ran(again, {**SAME, "train": {"./model": {"m.bin": b"changed", "cfg.json": b"{}"}}})
    client = owner.client()

    detail = client.get(f"{BASE}/runs/{again.name}/").json()
    listed = client.get(f"{BASE}/runs/").json()["results"]
    original = client.get(f"{BASE}/runs/{first.name}/").json()

    expected = {
        "state": "differs",
        "detail": "train ./model (m.bin)",
        "differences": [
            {
                "job": "train",
                "path": "./model",
                "files": ["m.bin"],
                "more_files": 0,
                "only_in": "",
                "text": "train ./model (m.bin)",
            }
        ],
    }
    assert (detail["rerun_of"], detail["reproduced"]) == (first.name, expected)
    assert [(r["name"], r["rerun_of"], r["reproduced"]) for r in listed] == [
        (again.name, first.name, expected),
        (first.name, None, None),
    ]
    assert (original["rerun_of"], original["reproduced"]) == (None, None)
    snapshot = run_to_dict(Run.objects.get(pk=again.pk))
    assert (snapshot["rerun_of"], snapshot["reproduced"]) == (first.name, expected)


def _original_and_rerun(team: Workspace, owner: Person) -> tuple[Run, Run]:
    first = submit(team, owner.user, workflow="train")
    again = run_rerun(run=first, user=owner.user)
    assert again.rerun_of_id == first.pk
    return first, again


def _ran(run: Run, outputs: Outputs, *, status: str = "succeeded", cached: dict[str, Run] | None = None) -> None:
    """``run`` ended with ``status``; each job named in ``outputs`` wrote
    complete artifacts {path: {file: bytes}}; each in ``cached`` was reused
    from that run's job of the same name (its source, when it was reused too)."""
    Run.objects.filter(pk=run.pk).update(status=status)
    for job in run.jobs.all():
        source = Job.objects.get(run=cached[job.name], name=job.name) if job.name in (cached or {}) else None
        source = source.cached_from or source if source is not None else None
        Job.objects.filter(pk=job.pk).update(status=JobStatus.SUCCEEDED, cached_from=source)
        for path, files in outputs.get(job.name, {}).items():
            artifact = Artifact.objects.create(
                workspace=run.workspace,
                run=run,
                job=job,
                path=path,
                status=ArtifactStatus.COMPLETE,
                storage_prefix=f"workspaces/{run.workspace_id}/artifacts/{job.pk}",
            )
            for name, data in files.items():
                sha = hashlib.sha256(data).hexdigest()
                ArtifactFile.objects.create(artifact=artifact, path=name, size=len(data), sha256=sha)


def _verdict(run: Run) -> RerunVerdict | None:
    return rerun_verdict(run=Run.objects.get(pk=run.pk))
