"""A workflow's ``cache:`` paths (``AssignJob.caches``, dstack 0.x): the
workspace's latest saving of each is restored before the commands start
and the path is saved again after they succeed (``runner/jobs/<job>/caches/``,
then the artifact endpoints; the server asks only for the files that changed
since the latest saving).

A cache is a speed-up, never a reason to fail a job: a restore or a save
that fails is logged and the job goes on. ``~`` is the job's home (the
runner's), a relative path is in the working directory.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from .artifacts import ArtifactError, manifest, upload_tree
from .inputs import InputError, fetch_inputs
from .protocol import CacheSpec, InputArtifact

log = logging.getLogger(__name__)


def cache_dir(path: str, work: Path) -> Path:
    """Where ``path`` is on this machine: ``~`` expanded, relative to ``work``."""
    expanded = Path(os.path.expanduser(path))
    return expanded if expanded.is_absolute() else work / expanded


async def restore_caches(
    caches: list[CacheSpec], work: Path, *, fresh_url: Callable[[str, str], str], job: str
) -> None:
    for cache in caches:
        if not cache.files:
            continue
        target = cache_dir(cache.path, work)
        target.mkdir(parents=True, exist_ok=True)
        try:
            await fetch_inputs(
                [InputArtifact(path=".", files=cache.files)],
                target,
                fresh_url=lambda _artifact, file, cache=cache: fresh_url(cache.path, file),  # type: ignore[misc]
            )
        except InputError as e:
            log.warning("job %s: could not restore the cache %s (the job goes on without it): %s", job, cache.path, e)
            continue
        log.info("job %s: restored the cache %s (%d files)", job, cache.path, len(cache.files))


async def save_caches(caches: list[CacheSpec], work: Path, *, job: str, attempt: int, api_url: str, token: str) -> None:
    for cache in caches:
        root = cache_dir(cache.path, work)
        if not root.is_dir():
            continue
        try:
            files = await asyncio.to_thread(manifest, root)
            if not files:
                continue
            if {(f.path, f.size, f.sha256) for f in files} == {(f.path, f.size, f.sha256) for f in cache.files}:
                log.info("job %s: the cache %s did not change", job, cache.path)
                continue
            created, _ = await asyncio.to_thread(
                upload_tree,
                cache.path,
                root,
                files,
                begin="caches",
                job=job,
                attempt=attempt,
                api_url=api_url,
                token=token,
            )
        except (ArtifactError, OSError) as e:
            log.warning("job %s: could not save the cache %s: %s", job, cache.path, e)
            continue
        log.info(
            "job %s: saved the cache %s (%d of %d files uploaded)", job, cache.path, len(created["uploads"]), len(files)
        )
