"""Whether a job is served from the cache: one decision, made the same way
for a pending job (the scheduler) and for a planned one (the dry run).

1. A job that can never be reused (no artifacts, part of a live cluster)
   runs; that alone is the reason.
2. With its inputs known, its cache key is computed (``dag.cache_key``).
3. ``--no-cache``: it runs.
4. An earlier successful job of the workspace with the same key, whose
   artifacts are all complete, is reused (``dag.cached_source``).
5. Otherwise it runs, and ``cachewhy`` says what differs from its previous
   job (the comparison reads the database, so a caller that has explained
   the miss before may skip it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from backend.runs.lifecycle.cachewhy import (
    NO_CACHE,
    Subject,
    decision_missed,
    decision_reused,
    decision_runs,
    not_cacheable_reason,
)
from backend.runs.lifecycle.dag import cache_key, cacheable, cached_source
from backend.runs.models import Job


@dataclass(frozen=True)
class CacheAnswer:
    key: str  # "" when the job can never be reused or its inputs are not known yet
    hit: Job | None  # the earlier identical job whose results it reuses
    decision: dict[str, Any] | None  # why, as stored on the job; None: a miss left unexplained


def cache_decide(
    *,
    spec: Mapping[str, Any],
    after_running: bool,
    no_cache: bool,
    subject_of: Callable[[], Subject],
    exclude: UUID | str | None = None,
    explain_miss: bool = True,
) -> CacheAnswer:
    """The module's steps for a job of ``spec``. ``subject_of`` is called only
    when the job can be reused at all (reading its inputs costs queries).
    ``exclude``: the job itself (it has the key once recorded);
    ``explain_miss`` False: a miss carries no decision."""
    if not cacheable(spec=dict(spec), after_running=after_running):
        return CacheAnswer("", None, decision_runs([not_cacheable_reason(spec=spec, after_running=after_running)]))
    subject = subject_of()
    spec = dict(subject.spec)
    known = subject.inputs is not None
    key = cache_key(spec=spec, code=subject.code.identity, inputs=list(subject.inputs or ())) if known else ""
    if no_cache:
        return CacheAnswer(key, None, decision_runs([NO_CACHE]))
    hit = cached_source(workspace_id=subject.workspace_id, key=key, exclude=exclude) if key else None
    if hit is not None:
        return CacheAnswer(key, hit, decision_reused(hit))
    return CacheAnswer(key, None, decision_missed(subject) if explain_miss else None)
