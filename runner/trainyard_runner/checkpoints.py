"""A job's checkpoint (``AssignJob.checkpoint``): restored before the
commands start, synced to the server's storage while they run.

A sync is a new version on the server (``runner/jobs/<job>/checkpoints/``,
then the artifact endpoints): the runner sends the manifest of every file
under the checkpoint path, the server answers with the files to upload
(those changed since the latest version; the others are carried by
reference), and the version becomes the latest only once the server has
verified all of its files. Syncs happen every ``sync_seconds`` when
something changed, when asked (``Job.sync_checkpoint``: an interruption
notice, a rebalance recommendation) and when the commands end; one at a
time. Each sync first copies the files into a staging directory (a file
whose size and mtime did not change since the last sync is hard-linked and
not hashed again) and uploads from there: a job that keeps writing its
checkpoint while it is uploaded cannot make the bytes differ from the
manifest. Changed files are found by size and sha256.

Restoring downloads the latest version's files like inputs (fresh URL on
403, sha256 checked) into ``<work>/<path>``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from .artifacts import ArtifactError, FileEntry, _entry, upload_tree
from .http import HttpError, post_json
from .inputs import InputError, fetch_inputs
from .protocol import CheckpointSpec, InputArtifact

log = logging.getLogger(__name__)


class CheckpointError(Exception):
    """The checkpoint could not be restored; the message says which file and why."""


class CheckpointSync:
    def __init__(
        self,
        spec: CheckpointSpec,
        *,
        work: Path,
        staging: Path,
        job: str,
        attempt: int,
        api_url: str,
        token: str,
        fresh_url: Callable[[dict[str, object]], str],
        begin: str = "checkpoints",
    ) -> None:
        """``begin``: "checkpoints" (versions, restored by the next attempt),
        or "artifacts" for a mounted artifact (``ArtifactSpec.mount``: each
        upload replaces the last; nothing to restore)."""
        self.spec = spec
        self._begin = begin
        self._work = work
        self._staging = staging
        self._job, self._attempt, self._api_url, self._token = job, attempt, api_url, token
        self._fresh_url = fresh_url
        # What the latest version on the server holds: path -> (size, sha256).
        self._synced: dict[str, tuple[int, str]] = {f.path: (f.size, f.sha256) for f in spec.files}
        self.version = spec.version  # the latest version's number (0: none yet)
        self._hashes: dict[str, tuple[int, int, str]] = {}  # path -> (size, mtime_ns, sha256)
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._periodic: asyncio.Task[None] | None = None

    @property
    def root(self) -> Path:
        return self._work / self.spec.path

    async def restore(self) -> None:
        """Put the latest version's files at the checkpoint path; raises CheckpointError."""
        if not self.spec.version:
            return
        started = time.monotonic()
        artifact = InputArtifact(path=self.spec.path, files=self.spec.files)
        try:
            await fetch_inputs([artifact], self._work, fresh_url=self._fresh_file_url)
        except InputError as e:
            raise CheckpointError(f"could not restore checkpoint {self.spec.version}: {e}") from None
        log.info(
            "job %s: restored checkpoint %d (%d files) in %.1fs",
            self._job,
            self.spec.version,
            len(self.spec.files),
            time.monotonic() - started,
        )

    def _fresh_file_url(self, _artifact: str, path: str) -> str:
        return self._fresh_url({"checkpoint": self.spec.version, "file": path})

    async def sync(self, reason: str) -> bool:
        """Make the server's latest version match the files now: True when it
        does (a new version, or nothing changed), False when the sync failed."""
        async with self._lock:
            try:
                files = await asyncio.to_thread(self._manifest)
            except OSError as e:
                log.warning("job %s: checkpoint sync (%s): cannot read %s: %s", self._job, reason, self.spec.path, e)
                return False
            current = {f.path: (f.size, f.sha256) for f in files}
            if not files or current == self._synced:
                log.debug("job %s: checkpoint sync (%s): nothing changed", self._job, reason)
                return True
            started = time.monotonic()
            try:
                created, _ = await asyncio.to_thread(
                    upload_tree,
                    self.spec.path,
                    self._staging,
                    files,
                    begin=self._begin,
                    job=self._job,
                    attempt=self._attempt,
                    api_url=self._api_url,
                    token=self._token,
                )
            except ArtifactError as e:
                log.warning("job %s: checkpoint sync (%s) failed: %s", self._job, reason, e)
                return False
            self._synced = current
            self.version = int(created.get("number") or self.version + 1)
            log.info(
                "job %s: %s %d synced (%s): %d of %d files uploaded in %.1fs",
                self._job,
                "checkpoint" if self._begin == "checkpoints" else f"mounted artifact {self.spec.path}",
                self.version,
                reason,
                len(created["uploads"]),
                len(files),
                time.monotonic() - started,
            )
            return True

    async def done(self) -> None:
        """Tell the server this attempt makes no more syncs (it was
        interrupted at a notice: the next attempt waits for this or for the
        machine's deadline). Best effort: without it the deadline decides."""
        async with self._lock:
            url = f"{self._api_url}/runner/jobs/{self._job}/checkpoints/done/?attempt={self._attempt}"
            try:
                await asyncio.to_thread(post_json, url, {}, token=self._token)
            except (OSError, HttpError) as e:
                log.warning("job %s: could not say the last checkpoint sync was made: %s", self._job, e)

    def start_periodic(self) -> None:
        if self._periodic is None:
            self._periodic = asyncio.get_running_loop().create_task(self._every())

    async def stop_periodic(self) -> None:
        """Stop the periodic syncs; one under way is finished first."""
        self._stop.set()
        if self._periodic is not None:
            await self._periodic

    async def _every(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), self.spec.sync_seconds)
                return
            except TimeoutError:
                pass
            await self.sync("periodic")

    def _manifest(self) -> list[FileEntry]:
        """Copy every regular file under the checkpoint path into the staging
        directory and return their manifest (sorted); a file whose size and
        mtime are as last seen is hard-linked and keeps its sha256."""
        root = self.root
        shutil.rmtree(self._staging, ignore_errors=True)
        self._staging.mkdir(parents=True)
        if not root.exists():
            return []
        if not root.resolve().is_relative_to(self._work.resolve()):
            raise OSError(f"{self.spec.path} is outside the working directory")
        found = [(root, root.name)] if root.is_file() else _walk(root)
        entries = []
        for full, rel in found:
            # A file renamed or removed since the walk (the job's own atomic
            # write: state.tmp replaced onto state.json) is not part of this
            # version; the next sync sees the directory as it is then.
            try:
                st = full.stat()
                copy = self._staging / rel
                copy.parent.mkdir(parents=True, exist_ok=True)
                cached = self._hashes.get(rel)
                if cached is not None and cached[:2] == (st.st_size, st.st_mtime_ns):
                    try:
                        os.link(full, copy)
                    except OSError:  # another file system: copied (a vanished file raises again)
                        shutil.copyfile(full, copy)
                    entries.append(FileEntry(rel, cached[0], cached[2]))
                    continue
                shutil.copyfile(full, copy)
            except FileNotFoundError:
                log.debug("job %s: %s went away during the checkpoint sync", self._job, rel)
                continue
            entry = _entry(copy, rel)
            self._hashes[rel] = (entry.size, st.st_mtime_ns, entry.sha256) if entry.size == st.st_size else (-1, 0, "")
            entries.append(entry)
        return sorted(entries, key=lambda e: e.path)


def _walk(root: Path) -> list[tuple[Path, str]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            full = Path(dirpath) / name
            if full.is_file() and not full.is_symlink():
                out.append((full, full.relative_to(root).as_posix()))
    return out
