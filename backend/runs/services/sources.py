"""Where a run started from the dashboard starts: per repository, the last run
submitted from it, with what a submission needs again (its code, its
workflows files, its environments' file digests) and the workflows those
files define. The dashboard's "New run" form sends these back through the
same submission API as the CLI (docs/RUNS.md, "Starting a run from the dashboard")."""

from __future__ import annotations

from typing import Any

from trainyard_spec import Source, WorkflowFileError, load_workflows

from backend.accounts.models import Workspace
from backend.runs.models import Run

MAX_SOURCES = 20
# Only this many of the newest runs are looked through for repositories.
RECENT_RUNS = 2000


def run_sources(*, workspace: Workspace) -> list[dict[str, Any]]:
    """The newest run of each repository (uploaded code without git counts as one), newest first."""
    recent = (
        Run.objects.for_workspace(workspace)
        .filter(environment_build=False)
        .order_by("-created_at")
        .values_list("pk", "repo_url", "code_kind")[:RECENT_RUNS]
    )
    latest: dict[tuple[str, str], Any] = {}
    for pk, repo_url, kind in recent:
        latest.setdefault((kind, repo_url), pk)
        if len(latest) >= MAX_SOURCES:
            break
    runs = Run.objects.filter(pk__in=latest.values()).select_related("submitted_by").order_by("-created_at")
    return [_source(run) for run in runs]


def _source(run: Run) -> dict[str, Any]:
    files = run.workflows_files or [{"path": run.workflows_file_path, "text": run.workflows_file_text}]
    return {
        "repo": run.repo_url or "uploaded code (no git)",
        "run": run.name,
        "submitted_at": run.created_at.isoformat().replace("+00:00", "Z"),
        "submitted_by": run.submitted_by.username if run.submitted_by else "",
        "code": {
            "kind": run.code_kind,
            "repo_url": run.repo_url,
            "commit": run.commit,
            "patch_blob": str(run.patch_blob_id) if run.patch_blob_id else None,
            "archive_blob": str(run.archive_blob_id) if run.archive_blob_id else None,
            "patch_files": run.patch_files,
        },
        "workflows_files": files,
        "environment_files": run.environment_files,
        "workflows": _workflows(files),
    }


def _workflows(files: list[dict[str, str]]) -> list[dict[str, str]]:
    """The runnable workflows of ``files`` (name, provider, help); none when the files no longer parse."""
    try:
        loaded = load_workflows([Source(f["path"], f["text"]) for f in files])
    except WorkflowFileError:
        return []
    return [{"name": name, "provider": wf.provider, "help": wf.help or ""} for name, wf in loaded.workflows.items()]
