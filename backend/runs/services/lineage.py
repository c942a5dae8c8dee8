"""A run's lineage: the runs that fed it and the runs that used its artifacts.

The edges are the ones stored when runs are submitted: a job's ``input_refs``
(``deps: - tag:``, ``- run:`` and another repository's ``- workflow:``, each
naming the producing run) and a job reused from the cache (``cached_from``,
the run whose job really ran). Read breadth-first in both directions, at most
``depth`` steps and ``MAX_RUNS`` runs: a graph past either bound says
``truncated``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q

from backend.runs.models import Job, Run, Tag

MAX_DEPTH = 5
DEFAULT_DEPTH = 3
MAX_RUNS = 100


@dataclass(frozen=True)
class Edge:
    producer: uuid.UUID
    consumer: uuid.UUID
    kind: str  # "tag", "run", "workflow" (deps), "cache" (a job reused from the producer's)
    name: str  # the tag's, run's or workflow's name as the deps named it; the job's for "cache"
    job: str  # the consumer's job that read it


@dataclass
class Lineage:
    run: Run
    depth: int
    # Run id -> steps from ``run``: negative upstream (it fed the run), positive downstream.
    distance: dict[uuid.UUID, int] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)
    truncated: bool = False


def run_lineage(*, run: Run, depth: int = DEFAULT_DEPTH) -> Lineage:
    """``run``'s lineage up to ``depth`` steps each way (1..MAX_DEPTH), within its workspace."""
    lineage = Lineage(run=run, depth=depth, distance={run.pk: 0})
    seen: set[Edge] = set()
    for side in (-1, 1):
        frontier = {run.pk}
        for step in range(1, depth + 1):
            found = _producers_of(run, frontier) if side < 0 else _consumers_of(run, frontier)
            reached: set[uuid.UUID] = set()
            for edge in found:
                if edge in seen:
                    continue
                other = edge.producer if side < 0 else edge.consumer
                if other not in lineage.distance:
                    if len(lineage.distance) >= MAX_RUNS:
                        lineage.truncated = True
                        continue
                    lineage.distance[other] = side * step
                    reached.add(other)
                seen.add(edge)
                lineage.edges.append(edge)
            frontier = reached
            if not frontier:
                break
        else:
            lineage.truncated = lineage.truncated or bool(
                frontier and (_producers_of(run, frontier) if side < 0 else _consumers_of(run, frontier))
            )
    return lineage


def lineage_shown(lineage: Lineage) -> dict[str, Any]:
    """The API's answer: the runs (by distance, then age) and the edges between them, by run name."""
    runs = Run.objects.filter(workspace_id=lineage.run.workspace_id, pk__in=lineage.distance).select_related(
        "submitted_by"
    )
    tags: dict[uuid.UUID, list[str]] = {}
    for run_id, name in Tag.objects.filter(run_id__in=lineage.distance).order_by("name").values_list("run_id", "name"):
        tags.setdefault(run_id, []).append(name)
    by_id = {r.pk: r for r in runs}
    ordered = sorted(by_id.values(), key=lambda r: (lineage.distance[r.pk], r.created_at))
    return {
        "run": lineage.run.name,
        "depth": lineage.depth,
        "truncated": lineage.truncated,
        "runs": [
            {
                "name": r.name,
                "workflow": r.workflow,
                "status": r.status,
                "created_at": r.created_at.isoformat().replace("+00:00", "Z"),
                "submitted_by": r.submitted_by.username if r.submitted_by else "",
                "tags": tags.get(r.pk, []),
                "distance": lineage.distance[r.pk],
            }
            for r in ordered
        ],
        "edges": [
            {
                "producer": by_id[e.producer].name,
                "consumer": by_id[e.consumer].name,
                "kind": e.kind,
                "name": e.name,
                "job": e.job,
            }
            for e in lineage.edges
            if e.producer in by_id and e.consumer in by_id
        ],
    }


def _producers_of(run: Run, consumers: Iterable[uuid.UUID]) -> list[Edge]:
    jobs = Job.objects.filter(workspace_id=run.workspace_id, run_id__in=list(consumers))
    edges: list[Edge] = []
    for consumer, job, refs, cached_run in jobs.values_list("run_id", "name", "input_refs", "cached_from__run_id"):
        for ref in refs:
            producer = _uuid(ref.get("run_id"))
            if producer is not None and producer != consumer:
                edges.append(Edge(producer, consumer, str(ref.get("kind", "")), str(ref.get("name", "")), job))
        if cached_run is not None and cached_run != consumer:
            edges.append(Edge(cached_run, consumer, "cache", job, job))
    return _in_workspace(run, edges, lambda e: e.producer)


def _consumers_of(run: Run, producers: Iterable[uuid.UUID]) -> list[Edge]:
    ids = list(producers)
    # The partial GIN index job_input_refs answers the containment test.
    by_refs = Q()
    for producer in ids:
        by_refs |= Q(input_refs__contains=[{"run_id": str(producer)}])
    jobs = Job.objects.filter(workspace_id=run.workspace_id).exclude(input_refs=[]).filter(by_refs)
    edges: list[Edge] = []
    wanted = {str(p) for p in ids}
    for consumer, job, refs in jobs.values_list("run_id", "name", "input_refs")[: MAX_RUNS * 4]:
        for ref in refs:
            named = _uuid(ref.get("run_id")) if str(ref.get("run_id")) in wanted else None
            if named is not None and named != consumer:
                edges.append(Edge(named, consumer, str(ref.get("kind", "")), str(ref.get("name", "")), job))
    cached = Job.objects.filter(workspace_id=run.workspace_id, cached_from__run_id__in=ids)
    for consumer, job, producer in cached.values_list("run_id", "name", "cached_from__run_id")[: MAX_RUNS * 4]:
        if producer != consumer:
            edges.append(Edge(producer, consumer, "cache", job, job))
    return edges


def _in_workspace(run: Run, edges: list[Edge], end: Any) -> list[Edge]:
    """Only edges whose other end is a run of ``run``'s workspace (refs are resolved within it; kept honest)."""
    ids = {end(e) for e in edges}
    if not ids:
        return edges
    known = set(Run.objects.filter(workspace_id=run.workspace_id, pk__in=ids).values_list("pk", flat=True))
    return [e for e in edges if end(e) in known]


def _uuid(value: object) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None
