"""Whether a re-run reproduced its original: the same artifacts, byte for byte.

A re-run (``run_rerun``) installs the original's recorded locks, so a
deterministic workflow re-executed months later writes the same bytes. The
verdict, for a run with ``rerun_of``:

1. Either run not finished: ``pending``.
2. The re-run or the original did not succeed: ``not_comparable``.
3. Each job of the re-run that really executed (not reused from the cache:
   a cache hit repeated nothing, so it is no evidence) is paired with the
   original's job of the same name, through its cache source when the
   original's was reused (``dag.effective``).
4. Each pair's complete output artifacts are compared by path: an artifact is
   its set of (file path, sha256), compared as one digest computed by
   Postgres, so no file row is read unless something differs.
5. Nothing compared: ``not_comparable``; any artifact different (or only on
   one side): ``differs``, naming the job, the path and a few files; else
   ``reproduced``.

``rerun_verdicts`` does this for many runs in at most four queries, however
many runs, jobs and files: the originals, their jobs and the re-runs', the
artifacts' digests, and the files of the artifacts that differ.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from uuid import UUID

from django.contrib.postgres.aggregates import StringAgg
from django.db.models import CharField, Count, Func, Value
from django.db.models.functions import Cast, Coalesce, Concat, Length

from backend.artifacts.models import Artifact, ArtifactFile, ArtifactStatus
from backend.runs.models import FINISHED_RUN, Job, Run, RunStatus

FILES_SHOWN = 3  # differing files named per artifact; the rest are counted
DIFFERENCES_SHOWN = 5  # artifacts named in the detail; the rest are counted


class ReproducedState(enum.StrEnum):
    REPRODUCED = "reproduced"
    DIFFERS = "differs"
    NOT_COMPARABLE = "not_comparable"
    PENDING = "pending"


@dataclass(frozen=True)
class ArtifactDifference:
    """One artifact path of one job whose files differ. ``files``: a few of
    the files changed, added or missing (sorted), ``more``: how many others;
    ``only_in``: "the re-run" or "the original" when one side has no such
    artifact (then no file is named)."""

    job: str
    path: str
    files: tuple[str, ...] = ()
    more: int = 0
    only_in: str = ""

    @property
    def text(self) -> str:
        if self.only_in:
            return f"{self.job} {self.path} (only in {self.only_in})"
        more = f" and {self.more} more" if self.more else ""
        return f"{self.job} {self.path} ({', '.join(self.files)}{more})"


@dataclass(frozen=True)
class RerunVerdict:
    original: str  # the original run's name
    state: ReproducedState
    detail: str  # in words: what was compared, what differs, or why nothing could be
    differences: tuple[ArtifactDifference, ...] = ()


def rerun_verdicts(*, runs: Sequence[Run]) -> dict[UUID, RerunVerdict]:
    """By run id, the verdict of each run of ``runs`` that is a re-run (the
    steps of the module docstring); a run that is none has no entry. Runs
    without ``rerun_of`` cost no query."""
    originals = _originals([(r, r.rerun_of_id) for r in runs if r.rerun_of_id is not None])
    reruns = [r for r in runs if r.pk in originals]
    comparable = [r for r in reruns if _finished(r) and _finished(originals[r.pk])]
    jobs = _jobs([*(r.pk for r in comparable), *(originals[r.pk].pk for r in comparable)])
    pairs = {r.pk: _pairs(jobs.get(r.pk, []), jobs.get(originals[r.pk].pk, [])) for r in comparable}
    digests = _digests(job for found in pairs.values() for pair in found for job in pair[1:])
    compared = {pk: _compare(found, digests) for pk, found in pairs.items()}
    changed = _changed_files(c for found in compared.values() for c in found.changed)
    return {r.pk: _verdict(r, originals[r.pk], compared.get(r.pk), changed) for r in reruns}


def rerun_verdict(*, run: Run) -> RerunVerdict | None:
    """``run``'s verdict, None when it is no re-run (or its original is gone)."""
    return rerun_verdicts(runs=[run]).get(run.pk)


# ------------------------------------------------------------------ helpers


@dataclass(frozen=True)
class _Original:
    pk: UUID
    name: str
    status: str


