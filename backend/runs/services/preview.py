"""``--dry-run``: the plan a submission would make, with cache decisions, written nowhere.

A job's cache key needs its inputs' digests, so a job is known to be a cache
hit only when every job it needs is a hit too (then their artifacts are
known); otherwise the preview says its inputs come from a job still to run,
and its decision names them (``cachewhy``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from backend.accounts.models import Workspace
from backend.artifacts.models import Artifact, ArtifactStatus
from backend.billing.selectors import shown
from backend.core.errors import ApplicationError
from backend.core.urlcreds import url_without_credentials
from backend.runs.lifecycle.cache import cache_decide
from backend.runs.lifecycle.cachewhy import (
    CodeFacts,
    Subject,
)
from backend.runs.lifecycle.dag import (
    InputArtifact,
    effective,
    ref_origin,
    run_artifacts,
)
from backend.runs.lifecycle.guards import Guards
from backend.runs.lifecycle.privateenv import private_names
from backend.runs.models import Job
from backend.runs.scheduler.volumes import volumes_outlook
from backend.runs.services.admission import Estimate, job_estimate
from backend.runs.services.datainputs import ListedInputs, data_outlook, inputs_list
from backend.runs.services.environments import environment_outlook
from backend.runs.services.offerplan import offer_plan
from backend.runs.services.runs import (
    PlanInputs,
    environment_files_of,
    job_spec,
    load_files,
    placements_of,
    resolve_plan,
    resolve_refs,
)
from backend.vault.services import secret_names


def run_plan_preview(
    *,
    workspace: Workspace,
    workflow: str,
    inputs: PlanInputs,
    code: CodeFacts,
    repo_url: str,
    no_cache: bool,
    placement: dict[str, object] | None = None,
) -> dict[str, Any]:
    file = load_files(inputs.files)
    plan = resolve_plan(file, workflow, inputs, known_secrets=secret_names(workspace_id=workspace.pk))
    refs = resolve_refs(workspace, plan)
    placements = placements_of(file, placement or {}, workspace)
    repo_url = url_without_credentials(repo_url.strip())  # as run_create stores it
    listed = inputs_list(workspace_id=workspace.pk, file=file, plan=plan)
    plan = dataclasses.replace(plan, jobs=[dataclasses.replace(j, data=listed.data_of(j)) for j in plan.jobs])
    hits: dict[str, Job | None] = {}
    artifacts_of = {j.name: list(j.artifacts) for j in plan.jobs}
    jobs = []
    estimates = []
    for planned in plan.jobs:
        needed, described, known = _inputs(planned.needs, refs[planned.name], hits, plan)
        pending = [(p, n) for n in planned.needs if hits.get(n) is None for p in artifacts_of[n]]
        spec = job_spec(
            planned, inputs.environment_files, private_names(env=inputs.env, inherited_env=inputs.inherited_env)
        )
        hit, decision = _decide(workspace, planned, spec, code, repo_url, no_cache, (needed, known), pending, listed)
        hits[planned.name] = hit
        jobs.append(
            {
                "name": planned.name,
                "workflow": planned.workflow,
                "provider": planned.provider,
                "needs": list(planned.needs),
                "after_running": list(planned.after_running),
                "resources": spec["resources"],
                "inputs": described,
                "data_inputs": data_outlook(workspace_id=workspace.pk, planned=planned, listed=listed),
                "volumes": volumes_outlook(workspace_id=workspace.pk, planned=planned.volumes),
                "cache": {"run": hit.run.name, "job": str(hit.pk)} if hit else None,
                "cache_decision": decision,
                "commands": list(planned.commands),
                "environment": environment_outlook(
                    workspace_id=workspace.pk,
                    workflow=planned.workflow,
                    environment=planned.environment,
                    files=environment_files_of(planned.environment, inputs.environment_files),
                ),
                "placement": placements[planned.workflow],
                "guards": Guards.from_placement(placements[planned.workflow]).words(),
            }
        )
        offer = offer_plan(
            workspace_id=workspace.pk,
            resources=dataclasses.asdict(planned.resources),
            placement=placements[planned.workflow],
        )
        estimates.append(job_estimate(job=planned.name, offer=offer, placement=placements[planned.workflow]))
        jobs[-1].update(offer=offer, max_cost=shown(estimates[-1].max_cost))
    return {
        "workflow": plan.workflow,
        "help": file.get(workflow).help or "",
        "jobs": jobs,
        # The most the run may cost (null: a job has no max_duration or no offer).
        "estimate": shown(Estimate(tuple(estimates)).total),
    }


def code_facts_of(
    *, kind: str, commit: str, patch_sha256: str, archive_sha256: str, patch_files: dict[str, str] | None
) -> CodeFacts:
    """The code facts dag.code_identity and cachewhy.code_facts give a stored run, from digests."""
    if kind == "archive":
        if not archive_sha256:
            raise ApplicationError("A dry run of an archive needs code.archive_sha256 (or archive_blob).")
        return CodeFacts(identity=f"archive:{archive_sha256}", kind=kind, commit="", patch_files=patch_files)
    files = {} if not patch_sha256 else patch_files
    return CodeFacts(identity=f"git:{commit}+{patch_sha256}", kind=kind, commit=commit, patch_files=files)


def _decide(
    workspace: Workspace,
    planned: Any,
    spec: dict[str, Any],
    code: CodeFacts,
    repo_url: str,
    no_cache: bool,
    inputs: tuple[list[InputArtifact], bool],
    pending: list[tuple[str, str]],
    listed: ListedInputs,
) -> tuple[Job | None, dict[str, Any]]:
    """The cache hit of a planned job (or None) and the decision, as the scheduler makes it."""
    needed, known = inputs

    def subject() -> Subject:
        return Subject(
            workspace_id=workspace.pk,
            workflow=planned.workflow,
            name=planned.name,
            repo_url=repo_url,
            spec=spec,
            code=code,
            inputs=needed if known else None,
            pending=pending,
            listed={listed.of(item).digest: listed.of(item).entries for item in planned.data},
        )

    answer = cache_decide(spec=spec, subject_of=subject, after_running=bool(planned.after_running), no_cache=no_cache)
    assert answer.decision is not None  # a miss is explained unless asked not to be
    return answer.hit, answer.decision


def _inputs(
    needs: list[str], refs: list[dict[str, str]], hits: dict[str, Job | None], plan: Any
) -> tuple[list[InputArtifact], list[dict[str, str]], bool]:
    inputs: list[InputArtifact] = []
    described: list[dict[str, str]] = []
    known = True
    artifacts_of = {j.name: j.artifacts for j in plan.jobs}
    for name in needs:
        source = hits.get(name)
        if source is None:
            known = False
            described += [{"path": p, "from": f"job {name}"} for p in artifacts_of[name]]
            continue
        for artifact in _complete(effective(source)):
            inputs.append(InputArtifact(artifact, f"job {name}"))
            described.append({"path": artifact.path, "from": f"job {name} (cached from {source.run.name})"})
    for ref in refs:
        origin = ref_origin(ref)
        for artifact in run_artifacts(run_id=ref["run_id"]):
            inputs.append(InputArtifact(artifact, origin))
            described.append({"path": artifact.path, "from": origin})
    return inputs, described, known


def _complete(job: Job) -> list[Artifact]:
    return list(
        Artifact.objects.filter(job=job, status=ArtifactStatus.COMPLETE).prefetch_related("files").order_by("path")
    )
