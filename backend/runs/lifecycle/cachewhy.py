"""Why a job is reused from the cache or runs: the decision a user reads.

A job is reused when an earlier identical job succeeded (``dag.cached_source``).
When none did, the miss is explained against the *previous* job: the latest
earlier successful job of the same workflow and job name, from the same
repository, in the workspace. In order:

1. ``--no-cache``, or the job can never be reused (no artifacts, ports, part
   of a live cluster): that alone.
2. No previous job: "no earlier run with this key".
3. The code identity differs: the files of the uncommitted patches that
   differ (when both runs' patch file lists are known), else the commits.
4. The spec differs: ``env`` by variable name, other keys by name.
5. An input's files differ (named by path and origin); in a dry run, an
   input from a job that runs first. A data input (``inputs:``) whose
   listing differs is named with what changed in it ("input
   s3://acme-data/imagenet/ changed: 3 objects added, 1 changed").
6. Nothing of that differs (the previous job lost its artifacts): "no
   earlier run with this key".

The decision is stored on the job (``Job.cache_decision``) and returned by
the dry run; it never changes what is reused (the cache key does that).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from backend.data.models import DataSnapshot, Entry
from backend.data.services import snapshot_change
from backend.runs.lifecycle.dag import WATCH_ONLY_KEYS, InputArtifact, code_identity, job_inputs
from backend.runs.models import Job, JobStatus, Run

FILES_SHOWN = 3  # changed files named in a reason; the rest are counted


class ReasonKind(enum.StrEnum):
    NO_CACHE = "no_cache"
    NOT_CACHEABLE = "not_cacheable"
    NO_EARLIER_RUN = "no_earlier_run"
    CODE_CHANGED = "code_changed"
    SPEC_CHANGED = "spec_changed"
    ENV_CHANGED = "env_changed"
    ENVIRONMENT_CHANGED = "environment_changed"  # its environment: (requirements files, pip, python, setup)
    INPUT_CHANGED = "input_changed"
    INPUT_PENDING = "input_pending"  # dry run: the input comes from a job that runs first


@dataclass(frozen=True)
class Reason:
    kind: ReasonKind
    text: str


@dataclass(frozen=True)
class CodeFacts:
    """A run's code as the cache sees it, plus what names changed files.
    ``patch_files``: {path: digest of its part of the patch} (for an archive:
    of each file); {} without a patch; None when unknown (sent by a client
    that does not list them)."""

    identity: str
    kind: str
    commit: str
    patch_files: Mapping[str, str] | None


@dataclass(frozen=True)
class Subject:
    """The job being decided. ``inputs`` None: not known yet (a dry run
    whose needed jobs run first, named in ``pending``). ``before``: only jobs
    of runs created before it are earlier (None: all)."""

    workspace_id: UUID | str
    workflow: str
    name: str
    repo_url: str
    spec: Mapping[str, Any]
    code: CodeFacts
    inputs: Sequence[InputArtifact] | None
    pending: Sequence[tuple[str, str]] = ()  # (artifact path, job name)
    before: datetime | None = None
    # A dry run's data listings, not stored: snapshot digest → its entries.
    listed: Mapping[str, Sequence[Entry]] = field(default_factory=dict)


def decision_reused(source: Job) -> dict[str, Any]:
    """The stored decision of a job reused from ``source``."""
    return {"reused": True, "text": f"reused from {source.run.name} (cached)", "run": source.run.name, "reasons": []}


def decision_runs(reasons: Sequence[Reason], *, compared_with: str = "") -> dict[str, Any]:
    """The stored decision of a job that runs: ``runs: <reason>; <reason>``."""
    return {
        "reused": False,
        "text": "runs: " + "; ".join(r.text for r in reasons),
        "compared_with": compared_with,
        "reasons": [{**asdict(r), "kind": str(r.kind)} for r in reasons],
    }


def not_cacheable_reason(*, spec: Mapping[str, Any], after_running: bool) -> Reason:
    if spec.get("dev_environment"):
        return Reason(ReasonKind.NOT_CACHEABLE, "never reused (a dev environment)")
    if after_running or spec.get("ports"):
        return Reason(ReasonKind.NOT_CACHEABLE, "never reused (part of a live cluster: it has ports or a master)")
    if spec.get("volumes") and spec.get("artifacts"):
        return Reason(ReasonKind.NOT_CACHEABLE, "never reused (it mounts a volume: what it makes may be there)")
    return Reason(ReasonKind.NOT_CACHEABLE, "never reused (no artifacts to reuse)")


NO_CACHE = Reason(ReasonKind.NO_CACHE, "--no-cache")
NO_EARLIER = Reason(ReasonKind.NO_EARLIER_RUN, "no earlier run with this key")


def decision_missed(subject: Subject) -> dict[str, Any]:
    """Why ``subject`` has no cache hit, compared with its previous job."""
    previous = previous_job(subject)
    if previous is None:
        return decision_runs([NO_EARLIER])
    reasons = [
        *_code_reasons(code_facts(previous.run), subject.code),
        *_spec_reasons(previous.spec, subject.spec),
        *_input_reasons(previous, subject),
        *_data_reasons(previous.spec, subject.spec, subject.workspace_id, subject.listed),
    ]
    return decision_runs(reasons or [NO_EARLIER], compared_with=previous.run.name)


def previous_job(subject: Subject) -> Job | None:
    """The latest earlier successful job of the same workflow and name, from
    the same repository (or, for uploaded code, any upload)."""
    jobs = Job.objects.filter(
        workspace_id=subject.workspace_id,
        workflow=subject.workflow,
        name=subject.name,
        status=JobStatus.SUCCEEDED,
        run__repo_url=subject.repo_url,
    )
    if subject.before is not None:
        jobs = jobs.filter(run__created_at__lt=subject.before)
    related = ("run", "run__patch_blob", "run__archive_blob")
    found: Job | None = jobs.select_related(*related).order_by("-run__created_at").first()
    return found


def code_facts(run: Run) -> CodeFacts:
    files = {} if run.patch_blob_id is None and run.archive_blob_id is None else run.patch_files
    return CodeFacts(identity=code_identity(run), kind=run.code_kind, commit=run.commit, patch_files=files)


# ------------------------------------------------------------------ helpers


def _code_reasons(old: CodeFacts, new: CodeFacts) -> list[Reason]:
    if old.identity == new.identity:
        return []
    if old.kind != new.kind or (new.kind == "archive" and (old.patch_files is None or new.patch_files is None)):
        before, after = _short(old.identity), _short(new.identity)
        return [Reason(ReasonKind.CODE_CHANGED, f"code changed ({before} → {after})")]
    if new.kind == "git" and old.commit != new.commit:
        return [Reason(ReasonKind.CODE_CHANGED, f"code changed (commit {old.commit[:7]} → {new.commit[:7]})")]
    if old.patch_files is None or new.patch_files is None:
        return [Reason(ReasonKind.CODE_CHANGED, "code changed (its uncommitted changes differ)")]
    # Both patches' files (or, for archives, every file's) are known: name what differs.
    changed = sorted(
        p for p in set(old.patch_files) | set(new.patch_files) if old.patch_files.get(p) != new.patch_files.get(p)
    )
    return [Reason(ReasonKind.CODE_CHANGED, f"code changed ({_some(changed) or 'its uncommitted changes differ'})")]


def _spec_reasons(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Reason]:
    reasons = []
    # A private value is compared by its digest (``privateenv``), under its name.
    old_env = {**(old.get("env") or {}), **(old.get("private_env") or {})}
    new_env = {**(new.get("env") or {}), **(new.get("private_env") or {})}
    env = sorted(k for k in set(old_env) | set(new_env) if old_env.get(k) != new_env.get(k))
    if env:
        reasons.append(Reason(ReasonKind.ENV_CHANGED, f"env changed ({_some(env)})"))
    environment = _environment_changes(old, new)
    if environment:
        reasons.append(Reason(ReasonKind.ENVIRONMENT_CHANGED, f"environment changed ({_some(environment)})"))
    own = {"env", "private_env", "environment", "environment_files", "data", *WATCH_ONLY_KEYS}
    keys = sorted(k for k in set(old) | set(new) if k not in own and old.get(k) != new.get(k))
    if keys:
        reasons.append(Reason(ReasonKind.SPEC_CHANGED, f"spec changed ({_some(keys)})"))
    return reasons


def _environment_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two jobs' ``environment`` (and the digests of
    the files it names): the files by path, the spec's parts by name."""
    before, after = dict(old.get("environment") or {}), dict(new.get("environment") or {})
    if not before or not after:
        return ["added" if after else "removed"] if before != after else []
    parts = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    old_files, new_files = old.get("environment_files"), new.get("environment_files")
    files: list[str] = []
    if old_files is not None and new_files is not None:
        files = sorted(p for p in set(old_files) | set(new_files) if old_files.get(p) != new_files.get(p))
    elif old_files != new_files and "requirements" not in parts:
        # One side's digests were not sent (an older client): say so rather than guess.
        files = [f"{after.get('requirements') or before.get('requirements')} (its digest was not sent before)"]
    return [*files, *parts]