@dataclass(frozen=True)
class _Job:
    name: str
    pk: UUID
    cached_from_id: UUID | None


@dataclass(frozen=True)
class _Digest:
    pk: UUID
    files: int
    digest: str


@dataclass(frozen=True)
class _Changed:
    job: str
    path: str
    ours: UUID  # the re-run's artifact
    theirs: UUID  # the original's


@dataclass
class _Comparison:
    files: int = 0  # files of the identical artifacts
    identical: int = 0  # artifacts
    changed: tuple[_Changed, ...] = ()
    only: tuple[ArtifactDifference, ...] = ()  # artifacts on one side only
    executed: int = 0  # jobs of the re-run that ran again
    reused: tuple[str, ...] = ()  # jobs of the re-run reused from the cache


def _finished(run: Run | _Original) -> bool:
    return run.status in FINISHED_RUN


def _originals(reruns: list[tuple[Run, UUID]]) -> dict[UUID, _Original]:
    """By re-run id, its original (``reruns``: each with its ``rerun_of_id``),
    only one of the re-run's own workspace. No query without re-runs."""
    if not reruns:
        return {}
    rows = Run.objects.filter(pk__in={pk for _, pk in reruns}).values_list("pk", "workspace_id", "name", "status")
    by_id = {pk: (ws, _Original(pk, name, status)) for pk, ws, name, status in rows}
    return {run.pk: by_id[pk][1] for run, pk in reruns if pk in by_id and by_id[pk][0] == run.workspace_id}


def _jobs(run_ids: list[UUID]) -> dict[UUID, list[_Job]]:
    if not run_ids:
        return {}
    found: dict[UUID, list[_Job]] = {}
    rows = Job.objects.filter(run_id__in=run_ids).order_by("name").values_list("run_id", "name", "pk", "cached_from_id")
    for run_id, name, pk, cached in rows:
        found.setdefault(run_id, []).append(_Job(name, pk, cached))
    return found


def _pairs(ours: list[_Job], theirs: list[_Job]) -> list[tuple[str, UUID | None, UUID | None]]:
    """(name, the re-run's job, the original's effective job) for each job of
    the re-run, in name order; a job reused from the cache has None for both."""
    by_name = {j.name: j.cached_from_id or j.pk for j in theirs}
    return [
        (j.name, None, None) if j.cached_from_id else (j.name, j.pk, by_name.get(j.name))
        for j in ours
        if j.cached_from_id or j.name in by_name
    ]


class _Sha256(Func):
    """Postgres's own sha256 (Django's ``SHA256`` needs the pgcrypto extension)."""

    template = "ENCODE(SHA256(CONVERT_TO(%(expressions)s, 'UTF8')), 'hex')"
    output_field = CharField()


def _digests(job_ids: Iterable[UUID | None]) -> dict[UUID, dict[str, _Digest]]:
    """By job, by path: each complete output artifact's file count and the
    sha256 of its sorted (path, sha256) list. Each entry is length-prefixed
    (a path may hold any character) and a sha256 is 64 characters: the list
    is read back one way only."""
    ids = {pk for pk in job_ids if pk is not None}
    if not ids:
        return {}
    entry = Concat(Cast(Length("files__path"), CharField()), Value(":"), "files__path", "files__sha256")
    listing = Coalesce(StringAgg(entry, delimiter="", order_by="files__path"), Value(""))
    rows = (
        Artifact.objects.filter(job_id__in=ids, status=ArtifactStatus.COMPLETE)
        .values("pk", "job_id", "path")
        .annotate(files_count=Count("files"), digest=_Sha256(listing))
        .values_list("pk", "job_id", "path", "files_count", "digest")
    )
    found: dict[UUID, dict[str, _Digest]] = {}
    for pk, job_id, path, count, digest in rows:
        found.setdefault(job_id, {})[path] = _Digest(pk, count, digest)
    return found


