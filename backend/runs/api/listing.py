"""The runs list's results as plain dicts: what ``RunOut`` shows of each run
(and ``RunDetailOut`` of one run), built from ``run_page``'s rows by plain
functions instead of DRF's nested serializers, which cost more per page than
its query (docs/decisions/0057-runs-list-page-in-sql.md). The serializers
stay the definition (the schema, the run page, websockets);
tests/runs/test_runs_list_output.py holds the two to the same output, field
by field."""

from __future__ import annotations

from datetime import datetime, tzinfo
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from backend.billing.rules import AttemptBill, Machine, attempt_bill
from backend.billing.selectors import bills_total
from backend.billing.selectors import shown as money_shown
from backend.core.urlcreds import url_without_credentials
from backend.runs.api.serializers import ReproducedOut
from backend.runs.lifecycle.dag import ref_origin
from backend.runs.lifecycle.devenvs import dev_environment_shown
from backend.runs.models import Run
from backend.runs.selectors import RunRow, job_data, run_row
from backend.runs.services.reproduced import rerun_verdicts


def runs_shown(rows: list[RunRow]) -> list[dict[str, Any]]:
    """``rows`` as ``RunOut(many=True)`` shows them; the re-runs' verdicts are
    read in one batch (no query when none is a re-run)."""
    reruns = [
        Run(id=r["id"], workspace_id=r["workspace_id"], rerun_of_id=r["rerun_of_id"], status=r["status"])
        for r in rows
        if r["rerun_of_id"] is not None
    ]
    verdicts = rerun_verdicts(runs=reruns)
    zone, now = timezone.get_current_timezone(), timezone.now()
    shown = []
    for row in rows:
        run = _run(row, zone)
        verdict = verdicts.get(row["id"])
        run["rerun_of"] = verdict.original if verdict is not None else None
        run["reproduced"] = dict(ReproducedOut(verdict).data) if verdict is not None else None
        jobs = [_job(job, zone, now) for job in row["jobs"]]
        run["jobs"] = [job for job, _ in jobs]
        costs = [cost for _, cost in jobs if cost is not None]
        run["cost"] = money_shown(sum(costs, Decimal(0)) if costs else None)
        shown.append(run)
    return shown


def run_shown(runs: QuerySet[Run]) -> dict[str, Any] | None:
    """The run of ``runs`` (by id or name) as ``RunDetailOut`` shows it,
    JSON-ready, in one query (two for a re-run, one more when a job reads
    data inputs): the run page, the run's published snapshots, its
    followers' and the submission's answer."""
    row = run_row(runs=runs, detail=True)
    if row is None:
        return None
    shown = runs_shown([row])[0]
    data = job_data(workspace_id=row["workspace_id"], specs={job["id"]: job for job in row["jobs"]})
    for job in shown["jobs"]:
        job["data_inputs"], job["volumes"] = data[job["id"]].inputs, data[job["id"]].volumes
    return shown


def run_snapshot(run: Run) -> dict[str, Any]:
    """``run`` as its followers and the workspace's see it (events.snapshot_with)."""
    shown = run_shown(Run.objects.filter(pk=run.pk))
    assert shown is not None, f"run {run.pk} is gone"
    return shown


def _run(row: RunRow, zone: tzinfo) -> dict[str, Any]:
    started, finished = row["started_at"], row["finished_at"]
    duration = round((finished - started).total_seconds(), 3) if started and finished else None
    return {
        "id": str(row["id"]),
        "name": row["name"],
        "workflow": row["workflow"],
        "help": row["help"],
        "status": row["status"],
        "status_reason": row["status_reason"],
        "exit_code": row["exit_code"],
        "submitted_by": row["submitter"],
        "created_at": _when(row["created_at"], zone),
        "started_at": _when(started, zone),
        "finished_at": _when(finished, zone),
        "duration_seconds": duration,
        "cost": None,  # runs_shown sums the jobs'
        "max_cost": None if row["max_cost"] is None else str(row["max_cost"]),
        "budget_override": row["budget_override"],
        "no_cache": row["no_cache"],
        "environment_build": row["environment_build"],
        "tags": sorted(row["tag_names"]),
        "code": {
            "kind": row["code_kind"],
            # A run stored before credentials were stripped at submission shows none either.
            "repo_url": url_without_credentials(row["repo_url"]),
            "commit": row["commit"],
            "has_patch": row["patch_blob_id"] is not None,
        },
    }