def _input_reasons(previous: Job, subject: Subject) -> list[Reason]:
    pending = [Reason(ReasonKind.INPUT_PENDING, f"input {p} from {j}, which runs first") for p, j in subject.pending]
    if subject.inputs is None:
        return pending
    old, new = _by_path(job_inputs(previous)), _by_path(subject.inputs)
    changed = sorted(p for p in set(old) | set(new) if old.get(p, (None, None))[1] != new.get(p, (None, None))[1])
    named = [f"{p} from {(new.get(p) or old[p])[0]}" for p in changed]
    return [*pending, *(Reason(ReasonKind.INPUT_CHANGED, f"input changed ({n})") for n in named)]


def _data_reasons(
    old: Mapping[str, Any], new: Mapping[str, Any], workspace_id: UUID | str, listed: Mapping[str, Sequence[Entry]]
) -> list[Reason]:
    """What differs between two jobs' data inputs, by path: the item as
    written, else the objects its listing holds."""
    before = {str(i["path"]): i for i in old.get("data") or []}
    after = {str(i["path"]): i for i in new.get("data") or []}
    reasons: list[Reason] = []
    digests = {str(i.get("snapshot", "")) for i in [*before.values(), *after.values()]}
    entries: dict[str, Sequence[Entry]] = {
        s.digest: s.entries
        for s in DataSnapshot.objects.filter(workspace_id=workspace_id, digest__in=sorted(digests - set(listed)))
    }
    entries.update(listed)
    for path in sorted(set(before) | set(after)):
        was, now = before.get(path), after.get(path)
        if was is None or now is None:
            item = now or was
            assert item is not None
            reasons.append(
                Reason(ReasonKind.INPUT_CHANGED, f"input {item['uri']} {'added' if was is None else 'removed'}")
            )
            continue
        written = {k: v for k, v in now.items() if k != "snapshot"}
        if written != {k: v for k, v in was.items() if k != "snapshot"}:
            reasons.append(Reason(ReasonKind.SPEC_CHANGED, f"spec changed (inputs: {path})"))
            continue
        if was.get("snapshot") == now.get("snapshot"):
            continue
        first, second = entries.get(str(was.get("snapshot"))), entries.get(str(now.get("snapshot")))
        change = snapshot_change(first, second) if first is not None and second is not None else None
        words = change.text() if change else "its objects differ"
        named = [*change.added, *change.changed, *change.removed] if change else []
        shown = f" ({_some([n or path for n in named])})" if named else ""
        reasons.append(Reason(ReasonKind.INPUT_CHANGED, f"input {now['uri']} changed: {words}{shown}"))
    return reasons


def _by_path(inputs: Sequence[InputArtifact]) -> dict[str, tuple[str, frozenset[tuple[str, str]]]]:
    """Artifact path → (origin, its files' (path, sha256))."""
    return {i.artifact.path: (i.origin, frozenset((f.path, f.sha256) for f in i.artifact.files.all())) for i in inputs}


def _some(names: Sequence[str]) -> str:
    shown = ", ".join(names[:FILES_SHOWN])
    more = len(names) - FILES_SHOWN
    return f"{shown}, +{more} more" if more > 0 else shown


def _short(identity: str) -> str:
    """``commit 1a2b3c4`` / ``archive 5d6e7f8`` for a code identity."""
    kind, _, rest = identity.partition(":")
    return f"commit {rest[:7]}" if kind == "git" else f"archive {rest[:7]}"