def _compare(pairs: list[tuple[str, UUID | None, UUID | None]], digests: dict[UUID, dict[str, _Digest]]) -> _Comparison:
    result = _Comparison(reused=tuple(name for name, ours, _ in pairs if ours is None))
    for name, ours, theirs in pairs:
        if ours is None:
            continue
        result.executed += 1
        mine, other = digests.get(ours, {}), (digests.get(theirs, {}) if theirs else {})
        for path in sorted(mine.keys() | other.keys()):
            _compare_one(result, name, path, mine.get(path), other.get(path))
    return result


def _compare_one(result: _Comparison, job: str, path: str, mine: _Digest | None, other: _Digest | None) -> None:
    if mine is None or other is None:
        side = "the re-run" if other is None else "the original"
        result.only += (ArtifactDifference(job, path, only_in=side),)
    elif mine.digest == other.digest:
        result.identical += 1
        result.files += mine.files
    else:
        result.changed += (_Changed(job, path, mine.pk, other.pk),)


def _changed_files(changed: Iterable[_Changed]) -> dict[tuple[UUID, UUID], tuple[str, ...]]:
    """By (re-run's, original's) artifact: every file path whose (path,
    sha256) is on one side only, sorted. One query, for differing artifacts only."""
    pairs = [(c.ours, c.theirs) for c in changed]
    if not pairs:
        return {}
    files: dict[UUID, set[tuple[str, str]]] = {}
    rows = ArtifactFile.objects.filter(artifact_id__in={pk for pair in pairs for pk in pair})
    for artifact_id, path, sha in rows.values_list("artifact_id", "path", "sha256"):
        files.setdefault(artifact_id, set()).add((path, sha))
    return {(a, b): tuple(sorted({path for path, _ in files.get(a, set()) ^ files.get(b, set())})) for a, b in pairs}


def _verdict(
    run: Run,
    original: _Original,
    compared: _Comparison | None,
    changed: dict[tuple[UUID, UUID], tuple[str, ...]],
) -> RerunVerdict:
    def verdict(state: ReproducedState, detail: str, differences: tuple[ArtifactDifference, ...] = ()) -> RerunVerdict:
        return RerunVerdict(original.name, state, detail, differences)

    if not _finished(run) or not _finished(original):
        waiting = "the re-run" if not _finished(run) else original.name
        return verdict(ReproducedState.PENDING, f"{waiting} has not finished")
    if run.status != RunStatus.SUCCEEDED:
        return verdict(ReproducedState.NOT_COMPARABLE, f"the re-run {_ended(run.status)}")
    if original.status != RunStatus.SUCCEEDED:
        return verdict(ReproducedState.NOT_COMPARABLE, f"{original.name} {_ended(original.status)}")
    assert compared is not None  # both succeeded: compared
    differences = compared.only + tuple(
        ArtifactDifference(c.job, c.path, *_few(changed.get((c.ours, c.theirs), ()))) for c in compared.changed
    )
    if differences:
        differences = tuple(sorted(differences, key=lambda d: (d.job, d.path)))
        return verdict(ReproducedState.DIFFERS, _differs_text(differences), differences)
    if not compared.identical:
        return verdict(ReproducedState.NOT_COMPARABLE, _nothing_compared(compared))
    files = f"{compared.files} file{'' if compared.files == 1 else 's'}"
    reused = f"; {', '.join(compared.reused)} reused from the cache, not compared" if compared.reused else ""
    return verdict(ReproducedState.REPRODUCED, f"every artifact byte-identical ({files}){reused}")


def _few(files: tuple[str, ...]) -> tuple[tuple[str, ...], int]:
    return files[:FILES_SHOWN], max(len(files) - FILES_SHOWN, 0)


def _differs_text(differences: tuple[ArtifactDifference, ...]) -> str:
    shown = "; ".join(d.text for d in differences[:DIFFERENCES_SHOWN])
    rest = len(differences) - DIFFERENCES_SHOWN
    return f"{shown}; and {rest} more artifact{'' if rest == 1 else 's'}" if rest > 0 else shown


def _nothing_compared(compared: _Comparison) -> str:
    if not compared.executed:
        return "every job was reused from the cache (nothing ran again)"
    return "the jobs that ran again wrote no artifacts"


def _ended(status: str) -> str:
    return "was stopped" if status == RunStatus.STOPPED else str(status)