def _job(job: dict[str, Any], zone: tzinfo, now: datetime) -> tuple[dict[str, Any], Decimal | None]:
    """The job as ``JobOut`` shows it, and its cost (None: unknown)."""
    source = job["cached_from_id"]
    bills = [(a["started_at"], _bill(a, now)) for a in job["attempts"]]
    cost = bills_total(bills)
    return {
        "id": job["id"],
        "name": job["name"],
        "workflow": job["workflow"],
        "provider": job["provider"],
        "status": job["status"],
        "status_reason": job["status_reason"],
        "exit_code": job["exit_code"],
        "attempt": job["attempt"],
        "attempts": [_attempt(a, zone, bill) for a, (_, bill) in zip(job["attempts"], bills, strict=True)],
        "cost": money_shown(cost),
        "instance": job["instance_name"],
        "ports": job["ports"],
        "resources": {k: job[k] for k in ("cpu", "memory_bytes", "gpu_count", "gpu_name")},
        "needs": sorted(job["need_names"]),
        "after_running": sorted(job["after_names"]),
        "cached_from": {"run": job["cached_from_run"], "job": source} if source is not None else None,
        "cache_decision": job["cache_decision"] or None,
        "inputs": _inputs(job),
        "checkpoint": _checkpoint(job, zone),
        "placement": job["placement"],
        "on_demand_since": _when(job["on_demand_since"], zone),
        "placement_note": job["placement_note"],
        "created_at": _when(job["created_at"], zone),
        "started_at": _when(job["started_at"], zone),
        "finished_at": _when(job["finished_at"], zone),
        "last_seq": job["last_seq"],
        "log_bytes": job["log_bytes"],
        "log_note": job["log_note"],
        "dev_environment": dev_environment_shown({"dev_environment": job["dev_environment"]}, job["ports"]),
    }, cost


def _bill(attempt: dict[str, Any], now: datetime) -> AttemptBill | None:
    if attempt["instance_name"] is None:
        return None
    price = Decimal(attempt["instance_price_per_hour"])
    machine = Machine(price, attempt["instance_running_at"], attempt["instance_terminated_at"])
    return attempt_bill(attempt["started_at"], attempt["finished_at"], machine, now)


def _attempt(attempt: dict[str, Any], zone: tzinfo, bill: AttemptBill | None) -> dict[str, Any]:
    return {
        "number": attempt["number"],
        "status": attempt["status"],
        "instance": attempt["instance_name"],
        **{k: attempt[f"instance_{k}"] for k in ("backend", "instance_type", "region", "zone", "spot")},
        "reason": attempt["termination_reason"],
        "message": attempt["termination_message"],
        "exit_code": attempt["exit_code"],
        "started_at": _when(attempt["started_at"], zone),
        "finished_at": _when(attempt["finished_at"], zone),
        "first_seq": attempt["first_seq"],
        "last_seq": attempt["last_seq"],
        "offers_tried": attempt["offers_tried"],
        "restored_checkpoint": attempt["restored_checkpoint"],
        "environment": attempt["environment_key"],
        "cost": money_shown(bill.cost) if bill is not None else None,
        "price_per_hour": str(bill.price_per_hour) if bill is not None else None,
        "billed_seconds": bill.seconds if bill is not None else None,
        "created_at": _when(attempt["created_at"], zone),
    }


def _inputs(job: dict[str, Any]) -> list[dict[str, str]]:
    """As ``dag.job_inputs``: each needed job's artifacts, then each ref's run's (by path)."""
    shown = [{"path": path, "from": f"job {name}"} for path, name in job["need_inputs"]]
    for number, ref in enumerate(job["input_refs"], start=1):
        paths = sorted(path for n, path in job["ref_inputs"] if n == number)
        shown += [{"path": path, "from": ref_origin(ref)} for path in paths]
    return shown


def _checkpoint(job: dict[str, Any], zone: tzinfo) -> dict[str, Any] | None:
    path = job["checkpoint_path"] or ""
    if not path:
        return None
    latest = job["checkpoint_latest"]
    if latest is not None:
        latest = {**latest, "completed_at": _when(latest["completed_at"], zone)}
    return {"path": str(path), "latest": latest}


def _when(value: datetime | None, zone: tzinfo) -> str | None:
    """As DRF's ``DateTimeField`` shows it: ISO 8601 in the current time zone, UTC as ``Z``."""
    if value is None:
        return None
    text = value.astimezone(zone).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text
