"""A workflow's ``cache:`` paths (``AssignJob.caches``, dstack 0.x): the
workspace's latest saving of each is restored before the commands start
and the path is saved again after they succeed (``runner/jobs/<job>/caches/``,
then the artifact endpoints; the server asks only for the files that changed
since the latest saving).

A cache is a speed-up, never a reason to fail a job: a restore or a save
that fails is logged and the job goes on. ``~`` is the job's home, a
relative path is in the working directory. A job with a user of its own
(jobuser.py) caches only paths under its working directory or its home,
and its files are read as that user.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .artifacts import ArtifactError, manifest, upload_tree
from .inputs import InputError, fetch_inputs
from .jobuser import JobUser
from .protocol import CacheSpec, InputArtifact

log = logging.getLogger(__name__)


def cache_dir(path: str, work: Path, home: Path | None = None) -> Path:
    """Where ``path`` is on this machine: ``~`` expanded (to ``home`` if
    given), relative to ``work``."""
    if home is not None and (path == "~" or path.startswith("~/")):
        return home / path[2:]
    expanded = Path(os.path.expanduser(path))
    return expanded if expanded.is_absolute() else work / expanded


def allowed(target: Path, work: Path, home: Path | None) -> bool:
    """A job with its own user (``home`` given) caches only under its working directory or home."""
    if home is None:
        return True
    return any(target.resolve().is_relative_to(root.resolve()) for root in (work, home))


async def restore_caches(
    caches: list[CacheSpec],
    work: Path,
    *,
    fresh_url: Callable[[str, str], str],
    job: str,
    home: Path | None = None,
) -> None:
    for cache in caches:
        if not cache.files:
            continue
        target = cache_dir(cache.path, work, home)
        if not allowed(target, work, home):
            log.warning("job %s: not restoring the cache %s: outside the job's directory and home", job, cache.path)
            continue
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


async def save_caches(
    caches: list[CacheSpec],
    work: Path,
    *,
    job: str,
    attempt: int,
    api_url: str,
    token: str,
    user: JobUser | None = None,
    home: Path | None = None,
) -> None:
    """Save each cache that changed; ``user``: the job's files are read as that user."""
    for cache in caches:
        root = cache_dir(cache.path, work, home)
        if not root.is_dir() or not allowed(root, work, home):
            continue
        try:
            files = await asyncio.to_thread(_as(user), manifest, root)
            if not files:
                continue
            if {(f.path, f.size, f.sha256) for f in files} == {(f.path, f.size, f.sha256) for f in cache.files}:
                log.info("job %s: the cache %s did not change", job, cache.path)
                continue
            created, _ = await asyncio.to_thread(
                _as(user),
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


def _as(user: JobUser | None) -> Callable[..., Any]:
    """Calls ``fn`` reading files as ``user`` (or as the runner)."""
    return user.reading if user is not None else _call


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)
